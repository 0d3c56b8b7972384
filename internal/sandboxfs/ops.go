package sandboxfs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"runtime"
	"strconv"
	"syscall"

	"github.com/minipy-go/minipy/internal/worker"
	"golang.org/x/sys/unix"
)

// The operations that change a root's tree. Like the others they reach only below the
// root: every step is taken from a descriptor opened beneath it (openat2 RESOLVE_BENEATH),
// and none follows a symbolic link the code made, at the end of a path or inside it.

// Stat describes name below the root, not following it.
func (r *Root) Stat(name string) (Info, error) {
	var st syscall.Stat_t
	if name == "." {
		if err := syscall.Fstat(r.FD, &st); err != nil {
			return Info{}, &fs.PathError{Op: "stat", Path: name, Err: err}
		}
		return InfoOf(r.Name(name), &st), nil
	}
	parent, err := r.OpenAt("stat", path.Dir(name), OPath|syscall.O_DIRECTORY, 0)
	if err != nil {
		return Info{}, err
	}
	defer syscall.Close(parent)
	if err := Fstatat(parent, path.Base(name), &st); err != nil {
		return Info{}, &fs.PathError{Op: "stat", Path: name, Err: err}
	}
	return infoIn(parent, r.Name(name), &st), nil
}

// MakeDir makes the directory name and its parents as needed; one that is there already is
// no error, a file of another kind there (or a link) is.
func (r *Root) MakeDir(name string) error {
	if err := r.MkdirAll(name); err != nil {
		return err
	}
	fd, err := r.OpenAt("mkdir", name, OPath|syscall.O_DIRECTORY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return &fs.PathError{Op: "mkdir", Path: name, Err: syscall.EEXIST} // a file, or a link
	}
	syscall.Close(fd)
	return nil
}

// Remove removes name: a file, a symbolic link (not what it points to), or a directory
// with everything in it.
func (r *Root) Remove(name string) error {
	parent, err := r.OpenAt("remove", path.Dir(name), OPath|syscall.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer syscall.Close(parent)
	if err := RemoveIn(parent, path.Base(name)); err != nil {
		return &fs.PathError{Op: "remove", Path: name, Err: err}
	}
	return nil
}

// Rename moves src to dst, both below the root, making dst's parents as needed and
// replacing what dst was (an empty directory, if src is one), as rename(2) does.
func (r *Root) Rename(src, dst string) error {
	if err := r.MkdirAll(path.Dir(dst)); err != nil {
		return err
	}
	srcDir, err := r.OpenAt("rename", path.Dir(src), OPath|syscall.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer syscall.Close(srcDir)
	dstDir, err := r.OpenAt("rename", path.Dir(dst), OPath|syscall.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer syscall.Close(dstDir)
	if err := syscall.Renameat(srcDir, path.Base(src), dstDir, path.Base(dst)); err != nil {
		return &os.LinkError{Op: "rename", Old: src, New: dst, Err: err}
	}
	var st syscall.Stat_t
	if Fstatat(dstDir, path.Base(dst), &st) == nil {
		r.wrote(dst, st.Ctim) // the host's change, not the next run's
	}
	return nil
}

// RemoveIn removes name in the directory open as parent, with what it holds if it is a
// directory: each directory is opened from its parent's descriptor without following a
// link, so a link the code swaps in meanwhile is removed, never walked.
func RemoveIn(parent int, name string) error {
	var st syscall.Stat_t
	if err := Fstatat(parent, name, &st); err != nil {
		return err
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFDIR {
		return unlinkatFlags(parent, name, 0)
	}
	// (RESOLVE_NO_XDEV: a mount there, such as a Mount bound under the working directory or
	// /tmp, is the host's files, never emptied by the host on the code's behalf; its mount
	// point's removal then fails.)
	dir, err := Openat2(parent, name, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW, 0,
		ResolveBeneath|ResolveNoSymlinks|ResolveNoXdev)
	if errors.Is(err, syscall.ELOOP) || errors.Is(err, syscall.ENOTDIR) {
		return unlinkatFlags(parent, name, 0) // swapped for a link or a file meanwhile
	}
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(dir), name)
	defer f.Close()
	for tries := 0; ; tries++ {
		names, err := f.Readdirnames(-1)
		if err != nil {
			return err
		}
		for _, child := range names {
			if err := RemoveIn(dir, child); err != nil && !errors.Is(err, syscall.ENOENT) {
				return fmt.Errorf("%s/%s: %w", name, child, err)
			}
		}
		err = unlinkatFlags(parent, name, atRemovedir)
		if !errors.Is(err, syscall.ENOTEMPTY) || tries == 3 {
			return err
		}
		if _, err := f.Seek(0, 0); err != nil { // the code wrote more meanwhile: again
			return err
		}
	}
}

// Symlink makes the symbolic link name (its directory exists) pointing to to.
func (r *Root) Symlink(to, name string) error {
	parent, err := r.OpenAt("symlink", path.Dir(name), syscall.O_RDONLY|syscall.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer syscall.Close(parent)
	base := path.Base(name)
	err = os.Symlink(to, "/proc/self/fd/"+strconv.Itoa(parent)+"/"+base)
	if err == nil && r.Owner >= 0 {
		err = Fchownat(parent, base, r.Owner)
	}
	return err
}

// Chmod sets the permission bits of name (not a link).
func (r *Root) Chmod(name string, mode uint32) error {
	fd, err := r.OpenAt("chmod", name, syscall.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return err
	}
	defer syscall.Close(fd)
	if err := syscall.Fchmod(fd, mode); err != nil {
		return &fs.PathError{Op: "chmod", Path: name, Err: err}
	}
	return nil
}

// ChownRoot makes the entry name the sandbox's root's (a restore that keeps owners).
func (r *Root) ChownRoot(name string) error {
	parent, err := r.OpenAt("chown", path.Dir(name), OPath|syscall.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer syscall.Close(parent)
	if err := Fchownat(parent, path.Base(name), worker.RootUID()); err != nil {
		return &fs.PathError{Op: "chown", Path: name, Err: err}
	}
	return nil
}

// MountedAt reports whether the name at the root is a mount (the image's /usr, /etc; /dev,
// /proc): what is there is not the root's, even to stat or make.
func (r *Root) MountedAt(name string) bool {
	var root, st unix.Statx_t
	const flags = unix.AT_SYMLINK_NOFOLLOW | unix.AT_NO_AUTOMOUNT
	return unix.Statx(r.FD, "", flags|unix.AT_EMPTY_PATH, unix.STATX_MNT_ID, &root) == nil &&
		unix.Statx(r.FD, name, flags, unix.STATX_MNT_ID, &st) == nil && st.Mnt_id != root.Mnt_id
}

// ActAs has this goroutine's thread use the file system as host user id (its fsuid and
// fsgid), until the root's Close: a sandbox's tmpfs is mounted in its user namespace, where
// a file of the host's root could not even be made (EOVERFLOW), and the host then has no
// more rights there than the code (a root host's CAP_DAC_OVERRIDE and the like are off for
// a thread whose fsuid is not 0), unless reach puts them back on for the thread (the
// sandbox's root's reach). The caller closes the root on the goroutine that opened it,
// last opened first closed.
func (r *Root) ActAs(id int, reach bool) error {
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
