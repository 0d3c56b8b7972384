package minipy_test

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/minipy-go/minipy"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// oomHelperEnv makes the test binary the host of TestIsolatedOOMWithoutCgroup's engine.
const oomHelperEnv = "MINIPY_OOM_HELPER"

// Issue 47: without a cgroup per sandbox (NoCgroup, or a host that has none), memory that
// one sandbox fills costs that sandbox only. The host runs in a memory cgroup of its own (a
// process of this test binary, as a machine whose memory is short): when a namespace fills
// it, the kernel's OOM killer picks that namespace's worker (oom_score_adj 1000, the largest
// there), whose snapshot takes over; the other namespace, the template, the guardians and
// the host go on.
func TestIsolatedOOMWithoutCgroup(t *testing.T) {
	if os.Getenv(oomHelperEnv) != "" {
		oomHelper(t)
		return
	}
	if os.Geteuid() != 0 {
		t.Skip("a memory cgroup for the host needs root")
	}
	dir, limit := oomCgroup(t, 768<<20)
	cmd := exec.Command(os.Args[0], "-test.run", "^TestIsolatedOOMWithoutCgroup$", "-test.count", "1", "-test.v")
	cmd.Env = append(os.Environ(), oomHelperEnv+"=1")
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	defer cmd.Process.Kill() //nolint:errcheck // (it has exited unless the test failed)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0))
	_, err = stdin.Write([]byte("go\n")) // (in the cgroup now, with all it will start)
	require.NoError(t, err)
	err = cmd.Wait()
	require.NoError(t, err, "the host, in a cgroup of %d MiB:\n%s", limit>>20, out.String())
	assert.Contains(t, out.String(), "--- PASS: TestIsolatedOOMWithoutCgroup", out.String())
	t.Log(out.String())
}

// oomHelper is the host in the memory cgroup: it waits for the parent's go, then fills memory
// in one namespace of an engine without cgroups.
func oomHelper(t *testing.T) {
	line, err := bufio.NewReader(os.Stdin).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "go\n", line)
	e := newIsolated(t, minipy.IsolatedConfig{NoCgroup: true, MemoryLimit: 2 << 30})
	require.Equal(t, minipy.LimitsRlimits, e.Stats().Limits)
	a, b := e.NewNamespace(), e.NewNamespace()
	defer a.Close()
	defer b.Close()
	valueIn(t, e, a, "x = 1")
	valueIn(t, e, b, "y = 2")
	for ns, name := range map[*minipy.Namespace]string{a: "x", b: "y"} {
		_, err := ns.Get(name) // (answered once the run's snapshot is made)
		require.NoError(t, err)
	}
	start := time.Now()
	_, err = runIn(t, e, b, "chunks = []\nfor _ in range(24):\n    chunks.append(b'x' * (64 << 20))")
	var lost *minipy.WorkerLostError
	require.ErrorAs(t, err, &lost, "1.5 GiB in a cgroup of 768 MiB")
	t.Logf("after %v: %v", time.Since(start).Round(time.Millisecond), err)
	assert.True(t, lost.RolledBack, "the OOM killer picked the worker, and its snapshot took over: %v", err)
	assert.Equal(t, int64(2), valueIn(t, e, b, "y"), "b as it was before the run")
	assert.Equal(t, int64(2), valueIn(t, e, a, "x + 1"), "a never noticed")
	assert.Zero(t, e.Stats().Deaths, "no process died between runs")
	assert.Equal(t, int64(3), valueIn(t, e, e.NewNamespace(), "3"), "the engine serves on")
}

// oomCgroup makes a memory cgroup of limit bytes (swap off) for the test's helper host, on
// cgroup v2 or v1, removed when the test ends; it returns its directory.
func oomCgroup(t *testing.T, limit int64) (string, int64) {
	name := fmt.Sprintf("minipy-oom-test-%d", os.Getpid())
	files := map[string]string{}
	var dir string
	if b, err := os.ReadFile("/sys/fs/cgroup/cgroup.controllers"); err == nil && strings.Contains(string(b), "memory") {
		// The root's child: the root may hold processes and hand controllers down.
		dir = filepath.Join("/sys/fs/cgroup", name)
		os.WriteFile("/sys/fs/cgroup/cgroup.subtree_control", []byte("+memory"), 0) //nolint:errcheck // may be on already
		files["memory.max"], files["memory.swap.max"] = strconv.FormatInt(limit, 10), "0"
	} else if _, err := os.Stat("/sys/fs/cgroup/memory/memory.limit_in_bytes"); err == nil {
		dir = filepath.Join("/sys/fs/cgroup/memory", name)
		files["memory.limit_in_bytes"] = strconv.FormatInt(limit, 10)
	} else {
		t.Skip("no memory cgroup controller here")
	}
	require.NoError(t, os.Mkdir(dir, 0o755))
	t.Cleanup(func() {
		require.Eventually(t, func() bool { return os.Remove(dir) == nil || errors.Is(os.Remove(dir), os.ErrNotExist) },
			30*time.Second, 50*time.Millisecond, "the test's cgroup empties")
	})
	for f, v := range files {
		require.NoError(t, os.WriteFile(filepath.Join(dir, f), []byte(v), 0), f)
	}
	if _, err := os.Stat(filepath.Join(dir, "memory.memsw.limit_in_bytes")); err == nil {
		require.NoError(t, os.WriteFile(filepath.Join(dir, "memory.memsw.limit_in_bytes"), []byte(files["memory.limit_in_bytes"]), 0))
	}
	return dir, limit
}
