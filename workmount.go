package minipy

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
	"syscall"

	"github.com/minipy-go/minipy/internal/worker"
)

// The working directories' cap (IsolatedConfig.WorkSize). With a template, each tree is a
// tmpfs of its own, and each working directory in it a tmpfs of WorkSize bytes, which the
// template mounts in its own mount namespace (pyrt.ControlMount): the tree's over the host's
// empty directory at its first working directory, so that a sandbox's /proc/self/mountinfo,
// where the tree is the root of what it binds, names no host path. The workers forked from
// it see them: their trees are slave copies of the template's, so the working directories
// it mounts after they started (a Fork copy's, a packed namespace's) reach them too. The
// host sees only its empty directory; it reaches the files through O_PATH fds of the
// tmpfs's roots, which the template sends it. Code that writes past the cap gets ENOSPC, and
// the host's disk holds nothing.
//
// The mounts live in their template's mount namespace, and in the sandboxes forked from it.
// When the template dies, its sandboxes go on (they are in pid namespaces of their own), and
// they and the host's fds hold the tmpfs, files and all. A new template's mounts do not
// reach them, so a working directory added to such a tree (a Fork copy's, a packed
// namespace's) is a plain directory in the tree's tmpfs (orphaned; the tree's size caps it),
// which the host makes through its fd. The next worker start of a tree moves its working
// directories (moveMounts) into tmpfs of the new template, or onto the host's disk if no
// template can start, since workers then start without one and bind the host's directories.
// Removing a directory (removeWorkDir, releaseDirs) detaches the mounts on it everywhere.

// workMount is a working directory that is a tmpfs (WorkSize).
type workMount struct {
	fd   int            // O_PATH, the tmpfs's root; the number stays while the directory lives (moveMounts dup3s over it)
	tmpl *worker.Worker // the template in whose mount namespace it is mounted
}

// defaultWorkSize is IsolatedConfig.WorkSize's default.
const defaultWorkSize = 1 << 30

// key names the working directory of d under the engine's trees, and its mount in e.mounts.
func (d workDirs) key() string { return d.tree.name + "/" + d.home }

// capped reports whether working directories get a tmpfs of WorkSize bytes.
func (e *Isolated) capped() bool {
	return e.sandbox && e.local() && !e.cfg.NoTemplate && e.cfg.WorkSize > 0
}

// treeTemplate returns the template that mounts the working directories of tree t, having
// it mount the tree's own tmpfs first if the tree has none yet; nil when its directories are
// plain ones: without WorkSize, without a template (none could start: workers start
// plainly, with the directories on the host's disk, as with NoTemplate), for a tree begun
// on the host's disk, or one whose template died (orphaned: they go in its tmpfs). The caller
// holds e.mountReq.
func (e *Isolated) treeTemplate(t *workTree) (*worker.Worker, error) {
	if !e.capped() {
		return nil, nil
	}
	e.mu.Lock()
	fd, owner, disk := t.fd, t.tmpl, t.disk
	e.mu.Unlock()
	switch {
	case disk:
		return nil, nil
	case fd >= 0 && (owner.Gone() || e.liveTemplate() != owner):
		// (A tree whose template was replaced stays in the old one's tmpfs, which its
		// sandbox binds, until its next worker start moves it.)
		return nil, nil
	case fd >= 0:
		return owner, nil
	}
	for tries := 0; ; tries++ {
		tmpl := e.liveTemplate()
		if tmpl == nil {
			e.mu.Lock()
			t.disk = true
			e.mu.Unlock()
			return nil, nil
		}
		root, err := e.askMount(tmpl, t.name, "")
		if errors.Is(err, worker.ErrTemplateGone) && tries < startAttempts-1 {
			e.dropTemplate(tmpl)
			continue // a new one starts
		}
		if err != nil {
			return nil, err
		}
		return tmpl, e.setTree(t, root, tmpl)
	}
}

// setTree gives tree t the tmpfs of template tmpl whose root is the fd root (dup3 over
// its old one's, whose number stays).
func (e *Isolated) setTree(t *workTree, root int, tmpl *worker.Worker) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed { // Close has closed the others
		syscall.Close(root)
		return ErrEngineClosed
	}
	t.tmpl, t.plain = tmpl, nil
	if t.fd >= 0 {
		err := syscall.Dup3(root, t.fd, syscall.O_CLOEXEC) // the old tmpfs goes with its last fd
		syscall.Close(root)
		return err
	}
	t.fd = root
	if e.tmpfsTrees == nil {
		e.tmpfsTrees = map[*workTree]bool{}
	}
	e.tmpfsTrees[t] = true
	return nil
}

