package minipy

import (
	"context"
	"errors"
	"time"

	"github.com/minipy-go/minipy/internal/procstat"
)

// How a run that passes its deadline is stopped, for both engines:
//
//  1. At the deadline (or when the context ends) the engine "kicks" the code: a signal to
//     the thread running it, whose handler raises minipy.TimeoutInterrupt, a BaseException
//     that `except Exception:` does not catch. Blocking calls (sleep, input, socket reads,
//     join, subprocess waits) return early because the signal interrupts them.
//  2. If the code is still running hardStageAfter after the first kick (it swallowed it with a
//     bare `except:`), the kick escalates: the exception is raised again on every line.
//  3. If it is still running abandonAfter the first kick (a C call holding the GIL, such as
//     sum(range(10**10))), the in-process engine returns ErrTimeout without waiting and the
//     interpreter stays busy until that call ends; the isolated engine kills the worker.
//
// Both stages count the time the code could run: the wall clock since the first kick, less
// the longest time one of its processes' main threads (the interpreter's thread
// in-process) waited for a CPU meanwhile, when the engine can tell (runQueueWaiter). On a
// loaded machine a run that was ready to stop, but not scheduled, is then neither hit on
// every line of its cleanup nor abandoned (for the isolated engine: killed and rolled back)
// for the machine's load. abandonCap bounds the grace on the wall clock all the same.
const (
	kickRepeat     = 20 * time.Millisecond
	hardStageAfter = 100 * time.Millisecond
	abandonAfter   = 500 * time.Millisecond
	abandonCap     = 10 * abandonAfter
)

// runQueueWaiter is a runHandle that can tell how long its code's threads have waited for
// a CPU: procstat.Waits of them (nil: it cannot tell).
type runQueueWaiter interface {
	runQueueWaits() map[int]time.Duration
}

// runHandle is a run in progress on one of the engines.
type runHandle interface {
	// wait waits up to d (negative: no limit) for the run to finish or for wake; it
	// reports whether the run finished.
	wait(d time.Duration) bool
	// kick interrupts the run at stage 1 or 2 if it is still running.
	kick(stage int)
	// wake makes a pending wait return.
	wake()
}

// stop records why and when a run was stopped; its zero value means it was not.
type stop struct {
	cause       error // ErrTimeout or the context's error
	ctxDeadline bool
	at          time.Time // the deadline, or when the context ended
	kickedAt    time.Time // when the first kick was sent
	abandoned   bool
}

// supervise waits for h to finish, kicking it when the deadline passes or ctx ends.
func supervise(ctx context.Context, h runHandle, dl deadline) stop {
	var s stop
	if ctx.Done() != nil {
		defer context.AfterFunc(ctx, h.wake)()
	}
	queue, _ := h.(runQueueWaiter)
	var waitsAtKick map[int]time.Duration
	// had is how long the code could run since the first kick, and since is the wall clock.
	had := func(now time.Time) (had, since time.Duration) {
		since = now.Sub(s.kickedAt)
		if waitsAtKick == nil {
			return since, since
		}
		return since - procstat.MostWaited(waitsAtKick, queue.runQueueWaits()), since
	}
	for {
		d := time.Duration(-1)
		if s.cause != nil {
			// Repeat the kick, but wake exactly at the next stage boundary (or the first
			// moment it can be reached): giving up is then on time, not up to a repeat
			// interval late.
			d = kickRepeat
			got, _ := had(time.Now())
			for _, boundary := range [...]time.Duration{hardStageAfter, abandonAfter} {
				if left := boundary - got; left > 0 && left < d {
					d = left
				}
			}
		} else if !dl.at.IsZero() {
			// max: a deadline already past (a timeout of a few microseconds) must kick now;
			// a negative wait would mean "no limit" and the run would never be stopped.
			d = max(time.Until(dl.at), 0)
		}
		if h.wait(d) {
			return s
		}
		now := time.Now()
		if s.cause == nil {
			switch err := ctx.Err(); {
			case err != nil:
				s.cause, s.ctxDeadline, s.at = err, errors.Is(err, context.DeadlineExceeded), now
			case !dl.at.IsZero() && !now.Before(dl.at) && dl.fromContext:
				// The context's own timer may not have fired yet; it is its deadline all the same.
				s.cause, s.ctxDeadline, s.at = context.DeadlineExceeded, true, dl.at
			case !dl.at.IsZero() && !now.Before(dl.at):
				s.cause, s.at = ErrTimeout, dl.at
			default:
				continue
			}
			s.kickedAt = now
			if queue != nil {
				waitsAtKick = queue.runQueueWaits()
			}
			h.kick(1)
			continue
		}
		// Counted from the first kick, not from the deadline: on a starved machine the
		// watchdog itself may wake late, and the code must still get the whole grace
		// (seen: a first kick 480 ms late, with 4 CPU-bound processes on 2 cores).
		got, late := had(now)
		if got >= abandonAfter || late >= abandonCap {
			s.abandoned = true
			return s
		}
		stage := 1
		if got >= hardStageAfter {
			stage = 2
		}
		h.kick(stage)
	}
}

