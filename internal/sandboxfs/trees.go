package sandboxfs

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

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
// a tmpfs that the template mounts, and the host makes them in it by its fd: mounts.go),
// owned by the host (a tree; root mapped in the template's user namespace) and by the
// workers' user (a working directory); the code cannot add entries to a tree when the host
// runs as root. The host never follows a link in them: it makes directories with mkdir and
// lchown and removes them with os.RemoveAll, none of which follow a symlink the code put
// there.

// HomeName is the name of the working directory of the namespace a tree was made for.
const HomeName = "work"

// Templates is what the trees need of the engine's templates: the live one (started if
// none runs; nil when none can, or the engine has none), and to drop one found dead.
type Templates interface {
	Live() *worker.Worker
	Drop(t *worker.Worker)
}

// Trees are an engine's trees of working directories. Its fields are set before first use;
// its methods are safe from any goroutine.
type Trees struct {
	Path    string // the trees' directory on the host (DIR/work), which the engine made
	Local   bool   // the engine's workers run here: the host makes their directories (a Command worker makes its own)
	Sandbox bool   // sandboxed workers: a working directory is the workers' user's
	// Size is WorkSize where each working directory is a tmpfs of its own, which the
	// engine's template mounts (Templates); 0: plain directories.
	Size      int64
	Templates Templates
	Timeout   time.Duration    // a template's answer to a mount request
	Attempts  int              // templates tried for a tree's first mount
	KeepRoot  bool             // moved files keep the sandbox's root's entries root's
	Owner     int              // the host user to give what the host makes; -1: the host's own
	Moved     func(key string) // a working directory's tmpfs was replaced (its watches end)

	seq      atomic.Uint64 // names the trees
	mu       sync.Mutex    // guards the trees' fields, mounts, tmpfs and closed
	mountReq sync.Mutex    // one request to a template at a time, and the moves
	mounts   map[string]*mount
	tmpfs    map[*Tree]bool // the trees with a tmpfs (their fds)
	closed   bool
}

// Tree is one tree: the directory of the working directories of the namespaces that may
// share one worker sandbox.
type Tree struct {
	Name string // its directory's name under the trees
	path string // its host path (with a tmpfs of its own, an empty directory here)
	refs int    // the worker slots whose workers bind it

	// With Size and a template, a tree is a tmpfs of its own that the template mounted
	// over path (mounts.go); the host reaches it by fd alone. Set under Trees.mountReq and
	// Trees.mu, read under either.
	fd    int             // O_PATH, its root; -1: none (path itself holds the tree); the number stays while the tree lives (move dup3s over it)
	tmpl  *worker.Worker  // the template that mounted it
	disk  bool            // begun on the host's disk (no template then): it stays there
	plain map[string]bool // working directories made in it after tmpl died: plain directories, not mounts
}

// Key names the working directory home of tree t under the trees.
func Key(t *Tree, home string) string { return t.Name + "/" + home }

// HomePath is the host path of the working directory home of t: through the fd of its
// tree's tmpfs in /proc when it has one.
func (ts *Trees) HomePath(t *Tree, home string) string {
	return filepath.Join(ts.treeRoot(t), home)
}

// treeRoot is the host path of tree t's root: path, or with a tmpfs, its fd in /proc, which
// this process (and its user) can use as a path.
func (ts *Trees) treeRoot(t *Tree) string {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if t.fd >= 0 {
		return "/proc/" + strconv.Itoa(os.Getpid()) + "/fd/" + strconv.Itoa(t.fd)
	}
	return t.path
}

// New makes a tree with a working directory in it (HomeName), for a worker slot of its own.
func (ts *Trees) New() (*Tree, error) {
	seq := ts.seq.Add(1)
	t := &Tree{Name: strconv.FormatUint(seq, 10), refs: 1, fd: -1}
	t.path = filepath.Join(ts.Path, t.Name)
	if ts.Local {
		if err := os.Mkdir(t.path, 0o755); err != nil {
			return nil, fmt.Errorf("minipy: making a namespace's working directory: %w", err)
		}
	}
	if err := ts.makeHome(t, HomeName); err != nil {
		ts.Release(t, HomeName)
		return nil, err
	}
	return t, nil
}

