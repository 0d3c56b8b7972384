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
// calls and forks. Counting the kernel's side needs root (or CAP_PERFMON, or
// kernel.perf_event_paranoid <= 1), and a tracepoint's id is read from tracefs: where
// none is mounted (a fresh machine has none), a root process mounts one in a mount
// namespace of one thread of its own, which the host never sees.
package opcount

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"
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

// Event names one of the four counts.
type Event int

// The events, in the order of Counts' fields.
const (
	ContextSwitches Event = iota
	PageFaults
	Syscalls
	Forks
	numEvents
)

func (e Event) String() string {
	return [...]string{"context switches", "page faults", "system calls", "forks"}[e]
}

// ErrUnavailable is matched (errors.Is) by Start's error when the kernel does not let this
// process count some or all of the events; the error's text names them, why, and the fix.
var ErrUnavailable = errors.New("opcount: the kernel's counters are not available")

// Where tracefs is looked for, and where a root process mounts its own when there is none
// (variables for the tests, which take both away).
var (
	tracefsDirs  = []string{"/sys/kernel/tracing", "/sys/kernel/debug/tracing"}
	privateMount = "/sys/kernel/tracing"
)

// Meter counts from Start until Close. Read and Since are safe from any goroutine.
type Meter struct {
	mu      sync.Mutex
	fds     [numEvents][]int // by event, one per thread of this process counted
	tids    map[int]bool
	on      [numEvents]bool // the events counted; the others read zero
	attrs   [numEvents]unix.PerfEventAttr
	filters [numEvents]string
	cost    Counts // what two Reads count of themselves (their own system calls)
}

// cloneThread is CLONE_THREAD: a new task with it is a thread, not a process.
const cloneThread = 0x10000

// Start begins counting this process and everything it starts from now on. Where the
// kernel lets it count some events and not others, it returns a Meter that counts those
// it can (the others read zero; Counting tells) and an error that matches ErrUnavailable
// and names what is missing and the fix; where it can count none, a nil Meter and that
// error.
func Start() (*Meter, error) {
	m := &Meter{tids: map[int]bool{}}
	m.attrs[ContextSwitches] = attr(unix.PERF_TYPE_SOFTWARE, unix.PERF_COUNT_SW_CONTEXT_SWITCHES)
	m.attrs[PageFaults] = attr(unix.PERF_TYPE_SOFTWARE, unix.PERF_COUNT_SW_PAGE_FAULTS)
	m.on[ContextSwitches], m.on[PageFaults] = true, true
	var why []string
	ids, err := tracepoints("raw_syscalls/sys_enter", "task/task_newtask")
	if err == nil {
		m.attrs[Syscalls] = attr(unix.PERF_TYPE_TRACEPOINT, ids[0])
		m.attrs[Forks] = attr(unix.PERF_TYPE_TRACEPOINT, ids[1])
		m.filters[Forks] = fmt.Sprintf("!(clone_flags & %#x)", cloneThread)
		m.on[Syscalls], m.on[Forks] = true, true
	} else {
		why = append(why, fmt.Sprintf("system calls and forks: %v", err))
	}
	// Whether each event opens at all, tried on this thread: one the kernel refuses here it
	// refuses on every thread.
	for ev := range numEvents {
		if !m.on[ev] {
			continue
		}
		fd, err := m.open(ev, 0)
		if err != nil {
			m.on[ev] = false
			why = append(why, fmt.Sprintf("%v: perf_event_open: %v", ev, err))
			continue
		}
		unix.Close(fd)
	}
	// A thread made by one already counted inherits its counters; one made meanwhile by a
	// thread not yet counted is found by the next pass.
	for {
		added, err := m.addThreads()
		if err != nil {
			m.Close()
			return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
		}
		if added == 0 {
			break
		}
	}
	// What two Reads count of themselves: each reads every counter, and the reading
	// thread's own counter takes in its calls up to its own read in the first Read and the
	// rest in the second.
	if m.on[Syscalls] {
		m.cost = Counts{Syscalls: int64(len(m.fds[Syscalls]) * m.counted())}
	}
	if len(why) == 0 {
		return m, nil
	}
	err = fmt.Errorf("%w: %s. %s", ErrUnavailable, strings.Join(why, "; "), fix())
	if m.counted() == 0 {
		m.Close()
		return nil, err
	}
	return m, err
}

// fix says how to let this process count everything.
func fix() string {
	if os.Geteuid() == 0 {
		return "To fix: this kernel has no tracefs, or this process may not mount one (a " +
			"container without CAP_SYS_ADMIN?): mount it where the process runs, with " +
			"`mount -t tracefs nodev /sys/kernel/tracing` (.ci/deps does, as root)"
	}
	return "To fix: run as root (`sudo make test`: .ci/deps mounts tracefs when it is missing), " +
		"or give this user the kernel's counters: `sysctl kernel.perf_event_paranoid=-1` and " +
		"read access to a tracefs (`mount -t tracefs -o gid=GROUP nodev /sys/kernel/tracing`)"
}

// Counting reports whether m counts ev (else ev's count reads zero).
func (m *Meter) Counting(ev Event) bool { return m.on[ev] }

// counted is how many events m counts.
func (m *Meter) counted() int {
	n := 0
	for _, on := range m.on {
		if on {
			n++
		}
	}
	return n
}

