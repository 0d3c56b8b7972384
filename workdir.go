package minipy

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/minipy-go/minipy/internal/worker"
)

// The working directories of an isolated engine's namespaces. Each namespace has one of its
// own on the host; the engine keeps them in trees under its private directory:
//
//	DIR/work/TREE/work   the working directory of the namespace a worker was started for
//	DIR/work/TREE/ID     the working directory of namespace ID that shares that worker's
//	                     sandbox: a Fork copy, or a namespace packed into a shared worker
//
// A sandboxed worker sees its own working directory at worker.SandboxWorkdir and its tree at
// worker.SandboxTree, nothing of other trees: namespaces with a worker of their own (the default)
// cannot see each other's files at all; a Fork copy and its source, which share a sandbox,
// and namespaces packed into one worker (which share a process anyway) can.
//
// A tree and its directories are made by the host (with WorkSize and a template, the tree is
// a tmpfs that the template mounts, and the host makes them in it by its fd: workmount.go),
// owned by the host (a tree; root mapped in the template's user namespace) and by the
// workers' user (a working directory); the code cannot add entries to a tree when the host
// runs as root. The host never follows a link in them: it makes directories with mkdir and
// lchown and removes them with os.RemoveAll, none of which follow a symlink the code put
// there.

// workTree is one tree: the directory of the working directories of the namespaces that may
// share one worker sandbox.
type workTree struct {
	name string // its directory's name under the engine's trees
	path string // its host path (with a tmpfs of its own, an empty directory here)
	refs int    // the worker slots whose workers bind it; guarded by Isolated.mu

	// With WorkSize and a template, a tree is a tmpfs of its own that the template mounted
	// over path (workmount.go); the host reaches it by fd alone. Set under
	// Isolated.mountReq and Isolated.mu, read under either.
	fd    int             // O_PATH, its root; -1: none (path itself holds the tree); the number stays while the tree lives (moveMounts dup3s over it)
	tmpl  *worker.Worker  // the template that mounted it
	disk  bool            // begun on the host's disk (no template then): it stays there
	plain map[string]bool // working directories made in it after tmpl died: plain directories, not mounts

	egress atomic.Pointer[egressRules] // its sandbox's egress rules (Namespace.SetEgressRules); nil: none
}

// workDirs are a worker slot's directories: the tree its workers bind, and the name in it of
// the working directory they bind at worker.SandboxWorkdir (their namespace's).
type workDirs struct {
	tree *workTree
	home string
	err  error // making them failed: the slot's workers cannot start
}

// homeName is the name of the working directory of the namespace a tree was made for.
const homeName = "work"

// homePath is the host path of the working directory of d: through the fd of its tree's
// tmpfs in /proc when it has one.
func (e *Isolated) homePath(d workDirs) string {
	if d.tree == nil {
		return ""
	}
	return filepath.Join(e.treeRoot(d.tree), d.home)
}

// treeRoot is the host path of tree t's root: path, or with a tmpfs, its fd in /proc, which
// this process (and its user) can use as a path.
func (e *Isolated) treeRoot(t *workTree) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	if t.fd >= 0 {
		return "/proc/" + strconv.Itoa(os.Getpid()) + "/fd/" + strconv.Itoa(t.fd)
	}
	return t.path
}

// local reports whether the engine's workers run here, so that their directories are the
// host's to make (a Command worker makes its own, on the far side, at the same paths).
func (e *Isolated) local() bool { return len(e.cfg.Command) == 0 }

// newDirs makes a tree with a working directory in it, for a worker slot of its own.
func (e *Isolated) newDirs() workDirs {
	seq := e.treeSeq.Add(1)
	t := &workTree{name: strconv.FormatUint(seq, 10), refs: 1, fd: -1}
	t.path = filepath.Join(e.trees, t.name)
	if e.local() {
		if err := os.Mkdir(t.path, 0o755); err != nil {
			return workDirs{err: fmt.Errorf("minipy: making a namespace's working directory: %w", err)}
		}
	}
	d := workDirs{tree: t, home: homeName}
	if err := e.makeWorkDir(t, homeName); err != nil {
		e.releaseDirs(d)
		return workDirs{err: err}
	}
	return d
}

// shareDirs returns directories in the tree of d for a namespace id that shares its
// workers' sandbox (a Fork copy), making its working directory.
func (e *Isolated) shareDirs(d workDirs, id uint32) (workDirs, error) {
	name := strconv.FormatUint(uint64(id), 10)
	if err := e.makeWorkDir(d.tree, name); err != nil {
		return workDirs{}, err
	}
	e.mu.Lock()
	d.tree.refs++
	e.mu.Unlock()
	return workDirs{tree: d.tree, home: name}, nil
}

// packedDirs makes the working directory of namespace id, packed into a shared worker
// with directories d (IsolatedConfig.Workers).
func (e *Isolated) packedDirs(d workDirs, id uint32) (workDirs, error) {
	name := strconv.FormatUint(uint64(id), 10)
	return workDirs{tree: d.tree, home: name}, e.makeWorkDir(d.tree, name)
}

