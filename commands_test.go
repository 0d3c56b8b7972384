package minipy_test

import (
	"errors"
	"io"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/minipy-go/minipy"
)

// output reads a process's stdout and stderr to their ends, then waits for it.
func output(t *testing.T, p *minipy.Process) (stdout, stderr string, st syscall.WaitStatus) {
	t.Helper()
	errc := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(p.Stderr)
		errc <- b
	}()
	out, err := io.ReadAll(p.Stdout)
	require.NoError(t, err)
	st, err = p.Wait()
	require.NoError(t, err)
	return string(out), string(<-errc), st
}

// A command runs in the namespace's sandbox: its files, its user, its environment, its
// limits; beside a run in progress, and through a rollback.
func TestNamespaceStart(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{OpenFiles: 100})
	ns := e.NewNamespace()
	defer ns.Close()
	valueIn(t, e, ns, `open("made-by-code.txt", "w").write("from the code")`)
	p, err := ns.Start(minipy.Command{Args: []string{"/bin/sh", "-c",
		`cat made-by-code.txt; echo; pwd; id -u; echo "$GREETING"; ulimit -n; ls /proc | grep -c '^[0-9]'; ` +
			`ls /proc/self/fd; echo oops >&2; exit 3`},
		Env: []string{"GREETING=hi"}})
	require.NoError(t, err)
	assert.Positive(t, p.Pid)
	require.NoError(t, p.Stdin.Close())
	stdout, stderr, st := output(t, p)
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	require.Len(t, lines, 10, stdout)
	assert.Equal(t, []string{"from the code", "/work", "1000", "hi", "100"}, lines[:5])
	procs, err := strconv.Atoi(lines[5])
	require.NoError(t, err)
	assert.Less(t, procs, 10, "the sandbox's pid namespace: its guardian, worker, snapshot, this command")
	assert.Equal(t, []string{"0", "1", "2", "3"}, lines[6:], "no descriptor of the guardian's (3: ls's own)")
	assert.Equal(t, "oops\n", stderr)
	assert.Equal(t, 3, st.ExitStatus())

	// Stdin, beside a run in progress, and through the rollback of a crashed worker.
	cat, err := ns.Start(minipy.Command{Args: []string{"cat"}})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		_, err := runIn(t, e, ns, "import time; time.sleep(0.5)")
		done <- err
	}()
	time.Sleep(100 * time.Millisecond)
	_, err = io.WriteString(cat.Stdin, "line one\n")
	require.NoError(t, err)
	require.NoError(t, <-done)
	_, err = runIn(t, e, ns, "import os; os._exit(9)")
	require.Error(t, err, "the worker crashed")
	_, err = io.WriteString(cat.Stdin, "line two\n")
	require.NoError(t, err, "the command outlives the worker's crash")
	require.NoError(t, cat.Stdin.Close())
	stdout, _, st = output(t, cat)
	assert.Equal(t, "line one\nline two\n", stdout)
	assert.Equal(t, 0, st.ExitStatus())
}

// Signal reaches the command's process group; the namespace's Close ends the commands left.
func TestNamespaceStartSignalAndClose(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{})
	ns := e.NewNamespace()
	p, err := ns.Start(minipy.Command{Args: []string{"sh", "-c", "sleep 60 & sleep 60; echo never"}})
	require.NoError(t, err)
	require.NoError(t, p.Signal(syscall.SIGTERM))
	_, _, st := output(t, p)
	assert.True(t, st.Signaled(), "%v", st)
	assert.Equal(t, syscall.SIGTERM, st.Signal())

	left, err := ns.Start(minipy.Command{Args: []string{"sleep", "60"}})
	require.NoError(t, err)
	require.NoError(t, ns.Close())
	_, err = left.Wait()
	assert.True(t, err == nil || errors.Is(err, minipy.ErrCommandLost), "%v", err)
	_, err = ns.Start(minipy.Command{Args: []string{"true"}})
	assert.ErrorIs(t, err, minipy.ErrNamespaceClosed)
}

// A command that does not start says why; namespaces without a sandbox of their own start
// none.
func TestNamespaceStartRefused(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{})
	ns := e.NewNamespace()
	defer ns.Close()
	p, err := ns.Start(minipy.Command{Args: []string{"/no/such/program"}})
	require.NoError(t, err) // (the exec fails in the child: its status says so)
	_, stderr, st := output(t, p)
	assert.Equal(t, 127, st.ExitStatus())
	assert.Contains(t, stderr, "/no/such/program")
	_, err = ns.Start(minipy.Command{})
	assert.Error(t, err)
	_, err = ns.Start(minipy.Command{Args: []string{"a\x00b"}})
	assert.Error(t, err)

	packed := newIsolated(t, minipy.IsolatedConfig{Workers: 1})
	pns := packed.NewNamespace()
	defer pns.Close()
	_, err = pns.Start(minipy.Command{Args: []string{"true"}})
	assert.ErrorIs(t, err, minipy.ErrNoCommands)
	inproc := minipy.NewNamespace()
	defer inproc.Close()
	_, err = inproc.Start(minipy.Command{Args: []string{"true"}})
	assert.ErrorIs(t, err, minipy.ErrNoCommands)
}
