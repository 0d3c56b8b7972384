package minipy_test

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

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
	assert.True(t, found(), "a child with the test's environment")
	require.NoError(t, cmd.Process.Kill())
	cmd.Wait() //nolint:errcheck // killed
	assert.False(t, found())
}