// makeWorkDir makes the working directory name in tree t, empty, owned by the workers'
// user, and, with WorkSize, has the template mount its tmpfs over it (in the tree's own,
// which it mounts at the tree's first directory: treeTemplate). Whatever the code put at
// that name (it may have guessed a namespace id) is removed first, links included, never
// followed.
func (e *Isolated) makeWorkDir(t *workTree, name string) error {
	if !e.local() {
		return nil
	}
	e.mountReq.Lock()
	defer e.mountReq.Unlock()
	tmpl, err := e.treeTemplate(t)
	if err != nil {
		return err
	}
	path := filepath.Join(e.treeRoot(t), name)
	if err := e.freshDir(path); err != nil {
		return err
	}
	if tmpl != nil {
		home, err := e.askMount(tmpl, t.name, name)
		if err == nil {
			return e.addMount(t, name, home, tmpl)
		}
		if !errors.Is(err, worker.ErrTemplateGone) {
			os.Remove(path)
			return err
		}
		// The tree's tmpfs is a dead template's now: the directory stays a plain one in it,
		// which the tree's next worker start moves (moveMounts).
		e.dropTemplate(tmpl)
	}
	e.mu.Lock()
	if t.fd >= 0 {
		if t.plain == nil {
			t.plain = map[string]bool{}
		}
		t.plain[name] = true
	}
	e.mu.Unlock()
	return nil
}

// freshDir makes the directory path (mode 0700, the workers' user's), removing first
// whatever is there.
func (e *Isolated) freshDir(path string) error {
	err := os.Mkdir(path, 0o700)
	if errors.Is(err, fs.ErrExist) {
		if err = os.RemoveAll(path); err == nil {
			err = os.Mkdir(path, 0o700)
		}
	}
	if err == nil && e.sandbox {
		err = os.Lchown(path, worker.UID(), worker.UID())
	}
	if err != nil {
		return fmt.Errorf("minipy: making a namespace's working directory: %w", err)
	}
	return nil
}

// releaseDirs removes the working directory of d, and its tree once no slot uses it.
func (e *Isolated) releaseDirs(d workDirs) {
	if d.tree == nil || !e.local() {
		return
	}
	e.removeWorkDir(d)
	e.mu.Lock()
	d.tree.refs--
	last := d.tree.refs == 0
	e.mu.Unlock()
	if last {
		// Removing the host's directory detaches the tree's tmpfs in every mount namespace.
		os.RemoveAll(d.tree.path)
		e.mountReq.Lock()
		e.mu.Lock()
		fd := d.tree.fd
		d.tree.fd, d.tree.tmpl = -1, nil
		delete(e.tmpfsTrees, d.tree)
		e.mu.Unlock()
		e.mountReq.Unlock()
		if fd >= 0 {
			syscall.Close(fd)
		}
	}
}

// removeWorkDir removes the working directory of d (a namespace's that ended). Removing the
// directory detaches the tmpfs mounted over it (WorkSize) in every mount namespace; its
// memory is freed once the host's fd and the last worker holding it are gone.
func (e *Isolated) removeWorkDir(d workDirs) {
	if d.tree == nil || !e.local() {
		return
	}
	e.mountReq.Lock() // (not while its tree's next worker start moves it: moveMounts)
	defer e.mountReq.Unlock()
	os.RemoveAll(e.homePath(d))
	e.mu.Lock()
	m := e.mounts[d.key()]
	delete(e.mounts, d.key())
	delete(d.tree.plain, d.home)
	e.mu.Unlock()
	if m != nil {
		syscall.Close(m.fd)
	}
}

// breakSandboxRoot makes the tests' engines give their workers a root mount point that does
// not exist (see NewIsolatedRefusingMounts).
var breakSandboxRoot bool

// makeDirs makes the engine's private directory: work/ (the trees of the namespaces'
// working directories; see workTree) and, sandboxed, root/ (the mount point of each
// worker's root).
func (e *Isolated) makeDirs() error {
	dir, err := os.MkdirTemp("", "minipy-isolated-")
	if err != nil {
		return fmt.Errorf("minipy: making the workers' directory: %w", err)
	}
	e.dir = dir
	e.trees = filepath.Join(dir, "work")
	err = os.Mkdir(e.trees, 0o711)
	if err == nil && e.sandbox {
		// The workers' user must pass through dir and trees (owned by the host) to reach
		// their own directories, but may list neither.
		e.rootdir = filepath.Join(dir, "root")
		err = errors.Join(os.Chmod(dir, 0o711), os.Chmod(e.trees, 0o711), os.Mkdir(e.rootdir, 0o755))
	}
	if err == nil && breakSandboxRoot {
		e.rootdir = "/proc/minipy-no-such-dir" // nobody can make it
	}
	if err == nil && strings.ContainsAny(dir, "\n\r\t") {
		err = errors.New("the temporary directory's name has a line break or tab")
	}
	if err != nil {
		os.RemoveAll(dir)
		return fmt.Errorf("minipy: making the workers' directory: %w", err)
	}
	return nil
}
