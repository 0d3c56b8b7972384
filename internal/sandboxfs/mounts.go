package sandboxfs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	"github.com/minipy-go/minipy/internal/worker"
)

// The working directories' cap (IsolatedConfig.WorkSize: Trees.Size). With a template,
// each tree is a tmpfs of its own, and each working directory in it a tmpfs of Size bytes,
// which the template mounts in its own mount namespace (pyrt.ControlMount): the tree's over
// the host's empty directory at its first working directory, so that a sandbox's
// /proc/self/mountinfo, where the tree is the root of what it binds, names no host path.
// The workers forked from it see them: their trees are slave copies of the template's, so
// the working directories it mounts after they started (a Fork copy's, a packed
// namespace's) reach them too. The host sees only its empty directory; it reaches the files
// through O_PATH fds of the tmpfs's roots, which the template sends it. Code that writes
// past the cap gets ENOSPC, and the host's disk holds nothing.
//
// The mounts live in their template's mount namespace, and in the sandboxes forked from it.
// When the template dies, its sandboxes go on (they are in pid namespaces of their own), and
// they and the host's fds hold the tmpfs, files and all. A new template's mounts do not
// reach them, so a working directory added to such a tree (a Fork copy's, a packed
// namespace's) is a plain directory in the tree's tmpfs (orphaned; the tree's size caps it),
// which the host makes through its fd. The next worker start of a tree moves its working
// directories (Move) into tmpfs of the new template, or onto the host's disk if no
// template can start, since workers then start without one and bind the host's directories.
// Removing a directory (RemoveHome, Release) detaches the mounts on it everywhere.

// ErrClosed: the trees were closed, as the engine that holds them was (minipy's
// ErrEngineClosed is this error).
var ErrClosed = errors.New("minipy: the isolated engine is closed")

// mount is a working directory that is a tmpfs (Size).
type mount struct {
	fd   int            // O_PATH, the tmpfs's root; the number stays while the directory lives (Move dup3s over it)
	tmpl *worker.Worker // the template in whose mount namespace it is mounted
}

// treeTemplate returns the template that mounts the working directories of tree t, having
// it mount the tree's own tmpfs first if the tree has none yet; nil when its directories are
// plain ones: without Size, without a template (none could start: workers start plainly,
// with the directories on the host's disk, as with NoTemplate), for a tree begun on the
// host's disk, or one whose template died (orphaned: they go in its tmpfs). The caller holds
// ts.mountReq.
func (ts *Trees) treeTemplate(t *Tree) (*worker.Worker, error) {
	if ts.Size <= 0 {
		return nil, nil
	}
	ts.mu.Lock()
	fd, owner, disk := t.fd, t.tmpl, t.disk
	ts.mu.Unlock()
	switch {
	case disk:
		return nil, nil
	case fd >= 0 && (owner.Gone() || ts.Templates.Live() != owner):
		// (A tree whose template was replaced stays in the old one's tmpfs, which its
		// sandbox binds, until its next worker start moves it.)
		return nil, nil
	case fd >= 0:
		return owner, nil
	}
	for tries := 0; ; tries++ {
		tmpl := ts.Templates.Live()
		if tmpl == nil {
			ts.mu.Lock()
			t.disk = true
			ts.mu.Unlock()
			return nil, nil
		}
		root, err := ts.askMount(tmpl, t.Name, "")
		if errors.Is(err, worker.ErrTemplateGone) && tries < ts.Attempts-1 {
			ts.Templates.Drop(tmpl)
			continue // a new one starts
		}
		if err != nil {
			return nil, err
		}
		return tmpl, ts.setTree(t, root, tmpl)
	}
}

// setTree gives tree t the tmpfs of template tmpl whose root is the fd root (dup3 over
// its old one's, whose number stays).
func (ts *Trees) setTree(t *Tree, root int, tmpl *worker.Worker) error {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if ts.closed { // Close has closed the others
		syscall.Close(root)
		return ErrClosed
	}
	t.tmpl, t.plain = tmpl, nil
	if t.fd >= 0 {
		err := syscall.Dup3(root, t.fd, syscall.O_CLOEXEC) // the old tmpfs goes with its last fd
		syscall.Close(root)
		return err
	}
	t.fd = root
	if ts.tmpfs == nil {
		ts.tmpfs = map[*Tree]bool{}
	}
	ts.tmpfs[t] = true
	return nil
}

// addMount records the tmpfs of working directory name of tree t, whose root is the fd
// home, mounted by template tmpl: a new one, or one moved there (dup3 over the old one's
// fd, whose number stays).
func (ts *Trees) addMount(t *Tree, name string, home int, tmpl *worker.Worker) error {
	key := Key(t, name)
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if ts.closed {
		syscall.Close(home)
		return ErrClosed
	}
	delete(t.plain, name)
	if m := ts.mounts[key]; m != nil {
		err := syscall.Dup3(home, m.fd, syscall.O_CLOEXEC) // the old tmpfs goes with its last fd
		m.tmpl = tmpl
		syscall.Close(home)
		return err
	}
	if ts.mounts == nil {
		ts.mounts = map[string]*mount{}
	}
	ts.mounts[key] = &mount{fd: home, tmpl: tmpl}
	return nil
}