// interrupted builds the error of a stopped run.
func (s stop) interrupted(started time.Time, py *PythonError) error {
	return &InterruptedError{
		Cause:     s.cause,
		After:     s.at.Sub(started),
		Python:    py,
		Abandoned: s.abandoned,
		deadline:  s.ctxDeadline,
	}
}

// notStarted is the error of a run whose context ended before it started: an
// InterruptedError like any other stop, so that errors.Is(err, ErrTimeout) holds for a
// context deadline whether it passed just before the run or during it.
func notStarted(ctxErr error) error {
	return &InterruptedError{Cause: ctxErr, deadline: errors.Is(ctxErr, context.DeadlineExceeded)}
}

// turn is an engine's (or a worker's) interpreter token: held while a request is in
// flight, so requests take turns. A buffered channel of capacity 1.
type turn chan struct{}

// acquire takes the turn, giving up when dl passes or ctx ends.
func (t turn) acquire(ctx context.Context, dl deadline) error {
	select {
	case t <- struct{}{}:
		return nil
	default:
	}
	var timeout <-chan time.Time
	if !dl.at.IsZero() {
		timer := time.NewTimer(time.Until(dl.at))
		defer timer.Stop()
		timeout = timer.C
	}
	select {
	case t <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-timeout:
		if dl.fromContext {
			return context.DeadlineExceeded
		}
		return ErrTimeout
	}
}

// release gives the turn back.
func (t turn) release() { <-t }

// deadline is when a run must stop (zero: never) and whether that is its context's.
type deadline struct {
	at          time.Time
	fromContext bool
}

// runDeadline is when a run started at now must stop: Options.Timeout (0: the default,
// negative: none) or the context's deadline, whichever is first.
func runDeadline(ctx context.Context, now time.Time, timeout time.Duration) deadline {
	var dl deadline
	if timeout == 0 {
		timeout = DefaultTimeout
	}
	if timeout > 0 {
		dl.at = now.Add(timeout)
	}
	if d, ok := ctx.Deadline(); ok && (dl.at.IsZero() || d.Before(dl.at)) {
		dl = deadline{at: d, fromContext: true}
	}
	return dl
}

// admit is how both engines' runs start: a run from inside a host function of the runs it
// would wait for is refused (ErrReentrant), a done ctx never starts one, and the run waits
// for its turn on token within its deadline, which it returns.
func admit(ctx context.Context, token turn, reentrant bool, started time.Time, opts *Options) (deadline, error) {
	if reentrant {
		return deadline{}, ErrReentrant
	}
	if err := ctx.Err(); err != nil {
		return deadline{}, notStarted(err)
	}
	dl := runDeadline(ctx, started, timeoutOf(opts))
	if err := token.acquire(ctx, dl); err != nil {
		return dl, &InterruptedError{Cause: waitCause(err), After: time.Since(started),
			deadline: errors.Is(err, context.DeadlineExceeded)}
	}
	return dl, nil
}

// finish is how both engines' runs end when the code answered: the reply decoded into res,
// then the run's interruption if it was kicked for its deadline or ctx (with the
// exception it raised), else the exception, else nil.
func finish(res *Result, resp []byte, kicked bool, s stop, started time.Time) (*Result, error) {
	py, err := runReply(resp, res)
	res.Duration = time.Since(started)
	switch {
	case err != nil:
		return res, err
	case kicked && s.cause != nil:
		return res, s.interrupted(started, py)
	case py != nil:
		return res, py
	}
	return res, nil
}
