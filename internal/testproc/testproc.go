// Package testproc checks that a package's tests leave no process behind: a test's
// TestMain calls Run.
package testproc

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/minipy-go/minipy/internal/worker"
)

// Key marks the processes this test binary starts with its environment (Command
// workers, their transports, in-process code's children, test binaries run as another
// user): their environment holds Key=PID of the test binary.
const Key = "MINIPY_TEST_PARENT"

// Run runs the tests of m and returns their exit code, failing them if they left a process
// behind: every process marked as this binary's (Key in its environment, or a marker
// "minipy-WHAT-PID-..." naming this binary's pid in its command line or environment) must be
// gone within ten seconds. Those that are not are named and killed, and the run fails.
// (Sandboxed workers start with a minimal environment; they die with their pid namespace,
// which the engine's tests check.) An engine's cgroup left behind (worker.LeftCgroups) fails
// it too, and is removed.
func Run(m *testing.M) int {
	os.Setenv(Key, strconv.Itoa(os.Getpid()))
	code := m.Run()
	var left []string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if left = Leftovers(); len(left) == 0 || time.Now().After(deadline) {
			break
		}
	}
	if len(left) > 0 {
		fmt.Fprintf(os.Stderr, "FAIL: the tests left %d processes behind (killed now):\n  %s\n", len(left),
			strings.Join(left, "\n  "))
		for _, p := range left {
			pid, _ := strconv.Atoi(strings.Fields(p)[0])
			syscall.Kill(pid, syscall.SIGKILL) //nolint:errcheck // may be gone
		}
		code = max(code, 1)
	}
	if dirs := worker.LeftCgroups(os.Getpid()); len(dirs) > 0 {
		fmt.Fprintf(os.Stderr, "FAIL: the tests left %d engine cgroups behind (removed now):\n  %s\n", len(dirs),
			strings.Join(dirs, "\n  "))
		for _, d := range dirs {
			if err := worker.RemoveCgroup(d); err != nil {
				fmt.Fprintln(os.Stderr, err)
			}
		}
		code = max(code, 1)
	}
	return code
}

// Leftovers lists the live processes (not zombies) marked as this test binary's: "PID
// command line".
func Leftovers() []string {
	self := os.Getpid()
	env := []byte(Key + "=" + strconv.Itoa(self) + "\x00")
	mark := []byte(fmt.Sprintf("-%d-", self)) // in "minipy-WHAT-PID-NANOS" (the tests' markers)
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []string
	for _, ent := range entries {
		pid, err := strconv.Atoi(ent.Name())
		if err != nil || pid == self {
			continue
		}
		dir := "/proc/" + ent.Name()
		stat, err := os.ReadFile(dir + "/stat")
		if s := string(stat); err != nil || strings.HasPrefix(s[strings.LastIndexByte(s, ')')+1:], " Z") {
			continue
		}
		cmdline, _ := os.ReadFile(dir + "/cmdline")
		environ, _ := os.ReadFile(dir + "/environ")
		// (A marker may be in the environment too: a worker started through sshd has none
		// of the test's environment but the variables its command sets.)
		marked := func(b []byte) bool { return bytes.Contains(b, []byte("minipy-")) && bytes.Contains(b, mark) }
		if bytes.Contains(append([]byte{0}, environ...), append([]byte{0}, env...)) || marked(cmdline) || marked(environ) {
			out = append(out, fmt.Sprintf("%d %s", pid, bytes.ReplaceAll(bytes.TrimRight(cmdline, "\x00"), []byte{0}, []byte{' '})))
		}
	}
	return out
}
