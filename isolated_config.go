package minipy

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/minipy-go/minipy/internal/worker"
)

// Unlimited, in a limit of IsolatedConfig (MemoryLimit, CPULimit, FileSizeLimit, OpenFiles,
// Processes, WorkSize), asks for no limit at all, where 0 asks for the field's default. Any
// negative value means the same.
const Unlimited = -1

// DefaultProcesses is the Processes limit of sandboxed local workers when the configuration
// gives none (0): at most this many processes and threads in each sandbox. A fork bomb
// takes no more of the machine's pids than that (the kernel's default pid_max is 32,768 or
// more), and it leaves room for what data-science code runs legitimately, which
// RLIMIT_NPROC counts too: the sandbox's own 4 (the guardian, the worker's two threads,
// its rollback snapshot; MinProcesses as a snapshot takes over), OpenBLAS's thread per core (numpy's BLAS; up to 64), another
// library's pool, and subprocesses. Hosts with more than about 100 cores and several
// thread pools may need more, or fewer threads per pool (OMP_NUM_THREADS,
// OPENBLAS_NUM_THREADS in Env).
const DefaultProcesses = 256

// MinProcesses is the least Processes a sandboxed local worker takes: the sandbox's own
// tasks when a rollback snapshot takes over from a worker that died (its pid 1, the dead
// worker until it is reaped, the snapshot now the worker and its control thread, the next
// snapshot), and one for the code. With fewer a sandbox failed to start, or its next
// snapshot's fork failed and a later rollback lost the namespace's variables; NewIsolated
// refuses them.
const MinProcesses = 6

