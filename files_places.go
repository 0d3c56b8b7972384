package minipy

import (
	"cmp"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
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

// tmpfsMagic is a tmpfs's f_type (linux/magic.h).
const tmpfsMagic = 0x01021994

// resolveNoXdev is RESOLVE_NO_XDEV (linux/openat2.h): no mount is crossed.
const resolveNoXdev = 0x01

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
	if !ok || b == nil || !e.sandbox || !e.local() || !b.slot.own || b.dirs.home != homeName {
		why := "only a sandboxed namespace with a sandbox of its own (not a Fork copy or a packed one) reaches its " +
			"sandbox's files by absolute names"
		return nil, nil, "", "", &fs.PathError{Op: op, Path: name, Err: fmt.Errorf("%w: %s", ErrBadPath, why)}
	}
	place, rel, ok = placeName(e.cfg.WorkDirPath, filepath.ToSlash(name))
	switch {
	case !ok || climbs(name):
		return nil, nil, "", "", &fs.PathError{Op: op, Path: name, Err: ErrBadPath}
	case rel == "." && !dirOK:
		return nil, nil, "", "", &fs.PathError{Op: op, Path: name, Err: fs.ErrInvalid}
	}
	return e, b, place, rel, nil
}

// placeRoot opens the place of the absolute name for namespace ns's file method op, acting
// as as, and returns it with the name's part there.
func (ns *Namespace) placeRoot(op, name string, dirOK bool, as fileActor) (*workRoot, string, error) {
	e, b, place, rel, err := ns.placeOf(op, name, dirOK)
	if err != nil {
		return nil, "", err
	}
	if place == e.cfg.WorkDirPath {
		r, err := e.rootOf(b)
		if err != nil {
			return nil, "", err
		}
		r.actor(as)
		r.base = place
		return r, rel, nil
	}
	r, err := e.sandboxPlace(b, place, as)
	if err != nil {
		return nil, "", &fs.PathError{Op: op, Path: name, Err: err}
	}
	if place == "/" && rel != "." && r.mountedAt(strings.SplitN(rel, "/", 2)[0]) {
		r.close()
		return nil, "", &fs.PathError{Op: op, Path: name, Err: fmt.Errorf("%w: the image's (a mount in the sandbox's "+
			"root)", ErrBadPath)}
	}
	return r, rel, nil
}

// mountedAt reports whether the name at the root is a mount (the image's /usr, /etc; /dev,
// /proc): what is there is not the root's, even to stat or make.
func (r *workRoot) mountedAt(name string) bool {
	var root, st unix.Statx_t
	const flags = unix.AT_SYMLINK_NOFOLLOW | unix.AT_NO_AUTOMOUNT
	return unix.Statx(r.fd, "", flags|unix.AT_EMPTY_PATH, unix.STATX_MNT_ID, &root) == nil &&
		unix.Statx(r.fd, name, flags, unix.STATX_MNT_ID, &st) == nil && st.Mnt_id != root.Mnt_id
}

// sandboxPlace opens place (one of sandboxPlaces) in the sandbox of b's worker, starting
// one if none runs, acting as as: the tmpfs there, which must be one (a mount's root).
func (e *Isolated) sandboxPlace(b *nsBinding, place string, as fileActor) (*workRoot, error) {
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
// (actAs): over the place's tmpfs alone, whose files are all the sandbox's (the names are
// resolved beneath it, crossing no mount), as its root's capabilities reach them.
func (e *Isolated) placeIn(root *os.File, place string, as fileActor) (*workRoot, error) {
	fd, err := openat2(int(root.Fd()), cmp.Or(place[1:], "."), oPath|syscall.O_DIRECTORY, 0,
		resolveBeneath|resolveNoSymlinks|resolveNoMagiclinks)
	if err != nil {
		return nil, err
	}
	var st syscall.Statfs_t
	if err := syscall.Fstatfs(fd, &st); err != nil || st.Type != tmpfsMagic {
		syscall.Close(fd)
		return nil, fmt.Errorf("%w: the sandbox's %s is not its tmpfs", ErrBadPath, place)
	}
	r := &workRoot{fd: fd, owner: e.fileOwner(), limit: e.cfg.TmpSize, base: place, noXdev: true,
		wrote: func(string, syscall.Timespec) {}}
	r.actor(as)
	if r.owner >= 0 {
		if err := r.actAs(r.owner, as != actUser); err != nil {
			syscall.Close(fd)
			return nil, err
		}
	}
	return r, nil
}

// actAs has this goroutine's thread use the file system as host user id (its fsuid and
// fsgid), until the root's close: a sandbox's tmpfs is mounted in its user namespace, where
// a file of the host's root could not even be made (EOVERFLOW), and the host then has no
// more rights there than the code (a root host's CAP_DAC_OVERRIDE and the like are off for
// a thread whose fsuid is not 0), unless reach puts them back on for the thread (the
// sandbox's root's reach: placeIn). The file methods close their root on the goroutine
// that opened it, last opened first closed.
func (r *workRoot) actAs(id int, reach bool) error {
	runtime.LockOSThread()
	prevUID, _, _ := syscall.RawSyscall(syscall.SYS_SETFSUID, uintptr(id), 0, 0)
	prevGID, _, _ := syscall.RawSyscall(syscall.SYS_SETFSGID, uintptr(id), 0, 0)
	r.restore = func() {
		// (Back to fsuid 0, the kernel puts the file capabilities back on by itself.)
		syscall.RawSyscall(syscall.SYS_SETFSGID, prevGID, 0, 0) //nolint:errcheck // (it returns the previous id)
		syscall.RawSyscall(syscall.SYS_SETFSUID, prevUID, 0, 0) //nolint:errcheck
		runtime.UnlockOSThread()
	}
	if reach {
		if err := reachAsRoot(); err != nil {
			r.restore()
			r.restore = nil
			return fmt.Errorf("minipy: acting as the sandbox's root: %w", err)
		}
	}
	return nil
}

// rootReach are the capabilities of the sandbox's root over its files that a thread whose
// fsuid is not 0 no longer has in effect (capabilities(7), "Effect of user ID changes on
// capabilities"): reachAsRoot puts them back on.
var rootReach = []int{unix.CAP_CHOWN, unix.CAP_DAC_OVERRIDE, unix.CAP_DAC_READ_SEARCH, unix.CAP_FOWNER, unix.CAP_FSETID}

// reachAsRoot puts rootReach in effect again for this thread (whose permitted set, a root
// host's, holds them).
func reachAsRoot() error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return err
	}
	for _, c := range rootReach {
		data[c/32].Effective |= 1 << (c % 32)
	}
	return unix.Capset(&hdr, &data[0])
}

// name is the name the file methods give for rel below the root: relative to the working
// directory, or absolute when the root is a place reached by an absolute name.
func (r *workRoot) name(rel string) string {
	if r.base == "" {
		return rel
	}
	return path.Join(r.base, rel)
}
