package minipy_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/minipy-go/minipy"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A worker must not outlive the host's decision, even when the host cannot reach it: the
// guardian kills it when the host's ends of its pipes close, and its deadman timer kills it
// at the deadline (plus grace and slack) when nothing closes.

// procsWith lists the live processes whose command line or initial environment contains
// marker (zombies have neither).
func procsWith(t *testing.T, marker string) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	require.NoError(t, err)
	var pids []int
	for _, ent := range entries {
		pid, err := strconv.Atoi(ent.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		for _, f := range []string{"cmdline", "environ"} {
			if b, err := os.ReadFile(filepath.Join("/proc", ent.Name(), f)); err == nil && strings.Contains(string(b), marker) {
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids
}

func uniqueMarker(what string) string {
	return fmt.Sprintf("minipy-%s-%d-%d", what, os.Getpid(), time.Now().UnixNano())
}

func requireNoProcsWithin(t *testing.T, marker string, d time.Duration, msg string) {
	t.Helper()
	require.Eventually(t, func() bool { return len(procsWith(t, marker)) == 0 }, d, 10*time.Millisecond,
		"%s: still running: %v", msg, procsWith(t, marker))
}

// requireGoneWithin requires that the processes pids are gone (or zombies) within d.
func requireGoneWithin(t *testing.T, pids []any, d time.Duration, msg string) {
	t.Helper()
	alive := func() (live []any) {
		for _, pid := range pids {
			stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
			if s := string(stat); err == nil && !strings.HasPrefix(s[strings.LastIndexByte(s, ')')+1:], " Z") {
				live = append(live, pid)
			}
		}
		return live
	}
	require.Eventually(t, func() bool { return len(alive()) == 0 }, d, 10*time.Millisecond, "%s: %v", msg, alive())
}

func TestIsolatedWorkerDiesWithItsHost(t *testing.T) {
	const key = "MINIPY_TEST_HOST_MARK"
	if mark := os.Getenv(key); mark != "" {
		// The host: a worker stuck in a C loop, then this process is killed from outside.
		e, err := minipy.NewIsolated(minipy.IsolatedConfig{Env: []string{key + "=" + mark}})
		require.NoError(t, err)
		e.Minipy("sum(range(10**13))", &minipy.Options{Timeout: -1}) //nolint:errcheck // never returns
		return
	}
	mark := uniqueMarker("host")
	host := exec.Command(os.Args[0], "-test.run=^"+t.Name()+"$", "-test.count=1")
	// Its engine's directory goes where this test removes it: the killed host cannot.
	host.Env = append(os.Environ(), key+"="+mark, "TMPDIR="+sandboxReadableDir(t))
	require.NoError(t, host.Start())
	defer host.Process.Kill()
	// The killed host cannot remove its engine's cgroup: this test does, once done.
	t.Cleanup(func() { assert.NoError(t, minipy.RemoveCgroupsOf(host.Process.Pid)) })
	require.Eventually(t, func() bool { return len(procsWith(t, mark)) >= 3 }, 10*time.Second, 10*time.Millisecond,
		"the host's worker (guardian and worker) runs")
	time.Sleep(100 * time.Millisecond) // into the C loop
	require.NoError(t, host.Process.Kill())
	host.Wait() //nolint:errcheck // killed
	requireNoProcsWithin(t, mark, time.Second, "a worker outlived its SIGKILLed host")
}

// stuckTransport is a Command that relays the worker's pipes through a detached process
// which, like a transport that never notices the host leaving, keeps the worker's stdin
// open after the host's side closes: only the worker's deadman can end it.
const stuckTransport = `import os, subprocess, sys, threading, signal
mark, boot = sys.argv[1], sys.argv[2:]
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        p = subprocess.Popen([sys.executable] + boot + [mark], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        def up():
            while True:
                b = os.read(0, 65536)
                if not b:
                    return  # the host is gone; the worker's stdin stays open
                os.write(p.stdin.fileno(), b)
        threading.Thread(target=up, daemon=True).start()
        while True:
            b = os.read(p.stdout.fileno(), 65536)
            if not b:
                os._exit(0)
            try:
                os.write(1, b)
            except OSError:
                pass
    os._exit(0)
signal.pause()
`

func TestIsolatedDeadmanKillsAWorkerTheHostCannotReach(t *testing.T) {
	mark := uniqueMarker("deadman")
	e := stuckEngine(t, mark)
	r, err := e.Minipy("import os; os.getpid(), os.getppid()", nil)
	require.NoError(t, err)
	pids := r.Value.([]any) // the worker and its guardian
	_, err = e.Minipy("sum(range(10**13))", &minipy.Options{Timeout: 200 * time.Millisecond})
	require.ErrorIs(t, err, minipy.ErrTimeout)
	require.ErrorIs(t, err, minipy.ErrStateLost)
	requireGoneWithin(t, pids, time.Second, "the worker outlived its deadline")
	// Its replacement, idle, ends once the closed engine has stopped beating.
	require.NoError(t, e.Close())
	requireNoProcsWithin(t, mark, 10*time.Second, "a worker or relay outlived its host's silence")
}

// stuckEngine is an engine whose Command workers run behind stuckTransport (marked mark),
// beaten every 100 ms and ending after a second of silence. Its processes that outlive the
// test are killed.
func stuckEngine(t *testing.T, mark string) *minipy.Isolated {
	e, err := minipy.NewIsolatedBeating(minipy.IsolatedConfig{
		Command: []string{minipy.LinkedPython(), "-c", stuckTransport, mark}, Network: true,
	}, 100*time.Millisecond, time.Second)
	require.NoError(t, err)
	t.Cleanup(func() {
		e.Close()
		for _, pid := range procsWith(t, mark) {
			syscall.Kill(pid, syscall.SIGKILL) //nolint:errcheck // may be gone
		}
	})
	return e
}

// An idle Command worker whose host has stopped speaking ends after a bounded silence,
// though its transport keeps its stdin open; while the host lives, its beats keep an idle
// worker alive, and a run may last longer than the silence.
func TestCommandWorkerEndsWhenItsHostFallsSilent(t *testing.T) {
	mark := uniqueMarker("silence")
	e := stuckEngine(t, mark)
	r, err := e.Minipy("import os; os.getpid(), os.getppid()", nil)
	require.NoError(t, err)
	pids := r.Value.([]any)
	time.Sleep(2500 * time.Millisecond) // idle, beaten
	r, err = e.Minipy("import os, time; time.sleep(1.5); os.getpid()", nil)
	require.NoError(t, err, "the beats kept the idle worker alive, and a run outlasts the silence")
	assert.Equal(t, pids[0], r.Value, "the same worker")
	require.NoError(t, e.Close())
	requireGoneWithin(t, pids, 10*time.Second, "the worker outlived its host's silence")
	requireNoProcsWithin(t, mark, 10*time.Second, "the relay outlived its worker")
}

// sshd starts an OpenSSH server on 127.0.0.1 with throwaway keys and returns the command
// that reaches this machine through it.
func sshd(t *testing.T) []string {
	t.Helper()
	daemon, err := exec.LookPath("sshd")
	if err != nil {
		daemon = "/usr/sbin/sshd"
	}
	if _, err := os.Stat(daemon); err != nil {
		t.Skip("no sshd (Debian's openssh-server, which .ci/deps installs)")
	}
	dir := t.TempDir()
	for _, k := range []string{"host", "client"} {
		out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", filepath.Join(dir, k)).CombinedOutput()
		require.NoError(t, err, string(out))
	}
	pub, err := os.ReadFile(filepath.Join(dir, "client.pub"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "authorized_keys"), pub, 0o600))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	config := fmt.Sprintf("Port %d\nListenAddress 127.0.0.1\nHostKey %s\nAuthorizedKeysFile %s\nPidFile %s\n"+
		"StrictModes no\nUsePAM no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"+
		"PermitRootLogin prohibit-password\n",
		port, filepath.Join(dir, "host"), filepath.Join(dir, "authorized_keys"), filepath.Join(dir, "sshd.pid"))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "sshd_config"), []byte(config), 0o600))
	if os.Geteuid() == 0 {
		require.NoError(t, os.MkdirAll("/run/sshd", 0o755)) // its privilege separation directory
	}
	server := exec.Command(daemon, "-D", "-e", "-f", filepath.Join(dir, "sshd_config"))
	var log strings.Builder
	server.Stderr = &log
	require.NoError(t, server.Start())
	t.Cleanup(func() {
		server.Process.Kill()
		server.Wait()
		if t.Failed() {
			t.Logf("sshd's log:\n%s", log.String())
		}
	})
	require.Eventually(t, func() bool {
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err == nil {
			c.Close()
		}
		return err == nil
	}, 10*time.Second, 20*time.Millisecond, "sshd listens")
	user := os.Getenv("USER")
	if u, err := exec.Command("id", "-un").Output(); err == nil {
		user = strings.TrimSpace(string(u))
	}
	return []string{"ssh", "-i", filepath.Join(dir, "client"), "-p", strconv.Itoa(port), "-o", "BatchMode=yes",
		"-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
		user + "@127.0.0.1"}
}