// addMount records the tmpfs of working directory name of tree t, whose root is the fd
// home, mounted by template tmpl: a new one, or one moved there (dup3 over the old one's
// fd, whose number stays).
func (e *Isolated) addMount(t *workTree, name string, home int, tmpl *worker.Worker) error {
	key := t.name + "/" + name
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		syscall.Close(home)
		return ErrEngineClosed
	}
	delete(t.plain, name)
	if m := e.mounts[key]; m != nil {
		err := syscall.Dup3(home, m.fd, syscall.O_CLOEXEC) // the old tmpfs goes with its last fd
		m.tmpl = tmpl
		syscall.Close(home)
		return err
	}
	if e.mounts == nil {
		e.mounts = map[string]*workMount{}
	}
	e.mounts[key] = &workMount{fd: home, tmpl: tmpl}
	return nil
}

// treeSize is the size of a tree's own tmpfs: it holds the mount points of its working
// directories and, after its template's death, the plain directories added to it.
func (e *Isolated) treeSize() int64 {
	return min(e.cfg.WorkSize, math.MaxInt64/2) * 2
}

// askMount has template t mount the tmpfs of working directory tree/name, or with name "",
// of the tree, and returns the fd of its root. The caller holds e.mountReq: one request at a
// time, so that an answer is the last request's.
func (e *Isolated) askMount(t *worker.Worker, tree, name string) (int, error) {
	size := e.cfg.WorkSize
	if name == "" {
		size = e.treeSize()
	}
	return t.AskMount(tree, name, size, e.cfg.StartTimeout)
}

// moveMounts moves the working directories of tree, when its template has died, into t, the
// template that the tree's next worker is forked from (nil: it starts without one, and
// binds the host's directories), copying their files; before a worker of tree starts.
func (e *Isolated) moveMounts(tree *workTree, t *worker.Worker) error {
	if !e.capped() || tree == nil {
		return nil
	}
	e.mountReq.Lock()
	defer e.mountReq.Unlock()
	e.mu.Lock()
	old, fd := tree.tmpl, tree.fd
	e.mu.Unlock()
	if fd < 0 || old == t {
		return nil
	}
	if t != nil && !old.Gone() {
		// A template that another has replaced is dying (dropTemplate killed it, or it died
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
		return e.moveToDisk(tree)
	}
	root, err := e.askMount(t, tree.name, "")
	if err != nil {
		return fmt.Errorf("minipy: moving a namespace's files to the new template: %w", err)
	}
	for _, name := range e.treeHomes(tree, t) {
		err = e.freshDir("/proc/self/fd/" + strconv.Itoa(root) + "/" + name)
		home := -1
		if err == nil {
			home, err = e.askMount(t, tree.name, name)
		}
		if err == nil {
			if err = e.copyHome(tree, name, e.newRoot(home)); err == nil {
				err = e.addMount(tree, name, home, t)
				home = -1
			}
		}
		if home >= 0 {
			syscall.Close(home)
		}
		if err != nil {
			syscall.Close(root)
			return fmt.Errorf("minipy: moving a namespace's files to the new template: %w", err)
		}
		e.watch.moved(tree.name + "/" + name)
	}
	return e.setTree(tree, root, t)
}

// treeHomes are the names of the working directories of tree that are still to move into
// template t: its mounts that another template made, and its plain directories.
func (e *Isolated) treeHomes(tree *workTree, t *worker.Worker) []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var names []string
	for key, m := range e.mounts {
		if name, ok := strings.CutPrefix(key, tree.name+"/"); ok && m.tmpl != t {
			names = append(names, name)
		}
	}
	for name := range tree.plain {
		names = append(names, name)
	}
	return names
}

// copyHome copies the files of working directory name of tree into dst: from its tmpfs (by
// the host's fd: the mount namespace of a dead template, where the tree's fd would have
// entered it, is gone), or the plain directory in the tree's.
func (e *Isolated) copyHome(tree *workTree, name string, dst *workRoot) error {
	e.mu.Lock()
	m := e.mounts[tree.name+"/"+name]
	fd := -1
	var err error
	if m != nil {
		fd, err = syscall.Dup(m.fd)
	}
	e.mu.Unlock()
	if m == nil {
		fd, err = e.openTreeDir(tree, name)
	}
	if err != nil {
		return err
	}
	defer syscall.Close(fd)
	return copyFiles(&workRoot{fd: fd, keepRoot: e.rootUser()}, dst, ".")
}

