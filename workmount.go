package minipy

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"strconv"
	"strings"
	"syscall"

	"github.com/minipy-go/minipy/internal/worker"
)

// The working directories' cap (IsolatedConfig.WorkSize). With a template, each working
// directory is a tmpfs of WorkSize bytes that the template mounts over the host's (empty)
// directory in its own mount namespace (pyrt.ControlMount). The workers forked from it see
// it: their trees are slave binds of the template's, so the mounts it makes after they
// started (a Fork copy's, a packed namespace's) reach them too. The host sees only its empty
// directory; it reaches the files through an O_PATH fd of the tmpfs's root, which the
// template sends it. Code that writes past the cap gets ENOSPC, and the host's disk holds
// nothing.
//
// A mount lives in its template's mount namespace, and in the sandboxes forked from it. When
// the template dies, its sandboxes go on (they are in pid namespaces of their own), and they
// and the host's fd hold the tmpfs, files and all. A new template's mounts do not reach
// them, so a working directory added to such a tree (a Fork copy's, a packed namespace's)
// stays on the host's disk, uncapped, as without a template (orphaned). The next worker
// start of a tree moves its mounts (moveMounts) into a tmpfs of the new template, or onto
// the host's disk if no template can start, since workers then start without one and bind
// the host's directory. Removing the host's directory (removeWorkDir) detaches the mount
// everywhere.

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

// mountWorkDir has the template mount the tmpfs of the working directory name in tree t.
// Without a template (none could start: workers start plainly) the directory stays on the
// host's disk, as with NoTemplate.
func (e *Isolated) mountWorkDir(t *workTree, name string) error {
	if !e.capped() {
		return nil
	}
	e.mountReq.Lock()
	defer e.mountReq.Unlock()
	if e.orphaned(t) {
		return nil
	}
	for tries := 0; ; tries++ {
		tmpl := e.liveTemplate()
		if tmpl == nil {
			return nil
		}
		fd, err := e.askMount(tmpl, t.name, name)
		if errors.Is(err, worker.ErrTemplateGone) && tries < startAttempts-1 {
			e.dropTemplate(tmpl)
			continue // a new one starts
		}
		if err != nil {
			return err
		}
		e.mu.Lock()
		defer e.mu.Unlock()
		if e.closed { // Close has closed the others
			syscall.Close(fd)
			return ErrEngineClosed
		}
		if e.mounts == nil {
			e.mounts = map[string]*workMount{}
		}
		e.mounts[t.name+"/"+name] = &workMount{fd: fd, tmpl: tmpl}
		return nil
	}
}

// orphaned reports whether tree t's sandbox outlived the template that mounted its working
// directories: another template's mounts would not reach it.
func (e *Isolated) orphaned(t *workTree) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	for key, m := range e.mounts {
		if strings.HasPrefix(key, t.name+"/") && m.tmpl.Gone() {
			return true
		}
	}
	return false
}

// askMount has template t mount the tmpfs of working directory tree/name and returns the
// fd of its root. The caller holds e.mountReq: one request at a time, so that an answer
// is the last request's.
func (e *Isolated) askMount(t *worker.Worker, tree, name string) (int, error) {
	return t.AskMount(tree, name, e.cfg.WorkSize, e.cfg.StartTimeout)
}

// moveMounts moves the working directories of tree whose template has died into t, the
// template that the tree's next worker is forked from (nil: it starts without one, and
// binds the host's directories), copying their files; before a worker of tree starts.
func (e *Isolated) moveMounts(tree *workTree, t *worker.Worker) error {
	if !e.capped() || tree == nil {
		return nil
	}
	e.mountReq.Lock()
	defer e.mountReq.Unlock()
	e.mu.Lock()
	moving := map[string]*workMount{}
	for key, m := range e.mounts {
		if strings.HasPrefix(key, tree.name+"/") && m.tmpl != t {
			moving[key] = m
		}
	}
	e.mu.Unlock()
	for key, m := range moving {
		if t != nil && !m.tmpl.Gone() {
			// A template that another has replaced is dying (dropTemplate killed it, or it
			// died and its exit is on its way): its mounts move once it is gone.
			m.tmpl.AwaitExit()
		}
		if !m.tmpl.Gone() {
			// Only the template that mounted it sees it: a worker started otherwise would
			// not find the namespace's files.
			return fmt.Errorf("minipy: the working directory of a namespace is held by the template, " +
				"which did not fork its worker")
		}
		name := path.Base(key)
		src := &workRoot{fd: m.fd}
		if t != nil {
			fd, err := e.askMount(t, tree.name, name)
			if err == nil {
				err = copyFiles(src, e.newRoot(fd), ".")
				if err != nil {
					syscall.Close(fd)
				}
			}
			if err != nil {
				return fmt.Errorf("minipy: moving a namespace's files to the new template: %w", err)
			}
			e.mu.Lock()
			err = syscall.Dup3(fd, m.fd, syscall.O_CLOEXEC) // the old tmpfs goes with its last fd
			m.tmpl = t
			e.mu.Unlock()
			syscall.Close(fd)
			e.watch.moved(key)
			if err != nil {
				return fmt.Errorf("minipy: moving a namespace's files to the new template: %w", err)
			}
			continue
		}
		fd, err := e.openHostDir(key)
		if err == nil {
			err = copyFiles(src, e.newRoot(fd), ".")
			syscall.Close(fd)
		}
		if err != nil {
			return fmt.Errorf("minipy: moving a namespace's files to the host's disk: %w", err)
		}
		e.mu.Lock()
		delete(e.mounts, key)
		e.mu.Unlock()
		syscall.Close(m.fd)
		e.watch.moved(key)
	}
	return nil
}

// closeMounts lets go of the working directories' tmpfs (the engine is closed).
func (e *Isolated) closeMounts() {
	e.mu.Lock()
	ms := e.mounts
	e.mounts = nil
	e.mu.Unlock()
	for _, m := range ms {
		syscall.Close(m.fd)
	}
}

// openWorkDir opens the working directory of d (O_PATH): through the host's fd of its
// tmpfs, or as a path of names the host made in the engine's trees, which only the host
// sees, without following a link (as non-root, the code's user owns a tree and could put
// one there).
func (e *Isolated) openWorkDir(d workDirs) (int, error) {
	e.mu.Lock()
	if m := e.mounts[d.key()]; m != nil {
		fd, err := openat2(m.fd, ".", oPath|syscall.O_DIRECTORY, 0, resolveBeneath) // under e.mu: m.fd stays m's
		e.mu.Unlock()
		if err != nil {
			return -1, &fs.PathError{Op: "open", Path: d.homePath(), Err: err}
		}
		return fd, nil
	}
	e.mu.Unlock()
	return e.openHostDir(d.key())
}

// openHostDir opens the directory key (TREE/NAME) of the engine's trees on the host's disk.
func (e *Isolated) openHostDir(key string) (int, error) {
	trees, err := syscall.Open(e.trees, oPath|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return -1, &fs.PathError{Op: "open", Path: e.trees, Err: err}
	}
	defer syscall.Close(trees)
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
	return b.dirs.homePath()
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
