package e2b

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A sandbox's metrics: a sample at once, then one each metricEvery, with its memory, disk
// and CPU as its code uses them, within start and end; another user's sandbox has none to
// give.
func TestMetrics(t *testing.T) {
	s, base := storeServer(t, t.TempDir(), Config{CPUCount: 2, DiskMB: 64})
	code, sb := callAs(t, "ann", "POST", base+"/v2/sandboxes", `{}`)
	require.Equal(t, http.StatusCreated, code)
	id := sb["sandboxID"].(string)
	run(t, base, sb, "1") // (its worker started)
	var list []sandboxMetric
	code, _ = getAs(t, "ann", base+"/sandboxes/"+id+"/metrics", &list)
	require.Equal(t, http.StatusOK, code)
	require.Len(t, list, 1, "sampled at the first request")
	first := list[0]
	assert.Equal(t, 2, first.CPUCount)
	assert.Positive(t, first.MemUsed)
	assert.Equal(t, int64(64<<20), first.DiskTotal)

	run(t, base, sb, "import time, os\nheld = bytearray(32 << 20)\nopen('f.bin', 'wb').write(os.urandom(8 << 20))\n"+
		"start = time.process_time()\nwhile time.process_time() - start < 0.5:\n    pass")
	for time.Now().Unix() <= first.TimestampUnix { // (end is in whole seconds: the second sample in a later one)
		time.Sleep(10 * time.Millisecond)
	}
	s.sample(s.lookup(id))
	code, _ = getAs(t, "ann", base+"/sandboxes/"+id+"/metrics", &list)
	require.Equal(t, http.StatusOK, code)
	require.Len(t, list, 2)
	last := list[1]
	assert.GreaterOrEqual(t, last.MemUsed-first.MemUsed, int64(24<<20), "memory")
	assert.GreaterOrEqual(t, last.DiskUsed-first.DiskUsed, int64(8<<20), "disk")
	assert.Positive(t, last.CPUUsedPct, "CPU")
	assert.False(t, last.Timestamp.Before(first.Timestamp))

	future := time.Now().Add(time.Hour).Unix()
	getAs(t, "ann", fmt.Sprintf("%s/sandboxes/%s/metrics?start=%d", base, id, future), &list)
	assert.Empty(t, list, "none after start")
	getAs(t, "ann", fmt.Sprintf("%s/sandboxes/%s/metrics?end=%d", base, id, first.TimestampUnix), &list)
	assert.Len(t, list, 1, "the first only, up to end")
	code, _ = getAs(t, "bob", base+"/sandboxes/"+id+"/metrics", &list)
	assert.Equal(t, http.StatusNotFound, code)
}
