package minipy_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/minipy-go/minipy"
)

// A server the code starts in its sandbox is reached from the host through DialPort, and
// only through it: its port is the sandbox's alone.
func TestDialPort(t *testing.T) {
	for name, cfg := range map[string]minipy.IsolatedConfig{"template": {}, "no template": {NoTemplate: true}} {
		t.Run(name, func(t *testing.T) {
			e := newIsolated(t, cfg)
			ns := e.NewNamespace()
			defer ns.Close()
			port := valueIn(t, e, ns, `import http.server, threading
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ("hello from " + self.path).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
threading.Thread(target=srv.serve_forever, daemon=True).start()
srv.server_address[1]`).(int64)
			c, err := ns.DialPort(context.Background(), int(port))
			require.NoError(t, err)
			defer c.Close()
			_, err = fmt.Fprintf(c, "GET /x HTTP/1.0\r\nHost: sandbox\r\n\r\n")
			require.NoError(t, err)
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			require.NoError(t, err)
			body, _ := io.ReadAll(resp.Body)
			assert.Equal(t, "hello from /x", string(body))

			other := e.NewNamespace()
			defer other.Close()
			_, err = other.DialPort(context.Background(), int(port))
			assert.ErrorIs(t, err, syscall.ECONNREFUSED, "another sandbox's port is not this one's")
			_, err = ns.DialPort(context.Background(), 1)
			assert.ErrorIs(t, err, syscall.ECONNREFUSED, "nothing listens there")
			_, err = ns.DialPort(context.Background(), 70000)
			assert.Error(t, err)
		})
	}
}

// Where the sandbox has no network of its own, or none that is its own to serve, DialPort
// refuses: with Network its 127.0.0.1 is the host's.
func TestDialPortRefused(t *testing.T) {
	for name, cfg := range map[string]minipy.IsolatedConfig{"network": {Network: true}, "packed": {Workers: 1}} {
		e := newIsolated(t, cfg)
		ns := e.NewNamespace()
		_, err := ns.DialPort(context.Background(), 80)
		assert.ErrorIs(t, err, minipy.ErrNoPorts, name)
		ns.Close()
	}
	_, err := minipy.NewNamespace().DialPort(context.Background(), 80)
	assert.ErrorIs(t, err, minipy.ErrNoPorts, "in-process")
}

// Connections are bounded engine-wide, and each gives its place back when closed; a
// connection ends with its sandbox.
func TestDialPortBounded(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{})
	ns := e.NewNamespace()
	port := valueIn(t, e, ns, `import socket
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(2048)
srv.getsockname()[1]`).(int64)
	var open []interface{ Close() error }
	var err error
	for range 1100 {
		var c interface{ Close() error }
		if c, err = ns.DialPort(context.Background(), int(port)); err != nil {
			break
		}
		open = append(open, c)
	}
	assert.ErrorIs(t, err, minipy.ErrTooManyConnections)
	assert.Len(t, open, 1024)
	open[0].Close()
	c, err := ns.DialPort(context.Background(), int(port))
	require.NoError(t, err, "a closed one's place is free")
	open[0] = c
	for _, c := range open {
		c.Close()
	}
	c, err = ns.DialPort(context.Background(), int(port))
	require.NoError(t, err)
	ns.Close()
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	_, err = c.Read(make([]byte, 1))
	assert.Error(t, err, "the sandbox ended, and the connection with it")
	c.Close()
}
