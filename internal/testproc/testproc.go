// Package testproc checks that a package's tests leave no process behind: a test's
// TestMain calls Run.
package testproc

import (
	"bytes"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
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
// it too, and is removed; one of a dead process that had this pid before is removed first.
func Run(m *testing.M) int {
	os.Setenv(Key, strconv.Itoa(os.Getpid()))
	// An engine's cgroup named for this pid before any test ran is a dead host's, whose
	// pid this binary was given (a host killed hard leaves its own): not this binary's
	// leftover, and in the way of its first engine's name.
	for _, d := range worker.LeftCgroups(os.Getpid()) {
		worker.RemoveCgroup(d) //nolint:errcheck // then counted below if it stays
	}
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
			killMarked(pid)
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

// killMarked SIGKILLs process pid if it is still one that Leftovers lists: held by a pidfd
// (os.FindProcess) first and checked after, so that a process given the number of one that
// ended meanwhile is never signalled.
func killMarked(pid int) {
	p, err := os.FindProcess(pid)
	if err != nil {
		return
	}
	defer p.Release() //nolint:errcheck // a handle
	if _, ok := marked(pid, os.Getpid()); ok {
		p.Kill() //nolint:errcheck // may have ended
	}
}

// Leftovers lists the live processes (not zombies) marked as this test binary's: "PID
// command line".
func Leftovers() []string {
	self := os.Getpid()
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
		if line, ok := marked(pid, self); ok {
			out = append(out, line)
		}
	}
	return out
}

// marked is "PID command line" of process pid, and whether it is live (not a zombie) and
// marked as test binary self's.
func marked(pid, self int) (string, bool) {
	env := []byte(Key + "=" + strconv.Itoa(self) + "\x00")
	// The tests' markers, "minipy-WHAT-PID-NANOS", and the engine's cgroups, "minipy-PID-N":
	// whole, not "minipy-" anywhere and "-PID-" anywhere else (a go tool's command line
	// names github.com/minipy-go, and a build id may hold "-PID-").
	mark := regexp.MustCompile(fmt.Sprintf(`minipy-([a-z]+-)?%d-[0-9]`, self))
	dir := "/proc/" + strconv.Itoa(pid)
	stat, err := os.ReadFile(dir + "/stat")
	if s := string(stat); err != nil || strings.HasPrefix(s[strings.LastIndexByte(s, ')')+1:], " Z") {
		return "", false
	}
	cmdline, _ := os.ReadFile(dir + "/cmdline")
	environ, _ := os.ReadFile(dir + "/environ")
	// (A marker may be in the environment too: a worker started through sshd has none
	// of the test's environment but the variables its command sets.)
	has := mark.Match
	if !bytes.Contains(append([]byte{0}, environ...), append([]byte{0}, env...)) && !has(cmdline) && !has(environ) {
		return "", false
	}
	return fmt.Sprintf("%d %s", pid, bytes.ReplaceAll(bytes.TrimRight(cmdline, "\x00"), []byte{0}, []byte{' '})), true
}

// SandboxPidOne is the host pid of the pid 1 of the sandbox whose /tmp holds the file
// marker (as the sandbox's code made it): a test kills it to kill the sandbox whole, as
// its code cannot. 0 if none.
func SandboxPidOne(marker string) int {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		status, err := os.ReadFile("/proc/" + e.Name() + "/status")
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(status), "\n") {
			if f := strings.Fields(line); len(f) > 2 && f[0] == "NSpid:" && f[len(f)-1] == "1" {
				if _, err := os.Stat("/proc/" + e.Name() + "/root/tmp/" + marker); err == nil {
					return pid
				}
			}
		}
	}
	return 0
}
