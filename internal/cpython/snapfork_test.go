//go:build cgo

package cpython

import (
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/minipy-go/minipy/internal/pyrt"
)

// worker.py's _FT_* are mp_snap_fork's table slots (MP_FT_*), name for name.
func TestSnapForkTableMatchesTheWorker(t *testing.T) {
	py := map[string]int{}
	assign := regexp.MustCompile(`(?m)^(_FT_\w+(?:, _FT_\w+)*) = ([0-9, ]+)$`)
	for _, m := range assign.FindAllStringSubmatch(pyrt.WorkerSource, -1) {
		names, values := strings.Split(m[1], ", "), strings.Split(m[2], ", ")
		require.Len(t, values, len(names), m[0])
		for i, name := range names {
			v, err := strconv.Atoi(values[i])
			require.NoError(t, err)
			py[strings.TrimPrefix(name, "_FT_")] = v
		}
	}
	assert.Equal(t, snapTable(), py)
}

// The code is its section's bytes, whole: it starts where mp_snap_fork does.
func TestSnapForkCode(t *testing.T) {
	code := SnapForkCode()
	require.NotEmpty(t, code)
	assert.Less(t, len(code), 4096, "one page")
	assert.Equal(t, code, SnapForkCode(), "a copy each time")
	section, fn := snapCodeStart()
	assert.Equal(t, section, fn)
}
