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

// upServers reads which servers of the backend the stats page says are UP.
func upServers(statsPort int) map[string]bool {
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/stats;csv", statsPort))
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	rows, _ := csv.NewReader(resp.Body).ReadAll()
	up := map[string]bool{}
	for _, row := range rows {
		if len(row) > 17 && row[0] == "minipy" && row[1] != "BACKEND" && row[1] != "FRONTEND" {
			up[row[1]] = strings.HasPrefix(row[17], "UP")
		}
	}
	return up
}

// Past one machine: HAProxy in front of two replicas that share a state directory; a
// rolling restart of both, one at a time (each drained by SIGTERM, started again at its
// address), keeps a session's variables, functions and files, whichever replica held it.
func TestServeBehindHAProxy(t *testing.T) {
	dir := t.TempDir()
	pa, pb, ph, ps := freePort(t), freePort(t), freePort(t), freePort(t)
	replica := func(port int) *serverProc {
		return startServer(t, "-http", "127.0.0.1:"+strconv.Itoa(port), "-backend", "isolated", "-state-dir", dir,
			"-state-idle", "200ms")
	}
	a, b := replica(pa), replica(pb)
	startHAProxy(t, fmt.Sprintf(haproxyConfig, ph, pa, pb, ps), ph)
	bothUp := func() bool { up := upServers(ps); return up["a"] && up["b"] }
	require.Eventually(t, bothUp, 10*time.Second, 50*time.Millisecond, "haproxy sees both replicas")

	client := mcp.NewClient(&mcp.Implementation{Name: "minipy-haproxy-test", Version: "0"}, nil)
	cs, err := client.Connect(context.Background(), &mcp.StreamableClientTransport{
		Endpoint: fmt.Sprintf("http://127.0.0.1:%d/mcp", ph)}, legacy)
	require.NoError(t, err)
	defer cs.Close()
	text, isError := runText(t, cs, map[string]any{"code": "n = 1\ndef bump():\n    global n\n    n += 1\n    return n\n" +
		"open('log.txt', 'w').write('start\\n')\nn"})
	require.False(t, isError, text)
	// A client of the sessionless revision, with a handle.
	modern, err := mcp.NewClient(&mcp.Implementation{Name: "minipy-haproxy-test", Version: "0"}, nil).Connect(
		context.Background(), &mcp.StreamableClientTransport{Endpoint: fmt.Sprintf("http://127.0.0.1:%d/mcp", ph)}, nil)
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
	}{{"a", &a, pa}, {"b", &b, pb}} {
		(*restart.proc).stop(t) // drains: saves the session if it was there
		*restart.proc = replica(restart.port)
		require.Eventually(t, bothUp, 10*time.Second, 50*time.Millisecond, "haproxy sees %s again", restart.name)
		text, isError = runText(t, cs, map[string]any{"code": fmt.Sprintf(
			"open('log.txt', 'a').write('after %s\\n')\nbump(), open('log.txt').read()", restart.name)})
		require.False(t, isError, "after restarting %s: %s\nA:\n%s\nB:\n%s", restart.name, text, a.log, b.log)
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
