package minipy

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"syscall"
	"time"

	"github.com/minipy-go/minipy/internal/sandboxfs"
	"github.com/minipy-go/minipy/internal/worker"
)

// ErrTimeout is matched (errors.Is) by the error of a run stopped because its
// Options.Timeout or its context's deadline passed.
var ErrTimeout = errors.New("minipy: run timed out")

// ErrNameNotFound is matched by Namespace.Get's error for a name that is not defined.
var ErrNameNotFound = errors.New("minipy: name not defined")

// ErrUnsupportedValue is matched by Namespace.Get's error for a value with no Go
// equivalent (the error's text carries its name, why and its repr: a value that contains
// itself, or nests deeper than the codec allows), and by *UnsupportedTypeError, Set's error
// for a Go value with no Python equivalent.
var ErrUnsupportedValue = errors.New("minipy: value has no Go equivalent")

// ErrBadArguments is matched by ToolResult.Err when the model's tool arguments were not a
// valid call (no code, a timeout that is not a duration, not JSON): nothing ran.
var ErrBadArguments = errors.New("minipy: the tool's arguments are not a valid call")

// ErrNamespaceClosed is matched by the error of any use of a closed Namespace.
var ErrNamespaceClosed = errors.New("minipy: namespace is closed")

// The oldest CPython minipy supports: internal/cpython does not build against an older
// libpython (its #error, pinned to these by a test), and NewIsolated refuses an older worker.
const (
	minPythonMajor = 3
	minPythonMinor = 11
)

// ErrPythonVersion is matched by NewIsolated's error when the worker's Python is older than
// 3.11, the oldest minipy supports.
var ErrPythonVersion = errors.New("minipy: the worker's Python is too old")

// PythonError is an exception raised by the code of a run, a SyntaxError included.
// SystemExit, KeyboardInterrupt and every other BaseException arrive as a PythonError too:
// they never end or crash the host process.
type PythonError struct {
	// Type is the exception's class: "ZeroDivisionError" for builtins, "module.Class"
	// for others ("minipy.TimeoutInterrupt" for a run minipy stopped).
	Type string
	// Message is str(exception).
	Message string
	// Traceback is the formatted traceback as Python prints it, with the user's source
	// lines (each run is the file "<cell-N>") and none of minipy's own frames.
	Traceback string
}

func (e *PythonError) Error() string {
	if e.Message == "" {
		return e.Type
	}
	return e.Type + ": " + e.Message
}

// InterruptedError is the error of a run that was stopped before it finished: its
// deadline passed (errors.Is(err, ErrTimeout); also context.DeadlineExceeded when the
// context's deadline was the one) or its context was cancelled (errors.Is(err,
// context.Canceled)). errors.As reaches the *PythonError with the traceback of where the
// code was when it stopped, unless the code never yielded (Abandoned).
type InterruptedError struct {
	// Cause is ErrTimeout or the context's error.
	Cause error
	// After is how long the run had been going when it was stopped.
	After time.Duration
	// Python is where the code was stopped; nil when the run was abandoned.
	Python *PythonError
	// Abandoned is true when the code did not yield to the interrupt in time (a C call
	// that holds the GIL): the call returned, but the interpreter stays busy until that
	// code finishes, and later runs wait for it.
	Abandoned bool

	deadline bool // Cause came from a context deadline
}

func (e *InterruptedError) Error() string {
	what := "timed out"
	if !errors.Is(e.Cause, ErrTimeout) {
		what = "cancelled (" + e.Cause.Error() + ")"
	}
	msg := fmt.Sprintf("minipy: run %s after %v", what, e.After.Round(time.Millisecond))
	if e.Abandoned {
		msg += "; the code did not yield (a long C call?) and still holds the interpreter"
	}
	return msg
}

// Unwrap gives errors.Is and errors.As the cause, ErrTimeout for a context deadline, and
// the Python error.
func (e *InterruptedError) Unwrap() []error {
	errs := []error{e.Cause}
	if e.deadline {
		errs = append(errs, ErrTimeout)
	}
	if e.Python != nil {
		errs = append(errs, e.Python)
	}
	return errs
}

// UnsupportedTypeError is returned by Namespace.Set for a Go value with no Python
// equivalent in the type table of the package doc. It matches ErrUnsupportedValue.
type UnsupportedTypeError struct {
	Type reflect.Type
}

