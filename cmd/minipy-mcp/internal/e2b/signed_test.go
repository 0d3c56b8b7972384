package e2b

import (
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// signedURL is the file URL E2B's SDK makes (downloadUrl: read, uploadUrl: write) for a
// sandbox whose access token is token, at base (E2B_SANDBOX_URL: it names no sandbox);
// expires is the Unix time it expires at (0: never). The signature is computed here as
// E2B's SDK computes it, not by the server's code.
func signedURL(base, path, operation, token string, expires int64) string {
	raw := path + ":" + operation + "::" + token
	q := url.Values{"path": {path}}
	if expires != 0 {
		raw += fmt.Sprintf(":%d", expires)
		q.Set("signature_expiration", fmt.Sprint(expires))
	}
	sum := sha256.Sum256([]byte(raw))
	q.Set("signature", "v1_"+strings.TrimRight(base64.StdEncoding.EncodeToString(sum[:]), "="))
	return base + "/files?" + q.Encode()
}

func fetch(t *testing.T, method, u string, body io.Reader) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, u, body)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// A sandbox's signed file URLs (downloadUrl, uploadUrl) work without its token, at the
// server's one address as at the sandbox's own host, for their path, operation and time
// only; another sandbox's signature reaches nothing of this one.
func TestSignedFileURLs(t *testing.T) {
	_, base := pauseServer(t, Config{})
	sandboxes := make([]map[string]any, 2)
	for i := range sandboxes {
		code, sb := call(t, "POST", base+"/v2/sandboxes", `{}`)
		require.Equal(t, http.StatusCreated, code)
		sandboxes[i] = sb
	}
	a, b := sandboxes[0], sandboxes[1]
	tokenA, tokenB := a["envdAccessToken"].(string), b["envdAccessToken"].(string)
	code, _ := onPort(t, base, a["sandboxID"].(string), tokenA, "49983", "POST", "/files?path=hello.txt", "hello world")
	require.Equal(t, http.StatusOK, code)
	now := time.Now().Unix()

	code, body := fetch(t, "GET", signedURL(base, "hello.txt", "read", tokenA, 0), nil)
	assert.Equal(t, http.StatusOK, code, body)
	assert.Equal(t, "hello world", body)
	code, body = fetch(t, "GET", signedURL(base, "hello.txt", "read", tokenA, now+600), nil)
	assert.Equal(t, http.StatusOK, code, body)
	code, body = fetch(t, "GET", signedURL(base, "hello.txt", "read", tokenA, now-600), nil)
	assert.Equal(t, http.StatusUnauthorized, code)
	assert.JSONEq(t, `{"code": 401, "message": "signature is already expired"}`, body, "E2B's envd's answer")

	// What the signature does not cover is refused: another path, the other operation, a
	// later expiration than signed, another sandbox's token.
	other := strings.Replace(signedURL(base, "hello.txt", "read", tokenA, 0), "path=hello.txt", "path=other.txt", 1)
	code, _ = fetch(t, "GET", other, nil)
	assert.Equal(t, http.StatusUnauthorized, code, "another path")
	code, _ = fetch(t, "POST", signedURL(base, "hello.txt", "read", tokenA, 0), strings.NewReader("planted"))
	assert.Equal(t, http.StatusUnauthorized, code, "a read's signature, to write")
	later := strings.Replace(signedURL(base, "hello.txt", "read", tokenA, now-600), fmt.Sprint(now-600), fmt.Sprint(now+600), 1)
	code, _ = fetch(t, "GET", later, nil)
	assert.Equal(t, http.StatusUnauthorized, code, "an expiration moved")
	code, body = fetch(t, "GET", signedURL(base, "hello.txt", "read", tokenB, 0), nil)
	assert.Equal(t, http.StatusNotFound, code, "b's signature reads b's files: b has no hello.txt (%s)", body)
	// At b's own host, a's signature reaches nothing.
	req, err := http.NewRequest("GET", signedURL(base, "hello.txt", "read", tokenA, 0), nil)
	require.NoError(t, err)
	req.Header.Set("E2b-Sandbox-Id", b["sandboxID"].(string))
	req.Header.Set("E2b-Sandbox-Port", "49983")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusUnauthorized, resp.StatusCode, "a's signature at b")

	code, body = fetch(t, "POST", signedURL(base, "up.txt", "write", tokenA, now+600), strings.NewReader("uploaded"))
	require.Equal(t, http.StatusOK, code, body)
	code, got := fetch(t, "GET", signedURL(base, "up.txt", "read", tokenA, 0), nil)
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, "uploaded", got)
}

