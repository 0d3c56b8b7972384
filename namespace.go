package minipy

import (
	"fmt"
	"runtime"
	"sync"

	"github.com/minipy-go/minipy/internal/pyrt"
)

// Namespace is a Python dict that holds a session's variables between runs: pass it as
// Options.Globals (and, rarely, Options.Locals). It starts with __name__ == "__main__" and
// the builtins.
//
// A Namespace belongs to the engine that made it (NewNamespace for the in-process engine,
// Isolated.NewNamespace for a worker pool); using it with another engine is an error.
// Its methods are safe to call from any goroutine: like runs, they take turns on the
// interpreter, so a Set never sees half of a run. Runs that share a namespace see each
// other's assignments in the order they ran. They take no deadline; while an in-process run
// that was abandoned (a C call that ignores the timeout) holds the interpreter they fail
// at once with ErrInterpreterBusy.
type Namespace struct {
	engine engine
	id     uint32
	ref    any // engine-specific (the isolated engine's worker slot)

	mu      sync.Mutex
	closed  bool
	cleanup runtime.Cleanup // frees the namespace when the wrapper is collected unclosed
}

// NewNamespace makes a fresh namespace in the in-process interpreter, starting it if needed.
// Call Close when done with it to free its variables (they are freed anyway, later, when
// the Namespace is garbage-collected).
func NewNamespace() *Namespace {
	ns, err := newInProcessNamespace()
	if err != nil {
		// No error result (the API is fixed): the namespace reports why it could not be
		// made (the interpreter did not start, or ErrInterpreterBusy) on every use.
		return &Namespace{closed: true, ref: err}
	}
	return ns
}

func newInProcessNamespace() (*Namespace, error) {
	e, err := inProcess()
	if err != nil {
		return nil, err
	}
	v, err := e.do(nil, pyrt.OpNew)
	if err != nil {
		return nil, err
	}
	id, _ := v.(int64)
	return newNamespace(e, uint32(id), nil), nil
}

// newNamespace wraps namespace id of engine e and frees it when the wrapper is collected.
func newNamespace(e engine, id uint32, ref any) *Namespace {
	ns := &Namespace{engine: e, id: id, ref: ref}
	ns.cleanup = runtime.AddCleanup(ns, func(id uint32) {
		go func() {
			// A run may still use it (its Options outlive the last reference): the free
			// waits for the interpreter, so its functions go after that run too.
			e.do(&Namespace{engine: e, id: id, ref: ref}, pyrt.OpFree, int64(id)) //nolint:errcheck // best effort
			e.hosts().forget(id)
		}()
	}, id)
	return ns
}

// idFor returns the namespace's id for engine e, or an error if it is closed or another's.
func (ns *Namespace) idFor(e engine) (uint32, error) {
	ns.mu.Lock()
	defer ns.mu.Unlock()
	if err := ns.usable(); err != nil {
		return 0, err
	}
	if ns.engine != e {
		return 0, fmt.Errorf("minipy: this namespace belongs to %s, not %s", ns.engine.name(), e.name())
	}
	return ns.id, nil
}

func (ns *Namespace) isOpen() bool {
	ns.mu.Lock()
	defer ns.mu.Unlock()
	return ns.usable() == nil
}

func (ns *Namespace) usable() error {
	if !ns.closed {
		return nil
	}
	if err, ok := ns.ref.(error); ok {
		return err // the interpreter could not start
	}
	return ErrNamespaceClosed
}

func (ns *Namespace) op(op byte, args ...any) (any, error) {
	ns.mu.Lock()
	err := ns.usable()
	ns.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return ns.engine.do(ns, op, append([]any{int64(ns.id)}, args...)...)
}

// Set binds name to v converted to Python (see the type table in the package doc). A Go
// value with no Python equivalent gives an *UnsupportedTypeError.
func (ns *Namespace) Set(name string, v any) error {
	if _, err := appendValue(nil, v, 0); err != nil {
		return err
	}
	_, err := ns.op(pyrt.OpSet, name, v)
	return err
}

