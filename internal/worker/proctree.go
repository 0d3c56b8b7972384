package worker

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// killDescendants kills every descendant of pid found in /proc, children that started
// sessions of their own included (the worker is their subreaper, so orphans stay in its
// tree while it lives), by the rule of proctree.py, which kills trees in Python (the
// in-process runtime, a worker's guardian): stopped round after round until a scan finds
// none it has not stopped, then killed; each held by a pidfd opened after the scan and
// kept only while its start time is the scanned one, so a pid reused meanwhile is never
// signalled. It must run before pid itself is killed.
func killDescendants(pid int) {
	held := map[int]heldProcess{}
	gone := map[int]bool{}
	defer func() {
		for _, h := range held {
			h.release()
		}
	}()
	for round := 0; round < 20; round++ {
		tree := ReadTree()
		fresh := 0
		for _, p := range tree.Below(pid) {
			if _, ok := held[p]; ok || gone[p] {
				continue
			}
			h, ok := holdProcess(p, tree.start[p])
			if !ok {
				gone[p] = true
				continue
			}
			held[p] = h
			h.signal(syscall.SIGSTOP)
			fresh++
		}
		if fresh == 0 {
			break
		}
	}
	for _, h := range held {
		h.signal(syscall.SIGKILL)
	}
}

// heldProcess is a process held for signals: by a pidfd, or (a kernel before 5.3) by its
// pid and start time, checked before each signal.
type heldProcess struct {
	pid, fd int
	start   uint64
}

// pidfd_open and pidfd_send_signal, the same numbers on every architecture.
const (
	sysPidfdOpen       = 434
	sysPidfdSendSignal = 424
)

// holdProcess holds pid if it is still the process that started at start.
func holdProcess(pid int, start uint64) (heldProcess, bool) {
	h := heldProcess{pid: pid, fd: -1, start: start}
	fd, _, errno := syscall.Syscall(sysPidfdOpen, uintptr(pid), 0, 0)
	switch {
	case errno == 0:
		h.fd = int(fd)
		syscall.CloseOnExec(h.fd)
	case errno != syscall.ENOSYS:
		return h, false // gone
	}
	if now, ok := procStart(pid); !ok || now != start {
		h.release()
		return h, false // gone, or another process has its pid
	}
	return h, true
}

func (h heldProcess) signal(sig syscall.Signal) {
	if h.fd >= 0 {
		syscall.Syscall6(sysPidfdSendSignal, uintptr(h.fd), uintptr(sig), 0, 0, 0, 0) //nolint:errcheck // may have ended
	} else if now, ok := procStart(h.pid); ok && now == h.start {
		syscall.Kill(h.pid, sig) //nolint:errcheck // may have ended
	}
}

func (h heldProcess) release() {
	if h.fd >= 0 {
		syscall.Close(h.fd)
	}
}

// Tree is the machine's processes by parent, with their start times, as /proc showed
// them at one moment.
type Tree struct {
	children map[int][]int
	start    map[int]uint64 // clock ticks since boot (/proc/PID/stat field 22)
}

// procStat is the parent and start time of pid from /proc/PID/stat.
func procStat(pid int) (ppid int, start uint64, ok bool) {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, false
	}
	// The fields after the command (which may hold spaces) start after the last ')'.
	i := strings.LastIndexByte(string(stat), ')')
	fields := strings.Fields(string(stat[i+1:]))
	if len(fields) < 20 {
		return 0, 0, false
	}
	ppid, err1 := strconv.Atoi(fields[1])
	start, err2 := strconv.ParseUint(fields[19], 10, 64)
	return ppid, start, err1 == nil && err2 == nil
}

func procStart(pid int) (uint64, bool) {
	_, start, ok := procStat(pid)
	return start, ok
}

// ReadTree reads /proc's parent links.
func ReadTree() Tree {
	tree := Tree{children: map[int][]int{}, start: map[int]uint64{}}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return tree
	}
	for _, ent := range entries {
		p, err := strconv.Atoi(ent.Name())
		if err != nil {
			continue
		}
		if ppid, start, ok := procStat(p); ok {
			tree.children[ppid] = append(tree.children[ppid], p)
			tree.start[p] = start
		}
	}
	return tree
}

// Below lists pid's descendants.
func (t Tree) Below(pid int) []int {
	var out []int
	queue := []int{pid}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		out = append(out, t.children[p]...)
		queue = append(queue, t.children[p]...)
	}
	return out
}

// procGuard keeps a worker process's pid from meaning anything else while the host may
// signal by number: until the process is reaped (under mu), the number is the worker's,
// alive or a zombie, and so is a process group of that number (a zombie leader keeps its
// group's number too). The kernel hands a freed number to the next process that asks
// (pid_max is 32,768 on many machines), so a kill by number after the reap could end any
// process of the machine, its children or its group.
type procGuard struct {
	mu     sync.Mutex
	reaped bool
}

// reap waits for cmd's process to end, leaving it a zombie (WNOWAIT); kills what is left of
// its process group, with group, while the zombie holds the number; then reaps it.
func (g *procGuard) reap(cmd *exec.Cmd, group bool) {
	pid := cmd.Process.Pid
	var info unix.Siginfo
	for unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil) == unix.EINTR {
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if group {
		syscall.Kill(-pid, syscall.SIGKILL) //nolint:errcheck // the group may be empty
	}
	cmd.Wait() //nolint:errcheck // the status is read from ProcessState
	g.reaped = true
}

// kill kills process pid and, with tree, its descendants and process group, unless it has
// been reaped.
func (g *procGuard) kill(pid int, tree bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.reaped {
		return // (reap killed its group; a child outside it was orphaned at the death, out of any tree's reach)
	}
	if tree {
		killDescendants(pid)
		syscall.Kill(-pid, syscall.SIGKILL) //nolint:errcheck // may be a zombie's empty group
	}
	syscall.Kill(pid, syscall.SIGKILL) //nolint:errcheck // may be a zombie
}
