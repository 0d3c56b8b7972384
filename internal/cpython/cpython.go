//go:build cgo

// Package cpython is minipy's only cgo boundary: it starts CPython on one locked OS thread
// and hands it requests (bytes for runtime.py's dispatch) through the C slot in cpython.c.
// Each operation is one crossing to submit and one to wait; the kick that interrupts a run
// is one more, only when a deadline passes.
package cpython

/*
#cgo pkg-config: python3-embed
#cgo CFLAGS: -O2 -Wall -Wno-unused-parameter
#cgo LDFLAGS: -ldl
// Python's configuration first: pyconfig.h defines _POSIX_C_SOURCE and the like, which
// must come before any system header (3.15's redefines it otherwise, a warning under -Wall).
#include <pyconfig.h>
#include <patchlevel.h>
#include <stdlib.h>
#include "cpython.h"

#ifdef Py_GIL_DISABLED
#define MP_FREE_THREADED 1
#else
#define MP_FREE_THREADED 0
#endif
*/
import "C"

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/minipy-go/minipy/internal/pyrt"
)

// Interpreter is the process's embedded CPython. There is at most one; Start makes it.
type Interpreter struct{}

// Start initialises CPython on a new locked OS thread with kickSignal as the signal that
// interrupts runs. It must be called once per process.
func Start(kickSignal int) (*Interpreter, error) {
	src := C.CString(pyrt.Source)
	file := C.CString(pyrt.RuntimeFile)
	exe := C.CString(LinkedPython())
	go func() {
		// The owner never unlocks and never returns: CPython's main thread must stay the
		// thread that initialised it, and only it may run Python code for us.
		runtime.LockOSThread()
		thread.Store(int32(syscall.Gettid()))
		C.mp_serve(src, file, exe, C.int(kickSignal))
		// Reached only if initialisation failed.
		C.free(unsafe.Pointer(src))
		C.free(unsafe.Pointer(file))
		C.free(unsafe.Pointer(exe))
	}()
	if C.mp_init_wait() == 0 {
		return nil, errors.New("minipy: starting CPython: " + C.GoString(C.mp_init_error()))
	}
	return &Interpreter{}, nil
}

// thread is the id of the interpreter's thread (ThreadID).
var thread atomic.Int32

// ThreadID is the kernel's id of the thread that runs Python code (procstat.TaskWait).
func (*Interpreter) ThreadID() int { return int(thread.Load()) }

// Request is one request handed to the interpreter. The caller must hold the interpreter
// (only one request is in flight at a time) until Done reports true.
type Request struct {
	gen uint64
}

// Submit hands req to the interpreter. hostCalls lets its code call host functions (see
// NextCall and Reply); otherwise such calls fail at once.
func (*Interpreter) Submit(req []byte, hostCalls bool) Request {
	p := C.CBytes(req) // the slot owns a C copy: the caller may stop waiting before it is read
	h := C.int(0)
	if hostCalls {
		h = 1
	}
	return Request{gen: uint64(C.mp_submit((*C.char)(p), C.size_t(len(req)), h))}
}

// NextCall waits up to d (negative: no limit) for a host call of the interpreter's code and
// returns its event, a frame of kind pyrt.FrameCall (nil when d passed).
func NextCall(d time.Duration) (frame []byte) {
	var n C.size_t
	p := C.mp_host_next(C.int64_t(d), &n)
	if p != nil {
		frame = C.GoBytes(unsafe.Pointer(p), C.int(n))
		C.free(unsafe.Pointer(p))
	}
	return frame
}

// Reply answers the host call id (from NextCall) with status (pyrt's Call*) and payload.
// Safe from any goroutine; a call that stopped waiting ignores it.
func Reply(id uint64, status byte, payload []byte) {
	var p *C.char
	if len(payload) > 0 {
		p = (*C.char)(unsafe.Pointer(&payload[0])) // read (copied) during the call only
	}
	C.mp_reply(C.uint64_t(id), C.int(status), p, C.size_t(len(payload)))
}

// Wait waits up to d (negative: no limit) for the request to finish, for it to queue
// events (see Events) when events is true, or for Wake. It reports whether the request
// has finished.
func (r Request) Wait(d time.Duration, events bool) bool {
	e := C.int(0)
	if events {
		e = 1
	}
	return C.mp_wait(C.uint64_t(r.gen), C.int64_t(d), e) == 1
}

