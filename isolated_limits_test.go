package minipy_test

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/minipy-go/minipy"
)

// The isolated engine's default limits (issue 34, finding 7): the zero IsolatedConfig caps
// each sandbox's processes at DefaultProcesses, so one fork bomb cannot take the machine's
// pids; Unlimited asks for no limit by name.

// limitsCode reads the process's rlimits, as the kernel shows them: {name: [soft, hard]}.
const limitsCode = `{l[:26].strip(): l[26:].split()[:2] for l in open("/proc/self/limits").read().splitlines()[1:]}`

// parseLimits reads a /proc/PID/limits file's text as limitsCode does.
func parseLimits(text string) map[string][2]string {
	out := map[string][2]string{}
	for _, line := range strings.Split(text, "\n")[1:] {
		if len(line) < 26 {
			continue
		}
		if f := strings.Fields(line[26:]); len(f) >= 2 {
			out[strings.TrimSpace(line[:26])] = [2]string{f[0], f[1]}
		}
	}
	return out
}

// workerLimits runs limitsCode in e and returns its value.
func workerLimits(t *testing.T, e *minipy.Isolated) map[string][2]string {
	t.Helper()
	r, err := e.Minipy(limitsCode, nil)
	require.NoError(t, err)
	out := map[string][2]string{}
	for k, v := range r.Value.(map[string]any) {
		pair := v.([]any)
		out[k] = [2]string{pair[0].(string), pair[1].(string)}
	}
	return out
}

// hostLimits are this test process's rlimits, which a worker that sets none inherits.
func hostLimits(t *testing.T) map[string][2]string {
	t.Helper()
	text, err := os.ReadFile("/proc/self/limits")
	require.NoError(t, err)
	return parseLimits(string(text))
}

// limitPair is a limit of n, soft and hard, as /proc/PID/limits shows it.
func limitPair(n int) [2]string {
	return [2]string{strconv.Itoa(n), strconv.Itoa(n)}
}

// The zero config's sandboxed workers have RLIMIT_NPROC DefaultProcesses, forked from the
// template or not; Processes: Unlimited leaves the host's own. Unsandboxed and Command
// workers get no default: RLIMIT_NPROC counts the processes of the host user (or the far
// side's) there, not the worker's own.
func TestIsolatedDefaultProcesses(t *testing.T) {
	host := hostLimits(t)["Max processes"]
	for _, mode := range engineModes {
		t.Run(mode.name, func(t *testing.T) {
			e := newIsolated(t, minipy.IsolatedConfig{NoTemplate: mode.noTemplate})
			assert.Equal(t, limitPair(minipy.DefaultProcesses), workerLimits(t, e)["Max processes"])
			e = newIsolated(t, minipy.IsolatedConfig{NoTemplate: mode.noTemplate, Processes: minipy.Unlimited})
			assert.Equal(t, host, workerLimits(t, e)["Max processes"], "Unlimited: the host's own")
			e = newIsolated(t, minipy.IsolatedConfig{NoTemplate: mode.noTemplate, Processes: 40})
			assert.Equal(t, limitPair(40), workerLimits(t, e)["Max processes"])
		})
	}
	t.Run("Unsandboxed", func(t *testing.T) {
		e, err := minipy.NewIsolatedActingUnsandboxed(minipy.IsolatedConfig{AllowUnsandboxed: true})
		require.NoError(t, err)
		defer e.Close()
		assert.Equal(t, host, workerLimits(t, e)["Max processes"], "no default: the count is the host user's")
	})
	t.Run("Command", func(t *testing.T) {
		e := newIsolated(t, minipy.IsolatedConfig{Command: []string{minipy.LinkedPython()}, Network: true})
		assert.Equal(t, host, workerLimits(t, e)["Max processes"], "no default: the other side is the sandbox")
	})
}