func (e *UnsupportedTypeError) Error() string {
	return fmt.Sprintf("minipy: a Go value of type %v has no Python equivalent (see the type table in the package doc)", e.Type)
}

// Is makes errors.Is(err, ErrUnsupportedValue) hold, for values refused either way.
func (e *UnsupportedTypeError) Is(target error) bool { return target == ErrUnsupportedValue }

// ---- the in-process engine ----

// ErrKickSignal is matched by Start's error for a KickSignal outside 34..64.
var ErrKickSignal = errors.New("minipy: the kick signal must be a real-time signal from 34 (SIGRTMIN+2) to 64 (SIGRTMAX)")

// ErrAlreadyStarted is matched by Start's error when the interpreter already runs with
// another configuration (Start came after the first run, or twice).
var ErrAlreadyStarted = errors.New("minipy: the in-process interpreter is already running")

// ErrInterpreterBusy is matched by the error of a Namespace method called while an abandoned
// run (a C call that ignored its timeout) still holds the in-process interpreter.
var ErrInterpreterBusy = errors.New("minipy: the in-process interpreter is still busy with an abandoned run (a C call that ignored its timeout)")

// ---- the isolated engine ----

// ErrStateLost is matched (errors.Is) by the error of a run whose worker process ended,
// killed after its deadline or crashed: the variables of every namespace on that worker
// are gone. The next run starts on a fresh worker with empty namespaces.
var ErrStateLost = errors.New("minipy: the worker process ended; its namespaces' variables are lost")

// ErrLimit is matched by the error of a run that hit one of IsolatedConfig's limits.
var ErrLimit = errors.New("minipy: resource limit hit")

// ErrNoSandbox is matched by NewIsolated's error when the kernel refuses what isolates
// local workers (user, mount, pid, IPC, UTS and network namespaces; the mounts of the worker's
// own root file system) and AllowUnsandboxed is false.
var ErrNoSandbox = worker.ErrNoSandbox

// ErrNoCgroup is matched by NewIsolated's error when IsolatedConfig.Cgroup names a cgroup
// the engine cannot make its own under (missing, not writable, without the memory and
// pids controllers, or holding processes on cgroup v2); the error says which. It is also
// IsolatedStats.CgroupError's, when the engine found none to use by itself.
var ErrNoCgroup = worker.ErrNoCgroup

// ErrSandboxAccess is matched (with fs.ErrPermission) by the error of NewIsolated or of a
// worker's start when a host path that sandboxed workers need, their Python or a Mount's
// Source, is one they may not reach, or a Mount is one the code could not use as it says
// (see Mount: read it, or write a Writable one); the error names it and the fix. They reach
// the host's paths as the host's user or, on a root host, as root within a user namespace of
// their own, which passes root's private directories (/root) but not another user's. It
// never matches ErrNoSandbox: AllowUnsandboxed does not fall back on it.
var ErrSandboxAccess = worker.ErrSandboxAccess

// ErrNoRootUser is matched by NewIsolated's error when IsolatedConfig.RootUser cannot be
// served (the host is not root, NoTemplate, no sandbox), and by Start's for a command as
// root in a sandbox without a root user.
var ErrNoRootUser = worker.ErrNoRootUser

// ErrStartKilled is the error of a run (or NewIsolated) whose worker could not be started
// because something outside minipy killed each try (three) as it started: an operator, the
// OOM killer, the engine's template killed with every sandbox forked from it. Nothing of
// the configuration is wrong; a later run starts one again.
var ErrStartKilled = worker.ErrStartKilled

// ErrBadPath is matched by the error of a Namespace file method (WriteFile, ReadFile,
// ListFiles, ...) given a name that is absolute, holds "..", or resolves through a
// symbolic link out of the namespace's working directory (the code may make links to
// anywhere; the host never follows one out). Nothing was read or written.
var ErrBadPath = sandboxfs.ErrBadPath

// ErrBadState is matched by Namespace.Restore's error for input that is not a saved
// namespace this minipy can restore here: empty, truncated, foreign, a later format, saved
// by another Python minor version, or holding values that cannot be loaded here (a module
// that is not installed). The namespace is unchanged.
var ErrBadState = errors.New("minipy: not a saved namespace that can be restored here")

