package e2b

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"time"

	"golang.org/x/time/rate"
)

// Signed file URLs: a sandbox's downloadUrl and uploadUrl are envd's GET and POST /files
// with a signature instead of the access token's header, for a browser or a tool that
// holds only the URL. The SDK signs them itself, as E2B's envd checks them: "v1_" and the
// unpadded base64 of the SHA-256 of "path:operation:username:access token", with
// ":expiration" (Unix seconds, signature_expiration) when the URL expires. A signature
// says which path, which operation (read: GET, write: POST) and which user it is for, and
// nothing else; an expired one is refused as E2B refuses it.
//
// With E2B_SANDBOX_URL (every sandbox at the server's one address) such a URL names no
// sandbox: the server finds the one whose token signed it, a hash per running sandbox.
// Those searches are rate limited server-wide (signedLookups), so that URLs made up to
// search cost a bounded share of the server's CPU.

const (
	signedLookupsPerSecond = 50
	signedLookupsBurst     = 100
)

// fileSignature is envd's signature of a file URL.
func fileSignature(path, operation, user, token, expiration string) string {
	raw := path + ":" + operation + ":" + user + ":" + token
	if expiration != "" {
		raw += ":" + expiration
	}
	sum := sha256.Sum256([]byte(raw))
	return "v1_" + base64.RawStdEncoding.EncodeToString(sum[:])
}

// isSignedFileURL reports whether r asks for a file by a signature (envd's /files, its
// query's signature).
func isSignedFileURL(r *http.Request) bool {
	return r.URL.Path == "/files" && (r.Method == http.MethodGet || r.Method == http.MethodPost) &&
		r.URL.Query().Get("signature") != ""
}

// signs reports whether sb's access token signed the file URL r.
func (sb *sandbox) signs(r *http.Request) bool { return signedWith(r, sb.token) }

// signedWith reports whether access token token signed the file URL r.
func signedWith(r *http.Request, token string) bool {
	if !isSignedFileURL(r) {
		return false
	}
	operation := "read"
	if r.Method == http.MethodPost {
		operation = "write"
	}
	q := r.URL.Query()
	want := fileSignature(q.Get("path"), operation, q.Get("username"), token, q.Get("signature_expiration"))
	return subtle.ConstantTimeCompare([]byte(q.Get("signature")), []byte(want)) == 1
}

// signatureExpired reports whether the signed file URL r has expired (its expiration is
// past, or not a number).
func signatureExpired(r *http.Request, now time.Time) bool {
	exp := r.URL.Query().Get("signature_expiration")
	if exp == "" {
		return false
	}
	at, err := strconv.ParseInt(exp, 10, 64)
	return err != nil || at < now.Unix()
}

// signedSandbox is the running sandbox whose access token signed the file URL r, which
// names none; status says why there is none (429: too many searches, 401: no sandbox's).
func (s *Server) signedSandbox(r *http.Request) (sb *sandbox, status int) {
	if !s.signedLookups.Allow() {
		return nil, http.StatusTooManyRequests
	}
	s.mu.Lock()
	all := slices.Collect(maps.Values(s.sandboxes))
	s.mu.Unlock()
	for _, one := range all {
		if (one.running() || one.asleepNow()) && one.signs(r) { // (asleep: woken as it is served)
			return one, http.StatusOK
		}
	}
	return nil, http.StatusUnauthorized
}

func newSignedLookups() *rate.Limiter {
	return rate.NewLimiter(signedLookupsPerSecond, signedLookupsBurst)
}
