package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os/exec"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/minipy-go/minipy"
)

// The limits of -backend isolated's workers: on by default, each set by its flag, all
// lifted by -limits none; the startup log says which are in force.

// workerLimitsCode prints the worker's rlimits as the kernel shows them, {name: soft}, and
// the CPU time it has used.
const workerLimitsCode = `import json, resource
ru = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"used": ru.ru_utime + ru.ru_stime, **{l[:26].strip(): l[26:].split()[0]
    for l in open("/proc/self/limits").read().splitlines()[1:]}}))`

// sessionLimits runs workerLimitsCode in a session of s.
func sessionLimits(t *testing.T, s *serverProc) map[string]any {
	t.Helper()
	text, isError := run(t, s.connect(t, ""), map[string]any{"code": workerLimitsCode})
	require.False(t, isError, text)
	var got map[string]any
	require.NoError(t, json.Unmarshal([]byte(text[strings.Index(text, "{"):strings.LastIndex(text, "}")+1]), &got), text)
	return got
}

var limitsLine = regexp.MustCompile(`minipy-mcp: limits of each worker: (.*)`)

// loggedLimits is the startup log's limits line of s (after "limits of each worker: ").
func loggedLimits(t *testing.T, s *serverProc) string {
	t.Helper()
	m := limitsLine.FindStringSubmatch(s.log.String())
	require.NotNil(t, m, "no limits line in the log:\n%s", s.log)
	require.Len(t, limitsLine.FindAllString(s.log.String(), -1), 1, "one line")
	return m[1]
}

// The default: memory, processes, CPU per run and open files bounded, said in one line of
// the log, and in force in a session's worker, where data-science code still works.
func TestServeDefaultLimits(t *testing.T) {
	s := startServer(t, "-backend", "isolated")
	memory := defaultMemoryLimit(runtime.NumCPU())
	assert.Equal(t, fmt.Sprintf("memory %s (-memory-limit), processes and threads %d (-processes), CPU 1m0s per run "+
		"(-cpu-limit), open files 1024 (-open-files)", byteText(memory), minipy.DefaultProcesses), loggedLimits(t, s))
	got := sessionLimits(t, s)
	assert.Equal(t, strconv.FormatInt(memory, 10), got["Max address space"])
	assert.Equal(t, strconv.Itoa(minipy.DefaultProcesses), got["Max processes"])
	assert.Equal(t, "1024", got["Max open files"])
	cpu, err := strconv.Atoi(got["Max cpu time"].(string))
	require.NoError(t, err)
	assert.InDelta(t, got["used"].(float64)+60, float64(cpu), 1.5, "60 s more than the worker has used")
	// -max-sessions's default counts what a session holds (256 MiB and its working
	// directory) against the memory budget, not the address space the default allows it;
	// each session gets its share of the budget.
	budget := minipy.DefaultMemoryBudget()
	sessions := defaultMaxSessions(budget, sessionMemory+defaultWorkSize)
	assert.Contains(t, s.log.String(), fmt.Sprintf("sessions: at most %d (-max-sessions)", sessions))
	share := budget / int64(sessions) >> 20 << 20
	assert.Contains(t, s.log.String(), fmt.Sprintf("memory: all sessions %s (-memory-budget), each session %s "+
		"(-session-memory)", byteText(budget), byteText(share)))

	cs := s.connect(t, "")
	if text, _ := run(t, cs, map[string]any{"code": `import importlib.util
all(importlib.util.find_spec(m) for m in ("numpy", "pandas", "matplotlib"))`}); text != "[value]\nTrue\n" {
		t.Skipf("numpy, pandas or matplotlib is not installed for the workers' Python: %s", text)
	}
	text, isError := run(t, cs, map[string]any{"code": `import numpy as np, pandas as pd
import io, matplotlib.pyplot as plt
a = np.random.rand(600, 600)
df = pd.DataFrame({"x": np.arange(200_000) % 10, "y": np.random.rand(200_000)})
plt.plot(df.groupby("x").y.mean())
plt.savefig(io.BytesIO(), format="png")
plt.close("all")
float((a @ a).sum()) > 0`})
	assert.False(t, isError, text)
	assert.Contains(t, text, "[value]\nTrue\n", "numpy with its threads, pandas and a figure work under the defaults")
}

