package main

import (
	"errors"
	"flag"
	"fmt"
	"runtime"
	"strings"
	"time"

	"github.com/minipy-go/minipy"
)

// The limits of each worker with -backend isolated: on by default, each changed by its flag,
// all lifted by -limits none (a flag given with it still sets its own).

// Defaults of the worker limits (-limits default).
const (
	// defaultMemoryBase and defaultMemoryPerCPU make -memory-limit's default, an address
	// space (RLIMIT_AS), which counts what libraries reserve as well as what they use: a
	// worker that has imported numpy, pandas and matplotlib and drawn a figure holds
	// 669 MB of it on a 2-core VM (115 MB resident), 530 MB of it without OpenBLAS's
	// threads, and numpy's OpenBLAS reserves 139 MiB more for each thread, one per core
	// (up to 64): 9.3 GB on 64 cores. Under too small a limit its threads fail to start
	// and `import numpy` hangs. So 4 GiB, for the data, plus 256 MiB per CPU, for the
	// thread pools (OpenBLAS's and another's).
	defaultMemoryBase   = 4 << 30
	defaultMemoryPerCPU = 256 << 20
	// defaultCPULimit is -cpu-limit's default: the CPU time a run may use, the default run
	// timeout's worth (a run whose threads work in parallel uses it up sooner). A -timeout
	// longer than it raises it to -timeout, so that a run the server allows can use its time.
	defaultCPULimit = time.Minute
	// defaultOpenFiles is -open-files's default: the usual soft limit of a login.
	defaultOpenFiles = 1024
)

// defaultMemoryLimit is -memory-limit's default on a machine with cpus CPUs.
func defaultMemoryLimit(cpus int) int64 {
	return defaultMemoryBase + int64(cpus)*defaultMemoryPerCPU
}

// workerLimits are the limits of each worker; 0 is none.
type workerLimits struct {
	memory    int64         // bytes of address space
	processes int           // processes and threads in the sandbox
	cpu       time.Duration // CPU time per run
	openFiles int           // file descriptors
}

// apply sets l in cfg.
func (l workerLimits) apply(cfg *minipy.IsolatedConfig) {
	cfg.MemoryLimit, cfg.CPULimit, cfg.OpenFiles = l.memory, l.cpu, l.openFiles
	cfg.Processes = l.processes
	if l.processes == 0 {
		cfg.Processes = minipy.Unlimited // (the library's 0 is its default)
	}
}

// String is the startup log's account of l: each limit and the flag that sets it.
func (l workerLimits) String() string {
	none := func(n int64, s string) string {
		if n <= 0 {
			return "none"
		}
		return s
	}
	return fmt.Sprintf("memory %s (-memory-limit), processes and threads %s (-processes), CPU %s (-cpu-limit), "+
		"open files %s (-open-files)",
		none(l.memory, byteText(l.memory)), none(int64(l.processes), fmt.Sprint(l.processes)),
		none(int64(l.cpu), l.cpu.String()+" per run"), none(int64(l.openFiles), fmt.Sprint(l.openFiles)))
}

// byteText writes n bytes in the largest binary unit that divides it.
func byteText(n int64) string {
	switch {
	case n%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", n>>30)
	case n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%d bytes", n)
}

// limitFlags are the flags of the worker limits.
type limitFlags struct {
	mode      string
	memory    int64
	processes int
	cpu       time.Duration
	openFiles int
}

func (f *limitFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.mode, "limits", "default", "with -backend isolated: `default` gives each worker the defaults of -memory-limit, "+
		"-processes, -cpu-limit and -open-files; none lifts them all (a limit's own flag still sets it)")
	fs.Int64Var(&f.memory, "memory-limit", 0, "with -backend isolated: the `bytes` of address space of each worker "+
		"(default: 4 GiB plus 256 MiB per CPU, for thread pools; 0: none)")
	fs.IntVar(&f.processes, "processes", 0, "with -backend isolated: the processes and threads of each session's sandbox "+
		fmt.Sprintf("(default %d; 0: none)", minipy.DefaultProcesses))
	fs.DurationVar(&f.cpu, "cpu-limit", 0, "with -backend isolated: the CPU time a run may use "+
		"(default 1m, or -timeout when longer; 0: none)")
	fs.IntVar(&f.openFiles, "open-files", 0, fmt.Sprintf("with -backend isolated: the file descriptors of each worker "+
		"(default %d; 0: none)", defaultOpenFiles))
}

// errLimits is matched by the errors of limit flags that do not parse.
var errLimits = errors.New("bad limit")

// resolve returns the limits in force after fs was parsed: -limits's, then each flag
// given. timeout is -timeout (0: the tool's default).
func (f *limitFlags) resolve(fs *flag.FlagSet, timeout time.Duration) (l workerLimits, err error) {
	switch f.mode {
	case "default":
		l = workerLimits{memory: defaultMemoryLimit(runtime.NumCPU()), processes: minipy.DefaultProcesses,
			cpu: max(defaultCPULimit, timeout), openFiles: defaultOpenFiles}
	case "none":
	default:
		return l, fmt.Errorf("%w: -limits %q: give default or none", errLimits, f.mode)
	}
	var bad []string
	fs.Visit(func(fl *flag.Flag) {
		switch fl.Name {
		case "memory-limit":
			l.memory = f.memory
			if f.memory < 0 {
				bad = append(bad, "-memory-limit")
			}
		case "processes":
			l.processes = f.processes
			if f.processes < 0 {
				bad = append(bad, "-processes")
			}
		case "cpu-limit":
			l.cpu = f.cpu
			if f.cpu < 0 {
				bad = append(bad, "-cpu-limit")
			}
		case "open-files":
			l.openFiles = f.openFiles
			if f.openFiles < 0 {
				bad = append(bad, "-open-files")
			}
		}
	})
	if len(bad) > 0 {
		return l, fmt.Errorf("%w: %s must not be negative (0: none)", errLimits, strings.Join(bad, ", "))
	}
	return l, nil
}
