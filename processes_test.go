package minipy_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"sync/atomic"
	"testing"
	"time"

	"github.com/minipy-go/minipy"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// runner is what the process tests need of an engine.
type runner struct {
	run   func(code string, opts *minipy.Options) (*minipy.Result, error)
	newNS func() *minipy.Namespace
}

var inProcessRunner = runner{
	run: func(code string, opts *minipy.Options) (*minipy.Result, error) {
		return minipy.Run(context.Background(), code, opts)
	},
	newNS: minipy.NewNamespace,
}

func isolatedRunner(e *minipy.Isolated) runner {
	return runner{run: e.Minipy, newNS: e.NewNamespace}
}

var markerSeq atomic.Int64

// sleepMarker is an argument for sleep(1) that no other process has: a number of seconds
// (about 1000) with unique decimals.
func sleepMarker() string {
	return fmt.Sprintf("%d.%d%03d", 1000+os.Getpid()%1000, time.Now().UnixNano()%1000000, markerSeq.Add(1))
}

func requireGoneSoon(t *testing.T, what string, markers ...string) {
	t.Helper()
	for _, m := range markers {
		require.Eventually(t, func() bool {
			pids, _ := markerProcs(t, m)
			return len(pids) == 0
		}, time.Second, 10*time.Millisecond, "%s: the process with %s is still running", what, m)
	}
}

func requireRunning(t *testing.T, what string, markers ...string) {
	t.Helper()
	for _, m := range markers {
		require.Eventually(t, func() bool {
			pids, _ := markerProcs(t, m)
			return len(pids) > 0
		}, 5*time.Second, 10*time.Millisecond, "%s: no process with %s", what, m)
	}
}

// checkStoppedRunKillsItsProcesses: what a timed-out run started and left running is killed
// with it, however it was started; a process of the host survives.
func checkStoppedRunKillsItsProcesses(t *testing.T, r runner, daemons bool) {
	popen, setsid, pipeline, system, forked, host := sleepMarker(), sleepMarker(), sleepMarker(), sleepMarker(),
		sleepMarker(), sleepMarker()
	daemon := "none"
	markers := []string{popen, setsid, pipeline, system, forked}
	if daemons {
		// A double fork leaves no parent to follow: only a worker, which adopts its orphans,
		// can tell that it came from the run.
		daemon = sleepMarker()
		markers = append(markers, daemon)
	}
	hostSleep := exec.Command("sleep", host)
	require.NoError(t, hostSleep.Start())
	t.Cleanup(func() { hostSleep.Process.Kill(); hostSleep.Wait() })

	ns := r.newNS()
	defer ns.Close()
	code := fmt.Sprintf(`import os, subprocess, threading, time
subprocess.Popen(["sleep", %q])
subprocess.Popen(["sleep", %q], start_new_session=True)
subprocess.Popen("sleep %s | cat", shell=True)
threading.Thread(target=os.system, args=("sleep %s",), daemon=True).start()
if os.fork() == 0:
    os.execvp("sleep", ["sleep", %q])
if %q != "none":
    subprocess.Popen("setsid sleep %s &", shell=True).wait()
while True:
    time.sleep(0.01)
`, popen, setsid, pipeline, system, forked, daemon, daemon)
	done := make(chan error, 1)
	go func() {
		_, err := r.run(code, &minipy.Options{Globals: ns, Timeout: 2 * time.Second})
		done <- err
	}()
	requireRunning(t, "while the run goes on", markers...)
	require.ErrorIs(t, <-done, minipy.ErrTimeout)
	requireGoneSoon(t, "after the run was stopped", markers...)
	pids, _ := markerProcs(t, host)
	assert.Len(t, pids, 1, "the host's own child is never touched")
}

// checkFinishedRunKeepsItsProcesses: a run that ends normally may leave a server running;
// it is killed when its namespace is closed.
func checkFinishedRunKeepsItsProcesses(t *testing.T, r runner) {
	server, other := sleepMarker(), sleepMarker()
	ns, keep := r.newNS(), r.newNS()
	defer keep.Close()
	_, err := r.run(fmt.Sprintf(`import subprocess; p = subprocess.Popen(["sleep", %q])`, server),
		&minipy.Options{Globals: ns})
	require.NoError(t, err)
	_, err = r.run(fmt.Sprintf(`import subprocess; q = subprocess.Popen(["sleep", %q])`, other),
		&minipy.Options{Globals: keep})
	require.NoError(t, err)
	time.Sleep(200 * time.Millisecond)
	requireRunning(t, "a finished run's process lives on", server, other)
	r2, err := r.run("p.poll()", &minipy.Options{Globals: ns})
	require.NoError(t, err)
	assert.Nil(t, r2.Value)
	require.NoError(t, ns.Close())
	requireGoneSoon(t, "after its namespace was closed", server)
	requireRunning(t, "another namespace's process is not touched", other)
	require.NoError(t, keep.Close())
	requireGoneSoon(t, "after its namespace was closed", other)
}

func TestStoppedRunKillsItsProcesses(t *testing.T) {
	checkStoppedRunKillsItsProcesses(t, inProcessRunner, false)
}

func TestIsolatedStoppedRunKillsItsProcesses(t *testing.T) {
	checkStoppedRunKillsItsProcesses(t, isolatedRunner(newIsolated(t, minipy.IsolatedConfig{})), true)
	e, err := minipy.NewIsolatedActingUnsandboxed(minipy.IsolatedConfig{AllowUnsandboxed: true})
	require.NoError(t, err)
	defer e.Close()
	checkStoppedRunKillsItsProcesses(t, isolatedRunner(e), true)
}

func TestFinishedRunKeepsItsProcesses(t *testing.T) {
	checkFinishedRunKeepsItsProcesses(t, inProcessRunner)
}

func TestIsolatedFinishedRunKeepsItsProcesses(t *testing.T) {
	checkFinishedRunKeepsItsProcesses(t, isolatedRunner(newIsolated(t, minipy.IsolatedConfig{})))
}

func TestOsSystemIsStoppable(t *testing.T) {
	// os.system waits in C and retries on EINTR; minipy's replacement waits in Python, so
	// the run stops at its deadline in-process too, and the shell is killed with it.
	m := sleepMarker()
	start := time.Now()
	r, err := minipy.Minipy(fmt.Sprintf("import os; os.system('sleep %s')", m), &minipy.Options{Timeout: 200 * time.Millisecond})
	require.ErrorIs(t, err, minipy.ErrTimeout, "%v", r)
	assert.Less(t, time.Since(start), 2*time.Second)
	requireGoneSoon(t, "os.system's shell", m)
	r = run(t, "import os; os.system('exit 3'), os.system('true')", nil)
	assert.Equal(t, []any{int64(3 << 8), int64(0)}, r.Value, "the wait status, as os.system returns it")
}
