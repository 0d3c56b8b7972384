//go:build !cgo

package cpython

import (
	"errors"
	"time"
)

// ErrNoCgo is what every in-process operation returns in a build without cgo.
var ErrNoCgo = errors.New("minipy: the in-process engine embeds CPython through cgo, and this binary was built with CGO_ENABLED=0; build with CGO_ENABLED=1 and python3-dev (pkg-config python3-embed) installed")

// Interpreter is unavailable without cgo.
type Interpreter struct{}

// Start always fails without cgo.
func Start(kickSignal int) (*Interpreter, error) { return nil, ErrNoCgo }

// Request is unavailable without cgo.
type Request struct{}

// Submit is unreachable without cgo (Start fails).
func (*Interpreter) Submit(req []byte, hostCalls bool) Request { panic(ErrNoCgo) }

// ThreadID is unreachable without cgo.
func (*Interpreter) ThreadID() int { panic(ErrNoCgo) }

// NextCall is unreachable without cgo.
func NextCall(d time.Duration) []byte { panic(ErrNoCgo) }

// Reply is unreachable without cgo.
func Reply(id uint64, status byte, payload []byte) { panic(ErrNoCgo) }

// Wait is unreachable without cgo.
func (Request) Wait(d time.Duration, events bool) bool { panic(ErrNoCgo) }

// WaitDone is unreachable without cgo.
func (Request) WaitDone() { panic(ErrNoCgo) }

// Kick is unreachable without cgo.
func (Request) Kick(stage int) { panic(ErrNoCgo) }

// Wake is unreachable without cgo.
func (*Interpreter) Wake() { panic(ErrNoCgo) }

// Events is unreachable without cgo.
func (Request) Events() ([]byte, int) { panic(ErrNoCgo) }

// ID is unreachable without cgo.
func (Request) ID() uint64 { panic(ErrNoCgo) }

// Take is unreachable without cgo.
func (Request) Take() ([]byte, bool) { panic(ErrNoCgo) }

// LinkedVersion is unknown without cgo: no libpython is linked.
func LinkedVersion() string { return "" }

// LinkedPython is unknown without cgo: no libpython is linked.
func LinkedPython() string { return "" }

// FreeThreaded is unknown without cgo: no libpython is linked.
func FreeThreaded() bool { return false }

// InlineHandler serves a call of a Function.Inline function (see the cgo build).
type InlineHandler func(frame []byte) (status byte, payload []byte)

// SetInlineHandler is unreachable without cgo (Start fails).
func SetInlineHandler(InlineHandler) { panic(ErrNoCgo) }

// ForkCode is nil without cgo: the isolated engine's snapshots fork with os.fork.
func ForkCode() []byte { return nil }