// -limits none lifts every limit, the memory budget too, and says so; a limit's own flag
// still sets it.
func TestServeLimitsNone(t *testing.T) {
	s := startServer(t, "-backend", "isolated", "-limits", "none")
	assert.Equal(t, "memory none (-memory-limit), processes and threads none (-processes), CPU none (-cpu-limit), "+
		"open files none (-open-files)", loggedLimits(t, s))
	got := sessionLimits(t, s)
	assert.Equal(t, "unlimited", got["Max address space"])
	assert.Equal(t, "unlimited", got["Max cpu time"])
	assert.NotEqual(t, strconv.Itoa(minipy.DefaultProcesses), got["Max processes"], "the server's own")
	assert.NotEqual(t, "1024", got["Max open files"])

	s = startServer(t, "-backend", "isolated", "-processes", "40", "-memory-limit", "2147483648", "-limits", "none",
		"-cpu-limit", "5s")
	assert.Equal(t, "memory 2 GiB (-memory-limit), processes and threads 40 (-processes), CPU 5s per run (-cpu-limit), "+
		"open files none (-open-files)", loggedLimits(t, s))
	got = sessionLimits(t, s)
	assert.Equal(t, "2147483648", got["Max address space"])
	assert.Equal(t, "40", got["Max processes"])
	assert.NotEqual(t, "unlimited", got["Max cpu time"])
	assert.Contains(t, s.log.String(), fmt.Sprintf("sessions: at most %d (-max-sessions)",
		defaultMaxSessions(0, sessionMemory+defaultWorkSize)))
	assert.Contains(t, s.log.String(), "memory: all sessions none (-memory-budget), each session none (-session-memory)")
}

// Each flag overrides its default; 0 lifts that one limit; a longer -timeout raises the
// CPU time's default with it; bad values stop the server with the reason.
func TestLimitFlags(t *testing.T) {
	resolve := func(args ...string) (workerLimits, error) {
		fs := flag.NewFlagSet("minipy-mcp", flag.ContinueOnError)
		var f limitFlags
		f.register(fs)
		timeout := fs.Duration("timeout", 0, "")
		require.NoError(t, fs.Parse(args))
		return f.resolve(fs, *timeout)
	}
	defaults := workerLimits{memory: defaultMemoryLimit(runtime.NumCPU()), processes: minipy.DefaultProcesses,
		cpu: time.Minute, openFiles: 1024}
	for _, c := range []struct {
		args []string
		want workerLimits
	}{
		{nil, defaults},
		{[]string{"-limits", "default"}, defaults},
		{[]string{"-limits", "none"}, workerLimits{}},
		{[]string{"-processes", "0"}, workerLimits{memory: defaults.memory, cpu: time.Minute, openFiles: 1024}},
		{[]string{"-memory-limit", "1073741824", "-open-files", "64"},
			workerLimits{memory: 1 << 30, processes: minipy.DefaultProcesses, cpu: time.Minute, openFiles: 64}},
		{[]string{"-open-files", "100", "-limits", "none"}, workerLimits{openFiles: 100}},
		{[]string{"-timeout", "5m"}, workerLimits{memory: defaults.memory, processes: minipy.DefaultProcesses,
			cpu: 5 * time.Minute, openFiles: 1024}},
		{[]string{"-timeout", "5m", "-cpu-limit", "10s"}, workerLimits{memory: defaults.memory,
			processes: minipy.DefaultProcesses, cpu: 10 * time.Second, openFiles: 1024}},
	} {
		got, err := resolve(c.args...)
		require.NoError(t, err, "%q", c.args)
		assert.Equal(t, c.want, got, "%q", c.args)
	}
	for _, args := range [][]string{{"-limits", "off"}, {"-processes", "-1"}, {"-cpu-limit", "-1s"}, {"-memory-limit", "-5"}} {
		_, err := resolve(args...)
		assert.ErrorIs(t, err, errLimits, "%q", args)
	}
	assert.Equal(t, int64(4<<30+2*256<<20), defaultMemoryLimit(2))
	assert.Equal(t, "4608 MiB", byteText(defaultMemoryLimit(2)))

	out, err := exec.Command(buildServer(t), "-http", "127.0.0.1:0", "-backend", "isolated", "-limits", "off").CombinedOutput()
	require.Error(t, err)
	assert.Contains(t, string(out), `-limits "off": give default or none`)
}
