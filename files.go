package minipy

import (
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/minipy-go/minipy/internal/sandboxfs"
	"github.com/minipy-go/minipy/internal/worker"
)

// FileInfo describes a file of a namespace's working directory (Namespace.ListFiles,
// Result.Files).
type FileInfo struct {
	// Name is the file's path relative to the working directory, slash-separated
	// ("out/chart.png"): what ReadFile takes.
	Name string
	// Size is its length in bytes (a symbolic link's: the length of its target's name).
	Size int64
	// ModTime is when its content last changed.
	ModTime time.Time
	// IsDir reports a directory.
	IsDir bool
	// Mode is its type and permission bits, as os.Lstat gives them (fs.ModeSymlink for a
	// symbolic link, which is never followed).
	Mode fs.FileMode
	// Target is a symbolic link's target as the link holds it (os.Readlink's text: it may be
	// relative to the link's directory, or point anywhere); "" for any other file.
	Target string
	// RootOwned reports a file of the sandbox's root (IsolatedConfig.RootUser): its host
	// owner is the one the sandboxes' root users stand for (uid 65533); else it is the
	// sandbox's user's.
	RootOwned bool
}

// Hidden reports a file that Result.Files and minipy-mcp's resources leave out: one with a
// hidden name in its path (".cache/matplotlib/fontlist.json": the working directory is the
// code's HOME, where libraries keep caches and settings) or in a __pycache__ directory.
// ListFiles lists them as any other.
func (f FileInfo) Hidden() bool { return sandboxfs.Info(f).Hidden() }

// fileInfos converts sandboxfs's descriptions (the same fields: the compiler checks) to
// FileInfos.
func fileInfos(in []sandboxfs.Info) []FileInfo {
	if in == nil {
		return nil
	}
	out := make([]FileInfo, len(in))
	for i, f := range in {
		out[i] = FileInfo(f)
	}
	return out
}

// The Namespace file methods work on the host's side, on the namespace's working directory
// (WorkDir), whatever its worker is doing: they neither wait for a run nor start a worker.
// Every name is resolved by the kernel (openat2 with RESOLVE_BENEATH, Linux 5.6) below that
// directory, which is itself opened without following a link: the code may leave links to
// anywhere, and a link that leads out gives ErrBadPath instead of being followed. A link
// that stays inside (relative, as "data.csv -> raw/data.csv") is followed; one with an
// absolute target (even "/work/...", which the code sees) leads out from the host's point
// of view. Files the host makes belong to the workers' user, so the code can change them.
// An absolute name is the sandbox's own path (its working directory, /tmp, /dev/shm:
// files_places.go), resolved the same way below that place. The mechanics are
// internal/sandboxfs's; here is which engine and namespace may use them, and as whom.

// WriteFile writes data to the file name, relative to the namespace's working directory,
// making the directories it needs and replacing what the file held. The namespace's code
// sees it at once (under /work when sandboxed). It is WriteFileFrom with a bytes.Reader.
func (ns *Namespace) WriteFile(name string, data []byte, opts ...FileOption) error {
	_, err := ns.WriteFileFrom(name, bytes.NewReader(data), opts...)
	return err
}

// FileOption changes whom a file method acts as (AsRoot).
type FileOption func(*fileOptions)

type fileOptions struct{ root bool }

// AsRoot has a file method act as the sandbox's root (IsolatedConfig.RootUser): it reaches
// what root may in the sandbox's writable layer (root's home, files of mode 0600 of either
// user), and what it makes is root's. Without it a file method acts as the sandbox's user,
// as the code does. It is ErrNoRootUser for a namespace whose sandbox has no root user.
func AsRoot() FileOption { return func(o *fileOptions) { o.root = true } }

// fileActor is whom the host acts as in a namespace's files.
type fileActor int

const (
	actUser   fileActor = iota // the sandbox's user: the code's reach; what the host makes is the user's
	actRoot                    // its root (AsRoot): root's reach over the writable layer; what it makes is root's
	actKeeper                  // Save and Restore in a sandbox with a root user: root's reach, each entry's owner kept
)

// actorOf is whom opts have a file method of a namespace of e act as.
func (e *Isolated) actorOf(op, name string, opts []FileOption) (fileActor, error) {
	var o fileOptions
	for _, f := range opts {
		f(&o)
	}
	if !o.root {
		return actUser, nil
	}
	if e == nil || !e.rootUser() {
		return actUser, &fs.PathError{Op: op, Path: name, Err: fmt.Errorf("%w: AsRoot needs a sandbox with a root "+
			"user (IsolatedConfig.RootUser)", ErrNoRootUser)}
	}
	return actRoot, nil
}

// rootUser reports whether e's sandboxes have a root user (IsolatedConfig.RootUser).
func (e *Isolated) rootUser() bool { return e.sandbox && e.cfg.RootUser }

// keeper is whom Save and Restore act as in e's files (nil: not the isolated engine's):
// in a sandbox with a root user they keep which files are root's.
func (e *Isolated) keeper() fileActor {
	if e != nil && e.rootUser() {
		return actKeeper
	}
	return actUser
}

