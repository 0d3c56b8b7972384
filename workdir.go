package minipy

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"

	"github.com/minipy-go/minipy/internal/sandboxfs"
	"github.com/minipy-go/minipy/internal/worker"
)

// The working directories of an isolated engine's namespaces: one each, in trees under the
// engine's private directory, a tree per worker sandbox (a Fork copy and namespaces packed
// into one worker share their source's), each a tmpfs of WorkSize bytes with a template.
// internal/sandboxfs (trees.go, mounts.go) makes, mounts, moves and removes them; here is
// what the engine keeps per tree, and its configuration of them.

// workTree is a tree of working directories, and its sandbox's egress rules
// (Namespace.SetEgressRules; nil: none).
type workTree struct {
	*sandboxfs.Tree
	egress atomic.Pointer[egressRules]
}

// workDirs are a worker slot's directories: the tree its workers bind, and the name in it of
// the working directory they bind at worker.SandboxWorkdir (their namespace's).
type workDirs struct {
	tree *workTree
	home string
	err  error // making them failed: the slot's workers cannot start
}

// key names the working directory of d under the engine's trees.
func (d workDirs) key() string { return sandboxfs.Key(d.tree.Tree, d.home) }

// keyOrNone is key, or "" for directories of no tree (a Command worker's).
func (d workDirs) keyOrNone() string {
	if d.tree == nil {
		return ""
	}
	return d.key()
}

// defaultWorkSize is IsolatedConfig.WorkSize's default.
const defaultWorkSize = 1 << 30

// local reports whether the engine's workers run here, so that their directories are the
// host's to make (a Command worker makes its own, on the far side, at the same paths).
func (e *Isolated) local() bool { return len(e.cfg.Command) == 0 }

// capped reports whether working directories get a tmpfs of WorkSize bytes.
func (e *Isolated) capped() bool {
	return e.sandbox && e.local() && !e.cfg.NoTemplate && e.cfg.WorkSize > 0
}

// fileOwner is the host user to give what the host makes in a working directory: the
// workers' user on a root host, -1 (the host's own) otherwise.
func (e *Isolated) fileOwner() int {
	if e.sandbox && os.Geteuid() == 0 {
		return worker.UID()
	}
	return -1
}

// newDirs makes a tree with a working directory in it, for a worker slot of its own.
func (e *Isolated) newDirs() workDirs {
	t, err := e.work.New()
	if err != nil {
		return workDirs{err: err}
	}
	return workDirs{tree: &workTree{Tree: t}, home: sandboxfs.HomeName}
}

// shareDirs returns directories in the tree of d for a namespace id that shares its
// workers' sandbox (a Fork copy), making its working directory.
func (e *Isolated) shareDirs(d workDirs, id uint32) (workDirs, error) {
	name, err := e.work.Share(d.tree.Tree, id)
	if err != nil {
		return workDirs{}, err
	}
	return workDirs{tree: d.tree, home: name}, nil
}

// packedDirs makes the working directory of namespace id, packed into a shared worker
// with directories d (IsolatedConfig.Workers).
func (e *Isolated) packedDirs(d workDirs, id uint32) (workDirs, error) {
	name, err := e.work.Pack(d.tree.Tree, id)
	return workDirs{tree: d.tree, home: name}, err
}

// releaseDirs removes the working directory of d, and its tree once no slot uses it.
func (e *Isolated) releaseDirs(d workDirs) {
	if d.tree != nil {
		e.work.Release(d.tree.Tree, d.home)
	}
}

// removeWorkDir removes the working directory of d (a namespace's that ended).
func (e *Isolated) removeWorkDir(d workDirs) {
	if d.tree != nil {
		e.work.RemoveHome(d.tree.Tree, d.home)
	}
}

// moveMounts moves the working directories of tree, when its template has died, into t,
// the template that the tree's next worker is forked from (nil: none); before a worker of
// tree starts (sandboxfs.Trees.Move).
func (e *Isolated) moveMounts(tree *workTree, t *worker.Worker) error {
	if tree == nil {
		return nil
	}
	return e.work.Move(tree.Tree, t)
}

// openWorkDir opens the working directory of d (O_PATH).
func (e *Isolated) openWorkDir(d workDirs) (int, error) {
	return e.work.OpenHome(d.tree.Tree, d.home)
}

// dirOf is the host path of the working directory of b (Namespace.WorkDir): with a tmpfs,
// the host's fd of it in /proc, which this process (and its user) can use as a path.
func (e *Isolated) dirOf(b *nsBinding) string {
	if b.dirs.tree == nil {
		return ""
	}
	return e.work.HomeDir(b.dirs.tree.Tree, b.dirs.home)
}

// engineTemplates are e's templates as its trees use them.
type engineTemplates struct{ e *Isolated }

func (t engineTemplates) Live() *worker.Worker  { return t.e.liveTemplate() }
func (t engineTemplates) Drop(w *worker.Worker) { t.e.dropTemplate(w) }

// breakSandboxRoot makes the tests' engines give their workers a root mount point that does
// not exist (see NewIsolatedRefusingMounts).
var breakSandboxRoot bool

// makeDirs makes the engine's private directory: work/ (the trees of the namespaces'
// working directories, e.work) and, sandboxed, root/ (the mount point of each worker's
// root).
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
	e.work = &sandboxfs.Trees{Path: e.trees, Local: e.local(), Sandbox: e.sandbox, Templates: engineTemplates{e},
		Timeout: e.cfg.StartTimeout, Attempts: startAttempts, KeepRoot: e.rootUser(), Owner: e.fileOwner(),
		Moved: e.watch.Moved}
	if e.capped() {
		e.work.Size = e.cfg.WorkSize
	}
	return nil
}
