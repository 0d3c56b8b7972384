package pyrt

import (
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The prelude keeps every line of the Python files where it is, so the line numbers of the
// runtime's own frames are those of the files.
func TestPreludeKeepsLineNumbers(t *testing.T) {
	assert.Equal(t, strings.Count(runtimeSource+"\n"+notebookSource+"\n"+prettySource+"\n"+procTreeSource+"\n"+stateSource, "\n"), strings.Count(Source, "\n"))
	assert.True(t, strings.HasPrefix(WorkerSource, withConstants(workerSource)))
	assert.Equal(t, strings.Count(workerSource, "\n"), strings.Count(withConstants(workerSource), "\n"))
	assert.NotContains(t, Source, constantsLine)
}

// The prelude is valid Python that defines what it says, with the values Go uses.
func TestPreludeIsPython(t *testing.T) {
	python, err := exec.LookPath("python3")
	require.NoError(t, err)
	code := prelude() + "\nprint(RUNTIME_FILE, OP_INFO, MAX_DEPTH, F_OUTPUT, OMITTED % (3, 'stdout'), sep='|')"
	out, err := exec.Command(python, "-c", code).CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Equal(t, "<minipy-runtime>|7|100|b'O'|\n[... 3 characters of stdout omitted ...]\n\n", string(out))
}

var updatePrelude = flag.Bool("update-prelude", false, "rewrite tests/prelude.py")

// TestPreludeFile pins tests/prelude.py, the prelude that the Python unit tests load so
// that they run on their own, to prelude(): change a constant, then run
// go test ./internal/pyrt -run TestPreludeFile -update-prelude.
func TestPreludeFile(t *testing.T) {
	want := "# Generated from pyrt.go's prelude(), pinned by TestPreludeFile: the constants the Python\n" +
		"# unit tests load as the runtime would get them (one line, as in the runtime).\n" + prelude() + "\n"
	if *updatePrelude {
		require.NoError(t, os.WriteFile(filepath.Join("tests", "prelude.py"), []byte(want), 0o644))
	}
	got, err := os.ReadFile(filepath.Join("tests", "prelude.py"))
	require.NoError(t, err)
	assert.Equal(t, want, string(got), "tests/prelude.py is stale: run with -update-prelude")
}

// The Python half's pure parts have unit tests of their own (tests/, python3 -m unittest),
// which run here too.
func TestPythonUnitTests(t *testing.T) {
	python, err := exec.LookPath("python3")
	require.NoError(t, err)
	cmd := exec.Command(python, "-W", "error::ResourceWarning", "-m", "unittest", "discover", "-s", "tests")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Contains(t, string(out), "OK")
}
