package minipy_test

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/minipy-go/minipy/internal/testproc"
)

// TestMain fails the run if a test left a process behind (testproc.Run).
func TestMain(m *testing.M) { os.Exit(testproc.Run(m)) }

// The check itself: a process started with the test's environment is found until it ends.
func TestLeftoversFindsMarkedProcesses(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	require.NoError(t, cmd.Start())
	pid := strconv.Itoa(cmd.Process.Pid) + " "
	found := func() bool {
		for _, p := range testproc.Leftovers() {
			if strings.HasPrefix(p, pid) {
				return true
			}
		}
		return false
	}
	// (Found once it has exec'd: until then its /proc/PID/environ is the environment this
	// process started with, before testproc.Run marked it; a loaded machine can hold a
	// child there for a while.)
	assert.Eventually(t, found, 10*time.Second, 5*time.Millisecond, "a child with the test's environment")
	require.NoError(t, cmd.Process.Kill())
	cmd.Wait() //nolint:errcheck // killed
	assert.False(t, found())
}

// A process is this binary's by a whole marker, "minipy-WHAT-PID-NANOS", in its command
// line (or environment); "minipy-" in one place and "-PID-" in another is a stranger's (a
// go tool naming github.com/minipy-go beside a build id), which the check must never kill.
func TestLeftoversMatchWholeMarkers(t *testing.T) {
	pid := strconv.Itoa(os.Getpid())
	for _, c := range []struct {
		arg  string
		ours bool
	}{
		{"minipy-tree-" + pid + "-1234", true},
		{"minipy-" + pid + "-7", true},
		{"github.com/minipy-go/minipy x-" + pid + "-y", false},
		{"minipy-tree-" + pid + "0-1234", false},
	} {
		cmd := exec.Command("/usr/bin/python3", "-c", "import time; time.sleep(60)", c.arg)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH")} // (not the test's: no MINIPY_TEST_PARENT)
		require.NoError(t, cmd.Start())
		require.Eventually(t, func() bool { // exec'd: the command line is python's
			b, _ := os.ReadFile("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/cmdline")
			return strings.HasPrefix(string(b), "/usr/bin/python3\x00")
		}, 5*time.Second, time.Millisecond)
		found := false
		for _, p := range testproc.Leftovers() {
			found = found || strings.HasPrefix(p, strconv.Itoa(cmd.Process.Pid)+" ")
		}
		assert.Equal(t, c.ours, found, "%q", c.arg)
		require.NoError(t, cmd.Process.Kill())
		cmd.Wait() //nolint:errcheck // killed
	}
}