// Events takes the events the request has queued since the last call: frames of u32
// length, kind byte, u64 run id (the request's generation, see ID), payload; and how many
// bytes of output were dropped because the queue was full.
func (r Request) Events() (frames []byte, dropped int) {
	var n C.size_t
	var d C.uint64_t
	p := C.mp_events(&n, &d)
	if p != nil {
		frames = C.GoBytes(unsafe.Pointer(p), C.int(n))
		C.free(unsafe.Pointer(p))
	}
	return frames, int(d)
}

// ID is the request's generation, which its events carry as their run id.
func (r Request) ID() uint64 { return r.gen }

// WaitDone waits for the request to finish, however often Wake is called meanwhile (a
// context that ends after its own run has finished wakes whoever waits next).
func (r Request) WaitDone() {
	for !r.Wait(-1, false) {
	}
}

// Kick interrupts the request if it is still running (stage 1: raise the timeout once;
// stage 2: raise it on every line). Safe from any goroutine.
func (r Request) Kick(stage int) {
	C.mp_kick(C.uint64_t(r.gen), C.int(stage))
}

// Wake makes every pending Wait return (a caller's context was cancelled).
func (*Interpreter) Wake() { C.mp_wake() }

// Take returns the response of a finished request and whether it was kicked.
func (r Request) Take() (resp []byte, kicked bool) {
	var n C.size_t
	var k C.int
	p := C.mp_take(C.uint64_t(r.gen), &n, &k)
	if p == nil {
		return nil, false
	}
	resp = C.GoBytes(unsafe.Pointer(p), C.int(n))
	C.free(unsafe.Pointer(p))
	return resp, k != 0
}

// LinkedVersion is the "major.minor" of the libpython this binary is built against.
func LinkedVersion() string {
	return fmt.Sprintf("%d.%d", C.PY_MAJOR_VERSION, C.PY_MINOR_VERSION)
}

// FreeThreaded reports whether that libpython is a free-threaded build (no GIL; its
// executable is python3.13t).
func FreeThreaded() bool { return C.MP_FREE_THREADED != 0 }

var linked struct {
	once sync.Once
	path string
}

// LinkedPython is the python executable that belongs to the libpython this binary links,
// found from the library's own file (see findPython), or "" when there is none. It is what
// the in-process interpreter reports as sys.executable and what the isolated engine's
// workers run by default, so that both engines run one Python build.
func LinkedPython() string {
	linked.once.Do(func() {
		var lib string
		if p := C.mp_libpython_file(); p != nil {
			lib = C.GoString(p)
			if self, err := os.Executable(); err == nil && sameFile(self, lib) {
				lib = "" // libpython is linked into this binary statically
			}
		}
		name := "python" + LinkedVersion()
		if FreeThreaded() {
			name += "t"
		}
		linked.path = findPython(lib, name)
	})
	return linked.path
}

// ForkCode is the machine code of the isolated engine's forks (cpython.h's mp_fork_code),
// which local workers' pythons copy and call (worker.py's _ForkCode): a rollback snapshot
// that runs no Python until it takes over, a sandbox whose set-up runs none. It is for this
// machine only; nil where it cannot be found (then the workers fork with os.fork).
func ForkCode() []byte {
	forkCodeOnce.once.Do(func() { forkCodeOnce.code = readForkCode() })
	return forkCodeOnce.code
}

var forkCodeOnce struct {
	once sync.Once
	code []byte
}

// forkSection is the section that holds mp_fork_code alone (cpython.c).
const forkSection = "minipy_fork_code"

// readForkCode reads mp_fork_code's bytes: as many as its section has in this
// executable's section headers (which strip and go build's -s keep; no linker symbol, which
// Go's internal linker would not make), from memory, and only if the file's section holds
// the same bytes (the function first in it, the file this process runs: /proc/self/exe
// even if it was replaced since).
func readForkCode() []byte {
	f, err := elf.Open("/proc/self/exe")
	if err != nil {
		return nil
	}
	defer f.Close()
	sec := f.Section(forkSection)
	if sec == nil || sec.Size == 0 || sec.Size > 1<<16 {
		return nil
	}
	data, err := sec.Data()
	if err != nil {
		return nil
	}
	code := C.GoBytes(unsafe.Pointer(C.mp_fork_code), C.int(len(data)))
	if !bytes.Equal(code, data) {
		return nil
	}
	return code
}