// Every limit may be Unlimited by name: the workers then set none, and inherit the host's.
func TestIsolatedUnlimitedByName(t *testing.T) {
	host := hostLimits(t)
	e := newIsolated(t, minipy.IsolatedConfig{MemoryLimit: minipy.Unlimited, CPULimit: minipy.Unlimited,
		FileSizeLimit: minipy.Unlimited, OpenFiles: minipy.Unlimited, Processes: minipy.Unlimited, WorkSize: minipy.Unlimited})
	got := workerLimits(t, e)
	for _, name := range []string{"Max address space", "Max cpu time", "Max file size", "Max processes"} {
		assert.Equal(t, host[name], got[name], name)
	}
	assert.Equal(t, [2]string{"unlimited", "unlimited"}, got["Max address space"])
	r, err := e.Minipy("b = bytearray(1 << 30); len(b)", nil)
	require.NoError(t, err, "no memory limit")
	assert.Equal(t, int64(1<<30), r.Value)
}

// forkBomb forks until the kernel refuses, each child waiting (30 s at most) for the parent
// to close the pipe w; it leaves kids and w for the next run, and returns the count and
// the errno that stopped it.
const forkBomb = `import os, select
r, w = os.pipe()
kids, err = [], None
while len(kids) < 100000:  # the limit stops it long before
    try:
        pid = os.fork()
    except OSError as e:
        err = e.errno
        break
    if pid == 0:
        os.close(w)
        select.select([r], [], [], 30)
        os._exit(0)
    kids.append(pid)
os.close(r)
[len(kids), err]`

// The children a fork bomb left are ended and reaped: closing the pipe wakes them.
const forkBombEnd = `os.close(w)
for p in kids:
    os.waitpid(p, 0)
sum(1 for p in os.listdir("/proc") if p.isdigit())`

// A fork bomb in a zero-config namespace stops at DefaultProcesses by itself (EAGAIN), the
// host can still start processes while its children live, and the engine serves on: the
// namespace's next run ends and reaps them, and a new namespace works.
func TestIsolatedForkBombStaysInCap(t *testing.T) {
	for _, mode := range engineModes {
		t.Run(mode.name, func(t *testing.T) {
			e := newIsolated(t, minipy.IsolatedConfig{NoTemplate: mode.noTemplate})
			ns := e.NewNamespace()
			defer ns.Close()
			r, err := e.Run(t.Context(), forkBomb, &minipy.Options{Globals: ns, Timeout: 2 * time.Minute})
			require.NoError(t, err)
			got := r.Value.([]any)
			forked := int(got[0].(int64))
			assert.Equal(t, int64(syscall.EAGAIN), got[1], "the limit stopped it")
			assert.Less(t, forked, minipy.DefaultProcesses)
			// The sandbox's own processes and threads (guardian, worker, its threads and
			// snapshot) are what the bomb could not take.
			assert.Greater(t, forked, minipy.DefaultProcesses-16)
			require.NoError(t, exec.Command("true").Run(), "the host still starts processes")
			st := e.Stats()
			t.Logf("%d forks before EAGAIN; the engine's processes: %d", forked, st.Processes)
			assert.Less(t, st.Processes, minipy.DefaultProcesses+8, "the engine's processes: the bomb's, its sandbox's, the template and a spare")

			r, err = e.Run(t.Context(), forkBombEnd, &minipy.Options{Globals: ns, Timeout: time.Minute})
			require.NoError(t, err, "the namespace serves its next run")
			assert.Less(t, r.Value, int64(8), "the bomb's children are gone: guardian, worker, snapshot")
			other := e.NewNamespace()
			defer other.Close()
			assert.Equal(t, int64(2), valueIn(t, e, other, "1 + 1"))
			assert.Equal(t, true, valueIn(t, e, ns, "len(kids) > 0"), "the namespace kept its variables")
		})
	}
}

// As an unprivileged host the default holds the same way: each sandbox is a user namespace
// of its own, whose count is its own (the root tests run these again as nobody).
func TestIsolatedDefaultProcessesAsUser(t *testing.T) {
	out := rerunAsNobody(t, "^(TestIsolatedDefaultProcesses|TestIsolatedForkBombStaysInCap|TestIsolatedUnlimitedByName)$")
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "forks before EAGAIN") {
			t.Log("as nobody:", strings.TrimSpace(line))
		}
	}
	assert.Contains(t, out, "--- PASS: TestIsolatedForkBombStaysInCap/NoTemplate")
	assert.Contains(t, out, "--- PASS: TestIsolatedDefaultProcesses/Unsandboxed")
}