// WriteFileFrom writes what r yields to the file name (see WriteFile), streaming: the host
// holds a buffer, not the file. It returns the bytes written. If writing fails (r's error,
// or ENOSPC past IsolatedConfig.WorkSize) the file is removed. The errors: ErrBadPath for a
// name that is not inside the working directory (or, absolute, one of the sandbox's places
// where it writes: files_places.go), ErrNoFiles for an in-process namespace,
// ErrNamespaceClosed, or an *fs.PathError.
func (ns *Namespace) WriteFileFrom(name string, r io.Reader, opts ...FileOption) (int64, error) {
	root, clean, err := ns.fileRoot("write", name, false, opts...)
	if err != nil {
		return 0, err
	}
	defer root.Close()
	return root.Write(clean, r)
}

// ReadFile returns the content of the file name, relative to the namespace's working
// directory. A missing file gives an error matching fs.ErrNotExist; a directory, FIFO or
// other file that is not a regular one an *fs.PathError (fs.ErrInvalid), without opening it
// for reading; otherwise as WriteFileFrom.
func (ns *Namespace) ReadFile(name string, opts ...FileOption) ([]byte, error) {
	root, clean, err := ns.fileRoot("read", name, false, opts...)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	return root.ReadFile(clean)
}

// ReadFileTo copies the file name (see ReadFile) to w, streaming, and returns the bytes
// copied.
func (ns *Namespace) ReadFileTo(name string, w io.Writer, opts ...FileOption) (int64, error) {
	root, clean, err := ns.fileRoot("read", name, false, opts...)
	if err != nil {
		return 0, err
	}
	defer root.Close()
	return root.ReadFileTo(clean, w)
}

// ListFiles lists the directory dir (relative to the working directory; "" is the working
// directory itself), one level, sorted by name: each FileInfo's Name is the entry's path
// relative to the working directory, so that ReadFile takes it. Symbolic links are listed
// as they are, not followed.
func (ns *Namespace) ListFiles(dir string, opts ...FileOption) ([]FileInfo, error) {
	root, clean, err := ns.fileRoot("list", dir, true, opts...)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	list, err := root.List(clean)
	return fileInfos(list), err
}

// fileRoot opens the namespace's working directory for a file method, and checks name;
// opts say whom it acts as (AsRoot).
func (ns *Namespace) fileRoot(op, name string, dirOK bool, opts ...FileOption) (*sandboxfs.Root, string, error) {
	e, _ := ns.engine.(*Isolated)
	as, err := e.actorOf(op, name, opts)
	if err != nil {
		return nil, "", err
	}
	return ns.rootAs(op, name, dirOK, as)
}

// keeperRoot opens the namespace's working directory for Save and Restore (op), acting as
// its engine's keeper.
func (ns *Namespace) keeperRoot(op string) (*sandboxfs.Root, string, error) {
	e, _ := ns.engine.(*Isolated)
	return ns.rootAs(op, ".", true, e.keeper())
}

// rootAs is fileRoot acting as as.
func (ns *Namespace) rootAs(op, name string, dirOK bool, as fileActor) (*sandboxfs.Root, string, error) {
	ns.mu.Lock()
	err := ns.usable()
	ns.mu.Unlock()
	if err != nil {
		return nil, "", err
	}
	if path.IsAbs(filepath.ToSlash(name)) && !strings.ContainsRune(name, 0) {
		if _, ok := ns.engine.(*Isolated); ok {
			return ns.placeRoot(op, name, dirOK, as)
		}
	}
	clean, err := sandboxfs.CleanName(op, name, dirOK)
	if err != nil {
		return nil, "", err
	}
	f, ok := ns.engine.(interface {
		workRoot(ns *Namespace, as fileActor) (*sandboxfs.Root, error)
	})
	if !ok {
		return nil, "", fmt.Errorf("%w: %s runs code in the host process, which shares the host's files (use the os "+
			"package)", ErrNoFiles, ns.engine.name())
	}
	root, err := f.workRoot(ns, as)
	if err != nil {
		return nil, "", err
	}
	return root, clean, nil
}

// workRoot opens the working directory of ns (openWorkDir), acting as as.
func (e *Isolated) workRoot(ns *Namespace, as fileActor) (*sandboxfs.Root, error) {
	r, err := e.rootOf(bindingOf(ns))
	if err == nil {
		actor(r, as)
	}
	return r, err
}

// actor has the root act as as: what the host makes is root's (actRoot), or each entry
// keeps its owner (actKeeper). (A working directory is the host's, who reaches all of it.)
func actor(r *sandboxfs.Root, as fileActor) {
	switch as {
	case actRoot:
		r.Owner = worker.RootUID()
	case actKeeper:
		r.KeepRoot = true
	}
}

func (e *Isolated) rootOf(b *nsBinding) (*sandboxfs.Root, error) {
	if b == nil || !e.local() {
		return nil, fmt.Errorf("%w: a Command worker's files are on the far side", ErrNoFiles)
	}
	if e.isClosed() {
		return nil, ErrEngineClosed
	}
	fd, err := e.openWorkDir(b.dirs)
	if err != nil {
		return nil, fmt.Errorf("minipy: opening the working directory: %w", err)
	}
	return &sandboxfs.Root{FD: fd, Owner: e.fileOwner(), Limit: e.readLimit(), Wrote: func(name string, ctime syscall.Timespec) {
		e.watch.HostWrote(b, name, ctime)
	}}, nil
}

// readLimit is sandboxfs.Root.Limit for e's working directories: WorkSize where it caps them.
func (e *Isolated) readLimit() int64 {
	if e.capped() {
		return e.cfg.WorkSize
	}
	return 0
}
