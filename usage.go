package minipy

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/minipy-go/minipy/internal/procstat"
	"github.com/minipy-go/minipy/internal/sandboxfs"
)

// Usage is what a namespace's sandbox uses (Namespace.Usage).
type Usage struct {
	// CPU is the CPU time of its processes: the worker, its rollback snapshots and what the
	// code started. With a cgroup (IsolatedStats.Limits v2), all of it since the sandbox
	// started, processes that ended included; else that of the processes alive now.
	CPU time.Duration
	// Memory is what it holds now, in bytes: its cgroup's count (its pages, page tables,
	// kernel memory and the files of its tmpfs), or without a cgroup the proportional set
	// sizes (PSS) of its processes.
	Memory int64
	// MemoryLimit is its limit (IsolatedConfig.MemoryLimit; 0: none).
	MemoryLimit int64
	// Disk is what its working directory holds, in bytes (0 without one: Command workers);
	// DiskLimit is the directory's size where one caps it (WorkSize), else 0.
	Disk, DiskLimit int64
}

// Usage reports what the namespace's sandbox uses now: CPU time, memory and its working
// directory's bytes, for metrics and for billing. A namespace's Fork copies share its
// sandbox, and its count. It takes no turn with runs: it reads the kernel's counts, and
// is safe from any goroutine. The in-process engine shares the host's process and has
// nothing of its own to count: an error matching errors.ErrUnsupported.
func (ns *Namespace) Usage() (Usage, error) {
	ns.mu.Lock()
	err := ns.usable()
	ns.mu.Unlock()
	if err != nil {
		return Usage{}, err
	}
	e, ok := ns.engine.(*Isolated)
	if !ok {
		return Usage{}, fmt.Errorf("minipy: Usage: %w: the in-process engine runs code in the host's own process",
			errors.ErrUnsupported)
	}
	return e.usage(ns)
}

func (e *Isolated) usage(ns *Namespace) (Usage, error) {
	if e.isClosed() {
		return Usage{}, ErrEngineClosed
	}
	b := bindingOf(ns)
	if b == nil {
		return Usage{}, ErrNamespaceClosed
	}
	u := Usage{MemoryLimit: max(e.cfg.MemoryLimit, 0)}
	b.slot.mu.Lock()
	w := b.slot.cur
	if w == nil { // (its worker started, or starting, before its first use)
		w = b.slot.started
	}
	b.slot.mu.Unlock()
	if w != nil && !w.Gone() {
		cpu, mem, cpuOK, ok := w.CgroupUsage()
		u.CPU, u.Memory = cpu, mem
		if !ok || !cpuOK { // (the processes alive now)
			for _, p := range w.Processes() {
				if !ok {
					u.Memory += procstat.PSS(p)
				}
				if !cpuOK {
					u.CPU += cpuTime(p)
				}
			}
		}
	}
	if !e.local() {
		return u, nil
	}
	root, err := e.rootOf(b)
	if err != nil {
		return u, err
	}
	defer root.Close()
	if e.capped() { // (its own tmpfs: what it holds, directories and all)
		var st syscall.Statfs_t
		if err := syscall.Fstatfs(root.FD, &st); err != nil {
			return u, fmt.Errorf("minipy: Usage: the working directory: %w", err)
		}
		u.Disk, u.DiskLimit = int64(st.Blocks-st.Bfree)*st.Bsize, e.cfg.WorkSize
		return u, nil
	}
	if u.Disk, err = sandboxfs.Size(root); err != nil {
		return u, fmt.Errorf("minipy: Usage: the working directory: %w", err)
	}
	return u, nil
}

// cpuTime is process pid's CPU time (user and system), 0 if it cannot be read.
func cpuTime(pid int) time.Duration {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(fields) < 13 {
		return 0
	}
	user, _ := strconv.ParseInt(fields[11], 10, 64)
	sys, _ := strconv.ParseInt(fields[12], 10, 64)
	return time.Duration(user+sys) * time.Second / clockTicks
}

// clockTicks is the kernel's USER_HZ, the unit of /proc's CPU times: 100 on every Linux
// architecture minipy runs on.
const clockTicks = 100
