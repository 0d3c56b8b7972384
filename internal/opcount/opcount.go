// Package opcount counts what an operation costs the kernel over a whole process tree:
// context switches, page faults, system calls and new processes, in this process (every
// thread) and in every process and thread it starts after the count begins, including
// those that have exited by the time it is read (the guardian, the worker, the template's
// forks, a snapshot that lived for one cycle).
//
// Times move several-fold between machines and between weeks of one VM; these counts do
// not, so minipy's speed goals are set in them (docs/benchmarks.md). The counters are the
// kernel's own (perf_event_open with inherit): software events for context switches and
// page faults, the raw_syscalls:sys_enter and task:task_newtask tracepoints for system
// calls and forks. Tracepoints need CAP_PERFMON (root) or kernel.perf_event_paranoid <= -1.
package opcount

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Counts is what the kernel did for a process tree between two moments.
type Counts struct {
	ContextSwitches int64 // voluntary and involuntary, every thread
	PageFaults      int64 // minor and major
	Syscalls        int64 // system calls entered
	Forks           int64 // new processes (threads are not counted)
}

// Sub is c - o.
func (c Counts) Sub(o Counts) Counts {
	return Counts{c.ContextSwitches - o.ContextSwitches, c.PageFaults - o.PageFaults,
		c.Syscalls - o.Syscalls, c.Forks - o.Forks}
}

// Add is c + o.
func (c Counts) Add(o Counts) Counts {
	return Counts{c.ContextSwitches + o.ContextSwitches, c.PageFaults + o.PageFaults,
		c.Syscalls + o.Syscalls, c.Forks + o.Forks}
}

// PerOp is c divided by n operations.
type PerOp struct {
	ContextSwitches, PageFaults, Syscalls, Forks float64
}

// Per is c over n operations.
func (c Counts) Per(n int) PerOp {
	d := float64(max(n, 1))
	return PerOp{float64(c.ContextSwitches) / d, float64(c.PageFaults) / d,
		float64(c.Syscalls) / d, float64(c.Forks) / d}
}

func (p PerOp) String() string {
	return fmt.Sprintf("%.1f context switches, %.1f page faults, %.1f system calls, %.2f forks",
		p.ContextSwitches, p.PageFaults, p.Syscalls, p.Forks)
}

// ErrUnavailable is returned by Start when the kernel does not let this process count
// (perf_event_open refused: not root, no CAP_PERFMON, perf_event_paranoid above -1, or no
// tracefs); errors.Is matches it.
var ErrUnavailable = errors.New("opcount: the kernel's counters are not available (perf_event_open " +
	"with tracepoints needs root or CAP_PERFMON, or kernel.perf_event_paranoid=-1)")

// Meter counts from Start until Close. Read and Since are safe from any goroutine.
type Meter struct {
	mu      sync.Mutex
	fds     [4][]int // by event, one per thread of this process counted
	tids    map[int]bool
	attrs   [4]unix.PerfEventAttr
	filters [4]string
	cost    Counts // what two Reads count of themselves (their own system calls)
}

const (
	evSwitches = iota
	evFaults
	evSyscalls
	evForks
)

// cloneThread is CLONE_THREAD: a new task with it is a thread, not a process.
const cloneThread = 0x10000

// Start begins counting this process and everything it starts from now on.
func Start() (*Meter, error) {
	syscalls, err := tracepoint("raw_syscalls/sys_enter")
	if err != nil {
		return nil, err
	}
	newtask, err := tracepoint("task/task_newtask")
	if err != nil {
		return nil, err
	}
	m := &Meter{tids: map[int]bool{}}
	m.attrs[evSwitches] = attr(unix.PERF_TYPE_SOFTWARE, unix.PERF_COUNT_SW_CONTEXT_SWITCHES)
	m.attrs[evFaults] = attr(unix.PERF_TYPE_SOFTWARE, unix.PERF_COUNT_SW_PAGE_FAULTS)
	m.attrs[evSyscalls] = attr(unix.PERF_TYPE_TRACEPOINT, syscalls)
	m.attrs[evForks] = attr(unix.PERF_TYPE_TRACEPOINT, newtask)
	m.filters[evForks] = fmt.Sprintf("!(clone_flags & %#x)", cloneThread)
	// A thread made by one already counted inherits its counters; one made meanwhile by a
	// thread not yet counted is found by the next pass.
	for {
		added, err := m.addThreads()
		if err != nil {
			m.Close()
			return nil, err
		}
		if added == 0 {
			break
		}
	}
	// What two Reads count of themselves: each reads every counter, and the reading
	// thread's own counter takes in its calls up to its own read in the first Read and the
	// rest in the second.
	m.cost = Counts{Syscalls: int64(len(m.fds[evSyscalls]) * len(m.fds))}
	return m, nil
}