// Share makes the working directory of namespace id in tree t, for a namespace that shares
// its workers' sandbox (a Fork copy), and counts the slot it gets; it returns its name.
func (ts *Trees) Share(t *Tree, id uint32) (string, error) {
	name := strconv.FormatUint(uint64(id), 10)
	if err := ts.makeHome(t, name); err != nil {
		return "", err
	}
	ts.mu.Lock()
	t.refs++
	ts.mu.Unlock()
	return name, nil
}

// Pack makes the working directory of namespace id in tree t, packed into a shared worker
// (IsolatedConfig.Workers), and returns its name.
func (ts *Trees) Pack(t *Tree, id uint32) (string, error) {
	name := strconv.FormatUint(uint64(id), 10)
	return name, ts.makeHome(t, name)
}

// makeHome makes the working directory name in tree t, empty, owned by the workers'
// user, and, with Size, has the template mount its tmpfs over it (in the tree's own,
// which it mounts at the tree's first directory: treeTemplate). Whatever the code put at
// that name (it may have guessed a namespace id) is removed first, links included, never
// followed.
func (ts *Trees) makeHome(t *Tree, name string) error {
	if !ts.Local {
		return nil
	}
	ts.mountReq.Lock()
	defer ts.mountReq.Unlock()
	tmpl, err := ts.treeTemplate(t)
	if err != nil {
		return err
	}
	path := filepath.Join(ts.treeRoot(t), name)
	if err := ts.freshDir(path); err != nil {
		return err
	}
	if tmpl != nil {
		home, err := ts.askMount(tmpl, t.Name, name)
		if err == nil {
			return ts.addMount(t, name, home, tmpl)
		}
		if !errors.Is(err, worker.ErrTemplateGone) {
			os.Remove(path)
			return err
		}
		// The tree's tmpfs is a dead template's now: the directory stays a plain one in it,
		// which the tree's next worker start moves (Move).
		ts.Templates.Drop(tmpl)
	}
	ts.mu.Lock()
	if t.fd >= 0 {
		if t.plain == nil {
			t.plain = map[string]bool{}
		}
		t.plain[name] = true
	}
	ts.mu.Unlock()
	return nil
}

// freshDir makes the directory path (mode 0700, the workers' user's), removing first
// whatever is there.
func (ts *Trees) freshDir(path string) error {
	err := os.Mkdir(path, 0o700)
	if errors.Is(err, fs.ErrExist) {
		if err = os.RemoveAll(path); err == nil {
			err = os.Mkdir(path, 0o700)
		}
	}
	if err == nil && ts.Sandbox {
		err = os.Lchown(path, worker.UID(), worker.UID())
	}
	if err != nil {
		return fmt.Errorf("minipy: making a namespace's working directory: %w", err)
	}
	return nil
}

// Release removes the working directory home of t, and t once no slot uses it.
func (ts *Trees) Release(t *Tree, home string) {
	if t == nil || !ts.Local {
		return
	}
	ts.RemoveHome(t, home)
	ts.mu.Lock()
	t.refs--
	last := t.refs == 0
	ts.mu.Unlock()
	if last {
		// Removing the host's directory detaches the tree's tmpfs in every mount namespace.
		os.RemoveAll(t.path)
		ts.mountReq.Lock()
		ts.mu.Lock()
		fd := t.fd
		t.fd, t.tmpl = -1, nil
		delete(ts.tmpfs, t)
		ts.mu.Unlock()
		ts.mountReq.Unlock()
		if fd >= 0 {
			syscall.Close(fd)
		}
	}
}

// RemoveHome removes the working directory home of t (a namespace's that ended). Removing
// the directory detaches the tmpfs mounted over it (Size) in every mount namespace; its
// memory is freed once the host's fd and the last worker holding it are gone.
func (ts *Trees) RemoveHome(t *Tree, home string) {
	if t == nil || !ts.Local {
		return
	}
	ts.mountReq.Lock() // (not while its tree's next worker start moves it: Move)
	defer ts.mountReq.Unlock()
	os.RemoveAll(ts.HomePath(t, home))
	ts.mu.Lock()
	m := ts.mounts[Key(t, home)]
	delete(ts.mounts, Key(t, home))
	delete(t.plain, home)
	ts.mu.Unlock()
	if m != nil {
		syscall.Close(m.fd)
	}
}