// ErrUntrustedState is matched by Namespace.Restore's error for a namespace saved by an
// isolated engine, restored into one of the in-process engine: its variables are a pickle
// that sandboxed code wrote, and unpickling runs code, here in the host process. Nothing of
// it is loaded, and the namespace is unchanged. Namespace.RestoreTrusted restores it all
// the same, for a caller who knows what the code was.
var ErrUntrustedState = errors.New("minipy: the saved namespace comes from a sandbox: restoring it in the host " +
	"process would run the sandboxed code's pickle here (RestoreTrusted if it is yours)")

// ErrStateTag is matched by Namespace.Restore's error for a saved namespace whose tag does
// not match under this process's state key (SetStateKey): sealed with another key, or
// altered. Nothing of it is loaded, and the namespace is unchanged.
var ErrStateTag = errors.New("minipy: the saved namespace's tag does not match the state key (another key, or altered)")

// ErrNoFiles is matched by the error of a Namespace file method on a namespace whose files
// the host cannot reach apart from its own: an in-process namespace's code shares the host
// process's file system and working directory (use the os package), and a Command worker's
// files are on the far side.
var ErrNoFiles = errors.New("minipy: this namespace has no working directory of its own")

// ErrEngineClosed is matched by the error of any use of a closed isolated engine.
var ErrEngineClosed = sandboxfs.ErrClosed

// ErrProtocol is matched by the error of a run or Namespace method whose worker broke the
// protocol: it sent the host what no worker sends, such as a frame larger than
// IsolatedConfig.MaxTransfer allows (refused at its header, before the host holds any of
// it). The code a worker runs can reach the worker's pipe to the host and write to it;
// minipy then kills the worker, and the error is a *WorkerLostError whose Protocol says
// what it sent.
var ErrProtocol = worker.ErrNotProtocol

// ErrFileTooLarge is matched by the error of Namespace.ReadFile, ReadFileTo and Save for a
// file of an isolated namespace's working directory that claims more bytes than the
// directory may hold (IsolatedConfig.WorkSize): a sparse file, whose holes would read as
// zeros (512 MiB of them from a 16 MiB directory, and 2.2 GiB of the host's memory for
// Save). Nothing is returned of it, and the host holds none of it.
var ErrFileTooLarge = sandboxfs.ErrFileTooLarge

// ErrTooLarge is matched by the error of Namespace.Get and Save on an isolated engine when
// the value, or the namespace's saved variables, are more bytes than a worker may send the
// host (IsolatedConfig.MaxTransfer). The worker and its namespaces are unchanged.
var ErrTooLarge = errors.New("minipy: more than a worker may send the host (IsolatedConfig.MaxTransfer)")

// ErrNoFork is matched by Namespace.Fork's error for a namespace that cannot be copied
// into a process of its own: one of the in-process engine (the host process is its
// process), of an isolated engine that packs namespaces into shared workers
// (IsolatedConfig.Workers), or of Command workers.
var ErrNoFork = errors.New("minipy: this namespace cannot be forked")

// WorkerLostError is the error of a run whose worker process ended (errors.Is(err,
// ErrStateLost)): killed because the run did not yield within the grace period after its
// deadline (Killed; errors.Is(err, ErrTimeout) then holds too), killed by a limit (Limit),
// or crashed (Signal or ExitCode).
type WorkerLostError struct {
	// Killed is true when minipy killed the worker because the run would not stop.
	Killed bool
	// Interrupted is why the run was stopped when Killed (ErrTimeout or the context's error).
	Interrupted *InterruptedError
	// Signal is the signal that ended the worker (0 if it exited).
	Signal syscall.Signal
	// ExitCode is the worker's exit status when it exited (-1 if it was signalled).
	ExitCode int
	// Limit names the limit that ended the worker ("cpu", "file size", "memory"), or "".
	Limit string
	// Stderr is the end of what the worker process itself wrote to its stderr (a segfault's
	// Python traceback, a fatal error); user output never goes there.
	Stderr string
	// Earlier is true when the worker ended before this run (another run on the same
	// worker crashed it, or it died while idle); this run did not start.
	Earlier bool
	// Idle is true (with Earlier) when the worker ended between runs, at At, and no
	// snapshot held the namespace's state to roll back to: Signal, ExitCode and Limit say
	// how it ended. (With a snapshot, a death between runs costs nothing: the snapshot
	// takes over at once, and the next run does not notice; IsolatedConfig.OnIdleDeath.)
	Idle bool
	// At is when the engine learned that the worker ended, for Idle.
	At time.Time
	// RolledBack is true when a snapshot of the worker taken before this run took its
	// place: the namespace is exactly as it was before the run (what the run assigned is
	// gone, what came before is kept), so the error does not match ErrStateLost.
	RolledBack bool
	// Protocol is set when minipy killed the worker because it broke the protocol (the
	// error matches ErrProtocol): it says what the worker sent, such as a frame past the
	// size cap (IsolatedConfig.MaxTransfer).
	Protocol error
}

