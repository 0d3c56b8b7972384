package main

import (
	"context"
	"encoding/csv"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/mcpfront"
)

// haproxyConfig balances two replicas as docs/deploy.md says: sticky on Mcp-Session-Id,
// learned from the response that makes a session, and on a 2026-07-28 client's session
// handle (Mcp-Param-Session), learned from the first request that carries it;
// health-checked on /healthz; a request whose replica is down goes to the other
// (redispatch). The stats page says which servers are up.
const haproxyConfig = `global
    maxconn 200
defaults
    mode http
    timeout connect 5s
    timeout client 2m
    timeout server 2m
    option redispatch
    retries 3
frontend mcp
    bind 127.0.0.1:%d
    default_backend minipy
backend minipy
    balance roundrobin
    option httpchk GET /healthz
    http-check expect status 200
    stick-table type string len 64 size 100k expire 30m
    stick on req.hdr(Mcp-Session-Id)
    stick store-response res.hdr(Mcp-Session-Id)
    stick on req.hdr(Mcp-Param-Session)
    server a 127.0.0.1:%d check inter 200ms fall 1 rise 1
    server b 127.0.0.1:%d check inter 200ms fall 1 rise 1
listen stats
    bind 127.0.0.1:%d
    stats enable
    stats uri /stats
`

// freePort is a TCP port of 127.0.0.1 that nothing listens on (as of now).
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// startHAProxy runs haproxy with config until the test ends.
func startHAProxy(t *testing.T, config string, port int) {
	t.Helper()
	haproxy, err := exec.LookPath("haproxy")
	if err != nil {
		haproxy = "/usr/sbin/haproxy" // (not on a user's PATH on Debian)
	}
	path := filepath.Join(t.TempDir(), "haproxy.cfg")
	require.NoError(t, os.WriteFile(path, []byte(config), 0o600))
	cmd := exec.Command(haproxy, "-db", "-f", path)
	out := &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	require.NoError(t, cmd.Start(), "haproxy (Debian's package; .ci/deps installs it)")
	t.Cleanup(func() {
		cmd.Process.Kill() //nolint:errcheck // ends with the test
		cmd.Wait()         //nolint:errcheck
		if t.Failed() {
			t.Logf("haproxy:\n%s", out)
		}
	})
	require.Eventually(t, func() bool {
		c, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err == nil {
			c.Close()
		}
		return err == nil
	}, 10*time.Second, 20*time.Millisecond, "haproxy listens")
}

// upServers reads which servers the stats page says are UP: the backend minipy's by name,
// another backend's as BACKEND/NAME.
func upServers(statsPort int) map[string]bool {
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/stats;csv", statsPort))
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	rows, _ := csv.NewReader(resp.Body).ReadAll()
	up := map[string]bool{}
	for _, row := range rows {
		if len(row) > 17 && row[1] != "BACKEND" && row[1] != "FRONTEND" {
			name := row[1]
			if row[0] != "minipy" {
				name = row[0] + "/" + row[1]
			}
			up[name] = strings.HasPrefix(row[17], "UP")
		}
	}
	return up
}

// balanced is two replicas behind HAProxy (haproxyConfig), and a client of the legacy
// revision through it, whose session has run "n = 1", defined bump() and written log.txt.
type balanced struct {
	a, b           *serverProc
	pa, pb, ph, ps int      // the replicas', HAProxy's and its stats page's ports
	args           []string // each replica's
	cs             *mcp.ClientSession
}

// startBalanced starts it, each replica with args (the isolated engine).
func startBalanced(t *testing.T, args ...string) *balanced {
	t.Helper()
	bl := &balanced{pa: freePort(t), pb: freePort(t), ph: freePort(t), ps: freePort(t), args: args}
	bl.a, bl.b = bl.replica(t, bl.pa), bl.replica(t, bl.pb)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("A's log:\n%s\nB's log:\n%s", bl.a.log, bl.b.log)
		}
	})
	startHAProxy(t, fmt.Sprintf(haproxyConfig, bl.ph, bl.pa, bl.pb, bl.ps), bl.ph)
	require.Eventually(t, bl.bothUp, 10*time.Second, 50*time.Millisecond, "haproxy sees both replicas")
	client := mcp.NewClient(&mcp.Implementation{Name: "minipy-haproxy-test", Version: "0"}, nil)
	cs, err := client.Connect(context.Background(), &mcp.StreamableClientTransport{
		Endpoint: fmt.Sprintf("http://127.0.0.1:%d/mcp", bl.ph)}, legacy)
	require.NoError(t, err)
	t.Cleanup(func() { cs.Close() })
	bl.cs = cs
	text, isError := runText(t, cs, map[string]any{"code": "n = 1\ndef bump():\n    global n\n    n += 1\n    return n\n" +
		"open('log.txt', 'w').write('start\\n')\nn"})
	require.False(t, isError, text)
	return bl
}

// replica starts a replica at port.
func (bl *balanced) replica(t *testing.T, port int) *serverProc {
	return startServer(t, append([]string{"-http", "127.0.0.1:" + strconv.Itoa(port), "-backend", "isolated"},
		bl.args...)...)
}

// bothUp reports whether HAProxy sees both replicas up.
func (bl *balanced) bothUp() bool { up := upServers(bl.ps); return up["a"] && up["b"] }

// Past one machine: HAProxy in front of two replicas that share a state directory; a
// rolling restart of both, one at a time (each drained by SIGTERM, started again at its
// address), keeps a session's variables, functions and files, whichever replica held it.
func TestServeBehindHAProxy(t *testing.T) {
	bl := startBalanced(t, "-state-dir", t.TempDir(), "-state-idle", "200ms")
	// A client of the sessionless revision, with a handle.
	modern, err := mcp.NewClient(&mcp.Implementation{Name: "minipy-haproxy-test", Version: "0"}, nil).Connect(
		context.Background(), &mcp.StreamableClientTransport{Endpoint: fmt.Sprintf("http://127.0.0.1:%d/mcp", bl.ph)}, nil)
	require.NoError(t, err)
	defer modern.Close()
	_, err = modern.ListTools(context.Background(), nil)
	require.NoError(t, err)
	text, isError, h := callText(t, modern, "minipy", map[string]any{"code": "m = 10"})
	require.False(t, isError, text)

	for i, restart := range []struct {
		name string
		proc **serverProc
		port int
	}{{"a", &bl.a, bl.pa}, {"b", &bl.b, bl.pb}} {
		(*restart.proc).stop(t) // drains: saves the session if it was there
		*restart.proc = bl.replica(t, restart.port)
		require.Eventually(t, bl.bothUp, 10*time.Second, 50*time.Millisecond, "haproxy sees %s again", restart.name)
		text, isError = runText(t, bl.cs, map[string]any{"code": fmt.Sprintf(
			"open('log.txt', 'a').write('after %s\\n')\nbump(), open('log.txt').read()", restart.name)})
		require.False(t, isError, "after restarting %s: %s", restart.name, text)
		want := "start\\n"
		for _, r := range []string{"a", "b"}[:i+1] {
			want += "after " + r + "\\n"
		}
		assert.Equal(t, fmt.Sprintf("[value]\n(%d, '%s')\n", i+2, want), text, "after restarting %s", restart.name)
		text, isError, _ = callText(t, modern, "minipy", map[string]any{"code": "m += 1\nm", mcpfront.HandleArg: h})
		require.False(t, isError, "the handle after restarting %s: %s", restart.name, text)
		assert.Equal(t, fmt.Sprintf("[value]\n%d\n", 11+i), text, "the handle after restarting %s", restart.name)
	}
}
