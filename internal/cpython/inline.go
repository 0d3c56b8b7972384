//go:build cgo

package cpython

// The Go side of host_call_inline (cpython.c): a file of its own, since a file with
// //export may only declare in its preamble.

/*
#include <stdlib.h>
*/
import "C"

import (
	"sync/atomic"
	"unsafe"

	"github.com/minipy-go/minipy/internal/pyrt"
)

// InlineHandler serves one host call event on the interpreter's own thread (see
// SetInlineHandler): it returns the call's status (pyrt's Call*) and reply payload.
type InlineHandler func(frame []byte) (status byte, payload []byte)

var inlineHandler atomic.Pointer[InlineHandler]

// SetInlineHandler sets what serves the calls of functions marked inline. Until it is set
// they are refused (pyrt.CallRefused).
func SetInlineHandler(h InlineHandler) { inlineHandler.Store(&h) }

//export mpHostCallInline
func mpHostCallInline(frame *C.char, n C.size_t, status *C.int, resp **C.char, respLen *C.size_t) {
	h := inlineHandler.Load()
	if h == nil {
		*status = C.int(pyrt.CallRefused)
		return
	}
	// A copy: the decoded arguments may keep slices of it after the call.
	st, payload := (*h)(C.GoBytes(unsafe.Pointer(frame), C.int(n)))
	*status = C.int(st)
	if len(payload) > 0 {
		*resp = (*C.char)(C.CBytes(payload)) // freed by host_call_inline
		*respLen = C.size_t(len(payload))
	}
}