func TestIsolatedSSHWorkerDiesWithItsRun(t *testing.T) {
	ssh := sshd(t)
	for _, tc := range []struct {
		name string
		stop func() (context.Context, *minipy.Options)
	}{
		{"deadline", func() (context.Context, *minipy.Options) {
			return context.Background(), &minipy.Options{Timeout: 200 * time.Millisecond}
		}},
		{"cancel", func() (context.Context, *minipy.Options) {
			// No deadline, so no deadman: only the guardian, seeing the connection close,
			// can end the remote worker.
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(200*time.Millisecond, cancel)
			return ctx, &minipy.Options{Timeout: -1}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mark := uniqueMarker("ssh")
			// The remote shell runs MARK=... python3: the mark is in the far side's environment.
			cmd := append(append([]string(nil), ssh...), "MINIPY_TEST_MARK="+mark, "python3")
			e := newIsolated(t, minipy.IsolatedConfig{Command: cmd, CommandShell: true, Network: true})
			r, err := e.Minipy("import os; x = 41\nos.getpid(), os.getppid(), os.environ['MINIPY_TEST_MARK']", nil)
			require.NoError(t, err)
			v := r.Value.([]any)
			assert.Equal(t, mark, v[2], "the worker runs behind sshd")
			r, err = e.Minipy("x + 1", nil)
			require.NoError(t, err)
			assert.Equal(t, int64(42), r.Value, "state persists on the far side")
			// Host functions: the far side's code calls back into this process over ssh.
			ns := e.NewNamespace()
			require.NoError(t, ns.Register(addFunction))
			r, err = e.Minipy("add(40, 2)", &minipy.Options{Globals: ns})
			require.NoError(t, err)
			assert.Equal(t, int64(42), r.Value)
			ctx, opts := tc.stop()
			_, err = e.Run(ctx, "sum(range(10**13))", opts)
			require.ErrorIs(t, err, minipy.ErrStateLost)
			requireGoneWithin(t, v[:2], time.Second, "the remote worker and its guardian outlived the host's kill")
			r, err = e.Minipy("1 + 1", nil)
			require.NoError(t, err, "a new remote worker")
			assert.Equal(t, int64(2), r.Value)
		})
	}
}

// A Command worker's beats start once its bootstrap and config are written: a beat written
// first was read as worker.py (NameError: name 'H' is not defined), when the start was
// slower than a beat's interval (a loaded machine).
func TestCommandWorkerBeatsWaitForItsStart(t *testing.T) {
	for i := 0; i < 3; i++ {
		e, err := minipy.NewIsolatedBeating(minipy.IsolatedConfig{Command: []string{minipy.LinkedPython()}, Network: true},
			time.Microsecond, time.Minute)
		require.NoError(t, err)
		r, err := e.Minipy("1 + 1", nil)
		require.NoError(t, err)
		assert.Equal(t, int64(2), r.Value)
		require.NoError(t, e.Close())
	}
}
