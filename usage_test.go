package minipy_test

import (
	"errors"
	"testing"
	"time"

	"github.com/minipy-go/minipy"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A namespace's usage follows what its code does: CPU time as it computes, memory as it
// holds more, its working directory's bytes as it writes; its limits are the engine's. The
// in-process engine has none of its own to count.
func TestNamespaceUsage(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{MemoryLimit: 1 << 30})
	ns := e.NewNamespace()
	defer ns.Close()
	valueIn(t, e, ns, "1")
	before, err := ns.Usage()
	require.NoError(t, err)
	assert.Positive(t, before.Memory)
	assert.Equal(t, int64(1<<30), before.MemoryLimit)
	t.Logf("a new namespace: %+v", before)

	valueIn(t, e, ns, `import time
start = time.process_time()
while time.process_time() - start < 0.3:
    pass
held = bytearray(64 << 20)
open("four.bin", "wb").write(b"x" * (4 << 20))
None`)
	after, err := ns.Usage()
	require.NoError(t, err)
	t.Logf("after 0.3 s of CPU, 64 MiB held, 4 MiB written: %+v", after)
	assert.GreaterOrEqual(t, after.CPU-before.CPU, 250*time.Millisecond, "CPU time (of the worker's process: 0.3 s)")
	assert.GreaterOrEqual(t, after.Memory-before.Memory, int64(48<<20), "memory")
	assert.GreaterOrEqual(t, after.Disk-before.Disk, int64(4<<20), "disk")

	require.NoError(t, ns.Close())
	_, err = ns.Usage()
	assert.ErrorIs(t, err, minipy.ErrNamespaceClosed)
	in := minipy.NewNamespace()
	defer in.Close()
	_, err = in.Usage()
	assert.ErrorIs(t, err, errors.ErrUnsupported)
}
