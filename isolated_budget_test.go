package minipy_test

import (
	"fmt"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"

	"github.com/minipy-go/minipy"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// touch is code that writes n MiB into memory it keeps, a page at a time, so that every
// page is resident (bytearray(n) alone could leave calloc's pages untouched).
func touch(mib int) string {
	return fmt.Sprintf(`held = []
for _ in range(%d):
    b = bytearray(1 << 20)
    for i in range(0, 1 << 20, 4096):
        b[i] = 1
    held.append(b)
x = "not rolled back"`, mib)
}

// memoryLimitFile is the engine's or a sandbox's memory limit, as its cgroup says it.
func memoryLimitFile(t *testing.T, e *minipy.Isolated, dir string) string {
	t.Helper()
	if e.Stats().Limits == minipy.LimitsCgroupV2 {
		return readTrim(t, filepath.Join(dir, "memory.max"))
	}
	return readTrim(t, filepath.Join(dir, "memory.limit_in_bytes"))
}

// The finding (13): minipy-mcp with no flags let a session touch 3 GiB, each session's
// only bound an address space of 4.5 GiB, 47 sessions of them: nothing bounded them all.
// The engine's cgroup has a budget now, which all its sandboxes share: with no per-sandbox
// limit at all, a namespace that touches more than the budget is the one that pays (its
// run ends at the memory limit, rolled back), and another namespace keeps its variables.
func TestMemoryBudget(t *testing.T) {
	const budget = 384 << 20
	e := newIsolated(t, minipy.IsolatedConfig{MemoryBudget: budget, ResidentLimit: minipy.Unlimited,
		MemoryLimit: minipy.Unlimited})
	needCgroup(t, e)
	st := e.Stats()
	assert.Equal(t, int64(budget), st.MemoryBudget)
	engine := minipy.EngineCgroupDirs(e)
	require.NotEmpty(t, engine)
	assert.Equal(t, strconv.Itoa(budget), memoryLimitFile(t, e, engine[0]), "the engine's cgroup")

	ns, other := e.NewNamespace(), e.NewNamespace()
	defer ns.Close()
	defer other.Close()
	_, err := runIn(t, e, ns, "x = 1")
	require.NoError(t, err)
	_, err = runIn(t, e, other, touch(32)+"\ny = 2")
	require.NoError(t, err)
	assert.NotEqual(t, strconv.Itoa(budget), memoryLimitFile(t, e, minipy.CgroupDirs(ns)[0]),
		"no limit of its own: the budget alone bounds it")

	_, err = runIn(t, e, ns, touch(768))
	requireMemoryLimit(t, err)
	assert.Equal(t, int64(1), valueIn(t, e, ns, "x"), "as before the run")
	assert.Equal(t, int64(2), valueIn(t, e, other, "y"), "the other namespace keeps its variables")
	assert.Equal(t, int64(3), valueIn(t, e, e.NewNamespace(), "1 + 2"), "the engine serves on")
}

// ResidentLimit caps each sandbox's cgroup apart from MemoryLimit's address space: a run
// that touches more than it ends there, where an address space of its size would not let
// numpy's thread pools start. 0 takes MemoryLimit (TestEngineCloseRemovesItsCgroup).
func TestResidentLimit(t *testing.T) {
	const limit = 256 << 20
	e := newIsolated(t, minipy.IsolatedConfig{ResidentLimit: limit, MemoryLimit: minipy.Unlimited})
	needCgroup(t, e)
	ns := e.NewNamespace()
	defer ns.Close()
	// (RLIM_INFINITY is -1 up to 3.14, 2**64-1 from 3.15.)
	_, err := runIn(t, e, ns, "import resource\nx = resource.getrlimit(resource.RLIMIT_AS)[0] == resource.RLIM_INFINITY")
	require.NoError(t, err)
	assert.Equal(t, true, valueIn(t, e, ns, "x"), "no address space limit")
	dir := minipy.CgroupDirs(ns)[0]
	assert.Equal(t, strconv.Itoa(limit), memoryLimitFile(t, e, filepath.Join(dir, "w")), "the code's processes")
	assert.Equal(t, strconv.Itoa(limit+minipy.TakeOverReserve), memoryLimitFile(t, e, dir), "with the guardian's")
	_, err = runIn(t, e, ns, touch(512))
	requireMemoryLimit(t, err)
	assert.Equal(t, true, valueIn(t, e, ns, "x"), "as before the run")
}

// By default the budget is DefaultMemoryBudget: three quarters of what the host may use.
func TestMemoryBudgetDefault(t *testing.T) {
	def := minipy.DefaultMemoryBudget()
	require.Positive(t, def)
	e := newIsolated(t, minipy.IsolatedConfig{})
	needCgroup(t, e)
	assert.Equal(t, def, e.Stats().MemoryBudget)
	assert.Equal(t, strconv.FormatInt(def, 10), memoryLimitFile(t, e, minipy.EngineCgroupDirs(e)[0]))
	none := newIsolated(t, minipy.IsolatedConfig{MemoryBudget: minipy.Unlimited})
	assert.Zero(t, none.Stats().MemoryBudget, "Unlimited: none")
	off := newIsolated(t, minipy.IsolatedConfig{NoCgroup: true})
	assert.Zero(t, off.Stats().MemoryBudget, "nothing enforces one without a cgroup")
	runtime.KeepAlive(e)
}