// forkTable is the layout of mp_fork_code's table (MP_FT_*), which worker.py's _FT_* must
// match, forkOps its ops (MP_OP_*, worker.py's _OP_*), and forkSteps its steps' numbers
// (MP_SS_*), template.py's _SS_* (a test pins them).
func forkTable() map[string]int {
	return map[string]int{
		"BEFORE_FORK": C.MP_FT_BEFORE_FORK, "AFTER_PARENT": C.MP_FT_AFTER_PARENT, "AFTER_CHILD": C.MP_FT_AFTER_CHILD,
		"FORK": C.MP_FT_FORK, "CLOSE": C.MP_FT_CLOSE, "RECVMSG": C.MP_FT_RECVMSG, "EXIT": C.MP_FT_EXIT,
		"ERRNO": C.MP_FT_ERRNO, "SOCK": C.MP_FT_SOCK, "KIND": C.MP_FT_KIND, "WANT": C.MP_FT_WANT,
		"NCLOSE": C.MP_FT_NCLOSE, "CLOSE_FDS": C.MP_FT_CLOSE_FDS, "FDS": C.MP_FT_FDS, "OP": C.MP_FT_OP,
		"SYSCALL": C.MP_FT_SYSCALL, "S_FDS": C.MP_FT_S_FDS, "S_NCG": C.MP_FT_S_NCG, "S_CG": C.MP_FT_S_CG,
		"S_TREES": C.MP_FT_S_TREES, "S_TREE": C.MP_FT_S_TREE, "S_HOME": C.MP_FT_S_HOME,
		"S_WORKDIR": C.MP_FT_S_WORKDIR, "S_MAPS": C.MP_FT_S_MAPS, "S_UNSHARE": C.MP_FT_S_UNSHARE,
		"S_PORT": C.MP_FT_S_PORT, "S_LISTEN": C.MP_FT_S_LISTEN, "S_HOSTNAME": C.MP_FT_S_HOSTNAME,
		"S_PROC": C.MP_FT_S_PROC, "S_PROC_DIR": C.MP_FT_S_PROC_DIR, "S_TMPFS": C.MP_FT_S_TMPFS,
		"S_TMP_DIRS": C.MP_FT_S_TMP_DIRS, "S_TMP_DATA": C.MP_FT_S_TMP_DATA, "S_FD_PATH": C.MP_FT_S_FD_PATH,
		"S_NCOVERED": C.MP_FT_S_NCOVERED, "S_COVERED": C.MP_FT_S_COVERED, "S_COVERED_DIR": C.MP_FT_S_COVERED_DIR,
		"S_FILTER": C.MP_FT_S_FILTER, "S_LIFE": C.MP_FT_S_LIFE, "S_WHY": C.MP_FT_S_WHY, "G_CTL": C.MP_FT_G_CTL,
		"G_KICK": C.MP_FT_G_KICK, "G_REPORT": C.MP_FT_G_REPORT, "G_SNAP_DIED": C.MP_FT_G_SNAP_DIED,
		"G_OOM_SELF": C.MP_FT_G_OOM_SELF, "G_OOM_PID": C.MP_FT_G_OOM_PID, "G_WORKER": C.MP_FT_G_WORKER,
		"G_V": C.MP_FT_G_V, "G_SNAP": C.MP_FT_G_SNAP, "G_GEN": C.MP_FT_G_GEN, "T_NEW": C.MP_FT_T_NEW,
		"T_MOUNT": C.MP_FT_T_MOUNT, "T_REFUSED": C.MP_FT_T_REFUSED, "T_MOVED": C.MP_FT_T_MOVED,
		"T_DATA": C.MP_FT_T_DATA, "T_SFD": C.MP_FT_T_SFD, "T_MASK": C.MP_FT_T_MASK, "W_SAVE": C.MP_FT_W_SAVE,
		"W_RESTORE": C.MP_FT_W_RESTORE, "W_NEW_BYTES": C.MP_FT_W_NEW_BYTES, "W_BYTES_AT": C.MP_FT_W_BYTES_AT,
		"W_CALL": C.MP_FT_W_CALL, "W_DECREF": C.MP_FT_W_DECREF, "W_GET_BUF": C.MP_FT_W_GET_BUF,
		"W_REL_BUF": C.MP_FT_W_REL_BUF, "W_TUPLE_LEN": C.MP_FT_W_TUPLE_LEN, "W_TUPLE_AT": C.MP_FT_W_TUPLE_AT,
		"W_SIGNALS": C.MP_FT_W_SIGNALS, "W_STRERROR": C.MP_FT_W_STRERROR, "W_HANDLE": C.MP_FT_W_HANDLE,
		"W_NONE": C.MP_FT_W_NONE, "W_IN": C.MP_FT_W_IN, "W_OUT": C.MP_FT_W_OUT, "W_ERR": C.MP_FT_W_ERR,
		"W_SNAPSHOTS": C.MP_FT_W_SNAPSHOTS, "W_CHANGED": C.MP_FT_W_CHANGED, "W_CHANGED_BIT": C.MP_FT_W_CHANGED_BIT,
		"W_NO_SNAP": C.MP_FT_W_NO_SNAP, "W_PAGES": C.MP_FT_W_PAGES, "W_PREV": C.MP_FT_W_PREV,
		"W_PAGES_CAP": C.MP_FT_W_PAGES_CAP, "W_NPAGES": C.MP_FT_W_NPAGES, "W_NPREV": C.MP_FT_W_NPREV,
		"W_AHEAD": C.MP_FT_W_AHEAD, "W_CYCLE": C.MP_FT_W_CYCLE, "W_SCRATCH": C.MP_FT_W_SCRATCH,
		"W_MAPS": C.MP_FT_W_MAPS, "W_PAGEMAP": C.MP_FT_W_PAGEMAP, "W_NREAPED": C.MP_FT_W_NREAPED,
		"W_UNREAPED": C.MP_FT_W_UNREAPED, "S_BOOT_ID": C.MP_FT_S_BOOT_ID, "S_ROOT_N": C.MP_FT_S_ROOT_N,
		"S_ROOT_KINDS": C.MP_FT_S_ROOT_KINDS, "S_ROOT_NAMES": C.MP_FT_S_ROOT_NAMES, "S_ROOT_LINKS": C.MP_FT_S_ROOT_LINKS,
		"S_ROOT_OPTS": C.MP_FT_S_ROOT_OPTS, "S_ROOT_AT": C.MP_FT_S_ROOT_AT, "S_ROOT_PROC": C.MP_FT_S_ROOT_PROC,
		"S_USERNS": C.MP_FT_S_USERNS, "S_IDMAP": C.MP_FT_S_IDMAP, "S_ID_FILES": C.MP_FT_S_ID_FILES,
		"S_ROOT_HOME": C.MP_FT_S_ROOT_HOME, "S_CAP_LAST": C.MP_FT_S_CAP_LAST, "S_SYNC": C.MP_FT_S_SYNC,
		"S_LOW_PORTS": C.MP_FT_S_LOW_PORTS,
		"SIZE":        C.MP_FT_SIZE,
	}
}

