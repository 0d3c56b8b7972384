package minipy_test

import (
	"bufio"
	"os"
	"strings"
	"testing"

	"github.com/minipy-go/minipy"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCompatTarget names the libpython this test binary loaded and the Python both engines
// run, and, when scripts/compat sets MINIPY_COMPAT_TARGET (3.13, 3.13t, 3.14...), checks
// them against it: a compat run that quietly linked the system's Python fails here.
func TestCompatTarget(t *testing.T) {
	var lib string
	maps, err := os.Open("/proc/self/maps")
	require.NoError(t, err)
	defer maps.Close()
	lines := bufio.NewScanner(maps)
	for lines.Scan() {
		if f := strings.Fields(lines.Text()); len(f) >= 6 && strings.Contains(f[5], "libpython3") {
			lib = f[5]
			break
		}
	}
	code := `import sys, sysconfig; sys.version.split()[0] + ("t" if sysconfig.get_config_var("Py_GIL_DISABLED") else "")`
	in, err := minipy.Minipy(code, nil)
	require.NoError(t, err)
	iso, err := newIsolated(t, minipy.IsolatedConfig{}).Minipy(code, nil)
	require.NoError(t, err)
	t.Logf("libpython loaded: %s; in-process Python %v, the isolated engine's workers %v (%s)",
		lib, in.Value, iso.Value, minipy.LinkedPython())
	target := os.Getenv("MINIPY_COMPAT_TARGET")
	if target == "" {
		return
	}
	major, ft := strings.CutSuffix(target, "t")
	for what, v := range map[string]any{"in-process": in.Value, "isolated": iso.Value} {
		s, _ := v.(string)
		version, isFT := strings.CutSuffix(s, "t")
		assert.True(t, strings.HasPrefix(version, major+"."), "%s runs Python %s, not the target %s", what, s, target)
		assert.Equal(t, ft, isFT, "%s: free-threaded", what)
	}
	assert.Contains(t, lib, "libpython"+major, "the loaded libpython")
}