// IsolatedConfig configures an isolated engine (see NewIsolated). The zero value is one
// local worker of the default Python, in a sandbox with no network and at most
// DefaultProcesses processes and threads, with no limit on a worker's memory, CPU time, file
// size or open files, and, where the engine has a cgroup, all the sandboxes' memory held to
// DefaultMemoryBudget. Each limit takes Unlimited for none.
type IsolatedConfig struct {
	// Workers packs namespaces into shared worker processes. 0 (the default) gives every
	// namespace a worker of its own, killed by its Close: namespaces never share memory, a
	// crash costs no other namespace its variables, and runs in different namespaces
	// proceed in parallel. NewNamespace takes a spare worker started ahead (Spares), so a
	// namespace rarely waits for a start. N > 0 runs N workers and spreads the namespaces
	// over them round-robin: fewer processes, but namespaces on one worker can reach each
	// other's objects (gc.get_objects) and are lost together.
	Workers int
	// Spares is the warm pool of a worker per namespace (Workers 0): sandboxes started
	// ahead, each handed whole to the next NewNamespace, whose first run then finds its
	// worker up (a few ms) instead of waiting for a start (50-150 ms; docs/benchmarks.md).
	// 0 (the default) adapts the pool to the calls: none until the first NewNamespace, then
	// as many as NewNamespace was called in the last 10 seconds (a burst's size), at least
	// one, at most 32 and a quarter of MemoryBudget at 48 MiB each; it shrinks back as the
	// calls age out. N > 0 keeps N ready from NewIsolated on; a negative value keeps none.
	// Spares start in parallel, as many at once as there are CPUs; one whose start fails
	// is dropped, and the pool starts none for a second (doubling while starts keep failing,
	// up to 30 s). Each is a sandbox like any other, counted in MemoryBudget and in Stats
	// (Workers, Spares, SpareHits, SpareMisses).
	Spares int
	// Python is the worker executable (a project's venv python works; 3.11 or later). ""
	// means the interpreter of the libpython minipy is built against, found from the
	// library's own file (PREFIX/bin/python3.X beside PREFIX/lib), else python3.X in
	// /usr/bin, /usr/local/bin or on PATH (never a pyenv shim), so that both engines run
	// one Python build. Its prefix (and a venv's base) and the directories on its sys.path
	// are bound read-only into the sandbox at their own paths. When the host runs as root,
	// sandboxed workers start it as root of a user namespace of their own, which enters
	// root's private directories (a venv under /root works) but not another user's (that is
	// ErrSandboxAccess), and they become the unprivileged user nobody before they build the
	// sandbox: the code imports from the venv as nobody, so the venv's own files must be
	// readable by others, as the usual umask makes them.
	Python string
	// Command, when set, starts each worker through a command that pipes stdin and stdout to
	// a Python interpreter elsewhere: the engine appends "-c" and the worker's bootstrap
	// program, so the command must end in the python executable, for example
	// {"kubectl", "exec", "-i", "POD", "--", "python3"} or {"docker", "exec", "-i", "ID",
	// "python3"}. Python is then ignored. Such workers get no Linux namespaces here (the
	// other side is the sandbox), so Network must be true; the rlimits (memory, CPU, file
	// size, open files, processes) are set by the worker itself and apply there. The far
	// side never outlives the host's decision: the worker's guardian kills it when the
	// connection closes, and its deadman timer at each run's deadline plus the grace.
	Command []string
	// CommandShell quotes the appended arguments for a POSIX shell, for commands that pass
	// their arguments through one, as ssh does: {"ssh", "host", "python3"}.
	CommandShell bool
	// MemoryLimit caps each worker's memory, in bytes; 0 or Unlimited means none. It is the
	// worker's address space (RLIMIT_AS): an allocation past it raises MemoryError, returned
	// as a *LimitError. The address space counts what libraries reserve, not only what they
	// use: numpy's OpenBLAS reserves about 139 MiB per thread, a thread per core
	// (docs/isolated.md, "Limits and their defaults"). Where the engine has a cgroup (see
	// Cgroup), it is also the memory limit of each sandbox's cgroup, which counts what the
	// address space does not: shared memory, memfd, and the files its processes write in
	// /tmp, /dev/shm and a tmpfs working directory, for as long as they exist; a sandbox
	// holds a worker, its rollback snapshot (pages the worker writes after a snapshot count
	// twice) and its Fork copies, which share the limit. Past it the kernel kills the worker
	// (a *WorkerLostError with Limit "memory", rolled back). Without a cgroup, sandboxed
	// workers under a MemoryLimit are refused SysV shared memory and new memfds, which
	// nothing else counts.
	MemoryLimit int64
	// ResidentLimit caps the memory each sandbox holds, where the engine has a cgroup (see
	// Cgroup): its cgroup's memory limit, which counts the pages in use (not the address
	// space that libraries reserve, as MemoryLimit does) and the tmpfs files and shared
	// memory of its processes. 0 means MemoryLimit (one number caps both); Unlimited, none
	// but MemoryBudget. Past it the kernel kills the sandbox's worker (a *WorkerLostError
	// with Limit "memory", rolled back). It bounds the sandbox's worker, snapshots, Fork
	// copies and commands; its guardian, and a snapshot while it takes over after the
	// worker's death, have 16 MiB beyond it (docs/isolated.md says why). Without a cgroup
	// nothing enforces it (Stats says why); MemoryLimit's address space still applies.
	ResidentLimit int64
	// MemoryBudget caps the memory all the engine's sandboxes hold together, where the
	// engine has a cgroup: the memory limit of the engine's own cgroup, above the sandboxes'
	// (memory.max, or v1's memory.limit_in_bytes), so that however many namespaces are open,
	// they cannot take the host down. 0 means DefaultMemoryBudget; Unlimited, none. When
	// the sandboxes together reach it, the kernel kills the worker that holds the most
	// (workers run at oom_score_adj 1000; their snapshots take over); give each sandbox a
	// ResidentLimit of its share (MemoryBudget divided by the namespaces you allow) so that
	// a namespace past its share fails its own run first. The template and the host
	// process are outside it.
	MemoryBudget int64
	// CPULimit caps the CPU time each run may use (whole seconds, rounded up); 0 or
	// Unlimited means none. A run that uses it up kills its worker: the error is a
	// *WorkerLostError with Limit "cpu". It is a soft RLIMIT_CPU, re-armed before each run,
	// which code could raise for itself: the run's Timeout and the hard kill still bound it.
	CPULimit time.Duration
	// FileSizeLimit caps the size of any file a worker writes (RLIMIT_FSIZE); 0 or
	// Unlimited means none. It bounds what a run may print, too (output is captured in
	// memory files): printing past it raises OSError (EFBIG) in the code. Without it, a
	// run's output is held in the worker's memory, whole, until the run ends, and only then
	// capped at MaxOutput.
	FileSizeLimit int64
	// OpenFiles caps the file descriptors each worker may hold (RLIMIT_NOFILE); 0 or
	// Unlimited: no cap.
	OpenFiles int
	// Processes caps the processes and threads in each sandbox (RLIMIT_NPROC; the
	// guardian, the worker's own threads and its rollback snapshot count too); 0 means
	// DefaultProcesses for sandboxed local workers, Unlimited none. Each sandbox is a user
	// namespace of its own, whose count is its own (a Fork's copy shares its original's;
	// packed workers' namespaces share their worker's), and it bites for root too: local
	// workers run as an unprivileged user there. Where the engine has a cgroup (see Cgroup)
	// it is also the pids.max of each sandbox's cgroup, which counts every process and
	// thread of the sandbox (the worker, its guardian and snapshot, its Fork copies, what
	// the code starts), whoever their user. Without the sandbox (AllowUnsandboxed) and for
	// Command workers, 0 means none: RLIMIT_NPROC counts every process of the user there
	// (the host's, or the far side's), not the worker's own, and root is exempt. A limit
	// given there still applies, to that count (and to the cgroup's, for a local worker).
	Processes int
	// Network lets workers reach the network. When false (the default), local workers run
	// in their own network namespace with no interfaces up.
	Network bool
	// AllowUnsandboxed runs local workers without Linux namespaces when the kernel refuses
	// them (no user namespaces), instead of failing. Without namespaces the network stays
	// reachable, Processes has no default and does not bite for root, and a timed-out
	// run's process tree is found by scanning /proc (children that were orphaned before the
	// kill can escape).
	AllowUnsandboxed bool
	// Env adds variables ("KEY=VALUE") to the workers' environment. Workers never inherit
	// the host's environment (an agent's API keys stay out of the model's reach): a local
	// worker starts with PATH (the python's own directory first, as in an active venv),
	// HOME (the working directory), TMPDIR, LANG=C.UTF-8 and USER, then Env, which may
	// override them and may set what Python reads at start (PYTHONPATH, ...). A Command
	// worker gets the environment its command gives it; Env is added there as the worker
	// starts.
	Env []string
	// Mounts shares host files and directories with sandboxed local workers, read-only
	// unless Writable (see Mount). Without the sandbox (AllowUnsandboxed on a kernel that
	// refuses it) only mounts whose Target is their Source can be honoured.
	Mounts []Mount
	// TmpSize caps a sandboxed worker's private /tmp and /dev/shm, and its root (what the code
	// writes elsewhere: /app), each a tmpfs (memory,
	// counted in MemoryLimit only where the engine has a cgroup), in bytes; 0 means 256 MiB. It has no Unlimited: a tmpfs
	// without a size may take half the machine's memory.
	TmpSize int64
	// WorkSize caps the bytes that each namespace's working directory may hold; 0 means
	// 1 GiB, Unlimited (any negative value) no cap. Past it the code's writes fail with
	// OSError ENOSPC, and WriteFile with an error that matches syscall.ENOSPC; the host's
	// disk holds none of it. Each working directory is then a tmpfs of that size: memory, like TmpSize (only
	// what is written counts; in MemoryLimit only with a cgroup), with an inode per 4 KiB, mounted
	// by the template in the workers' mount namespaces, so Namespace.WorkDir is a path
	// through the host process's /proc/PID/fd. Sandboxed workers forked from the template
	// (the default) get it; with NoTemplate, without the sandbox, for Command workers and
	// with a negative WorkSize, working directories are directories on the host's disk.
	// With the template, the directory of a namespace's working directories (a Fork
	// copy's and packed namespaces' are there too) is a tmpfs of its own, twice WorkSize,
	// which holds their mount points and, after the template's death, the working
	// directories added to it: the code's /proc/self/mountinfo names no host path.
	WorkSize int64
	// WorkDirPath is where sandboxed code sees its namespace's working directory, which is
	// also its current directory and HOME (and the home of its user in /etc/passwd): an
	// absolute path; "" means /work. E2B's SDKs expect /home/user (minipy-mcp -e2b). It may
	// not be "/" or lie in what the sandbox makes or binds itself: /proc, /dev, /tmp,
	// /namespaces, /etc and the system directories (/usr, /bin, /lib...).
	WorkDirPath string
	// MaxTransfer caps, in bytes, what a worker may send the host in one message: a run's
	// result (its value, output and displays), a Get's value, a Save's variables, a host
	// function call with its arguments. It bounds what the code in a worker can make the host
	// process hold: the worker keeps under it, and a worker that sends more all the same
	// (its code can write to the worker's pipe to the host) is killed as the frame's header
	// arrives, with a *WorkerLostError matching ErrProtocol (its namespace rolls back).
	// Within it, a run's value that does not fit is left out (Value nil, Repr kept), then its
	// displays, then its output is cut; Get and Save fail with ErrTooLarge, the worker
	// unchanged; a host call raises ValueError in the code. 0 means DefaultMaxTransfer; it
	// may be 1 MiB to 1 GiB.
	MaxTransfer int64
	// KickSignal is the signal that interrupts a run inside a worker; 0: DefaultKickSignal.
	KickSignal syscall.Signal
	// StartTimeout bounds a worker's start; 0 means 30 s.
	StartTimeout time.Duration
	// NoRollback turns off rollback snapshots. By default a local worker forks a snapshot
	// of itself after each request it answers (copy-on-write, between requests); when a
	// run crashes the worker (os._exit, a segfault, a limit) or is killed at its deadline,
	// the snapshot takes over, so its namespaces are exactly as they were before that run,
	// and the error (a *WorkerLostError with RolledBack) does not match ErrStateLost. (A
	// new worker makes its first snapshot once a request has changed its state: a run
	// that crashes it before that rolls back to a new worker, which holds the same.)
	// Threads and child processes that earlier runs left running are not in the snapshot.
	// Command workers have no snapshots, nor have workers of a free-threaded Python with a
	// MemoryLimit (a snapshot could not start its threads under it).
	NoRollback bool
	// OnIdleDeath, if set, is called (on a goroutine of the engine's, which it should not
	// hold up) for each worker that ended between runs: killed from outside, crashed by a
	// thread the code left running, or a spare killed before any namespace took it. The
	// engine has already dealt with it: a snapshot holding the state of the last run took
	// over, so the namespaces lost nothing and their next run does not notice; or, without
	// one, the worker was replaced, and each namespace it held fails its next use with a
	// *WorkerLostError (Idle) matching ErrStateLost, once.
	OnIdleDeath func(IdleDeath)
	// Egress, if set, gives sandboxed workers (Network false) a way out through a proxy the
	// host runs, under its policy (see Egress); nil with Network false: no network at all.
	Egress *Egress
	// OnEgress, if set, is called for each connection or request through a sandbox's egress
	// proxy, allowed or refused, when it ends (on the proxy's goroutine: keep it short).
	OnEgress func(EgressEvent)
	// RootUser gives each sandbox a root user that its processes may become without a
	// password, as E2B's sandboxes have one: Command.User "root", and sudo (first on the
	// sandbox's PATH: sudo [-u USER] [-E] [-i | -s] COMMAND). Root there is root over the
	// sandbox alone: its user namespace maps its root to a host user of its own (uid and
	// gid 65533) and its user to the usual one, owns no other namespace, and maps neither
	// the host's root nor any other user, so no capability of it reaches a file of the
	// image or a process outside the sandbox, and every other limit, the seccomp filter
	// and no_new_privs hold as without it. The sandbox's processes, its user's too, hold
	// every capability of that namespace (what sudo needs; docs/isolated.md, "A root
	// user", says what that gives and what not). /root is root's home. It needs a root
	// host and the template (not NoTemplate): ErrNoRootUser otherwise.
	RootUser bool
	// NoTemplate starts each sandboxed worker as a process of its own. By default an engine
	// with sandboxed local workers keeps a template: a process in the sandbox's file system
	// that has loaded the runtime and Preload, from which each new worker is forked
	// (copy-on-write, so workers share those pages) into namespaces of its own (user, pid,
	// mount, IPC, UTS, network), with a fresh /tmp and /dev/shm, its own limits, and no
	// capability. Workers of Command or without the sandbox always start plainly.
	NoTemplate bool
	// Cgroup names the cgroup under which the engine makes its own, as /proc/self/cgroup
	// names cgroups ("/system.slice/app.service"): on cgroup v2 a delegated one that holds
	// no process (only leaves hold processes, so a cgroup with the host in it cannot hand
	// the memory and pids controllers down), on v1 one in both the memory and the pids
	// hierarchies. "" (the default) uses the host process's own cgroup when the engine may:
	// on v1, a root host; on v2, only a host in the hierarchy's root. The engine's cgroup
	// (minipy-PID-N) holds a cgroup per sandbox, which bounds its memory (MemoryLimit) and
	// processes (Processes), and which the engine kills whole when it ends that sandbox;
	// Close removes them all. A Cgroup that cannot be used fails NewIsolated with
	// ErrNoCgroup; without one the limits are rlimits alone, and Stats says why.
	// docs/deploy.md shows how systemd and Kubernetes delegate one. Local workers only.
	Cgroup string
	// NoCgroup runs the engine without a cgroup: MemoryLimit and Processes are rlimits
	// alone (and sandboxed workers under a MemoryLimit are refused memfd_create and shmget).
	NoCgroup bool
	// Preload names modules ("numpy", "pandas", "matplotlib.pyplot") that every worker
	// imports as it starts, before its first run: workers are started ahead of need (at
	// NewIsolated and NewNamespace, and as soon as one is lost), so a session's first cell
	// does not pay for them. A module that cannot be imported fails the worker's start
	// (NewIsolated, or the namespace's first use, returns the error). The imports count
	// towards StartTimeout and run under the worker's limits.
	Preload []string
	// Startup is Python code that every worker runs once as it starts, after Preload and
	// before its first run, in a module of its own, as IPython runs its startup files: to
	// register display formatters (__minipy__.display_formatter.formatters, docs/notebook.md),
	// patch a library, set defaults. With the template (the default) it runs there, once,
	// and every worker forked from it starts with it done. Code that fails fails the
	// worker's start, with its error, as a Preload import does; what it prints is dropped.
	Startup string
}

