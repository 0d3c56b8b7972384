package minipy

import (
	"errors"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/minipy-go/minipy/internal/cpython"
	"github.com/minipy-go/minipy/internal/worker"

	"github.com/minipy-go/minipy/internal/sandboxfs"
)

// The grace before a run that ignores its kicks is abandoned (timeout.go), and its bound on
// the wall clock when the code waited for a CPU.
const (
	AbandonAfter = abandonAfter
	AbandonCap   = abandonCap
)

// NewIsolatedActingUnsandboxed is NewIsolated on a kernel that (it pretends) refuses
// namespaces, for the tests of AllowUnsandboxed.
func NewIsolatedActingUnsandboxed(cfg IsolatedConfig) (*Isolated, error) {
	return newIsolated(cfg, false)
}

// NewIsolatedBelowProcessFloor is NewIsolated that takes a Processes under MinProcesses,
// for the test of a sandbox that cannot start for a process limit.
func NewIsolatedBelowProcessFloor(cfg IsolatedConfig) (*Isolated, error) {
	processFloor = 0
	defer func() { processFloor = MinProcesses }()
	return newIsolated(cfg, true)
}

// LinkedPython is the python executable of the linked libpython: the isolated engine's
// default worker and the in-process sys.executable.
var LinkedPython = cpython.LinkedPython

// LinkedVersion and FreeThreaded describe the linked libpython, for tests whose guarantees
// differ between versions.
var (
	LinkedVersion = cpython.LinkedVersion
	FreeThreaded  = cpython.FreeThreaded
)

// MinPythonVersion is the oldest supported CPython, for the test that pins the C layer's
// #error to it.
var MinPythonVersion = [2]int{minPythonMajor, minPythonMinor}

// NewIsolatedRefusingMounts is NewIsolated on a kernel that (it pretends) allows the
// sandbox's namespaces but refuses its mounts: the workers' root mount point is missing.
func NewIsolatedRefusingMounts(cfg IsolatedConfig) (*Isolated, error) {
	breakSandboxRoot = true
	defer func() { breakSandboxRoot = false }()
	return newIsolated(cfg, true)
}

// CheckGolden compares got with testdata/NAME (a version's own copy where it has one), and
// rewrites it with -update-tool; CellNumber matches the "<cell-12>" file names of tracebacks.
var (
	CheckGolden = checkGolden
	CellNumber  = cellNumber
)

// TemplatePID is the pid of e's template process, 0 when it has none.
func TemplatePID(e *Isolated) int {
	e.tmplMu.Lock()
	defer e.tmplMu.Unlock()
	if e.tmpl == nil {
		return 0
	}
	return e.tmpl.Pid()
}

// HostWorkDir is the host's path of the namespace's working directory in the engine's
// trees: with WorkSize, the directory in its tree's tmpfs that the template mounts its
// tmpfs over, through the host's fd of the tree.
func HostWorkDir(ns *Namespace) string {
	d := bindingOf(ns).dirs
	return ns.engine.(*Isolated).work.HomePath(d.tree.Tree, d.home)
}

// HostTreeDir is the host's directory of the namespace's tree on its disk: with WorkSize,
// the empty directory that the template mounts the tree's tmpfs over.
func HostTreeDir(ns *Namespace) string {
	return bindingOf(ns).dirs.tree.HostPath()
}

// WorkMounts is the number of working directories of e that are a tmpfs the host holds.
func WorkMounts(e *Isolated) int {
	return e.work.Mounts()
}

// NewIsolatedBeating is NewIsolated whose Command workers get a beat every `every` and end
// after a silence of silence.
func NewIsolatedBeating(cfg IsolatedConfig, every, silence time.Duration) (*Isolated, error) {
	testBeats = &worker.Beats{Every: every, Silence: silence}
	defer func() { testBeats = nil }()
	return NewIsolated(cfg)
}

// NewIsolatedOSFork is NewIsolated whose workers' snapshots, and its template's sandboxes,
// fork with os.fork, as they do where the host's fork code cannot be used (worker.py's
// _ForkCode).
func NewIsolatedOSFork(cfg IsolatedConfig) (*Isolated, error) {
	testOSFork = true
	defer func() { testOSFork = false }()
	return NewIsolated(cfg)
}