// OpenHome opens the working directory home of t (O_PATH): through the host's fd of its
// tmpfs, or as a name in its tree (openTreeDir).
func (ts *Trees) OpenHome(t *Tree, home string) (int, error) {
	ts.mu.Lock()
	if m := ts.mounts[Key(t, home)]; m != nil {
		fd, err := Openat2(m.fd, ".", OPath|syscall.O_DIRECTORY, 0, ResolveBeneath) // under ts.mu: m.fd stays m's
		ts.mu.Unlock()
		if err != nil {
			return -1, &fs.PathError{Op: "open", Path: Key(t, home), Err: err}
		}
		return fd, nil
	}
	ts.mu.Unlock()
	return ts.openTreeDir(t, home)
}

// openTreeDir opens the directory name of tree t (O_PATH): the tree's tmpfs enters the
// mount of a working directory in it; without one, the tree is a directory on the host's
// disk, of names the host made, which only the host sees. Without following a link (as
// non-root, the code's user owns a tree and could put one there).
func (ts *Trees) openTreeDir(t *Tree, name string) (int, error) {
	ts.mu.Lock()
	if t.fd >= 0 {
		fd, err := Openat2(t.fd, name, OPath|syscall.O_DIRECTORY, 0, ResolveBeneath|ResolveNoSymlinks) // (t.fd stays t's under ts.mu)
		ts.mu.Unlock()
		if err != nil {
			return -1, &fs.PathError{Op: "open", Path: Key(t, name), Err: err}
		}
		return fd, nil
	}
	ts.mu.Unlock()
	trees, err := syscall.Open(ts.Path, OPath|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return -1, &fs.PathError{Op: "open", Path: ts.Path, Err: err}
	}
	defer syscall.Close(trees)
	key := Key(t, name)
	fd, err := Openat2(trees, key, OPath|syscall.O_DIRECTORY, 0, ResolveBeneath|ResolveNoSymlinks)
	if err != nil {
		return -1, &fs.PathError{Op: "open", Path: path.Join(ts.Path, key), Err: err}
	}
	return fd, nil
}

// HomeDir is the host path of the working directory home of t (Namespace.WorkDir): with a
// tmpfs, the host's fd of it in /proc, which this process (and its user) can use as a path.
func (ts *Trees) HomeDir(t *Tree, home string) string {
	ts.mu.Lock()
	m := ts.mounts[Key(t, home)]
	ts.mu.Unlock()
	if m != nil {
		return "/proc/" + strconv.Itoa(os.Getpid()) + "/fd/" + strconv.Itoa(m.fd)
	}
	return ts.HomePath(t, home)
}

// treeSize is the size of a tree's own tmpfs: it holds the mount points of its working
// directories and, after its template's death, the plain directories added to it.
func (ts *Trees) treeSize() int64 {
	return min(ts.Size, math.MaxInt64/2) * 2
}

// homesOf are the names of the working directories of tree that are still to move into
// template t: its mounts that another template made, and its plain directories.
func (ts *Trees) homesOf(tree *Tree, t *worker.Worker) []string {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	var names []string
	for key, m := range ts.mounts {
		if name, ok := strings.CutPrefix(key, tree.Name+"/"); ok && m.tmpl != t {
			names = append(names, name)
		}
	}
	for name := range tree.plain {
		names = append(names, name)
	}
	return names
}

// The hooks of tests.

// HostPath is the host's directory of tree t on its disk: with Size, the empty directory
// that the template mounts the tree's tmpfs over.
func (t *Tree) HostPath() string { return t.path }

// TreeRoot is the host path of tree t's root (through its tmpfs's fd, with one).
func (ts *Trees) TreeRoot(t *Tree) string { return ts.treeRoot(t) }

// TreeSize is the size of a tree's own tmpfs.
func (ts *Trees) TreeSize() int64 { return ts.treeSize() }

// Mounts is the number of working directories that are a tmpfs the host holds.
func (ts *Trees) Mounts() int {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return len(ts.mounts)
}

// AskMount is template t's AskMount, as the trees ask it (one request at a time).
func (ts *Trees) AskMount(t *worker.Worker, tree, name string, size int64, timeout time.Duration) (int, error) {
	ts.mountReq.Lock()
	defer ts.mountReq.Unlock()
	return t.AskMount(tree, name, size, timeout)
}