// DefaultMemoryBudget is IsolatedConfig.MemoryBudget when it is 0: three quarters of the
// memory the host process may use (the machine's, or its cgroup's limit when lower), the
// rest left for the host, the template and the system; in whole MiB.
func DefaultMemoryBudget() int64 {
	return HostMemory() / 4 * 3 >> 20 << 20
}

// HostMemory is the memory this process may use: the machine's (MemTotal), or less where
// its memory cgroup, or one above it, has a lower limit; 0 if none of it can be read.
func HostMemory() int64 { return worker.HostMemory() }

// DefaultMaxTransfer is IsolatedConfig.MaxTransfer when it is 0: 64 MiB.
const DefaultMaxTransfer = worker.DefaultMaxTransfer

// The bounds of IsolatedConfig.MaxTransfer: a run's result needs room for its output
// (runtime.py's _fit_run_reply), and a frame's length is a u32.
const (
	minTransfer = 1 << 20
	maxTransfer = 1 << 30
)

// Mount shares a host path with sandboxed workers (IsolatedConfig.Mounts).
//
// The code uses it as the workers' host user: the host's own user, or nobody (uid and gid
// 65534) when the host runs as root. On a root host, a Mount that nobody could not use as
// it says, by the mode of Source (read a read-only one; write a Writable one, such as a
// directory of root's that os.MkdirTemp or t.TempDir made), is an idmapped bind mount
// (Linux 5.12 or later): through it Source's owner and group are the workers' user, so the
// code reads and writes what they may, and what it writes belongs to them on the host.
// Files of other users under it keep their own permissions for the code (it is none of
// them). NewIsolated fails with ErrSandboxAccess, naming the path and the fix, for a Mount
// the workers could not use: one that an unprivileged host's user may not use as it says,
// or one that needs an idmapped mount where none can be made: on a file system that
// refuses them (ramfs, /proc, NFS, most FUSE file systems, tmpfs before Linux 6.3), or by
// a root without CAP_SYS_ADMIN (a container's, by default).
type Mount struct {
	// Source is the host's file or directory (an absolute path that exists). Sandboxed
	// workers open it as they set up their sandbox, with the host's user's access or, when
	// the host runs as root, that of root in a user namespace of their own, which enters
	// root's private directories but not another user's (ErrSandboxAccess).
	Source string
	// Target is where the worker sees it (absolute; "" means Source). It may not be "/"
	// or lie under /proc or /dev. Under the worker's working directory (/work, or
	// WorkDirPath), its mount point is made in the engine's working directory.
	Target string
	// Writable lets the code write through to Source; otherwise it is read-only.
	Writable bool
}