// askMount has template t mount the tmpfs of working directory tree/name, or with name "",
// of the tree, and returns the fd of its root. The caller holds ts.mountReq: one request at
// a time, so that an answer is the last request's.
func (ts *Trees) askMount(t *worker.Worker, tree, name string) (int, error) {
	size := ts.Size
	if name == "" {
		size = ts.treeSize()
	}
	return t.AskMount(tree, name, size, ts.Timeout)
}

// Move moves the working directories of tree, when its template has died, into t, the
// template that the tree's next worker is forked from (nil: it starts without one, and
// binds the host's directories), copying their files; before a worker of tree starts.
func (ts *Trees) Move(tree *Tree, t *worker.Worker) error {
	if ts.Size <= 0 || tree == nil {
		return nil
	}
	ts.mountReq.Lock()
	defer ts.mountReq.Unlock()
	ts.mu.Lock()
	old, fd := tree.tmpl, tree.fd
	ts.mu.Unlock()
	if fd < 0 || old == t {
		return nil
	}
	if t != nil && !old.Gone() {
		// A template that another has replaced is dying (the engine dropped it, or it died
		// and its exit is on its way): its mounts move once it is gone.
		old.AwaitExit()
	}
	if !old.Gone() {
		// Only the template that mounted it sees it: a worker started otherwise would not
		// find the namespace's files.
		return fmt.Errorf("minipy: the working directory of a namespace is held by the template, " +
			"which did not fork its worker")
	}
	if t == nil {
		return ts.moveToDisk(tree)
	}
	root, err := ts.askMount(t, tree.Name, "")
	if err != nil {
		return fmt.Errorf("minipy: moving a namespace's files to the new template: %w", err)
	}
	for _, name := range ts.homesOf(tree, t) {
		if err := ts.moveHome(tree, name, root, t); err != nil {
			syscall.Close(root)
			return fmt.Errorf("minipy: moving a namespace's files to the new template: %w", err)
		}
		ts.Moved(Key(tree, name))
	}
	return ts.setTree(tree, root, t)
}

// moveHome moves the working directory name of tree into a tmpfs of template t, in the
// tree's new tmpfs whose root is open as root.
func (ts *Trees) moveHome(tree *Tree, name string, root int, t *worker.Worker) error {
	err := ts.freshDir("/proc/self/fd/" + strconv.Itoa(root) + "/" + name)
	home := -1
	if err == nil {
		home, err = ts.askMount(t, tree.Name, name)
	}
	if err == nil {
		if err = ts.copyHome(tree, name, ts.newRoot(home)); err == nil {
			err = ts.addMount(tree, name, home, t)
			home = -1
		}
	}
	if home >= 0 {
		syscall.Close(home)
	}
	return err
}

// copyHome copies the files of working directory name of tree into dst: from its tmpfs (by
// the host's fd: the mount namespace of a dead template, where the tree's fd would have
// entered it, is gone), or the plain directory in the tree's.
func (ts *Trees) copyHome(tree *Tree, name string, dst *Root) error {
	ts.mu.Lock()
	m := ts.mounts[Key(tree, name)]
	fd := -1
	var err error
	if m != nil {
		fd, err = syscall.Dup(m.fd)
	}
	ts.mu.Unlock()
	if m == nil {
		fd, err = ts.openTreeDir(tree, name)
	}
	if err != nil {
		return err
	}
	defer syscall.Close(fd)
	return Copy(&Root{FD: fd, KeepRoot: ts.KeepRoot}, dst, ".")
}

// moveToDisk moves the working directories of tree, whose template died and which no
// template can take, onto the host's disk, where a worker started plainly binds them.
func (ts *Trees) moveToDisk(tree *Tree) error {
	for _, name := range ts.homesOf(tree, nil) {
		path := filepath.Join(tree.path, name)
		err := ts.freshDir(path)
		var fd int
		if err == nil {
			fd, err = syscall.Open(path, OPath|syscall.O_DIRECTORY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
		}
		if err == nil {
			err = ts.copyHome(tree, name, ts.newRoot(fd))
			syscall.Close(fd)
		}
		if err != nil {
			os.RemoveAll(path)
			return fmt.Errorf("minipy: moving a namespace's files to the host's disk: %w", err)
		}
		key := Key(tree, name)
		ts.mu.Lock()
		m := ts.mounts[key]
		delete(ts.mounts, key)
		delete(tree.plain, name)
		ts.mu.Unlock()
		if m != nil {
			syscall.Close(m.fd)
		}
		ts.Moved(key)
	}
	ts.mu.Lock()
	defer ts.mu.Unlock()
	syscall.Close(tree.fd)
	tree.fd, tree.tmpl, tree.disk, tree.plain = -1, nil, true, nil
	delete(ts.tmpfs, tree)
	return nil
}

// Close lets go of the working directories' and the trees' tmpfs (the engine is closed).
func (ts *Trees) Close() {
	ts.mu.Lock()
	ms, trees := ts.mounts, ts.tmpfs
	ts.mounts, ts.tmpfs, ts.closed = nil, nil, true
	var fds []int
	for t := range trees {
		fds = append(fds, t.fd)
		t.fd, t.tmpl = -1, nil
	}
	ts.mu.Unlock()
	for _, m := range ms {
		fds = append(fds, m.fd)
	}
	for _, fd := range fds {
		syscall.Close(fd)
	}
}

// newRoot is a Root of the open directory fd whose writes are not the host's WriteFile
// (a move's).
func (ts *Trees) newRoot(fd int) *Root { return &Root{FD: fd, Owner: ts.Owner, Limit: ts.Size} }
