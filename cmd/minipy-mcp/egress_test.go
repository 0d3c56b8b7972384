package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// -egress-allow end to end, with a real client: an allowed host answers through the
// sandbox's proxy, another gets the proxy's one-line refusal, SIGHUP re-reads
// -egress-allow-file, and /metrics counts both. (The "internet" is a server on 127.0.0.2,
// which -egress-allow-nets lets through; nothing leaves this machine.)
func TestEgressFlags(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.2:0")
	require.NoError(t, err)
	srv := &httptest.Server{Listener: l, Config: &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from %s", r.URL.Path)
	})}}
	srv.Start()
	defer srv.Close()
	_, port, _ := net.SplitHostPort(l.Addr().String())
	file := filepath.Join(t.TempDir(), "allow")
	require.NoError(t, os.WriteFile(file, []byte("# nothing yet\n"), 0o644))
	s := startServer(t, "-backend", "isolated", "-egress-allow", "127.0.0.2:"+port, "-egress-allow-file", file,
		"-egress-allow-nets", "127.0.0.2/32")
	assert.Contains(t, s.log.String(), "allowed: 127.0.0.2:"+port)
	cs := connectClient(t, &mcp.StreamableClientTransport{Endpoint: s.base + "/mcp"})
	fetch := func(path string) string {
		text, isError := run(t, cs, map[string]any{"code": fmt.Sprintf(`import urllib.request, urllib.error
try:
    r = urllib.request.urlopen("http://127.0.0.2:%s%s", timeout=10).read().decode()
except urllib.error.HTTPError as e:
    r = e.read().decode().strip()
r`, port, path)})
		require.False(t, isError, text)
		return text
	}
	assert.Equal(t, "[value]\n'hello from /a'\n", fetch("/a"))
	// Another port of the same address is not in the list.
	other, err := net.Listen("tcp", "127.0.0.2:0")
	require.NoError(t, err)
	defer other.Close()
	_, otherPort, _ := net.SplitHostPort(other.Addr().String())
	refused, _ := run(t, cs, map[string]any{"code": fmt.Sprintf(`import urllib.request, urllib.error
try:
    urllib.request.urlopen("http://127.0.0.2:%s/", timeout=10)
except urllib.error.HTTPError as e:
    print(e.code, e.read().decode().strip())`, otherPort)})
	assert.Contains(t, refused, "403 minipy: egress to 127.0.0.2:"+otherPort+" is not allowed")
	require.Eventually(t, func() bool { return strings.Contains(s.log.String(), "egress refused: minipy: egress to") },
		10*time.Second, 20*time.Millisecond, "the refusal is logged")

	// SIGHUP: the file now allows the other port.
	require.NoError(t, os.WriteFile(file, []byte("127.0.0.2:"+otherPort+"  # the second service\n"), 0o644))
	require.NoError(t, s.cmd.Process.Signal(syscall.SIGHUP))
	require.Eventually(t, func() bool { return strings.Contains(s.log.String(), "egress read again") },
		10*time.Second, 20*time.Millisecond)
	go http.Serve(other, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { //nolint:errcheck // ends with other
		fmt.Fprint(w, "the second service")
	}))
	text, _ := run(t, cs, map[string]any{"code": fmt.Sprintf(`import urllib.request
urllib.request.urlopen("http://127.0.0.2:%s/", timeout=10).read().decode()`, otherPort)})
	assert.Equal(t, "[value]\n'the second service'\n", text)

	resp, err := http.Get(s.base + "/metrics")
	require.NoError(t, err)
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Contains(t, string(metrics), `minipy_egress_total{result="allowed"} 2`)
	assert.Contains(t, string(metrics), `minipy_egress_total{result="refused"} 1`)
}

func TestEgressFlagsNeedTheIsolatedBackend(t *testing.T) {
	out, err := exec.Command(buildServer(t), "-http", "127.0.0.1:0", "-backend", "inprocess", "-egress-allow",
		"pypi").CombinedOutput()
	assert.Error(t, err)
	assert.Contains(t, string(out), "-egress-allow and -egress-allow-file apply to -backend isolated")
}
