package session

import (
	"context"
	"fmt"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/minipy-go/minipy"
)

// Every run outcome has its label.
func TestOutcome(t *testing.T) {
	py := &minipy.PythonError{Type: "ValueError"}
	for err, want := range map[error]string{
		nil: outcomeOK,
		py:  outcomePythonError,
		fmt.Errorf("%w: x", minipy.ErrBadArguments):                                                            outcomeBadArgs,
		&minipy.InterruptedError{Cause: minipy.ErrTimeout}:                                                     outcomeTimeout,
		&minipy.InterruptedError{Cause: context.Canceled}:                                                      outcomeCancelled,
		&minipy.WorkerLostError{Signal: syscall.SIGSEGV, RolledBack: true}:                                     outcomeRolledBack,
		&minipy.WorkerLostError{Signal: syscall.SIGSEGV}:                                                       outcomeWorkerLost,
		&minipy.LimitError{Limit: "memory", Python: py}:                                                        outcomeLimit,
		minipy.ErrEngineClosed:                                                                                 outcomeError,
		&minipy.WorkerLostError{Killed: true, Interrupted: &minipy.InterruptedError{Cause: minipy.ErrTimeout}}: outcomeTimeout,
	} {
		assert.Equal(t, want, Outcome(err), "%v", err)
	}
}