func attr(typ uint32, config uint64) unix.PerfEventAttr {
	return unix.PerfEventAttr{
		Type:   typ,
		Size:   uint32(unsafe.Sizeof(unix.PerfEventAttr{})),
		Config: config,
		Bits:   unix.PerfBitInherit | unix.PerfBitExcludeHv,
	}
}

// tracepoints is the ids of the tracepoints named "system/event", from a tracefs mounted
// on the host, or from one mounted in a private mount namespace when none is.
func tracepoints(names ...string) ([]uint64, error) {
	for _, dir := range tracefsDirs {
		if _, err := os.Stat(filepath.Join(dir, "events")); err == nil {
			return readIDs(dir, names)
		}
	}
	ids, err := readIDsPrivately(privateMount, names)
	if err != nil {
		return nil, fmt.Errorf("no tracefs mounted (looked under %s), and mounting one in a mount "+
			"namespace of its own failed: %w", strings.Join(tracefsDirs, " and "), err)
	}
	return ids, nil
}

func readIDs(dir string, names []string) ([]uint64, error) {
	ids := make([]uint64, len(names))
	for i, name := range names {
		b, err := os.ReadFile(filepath.Join(dir, "events", name, "id"))
		if err != nil {
			return nil, err
		}
		if ids[i], err = strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64); err != nil {
			return nil, fmt.Errorf("tracepoint %s: %w", name, err)
		}
	}
	return ids, nil
}

// readIDsPrivately mounts a tracefs on dir in a mount namespace that one OS thread makes for
// itself, reads the ids there, and lets the thread end (its goroutine never unlocks it, so
// the Go runtime retires it, and the namespace and mount go with it). A tracepoint's id is
// the kernel's, whichever tracefs shows it.
func readIDsPrivately(dir string, names []string) ([]uint64, error) {
	type result struct {
		ids []uint64
		err error
		tid int // the thread that made the namespace (0: none)
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: see above
		var r result
		if unix.Gettid() == unix.Getpid() {
			// The main thread, which the runtime never retires (it would stay in the
			// namespace, and /proc/PID/mountinfo shows it): held here, it cannot take
			// the next goroutine, which runs on another thread.
			r.ids, r.err = readIDsPrivately(dir, names)
			runtime.UnlockOSThread()
		} else if r.err = unix.Unshare(unix.CLONE_NEWNS); r.err != nil {
			r.err = fmt.Errorf("unshare(CLONE_NEWNS): %w", r.err)
		} else {
			r.tid = unix.Gettid()
			r.ids, r.err = mountAndRead(dir, names)
		}
		done <- r
	}()
	r := <-done
	// The thread ends after its goroutine has sent this: until it has, the namespace is
	// this process's too (its /proc/self/task shows it), so wait for it, a second at most.
	for deadline := time.Now().Add(time.Second); r.tid != 0 && time.Now().Before(deadline); {
		if _, err := os.Stat("/proc/self/task/" + strconv.Itoa(r.tid)); errors.Is(err, fs.ErrNotExist) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	return r.ids, r.err
}

// mountAndRead mounts a tracefs on dir, in this thread's own mount namespace, and reads
// the ids there.
func mountAndRead(dir string, names []string) ([]uint64, error) {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return nil, fmt.Errorf("making / private: %w", err)
	}
	if err := unix.Mount("nodev", dir, "tracefs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return nil, fmt.Errorf("mount -t tracefs nodev %s: %w", dir, err)
	}
	return readIDs(dir, names)
}

// open opens ev's counter for the thread tid (0: the calling thread).
func (m *Meter) open(ev Event, tid int) (int, error) {
	a := m.attrs[ev]
	fd, err := unix.PerfEventOpen(&a, tid, -1, -1, unix.PERF_FLAG_FD_CLOEXEC)
	if err == nil && m.filters[ev] != "" {
		if err = setFilter(fd, m.filters[ev]); err != nil {
			unix.Close(fd)
		}
	}
	return fd, err
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
		var fds [numEvents]int
		var opened []int
		for ev := range numEvents {
			if !m.on[ev] {
				continue
			}
			fd, err := m.open(ev, tid)
			if err != nil {
				closeAll(opened)
				opened = nil
				if errors.Is(err, unix.ESRCH) {
					break // the thread ended meanwhile: its counts were nobody's
				}
				return added, fmt.Errorf("%v: perf_event_open: %w", ev, err)
			}
			fds[ev] = fd
			opened = append(opened, fd)
		}
		if opened == nil {
			continue
		}
		for ev := range numEvents {
			if m.on[ev] {
				m.fds[ev] = append(m.fds[ev], fds[ev])
			}
		}
		m.tids[tid] = true
		added++
	}
	return added, nil
}

func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
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
	var v [numEvents]int64
	var buf [8]byte
	for ev, fds := range m.fds {
		for _, fd := range fds {
			if n, err := unix.Read(fd, buf[:]); err == nil && n == len(buf) {
				v[ev] += int64(binary.NativeEndian.Uint64(buf[:]))
			}
		}
	}
	return Counts{v[ContextSwitches], v[PageFaults], v[Syscalls], v[Forks]}
}

// Close stops counting.
func (m *Meter) Close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for ev, fds := range m.fds {
		closeAll(fds)
		m.fds[ev] = nil
	}
}