func forkOps() map[string]int {
	return map[string]int{
		"SNAPSHOT": C.MP_OP_SNAPSHOT, "SANDBOX": C.MP_OP_SANDBOX, "TEMPLATE": C.MP_OP_TEMPLATE, "SERVE": C.MP_OP_SERVE,
	}
}

func forkSteps() map[string]int {
	return map[string]int{
		"SETSID": C.MP_SS_SETSID, "CGROUP": C.MP_SS_CGROUP, "TREE_NS": C.MP_SS_TREE_NS,
		"TREE_SLAVE": C.MP_SS_TREE_SLAVE, "TREE_OPEN": C.MP_SS_TREE_OPEN, "TREE_COPY": C.MP_SS_TREE_COPY,
		"TREE_DETACH": C.MP_SS_TREE_DETACH, "TREE_MOVE": C.MP_SS_TREE_MOVE, "USERNS": C.MP_SS_USERNS,
		"MAPS": C.MP_SS_MAPS, "UNSHARE": C.MP_SS_UNSHARE, "EGRESS": C.MP_SS_EGRESS, "FORK": C.MP_SS_FORK,
		"HOSTNAME": C.MP_SS_HOSTNAME, "PROC": C.MP_SS_PROC, "HOME": C.MP_SS_HOME, "BIND_HOME": C.MP_SS_BIND_HOME,
		"TMPFS": C.MP_SS_TMPFS, "COVERED": C.MP_SS_COVERED, "CAPS": C.MP_SS_CAPS, "SECCOMP": C.MP_SS_SECCOMP,
		"FDS": C.MP_SS_FDS, "GUARDIAN": C.MP_SS_GUARDIAN, "DUMPABLE": C.MP_SS_DUMPABLE,
		"TEMPLATE_FORK": C.MP_SS_TEMPLATE_FORK, "BOOT_ID": C.MP_SS_BOOT_ID, "ROOT": C.MP_SS_ROOT,
		"ROOT_HOME": C.MP_SS_ROOT_HOME,
		"COUNT":     C.MP_SS_COUNT,
	}
}
