package minipy

import (
	"cmp"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/minipy-go/minipy/internal/sandboxfs"
)

// Absolute names: the sandbox's places. A name given to a file method may be absolute, as
// the namespace's code sees its sandbox: under IsolatedConfig.WorkDirPath it is the working
// directory's (the same file as the relative name), under /tmp or /dev/shm the sandbox's
// own tmpfs there, elsewhere its root's (each TmpSize; its worker's: a new worker starts
// with them as the image has them). What is mounted in the root (the image's read-only
// binds: /usr, /etc; /dev, /proc, /namespaces) is not reached: such a name is ErrBadPath.
// The host reaches the places through the sandbox's root, which the sandbox's guardian hands
// it (worker.SandboxRoot; the code cannot reach the guardian), and then only inside each
// tmpfs: no link is followed out of it and no mount in it is entered (RESOLVE_BENEATH,
// RESOLVE_NO_XDEV), so the host, root or not, touches nothing there the code could not have
// put there itself.

// sandboxPlaces are the places besides the working directory that absolute names reach:
// each a tmpfs of the sandbox's own; "/", its root, holds the names no other place does.
var sandboxPlaces = []string{"/tmp", "/dev/shm", "/"}

// sandboxRootTimeout bounds the guardian's answer with its root (a message each way).
const sandboxRootTimeout = 10 * time.Second

// placeName splits the absolute name into the place it is under (WorkDirPath or one of
// sandboxPlaces) and its name there ("." for the place itself). ok is false for a name
// elsewhere.
func placeName(workDir, name string) (place, rel string, ok bool) {
	clean := path.Clean(name)
	for _, p := range append([]string{workDir}, sandboxPlaces...) {
		switch {
		case clean == p:
			return p, ".", true
		case p == "/" && strings.HasPrefix(clean, "/"):
			return p, clean[1:], true
		case strings.HasPrefix(clean, p+"/"):
			return p, clean[len(p)+1:], true
		}
	}
	return "", "", false
}

// placeOf checks the absolute name for namespace ns's file method op and splits it into its
// place and its name there (placeName), opening nothing.
func (ns *Namespace) placeOf(op, name string, dirOK bool) (e *Isolated, b *nsBinding, place, rel string, err error) {
	e, ok := ns.engine.(*Isolated)
	b = bindingOf(ns)
	if !ok || b == nil || !e.sandbox || !e.local() || !b.slot.own || b.dirs.home != sandboxfs.HomeName {
		why := "only a sandboxed namespace with a sandbox of its own (not a Fork copy or a packed one) reaches its " +
			"sandbox's files by absolute names"
		return nil, nil, "", "", &fs.PathError{Op: op, Path: name, Err: fmt.Errorf("%w: %s", ErrBadPath, why)}
	}
	place, rel, ok = placeName(e.cfg.WorkDirPath, filepath.ToSlash(name))
	switch {
	case !ok || sandboxfs.Climbs(name):
		return nil, nil, "", "", &fs.PathError{Op: op, Path: name, Err: ErrBadPath}
	case rel == "." && !dirOK:
		return nil, nil, "", "", &fs.PathError{Op: op, Path: name, Err: fs.ErrInvalid}
	}
	return e, b, place, rel, nil
}

// placeRoot opens the place of the absolute name for namespace ns's file method op, acting
// as as, and returns it with the name's part there.
func (ns *Namespace) placeRoot(op, name string, dirOK bool, as fileActor) (*sandboxfs.Root, string, error) {
	e, b, place, rel, err := ns.placeOf(op, name, dirOK)
	if err != nil {
		return nil, "", err
	}
	if place == e.cfg.WorkDirPath {
		r, err := e.rootOf(b)
		if err != nil {
			return nil, "", err
		}
		actor(r, as)
		r.Base = place
		return r, rel, nil
	}
	r, err := e.sandboxPlace(b, place, as)
	if err != nil {
		return nil, "", &fs.PathError{Op: op, Path: name, Err: err}
	}
	if place == "/" && rel != "." && r.MountedAt(strings.SplitN(rel, "/", 2)[0]) {
		r.Close()
		return nil, "", &fs.PathError{Op: op, Path: name, Err: fmt.Errorf("%w: the image's (a mount in the sandbox's "+
			"root)", ErrBadPath)}
	}
	return r, rel, nil
}

// sandboxPlace opens place (one of sandboxPlaces) in the sandbox of b's worker, starting
// one if none runs, acting as as: the tmpfs there, which must be one (a mount's root).
func (e *Isolated) sandboxPlace(b *nsBinding, place string, as fileActor) (*sandboxfs.Root, error) {
	root, err := e.sandboxRoot(b)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	return e.placeIn(root, place, as)
}

// sandboxRoot is the root of the sandbox of b's worker, starting one if none runs, as its
// guardian hands it over.
func (e *Isolated) sandboxRoot(b *nsBinding) (*os.File, error) {
	if e.isClosed() {
		return nil, ErrEngineClosed
	}
	w, err := b.slot.current()
	if err != nil {
		return nil, err
	}
	return w.SandboxRoot(sandboxRootTimeout)
}

// placeIn opens place (one of sandboxPlaces) in the sandbox whose root is root, acting as
// as: the sandbox's user, with the code's reach (a root host's thread takes the user's
// fsuid, which puts its file capabilities off); its root (actRoot: root's fsuid); or, to
// save and restore a sandbox with a root user (actKeeper), its user keeping which entries
// are root's. Root's reach is the thread's own CAP_DAC_OVERRIDE and the like, put back on
// (sandboxfs.Root.ActAs): over the place's tmpfs alone, whose files are all the sandbox's (the names are
// resolved beneath it, crossing no mount), as its root's capabilities reach them.
func (e *Isolated) placeIn(root *os.File, place string, as fileActor) (*sandboxfs.Root, error) {
	fd, err := sandboxfs.Openat2(int(root.Fd()), cmp.Or(place[1:], "."), sandboxfs.OPath|syscall.O_DIRECTORY, 0,
		sandboxfs.ResolveBeneath|sandboxfs.ResolveNoSymlinks|sandboxfs.ResolveNoMagiclinks)
	if err != nil {
		return nil, err
	}
	var st syscall.Statfs_t
	if err := syscall.Fstatfs(fd, &st); err != nil || st.Type != sandboxfs.TmpfsMagic {
		syscall.Close(fd)
		return nil, fmt.Errorf("%w: the sandbox's %s is not its tmpfs", ErrBadPath, place)
	}
	r := &sandboxfs.Root{FD: fd, Owner: e.fileOwner(), Limit: e.cfg.TmpSize, Base: place, NoXdev: true}
	actor(r, as)
	if r.Owner >= 0 {
		if err := r.ActAs(r.Owner, as != actUser); err != nil {
			syscall.Close(fd)
			return nil, err
		}
	}
	return r, nil
}