func attr(typ uint32, config uint64) unix.PerfEventAttr {
	return unix.PerfEventAttr{
		Type:   typ,
		Size:   uint32(unsafe.Sizeof(unix.PerfEventAttr{})),
		Config: config,
		Bits:   unix.PerfBitInherit | unix.PerfBitExcludeHv,
	}
}

// tracepoint is the id of the tracepoint named "system/event".
func tracepoint(name string) (uint64, error) {
	for _, root := range []string{"/sys/kernel/tracing", "/sys/kernel/debug/tracing"} {
		b, err := os.ReadFile(filepath.Join(root, "events", name, "id"))
		if err == nil {
			return strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
		}
	}
	return 0, fmt.Errorf("%w: no tracepoint %s under /sys/kernel/tracing", ErrUnavailable, name)
}

// addThreads opens the counters of each thread of this process not counted yet.
func (m *Meter) addThreads() (int, error) {
	entries, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return 0, err
	}
	added := 0
	for _, e := range entries {
		tid, err := strconv.Atoi(e.Name())
		if err != nil || m.tids[tid] {
			continue
		}
		var fds [4]int
		opened := 0
		for ev := range fds {
			a := m.attrs[ev]
			fd, err := unix.PerfEventOpen(&a, tid, -1, -1, unix.PERF_FLAG_FD_CLOEXEC)
			if err == nil && m.filters[ev] != "" {
				if err = setFilter(fd, m.filters[ev]); err != nil {
					unix.Close(fd)
				}
			}
			if err != nil {
				for _, fd := range fds[:opened] {
					unix.Close(fd)
				}
				if errors.Is(err, unix.ESRCH) {
					break // the thread ended meanwhile: its counts were nobody's
				}
				return added, fmt.Errorf("%w: perf_event_open: %v", ErrUnavailable, err)
			}
			fds[ev] = fd
			opened++
		}
		if opened == len(fds) {
			for ev, fd := range fds {
				m.fds[ev] = append(m.fds[ev], fd)
			}
			m.tids[tid] = true
			added++
		}
	}
	return added, nil
}

func setFilter(fd int, filter string) error {
	p, err := unix.BytePtrFromString(filter)
	if err != nil {
		return err
	}
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.PERF_EVENT_IOC_SET_FILTER, uintptr(unsafe.Pointer(p)))
	runtime.KeepAlive(p)
	if errno != 0 {
		return errno
	}
	return nil
}

// Read is the counts since Start.
func (m *Meter) Read() Counts {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.read()
}

// Since is the counts from before (a Read) to now, less what the two Reads counted of
// themselves. Its system calls are exact when both Reads ran on one thread, and within
// Slack of it when the goroutine moved to another between them (which thread's counter
// is read where in the list decides how many of the Reads' own calls it holds).
func (m *Meter) Since(before Counts) Counts {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.read().Sub(before).Sub(m.cost)
}

// Slack bounds how far Since's system calls may be from the truth: the calls one Read
// makes.
func (m *Meter) Slack() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cost.Syscalls
}

func (m *Meter) read() Counts {
	var v [4]int64
	var buf [8]byte
	for ev, fds := range m.fds {
		for _, fd := range fds {
			if n, err := unix.Read(fd, buf[:]); err == nil && n == len(buf) {
				v[ev] += int64(binary.NativeEndian.Uint64(buf[:]))
			}
		}
	}
	return Counts{v[evSwitches], v[evFaults], v[evSyscalls], v[evForks]}
}

// Close stops counting.
func (m *Meter) Close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for ev, fds := range m.fds {
		for _, fd := range fds {
			unix.Close(fd)
		}
		m.fds[ev] = nil
	}
}
