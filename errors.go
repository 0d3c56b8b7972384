package minipy

import (
	"errors"
	"fmt"
	"time"
)

// ErrTimeout is matched (errors.Is) by the error of a run stopped because its
// Options.Timeout or its context's deadline passed.
var ErrTimeout = errors.New("minipy: run timed out")

// ErrNameNotFound is matched by Namespace.Get's error for a name that is not defined.
var ErrNameNotFound = errors.New("minipy: name not defined")

// ErrUnsupportedValue is matched by Namespace.Get's error for a value with no Go
// equivalent (the error's text carries its type and repr).
var ErrUnsupportedValue = errors.New("minipy: value has no Go equivalent")

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