// Get returns the value bound to name, converted to Go. A missing name gives an error
// matching ErrNameNotFound; a value with no Go equivalent one matching ErrUnsupportedValue.
func (ns *Namespace) Get(name string) (any, error) {
	return ns.op(pyrt.OpGet, name)
}

// Names returns the namespace's names in the order they were bound, leaving out dunder
// names such as __builtins__.
func (ns *Namespace) Names() ([]string, error) {
	v, err := ns.op(pyrt.OpNames)
	if err != nil {
		return nil, err
	}
	items, _ := v.([]any)
	names := make([]string, 0, len(items))
	for _, item := range items {
		if s, ok := item.(string); ok {
			names = append(names, s)
		}
	}
	return names, nil
}

// Fork returns a copy of the namespace in a process of its own, for an agent that branches
// a conversation: the copy has the namespace's variables, imported modules and host
// functions as they are between runs, and from then on changes to either never reach the
// other. It waits for a run in progress in the namespace. Threads and child processes
// that earlier runs left running are not copied. The files of the working directory are:
// the copy gets a working directory of its own (WorkDir; /namespaces/ID in the sandbox,
// where it works from the same relative place) holding a copy of them, symlinks as links,
// without special files or what Mounts put there. Both still run in one sandbox: /tmp is
// shared, and each can read the other's working directory under /namespaces. Closing one
// leaves the other.
//
// Only namespaces of an isolated engine with a worker per namespace (IsolatedConfig.Workers
// 0) and local workers can fork; others give an error matching ErrNoFork. A fork costs
// about as much as a rollback snapshot (a copy-on-write fork of the worker process), plus
// the copy of the files.
func (ns *Namespace) Fork() (*Namespace, error) {
	ns.mu.Lock()
	err := ns.usable()
	ns.mu.Unlock()
	if err != nil {
		return nil, err
	}
	f, ok := ns.engine.(interface {
		fork(ns *Namespace) (*Namespace, error)
	})
	if !ok {
		return nil, fmt.Errorf("%w: %s runs in the host process (Fork needs the isolated engine)", ErrNoFork,
			ns.engine.name())
	}
	return f.fork(ns)
}

// WorkDir is the host directory that is the namespace's working directory (and HOME) in
// an isolated engine: each namespace has one of its own, which its code sees as /work
// (sandboxed; a Fork copy or a namespace packed with others into a shared worker sees
// /namespaces/ID) and the host may read and fill, until Close removes it. Files survive a
// lost or rolled-back worker: rollback restores variables, not files. "" for in-process
// namespaces, whose code shares the host process's working directory, and for Command
// workers, whose files are on the far side.
//
// With IsolatedConfig.WorkSize (sandboxed workers forked from the template, the default)
// the directory is a tmpfs that only the sandbox's mount namespaces hold, and the path is
// this process's link to it, /proc/PID/fd/N: paths below it, os.Stat, os.ReadDir,
// os.OpenRoot and os.DirFS work (for this process, and for its user or root through
// /proc); os.Lstat sees the link, so walk it through os.DirFS or os.Root, not
// filepath.WalkDir.
//
// The code can make symbolic links there, to anywhere: reach its files with the file
// methods (WriteFile, ReadFile, ListFiles), which never follow a link out of the directory,
// or with os.Root (os.OpenRoot(ns.WorkDir())), not with plain paths.
func (ns *Namespace) WorkDir() string {
	w, ok := ns.engine.(interface{ workDir(*Namespace) string })
	if !ok {
		return ""
	}
	return w.workDir(ns)
}

// Close frees the namespace's variables. Later uses return ErrNamespaceClosed; closing
// twice is not an error.
func (ns *Namespace) Close() error {
	ns.mu.Lock()
	if ns.closed {
		ns.mu.Unlock()
		return nil
	}
	ns.closed = true
	ns.mu.Unlock()
	// Closed: a collection must not free it again (an isolated namespace's second free
	// would release its working directories' tree twice, under its Fork copies' feet).
	ns.cleanup.Stop()
	ns.engine.hosts().forget(ns.id)
	_, err := ns.engine.do(ns, pyrt.OpFree, int64(ns.id))
	return err
}