// A signed file URL that names no sandbox is searched for among the running sandboxes, a
// hash each: made-up signatures are refused (401), and past the server's rate of searches
// answered 429, so that they cost a bounded share of its CPU.
func TestSignedFileURLSearchesBounded(t *testing.T) {
	_, base := pauseServer(t, Config{})
	code, _ := call(t, "POST", base+"/v2/sandboxes", `{}`)
	require.Equal(t, http.StatusCreated, code)
	code, _ = fetch(t, "GET", signedURL(base, "x", "read", "not a token", 0), nil)
	require.Equal(t, http.StatusUnauthorized, code)
	limited := false
	for i := 0; i < 5000 && !limited; i++ {
		code, _ = fetch(t, "GET", signedURL(base, fmt.Sprint(i), "read", "not a token", 0), nil)
		limited = code == http.StatusTooManyRequests
		require.Contains(t, []int{http.StatusUnauthorized, http.StatusTooManyRequests}, code)
	}
	assert.True(t, limited, "searches are rate limited")
}

// A signed file URL of a sandbox asleep wakes it, as a request with its token does: at the
// sandbox's own host, asleep in the server's memory or in a store that no server holds it
// in (a replica's restart), and at the server's one address (which names no sandbox) once
// a server holds it; an expired one wakes nothing.
func TestSignedFileURLWakes(t *testing.T) {
	atItsHost := func(t *testing.T, base string, sb map[string]any, expires int64) (int, string) {
		t.Helper()
		req, err := http.NewRequest("GET", signedURL(base, "note.txt", "read", sb["envdAccessToken"].(string), expires), nil)
		require.NoError(t, err)
		req.Header.Set("E2b-Sandbox-Id", sb["sandboxID"].(string))
		req.Header.Set("E2b-Sandbox-Port", "49983")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		got, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(got)
	}
	check := func(t *testing.T, s *Server, base string, sb map[string]any) {
		t.Helper()
		code, body := atItsHost(t, base, sb, time.Now().Unix()-60)
		assert.Equal(t, http.StatusUnauthorized, code, body)
		assert.Zero(t, s.Stats().Woken, "an expired signature wakes nothing")
		code, body = atItsHost(t, base, sb, time.Now().Unix()+60)
		assert.Equal(t, http.StatusOK, code, body)
		assert.Equal(t, "kept", body)
		assert.Equal(t, 1, s.Stats().Woken)
		asleepSoon(t, s, 1)
		code, body = fetch(t, "GET", signedURL(base, "note.txt", "read", sb["envdAccessToken"].(string), 0), nil)
		assert.Equal(t, http.StatusOK, code, "at the server's one address: %s", body)
		assert.Equal(t, "kept", body)
		assert.Equal(t, 2, s.Stats().Woken)
	}
	asleepWithFile := func(t *testing.T, s *Server, base string) map[string]any {
		code, sb := callAs(t, "ann", "POST", base+"/v2/sandboxes", `{"timeout": 600}`)
		require.Equal(t, http.StatusCreated, code, "%v", sb)
		require.Equal(t, "", run(t, base, sb, "_ = open('note.txt', 'w').write('kept')"))
		asleepSoon(t, s, 1)
		return sb
	}
	t.Run("memory", func(t *testing.T) {
		s, base := pauseServer(t, Config{SleepIdle: sleepIdle})
		check(t, s, base, asleepWithFile(t, s, base))
	})
	t.Run("store", func(t *testing.T) {
		dir := t.TempDir()
		a, baseA := storeServer(t, dir, Config{SleepIdle: sleepIdle})
		sb := asleepWithFile(t, a, baseA)
		a.Close()
		b, baseB := storeServer(t, dir, Config{SleepIdle: sleepIdle})
		check(t, b, baseB, sb)
	})
}