func (e *WorkerLostError) Error() string {
	var what string
	switch {
	case e.Idle:
		how := fmt.Sprintf("exit status %d", e.ExitCode)
		if e.Limit != "" {
			how = "its " + e.Limit + " limit"
		} else if e.Signal != 0 {
			how = fmt.Sprintf("signal %d (%v)", int(e.Signal), e.Signal)
		}
		at := e.At.Format("15:04:05.000 MST")
		if e.RolledBack { // (IdleDeath.How only: no run fails for it)
			return fmt.Sprintf("minipy: the worker ended between runs, at %s (%s); its snapshot took over, holding "+
				"the state of the last run", at, how)
		}
		what = fmt.Sprintf("the worker holding this namespace ended between runs, at %s (%s), with no snapshot "+
			"to roll back to; this run did not start", at, how)
	case e.Earlier:
		what = "the worker holding this namespace ended before this run (see an earlier error), which did not start"
	case e.Killed:
		what = e.Interrupted.Error() + "; the code did not yield, so its worker process tree was killed"
	case e.Protocol != nil:
		what = e.Protocol.Error() + "; the worker was killed"
	case e.Limit == "memory":
		// (Only a cgroup's OOM killer says so, and it counts what the sandbox holds besides
		// the processes: files that outlive the run keep counting until they are removed.)
		what = "the worker was killed by its memory limit, which counts its sandbox's files in /tmp, /dev/shm " +
			"and the working directory and its SysV shared memory too, for as long as they exist"
	case e.Limit != "":
		what = fmt.Sprintf("the worker was killed by its %s limit", e.Limit)
	case e.Signal != 0:
		what = fmt.Sprintf("the worker crashed: signal %d (%v)", int(e.Signal), e.Signal)
	default:
		what = fmt.Sprintf("the worker exited with status %d", e.ExitCode)
	}
	if e.RolledBack {
		return "minipy: " + strings.TrimPrefix(what, "minipy: ") + "; the namespace was rolled back to before this run"
	}
	return "minipy: " + strings.TrimPrefix(what, "minipy: ") + "; the namespace's variables are lost"
}

// Unwrap gives errors.Is ErrStateLost, ErrLimit when a limit ended the worker, the
// interruption (ErrTimeout, context errors) when minipy killed it, and ErrProtocol when it
// broke the protocol.
func (e *WorkerLostError) Unwrap() []error {
	var errs []error
	if !e.RolledBack {
		errs = append(errs, ErrStateLost)
	}
	if e.Limit != "" {
		errs = append(errs, ErrLimit)
	}
	if e.Interrupted != nil {
		errs = append(errs, e.Interrupted)
	}
	if e.Protocol != nil {
		errs = append(errs, e.Protocol)
	}
	return errs
}

// LimitError is the error of a run that raised because it hit a limit but whose worker
// survived (a MemoryError under MemoryLimit): errors.As reaches the *PythonError.
type LimitError struct {
	// Limit is the limit hit ("memory").
	Limit string
	// Python is the exception the code raised.
	Python *PythonError
}

func (e *LimitError) Error() string {
	return fmt.Sprintf("minipy: the run hit the worker's %s limit: %v", e.Limit, e.Python)
}

// Unwrap gives errors.Is ErrLimit and errors.As the *PythonError.
func (e *LimitError) Unwrap() []error { return []error{ErrLimit, e.Python} }

// ErrInvalidFunction is matched by Namespace.Register's error for a Function it cannot
// bind: a name that is not a Python identifier (or dotted path of them), a nil Call, an
// input schema that is not a valid JSON Schema of type "object", or a Func whose input
// type has no schema.
var ErrInvalidFunction = errors.New("minipy: invalid host function")

// ErrReentrant is matched by the error of a Run, CallTool or Namespace method called from
// inside a host function (or with its context) on the interpreter that is waiting for
// that function: the run holds that interpreter, so the call could only deadlock. Another
// engine, or another worker of an isolated engine, serves such calls.
var ErrReentrant = errors.New("minipy: a host function cannot use the interpreter that is waiting for it")