// moveToDisk moves the working directories of tree, whose template died and which no
// template can take, onto the host's disk, where a worker started plainly binds them.
func (e *Isolated) moveToDisk(tree *workTree) error {
	for _, name := range e.treeHomes(tree, nil) {
		path := filepath.Join(tree.path, name)
		err := e.freshDir(path)
		var fd int
		if err == nil {
			fd, err = syscall.Open(path, oPath|syscall.O_DIRECTORY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
		}
		if err == nil {
			err = e.copyHome(tree, name, e.newRoot(fd))
			syscall.Close(fd)
		}
		if err != nil {
			os.RemoveAll(path)
			return fmt.Errorf("minipy: moving a namespace's files to the host's disk: %w", err)
		}
		key := tree.name + "/" + name
		e.mu.Lock()
		m := e.mounts[key]
		delete(e.mounts, key)
		delete(tree.plain, name)
		e.mu.Unlock()
		if m != nil {
			syscall.Close(m.fd)
		}
		e.watch.moved(key)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	syscall.Close(tree.fd)
	tree.fd, tree.tmpl, tree.disk, tree.plain = -1, nil, true, nil
	delete(e.tmpfsTrees, tree)
	return nil
}

// closeMounts lets go of the working directories' and the trees' tmpfs (the engine is
// closed).
func (e *Isolated) closeMounts() {
	e.mu.Lock()
	ms, trees := e.mounts, e.tmpfsTrees
	e.mounts, e.tmpfsTrees = nil, nil
	var fds []int
	for t := range trees {
		fds = append(fds, t.fd)
		t.fd, t.tmpl = -1, nil
	}
	e.mu.Unlock()
	for _, m := range ms {
		fds = append(fds, m.fd)
	}
	for _, fd := range fds {
		syscall.Close(fd)
	}
}

// openWorkDir opens the working directory of d (O_PATH): through the host's fd of its
// tmpfs, or as a name in its tree (openTreeDir).
func (e *Isolated) openWorkDir(d workDirs) (int, error) {
	e.mu.Lock()
	if m := e.mounts[d.key()]; m != nil {
		fd, err := openat2(m.fd, ".", oPath|syscall.O_DIRECTORY, 0, resolveBeneath) // under e.mu: m.fd stays m's
		e.mu.Unlock()
		if err != nil {
			return -1, &fs.PathError{Op: "open", Path: d.key(), Err: err}
		}
		return fd, nil
	}
	e.mu.Unlock()
	return e.openTreeDir(d.tree, d.home)
}

// openTreeDir opens the directory name of tree t (O_PATH): the tree's tmpfs enters the
// mount of a working directory in it; without one, the tree is a directory on the host's
// disk, of names the host made, which only the host sees. Without following a link (as
// non-root, the code's user owns a tree and could put one there).
func (e *Isolated) openTreeDir(t *workTree, name string) (int, error) {
	e.mu.Lock()
	if t.fd >= 0 {
		fd, err := openat2(t.fd, name, oPath|syscall.O_DIRECTORY, 0, resolveBeneath|resolveNoSymlinks) // (t.fd stays t's under e.mu)
		e.mu.Unlock()
		if err != nil {
			return -1, &fs.PathError{Op: "open", Path: t.name + "/" + name, Err: err}
		}
		return fd, nil
	}
	e.mu.Unlock()
	trees, err := syscall.Open(e.trees, oPath|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return -1, &fs.PathError{Op: "open", Path: e.trees, Err: err}
	}
	defer syscall.Close(trees)
	key := t.name + "/" + name
	fd, err := openat2(trees, key, oPath|syscall.O_DIRECTORY, 0, resolveBeneath|resolveNoSymlinks)
	if err != nil {
		return -1, &fs.PathError{Op: "open", Path: path.Join(e.trees, key), Err: err}
	}
	return fd, nil
}

// dirOf is the host path of the working directory of b (Namespace.WorkDir): with a tmpfs,
// the host's fd of it in /proc, which this process (and its user) can use as a path.
func (e *Isolated) dirOf(b *nsBinding) string {
	e.mu.Lock()
	m := e.mounts[b.dirs.key()]
	e.mu.Unlock()
	if m != nil {
		return "/proc/" + strconv.Itoa(os.Getpid()) + "/fd/" + strconv.Itoa(m.fd)
	}
	return e.homePath(b.dirs)
}

// newRoot is a workRoot of the open directory fd whose writes do not count as the host's
// WriteFile (moveMounts).
func (e *Isolated) newRoot(fd int) *workRoot {
	return &workRoot{fd: fd, owner: e.fileOwner(), limit: e.readLimit(), wrote: func(string, syscall.Timespec) {}}
}

// fileOwner is the host user to give what the host makes in a working directory: the
// workers' user on a root host, -1 (the host's own) otherwise.
func (e *Isolated) fileOwner() int {
	if e.sandbox && os.Geteuid() == 0 {
		return worker.UID()
	}
	return -1
}

// symlink makes the symbolic link name (its directory exists) pointing to to.
func (r *workRoot) symlink(to, name string) error {
	parent, err := r.openat("symlink", path.Dir(name), syscall.O_RDONLY|syscall.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer syscall.Close(parent)
	base := path.Base(name)
	err = os.Symlink(to, "/proc/self/fd/"+strconv.Itoa(parent)+"/"+base)
	if err == nil && r.owner >= 0 {
		err = fchownat(parent, base, r.owner)
	}
	return err
}

// chmod sets the permission bits of name (not a link).
func (r *workRoot) chmod(name string, mode uint32) error {
	fd, err := r.openat("chmod", name, syscall.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return err
	}
	defer syscall.Close(fd)
	if err := syscall.Fchmod(fd, mode); err != nil {
		return &fs.PathError{Op: "chmod", Path: name, Err: err}
	}
	return nil
}