// ReadBufferCap is the capacity of the read buffer of the worker that holds ns (-1: none).
func ReadBufferCap(ns *Namespace) int {
	slot := bindingOf(ns).slot
	slot.mu.Lock()
	defer slot.mu.Unlock()
	if slot.cur == nil {
		return -1
	}
	return slot.cur.BufferCap()
}

// SetWatchLimits sets e's bounds on Result.Files' inotify watches (per namespace, for the
// engine), on the directory entries a run's walk may visit and on those listed to set
// watches up (0: the default), so that tests reach them fast.
func SetWatchLimits(e *Isolated, perNS, perEngine, walk, list int) {
	e.watch.SetLimits(perNS, perEngine, walk, list)
}

// NSWatchLimit is a namespace's bound on watches, when no test set it.
const NSWatchLimit = sandboxfs.NSWatchLimit

// HostWatches is how many watches e's inotify instance holds, as the kernel counts them
// (the "inotify wd:" lines of its /proc/self/fdinfo), -1 if it has none.
func HostWatches(e *Isolated) int {
	fd := e.watch.FD()
	if fd <= 0 {
		return -1
	}
	b, err := os.ReadFile("/proc/self/fdinfo/" + strconv.Itoa(fd))
	if err != nil {
		return -1
	}
	n := 0
	for line := range strings.Lines(string(b)) {
		if strings.HasPrefix(line, "inotify wd:") {
			n++
		}
	}
	return n
}

// CgroupDirs are the directories of the cgroup of ns's sandbox (none without one, or
// before its worker started).
func CgroupDirs(ns *Namespace) []string {
	s := bindingOf(ns).slot
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur == nil {
		return nil
	}
	return s.cur.CgroupDirs()
}

// TakeOverReserve is the memory a sandbox's cgroup holds beyond its work group's limit,
// for its guardian and a rollback's take-over.
const TakeOverReserve = worker.TakeOverReserve

// EngineCgroupDirs are the directories of e's cgroup (none without one).
func EngineCgroupDirs(e *Isolated) []string {
	if e.cgroups == nil {
		return nil
	}
	return e.cgroups.Dirs()
}

// RemoveCgroupsOf removes the engines' cgroups that process pid (a host a test killed)
// left.
func RemoveCgroupsOf(pid int) error {
	var errs []error
	for _, d := range worker.LeftCgroups(pid) {
		errs = append(errs, worker.RemoveCgroup(d))
	}
	return errors.Join(errs...)
}

// NewIsolatedCgroupBare is NewIsolated that takes a cgroup2 hierarchy without the memory
// and pids controllers (this machine's, whose controllers are on v1): its groups place
// and kill the workers, and bound nothing.
func NewIsolatedCgroupBare(cfg IsolatedConfig) (*Isolated, error) {
	testCgroupBare = true
	defer func() { testCgroupBare = false }()
	return NewIsolated(cfg)
}

// SpareStarted reports whether e has a spare worker that has finished starting (a kill
// before that is the start's failure, not a death between runs).
func SpareStarted(e *Isolated) bool {
	e.mu.Lock()
	var spares []*workerSlot
	for _, s := range e.pool.spares {
		spares = append(spares, s.slot)
	}
	e.mu.Unlock()
	for _, s := range spares {
		s.mu.Lock()
		up := s.started != nil || s.cur != nil
		s.mu.Unlock()
		if up {
			return true
		}
	}
	return false
}

// ReadySpares is the number of e's spares whose start has ended.
func ReadySpares(e *Isolated) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.pool.up()
}

// SetSpareWindow shortens how far back e's adaptive pool counts NewNamespace calls.
func SetSpareWindow(e *Isolated, d time.Duration) {
	e.mu.Lock()
	e.pool.window = d
	e.mu.Unlock()
	e.pool.poke()
}

// SpareTarget is how many spares e's pool holds at the moment, once its starts end.
func SpareTarget(e *Isolated) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.pool.target(time.Now())
}

// SetOpTimeout shortens how long e lets a namespace operation but a run take.
func SetOpTimeout(e *Isolated, d time.Duration) {
	e.opTimeout = d
}
