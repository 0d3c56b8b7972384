// Package redistest starts a real redis-server for tests (apt's redis-server, which `make
// deps` installs) on a free port of loopback, appending every write to a file of its own
// (fsync always) so that a restart keeps what was written; it is killed when the test ends.
package redistest

import (
	"context"
	"net"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// Server is a redis-server of a test's.
type Server struct {
	t    testing.TB
	path string
	dir  string
	port int
	cmd  *exec.Cmd
}

// Start starts one, stopped when t ends.
func Start(t testing.TB) *Server {
	t.Helper()
	path, err := exec.LookPath("redis-server")
	require.NoError(t, err, "redis-server is needed: make deps installs it (apt's redis-server)")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	r := &Server{t: t, path: path, dir: t.TempDir(), port: port}
	r.Start()
	t.Cleanup(r.Stop)
	return r
}

// Start starts it again after Stop, on the same port and with the same data.
func (r *Server) Start() {
	r.t.Helper()
	r.cmd = exec.Command(r.path, "--port", strconv.Itoa(r.port), "--bind", "127.0.0.1", "--dir", r.dir,
		"--appendonly", "yes", "--appendfsync", "always", "--save", "", "--daemonize", "no")
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // (nothing outlives the test)
	require.NoError(r.t, r.cmd.Start())
	c := redis.NewClient(&redis.Options{Addr: r.Addr()})
	defer c.Close()
	require.Eventually(r.t, func() bool { return c.Ping(context.Background()).Err() == nil }, 20*time.Second,
		20*time.Millisecond, "redis-server did not answer")
}

// Addr is its host:port; URL its redis:// URL (database 0).
func (r *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(r.port) }
func (r *Server) URL() string  { return "redis://" + r.Addr() + "/0" }

// Client is a client of it, closed when the test ends.
func (r *Server) Client() *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: r.Addr()})
	r.t.Cleanup(func() { c.Close() })
	return c
}

// Stop stops it (SIGTERM: it finishes its writes), if it runs.
func (r *Server) Stop() {
	if r.cmd == nil || r.cmd.Process == nil {
		return
	}
	r.cmd.Process.Signal(syscall.SIGTERM) //nolint:errcheck // may have exited
	done := make(chan struct{})
	go func() { r.cmd.Wait(); close(done) }() //nolint:errcheck // stopped
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		r.cmd.Process.Kill() //nolint:errcheck // stuck
		<-done
	}
	r.cmd = nil
}

// Restart stops it and starts it again.
func (r *Server) Restart() {
	r.Stop()
	r.Start()
}