// moduleName is a dotted Python module name.
var moduleName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$`)

// withDefaults checks cfg and fills in its defaults.
// processFloor is MinProcesses, but for the test that starts a sandbox below it.
var processFloor = MinProcesses

func withDefaults(cfg IsolatedConfig) (IsolatedConfig, error) {
	if cfg.Workers < 0 {
		return cfg, errors.New("minipy: IsolatedConfig.Workers must not be negative")
	}
	if cfg.Spares > 0 && cfg.Workers > 0 {
		return cfg, errors.New("minipy: IsolatedConfig.Spares applies to a worker per namespace (Workers 0)")
	}
	if cfg.KickSignal == 0 {
		cfg.KickSignal = DefaultKickSignal
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = 30 * time.Second
	}
	if len(cfg.Command) > 0 && !cfg.Network {
		return cfg, errors.New("minipy: IsolatedConfig.Command workers cannot be cut off from the network here " +
			"(the command itself may need it); set Network: true and isolate the other side")
	}
	if len(cfg.Command) == 0 && cfg.Python == "" {
		cfg.Python = defaultWorkerPython()
	}
	if cfg.Egress != nil && (cfg.Network || len(cfg.Command) > 0) {
		return cfg, errors.New("minipy: IsolatedConfig.Egress is the way out of a sandbox without a network of its " +
			"own: it cannot go with Network (the host's network) or Command (workers elsewhere)")
	}
	switch {
	case cfg.MaxTransfer == 0:
		cfg.MaxTransfer = DefaultMaxTransfer
	case cfg.MaxTransfer < minTransfer || cfg.MaxTransfer > maxTransfer:
		return cfg, fmt.Errorf("minipy: IsolatedConfig.MaxTransfer must be %d (1 MiB) to %d (1 GiB) bytes, or 0 for "+
			"DefaultMaxTransfer", minTransfer, maxTransfer)
	}
	if len(cfg.Command) == 0 && cfg.Processes > 0 && cfg.Processes < processFloor {
		return cfg, fmt.Errorf("minipy: IsolatedConfig.Processes must be at least %d (MinProcesses: what a sandbox "+
			"needs of its own), 0 for DefaultProcesses, or Unlimited; it is %d", processFloor, cfg.Processes)
	}
	if cfg.TmpSize < 0 {
		return cfg, errors.New("minipy: IsolatedConfig.TmpSize must not be negative")
	}
	if cfg.TmpSize == 0 {
		cfg.TmpSize = worker.DefaultTmpSize
	}
	if cfg.WorkSize == 0 {
		cfg.WorkSize = defaultWorkSize
	}
	if cfg.MemoryBudget == 0 {
		cfg.MemoryBudget = DefaultMemoryBudget()
	}
	if err := checkEnv(cfg.Env, len(cfg.Command) > 0); err != nil {
		return cfg, err
	}
	for _, name := range cfg.Preload {
		if !moduleName.MatchString(name) {
			return cfg, fmt.Errorf("minipy: IsolatedConfig.Preload: %q is not a module name (such as numpy or matplotlib.pyplot)", name)
		}
	}
	workDir, err := checkWorkDirPath(cfg.WorkDirPath)
	if err != nil {
		return cfg, err
	}
	cfg.WorkDirPath = workDir
	mounts, err := checkMounts(cfg.Mounts)
	if err != nil {
		return cfg, err
	}
	cfg.Mounts = mounts
	if len(cfg.Command) > 0 && len(cfg.Mounts) > 0 {
		return cfg, errors.New("minipy: IsolatedConfig.Mounts apply to local workers; a Command worker's files are the other side's")
	}
	if cfg.Cgroup != "" && (len(cfg.Command) > 0 || cfg.NoCgroup) {
		return cfg, errors.New("minipy: IsolatedConfig.Cgroup applies to local workers with a cgroup (not with Command or NoCgroup)")
	}
	return cfg, nil
}

// processCap is the Processes limit of cfg's workers: 0 for none. sandboxed says whether
// they are local workers in the sandbox, where each sandbox is a user namespace whose
// count is its own (DefaultProcesses when cfg gives none).
func (cfg IsolatedConfig) processCap(sandboxed bool) int {
	switch {
	case cfg.Processes > 0:
		return cfg.Processes
	case cfg.Processes == 0 && sandboxed:
		return DefaultProcesses
	}
	return 0
}

// residentCap is the memory limit of each sandbox's cgroup: ResidentLimit, else
// MemoryLimit; 0 for none.
func (cfg IsolatedConfig) residentCap() int64 {
	if cfg.ResidentLimit != 0 {
		return max(cfg.ResidentLimit, 0)
	}
	return max(cfg.MemoryLimit, 0)
}

// checkEnv checks IsolatedConfig.Env; a Command worker gets it (and a sandboxed worker
// PYTHONPATH) through a config frame of lines, so those values may not hold line breaks.
func checkEnv(env []string, command bool) error {
	for _, kv := range env {
		key, _, ok := strings.Cut(kv, "=")
		// A Command worker gets Env, and a sandboxed one PYTHONPATH, through the config frame.
		lines := command || key == "PYTHONPATH"
		if !ok || key == "" || strings.ContainsRune(kv, 0) || lines && strings.ContainsAny(kv, "\n\r") {
			return fmt.Errorf("minipy: IsolatedConfig.Env entry %q is not KEY=VALUE (a non-empty key, no NUL byte"+
				", no line break for Command workers or in PYTHONPATH)", kv)
		}
	}
	return nil
}

// checkWorkDirPath checks IsolatedConfig.WorkDirPath and returns it clean ("": the default).
func checkWorkDirPath(p string) (string, error) {
	if p == "" {
		return worker.SandboxWorkdir, nil
	}
	clean := filepath.Clean(p)
	bad := func(why string) (string, error) {
		return "", fmt.Errorf("minipy: IsolatedConfig.WorkDirPath %q: %s", p, why)
	}
	switch {
	case !filepath.IsAbs(p):
		return bad("it must be absolute")
	case clean == "/":
		return bad("it cannot be the root")
	case strings.ContainsAny(clean, "\n\r\t\x00"):
		return bad("it may not hold line breaks, tabs or NUL bytes")
	}
	for _, reserved := range worker.SandboxReserved {
		if clean == reserved || strings.HasPrefix(clean, reserved+"/") {
			return bad("the sandbox makes or binds " + reserved + " itself")
		}
	}
	return clean, nil
}

// checkMounts checks IsolatedConfig.Mounts and returns them with clean paths and targets
// filled in.
func checkMounts(mounts []Mount) ([]Mount, error) {
	out := make([]Mount, 0, len(mounts))
	for _, m := range mounts {
		if m.Target == "" {
			m.Target = m.Source
		}
		bad := func(why string) error {
			return fmt.Errorf("minipy: IsolatedConfig.Mounts: %q -> %q: %s", m.Source, m.Target, why)
		}
		if !filepath.IsAbs(m.Source) || !filepath.IsAbs(m.Target) {
			return nil, bad("paths must be absolute")
		}
		m.Source, m.Target = filepath.Clean(m.Source), filepath.Clean(m.Target)
		if strings.ContainsAny(m.Source+m.Target, "\n\r\t\x00") {
			return nil, bad("paths may not hold line breaks, tabs or NUL bytes")
		}
		for _, reserved := range []string{"/proc", "/dev", worker.SandboxTree} {
			if m.Target == reserved || strings.HasPrefix(m.Target, reserved+"/") {
				return nil, bad("the sandbox makes " + reserved + " itself")
			}
		}
		if m.Target == "/" {
			return nil, bad("the target cannot be the root")
		}
		if _, err := os.Stat(m.Source); err != nil {
			return nil, bad(err.Error())
		}
		out = append(out, m)
	}
	return out, nil
}
