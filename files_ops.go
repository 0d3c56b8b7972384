package minipy

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"syscall"
	"unsafe"
)

// The file methods that change a working directory's tree: Stat, MakeDir, Remove, Rename.
// Like the others they reach only below the working directory: every step is taken from
// a descriptor opened beneath it (openat2 RESOLVE_BENEATH), and none follows a symbolic
// link the code made, at the end of a path or inside it.

// Stat describes the file name, relative to the working directory ("" or "." for the
// working directory itself), without following it if it is a symbolic link. A missing file
// gives an error matching fs.ErrNotExist.
func (ns *Namespace) Stat(name string, opts ...FileOption) (FileInfo, error) {
	root, clean, err := ns.fileRoot("stat", name, true, opts...)
	if err != nil {
		return FileInfo{}, err
	}
	defer root.close()
	return root.stat(clean)
}

// MakeDir makes the directory name, relative to the working directory, and its parents as
// needed; one that is there already is no error, a file of another kind there is.
func (ns *Namespace) MakeDir(name string, opts ...FileOption) error {
	root, clean, err := ns.fileRoot("mkdir", name, false, opts...)
	if err != nil {
		return err
	}
	defer root.close()
	if err := root.mkdirAll(clean); err != nil {
		return err
	}
	fd, err := root.openat("mkdir", clean, oPath|syscall.O_DIRECTORY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return &fs.PathError{Op: "mkdir", Path: clean, Err: syscall.EEXIST} // a file, or a link
	}
	syscall.Close(fd)
	return nil
}

// Remove removes the file name, relative to the working directory: a file, a symbolic link
// (not what it points to), or a directory with everything in it. A missing file gives an
// error matching fs.ErrNotExist; the working directory itself cannot be removed.
func (ns *Namespace) Remove(name string, opts ...FileOption) error {
	root, clean, err := ns.fileRoot("remove", name, false, opts...)
	if err != nil {
		return err
	}
	defer root.close()
	parent, err := root.openat("remove", path.Dir(clean), oPath|syscall.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer syscall.Close(parent)
	if err := removeIn(parent, path.Base(clean)); err != nil {
		return &fs.PathError{Op: "remove", Path: clean, Err: err}
	}
	return nil
}

// Rename moves the file from to the name to, both relative to the working directory,
// making to's parent directories as needed and replacing what to was (an empty directory,
// if from is one), as rename(2) does.
func (ns *Namespace) Rename(from, to string, opts ...FileOption) error {
	root, src, err := ns.fileRoot("rename", from, false, opts...)
	if err != nil {
		return err
	}
	defer root.close()
	dst, err := ns.renameTarget(root, to)
	if err != nil {
		return err
	}
	if err := root.mkdirAll(path.Dir(dst)); err != nil {
		return err
	}
	srcDir, err := root.openat("rename", path.Dir(src), oPath|syscall.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer syscall.Close(srcDir)
	dstDir, err := root.openat("rename", path.Dir(dst), oPath|syscall.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer syscall.Close(dstDir)
	if err := syscall.Renameat(srcDir, path.Base(src), dstDir, path.Base(dst)); err != nil {
		return &os.LinkError{Op: "rename", Old: src, New: dst, Err: err}
	}
	var st syscall.Stat_t
	if fstatat(dstDir, path.Base(dst), &st) == nil {
		root.wrote(dst, st.Ctim) // the host's change, not the next run's
	}
	return nil
}

// renameTarget is Rename's to below root, the from's: a relative name where root is the
// working directory, an absolute one in the same place (a rename does not cross file
// systems).
func (ns *Namespace) renameTarget(root *workRoot, to string) (string, error) {
	abs := path.IsAbs(filepath.ToSlash(to))
	e, _ := ns.engine.(*Isolated)
	switch {
	case !abs && (root.base == "" || e != nil && root.base == e.cfg.WorkDirPath):
		return cleanFileName("rename", to, false)
	case !abs || e == nil:
		return "", &fs.PathError{Op: "rename", Path: to, Err: fmt.Errorf("%w: not in %s, where the file is", ErrBadPath, root.base)}
	}
	_, _, place, rel, err := ns.placeOf("rename", to, false)
	if err != nil {
		return "", err
	}
	if place != root.base && !(place == e.cfg.WorkDirPath && root.base == "") {
		if place == "/" { // (a name in what the image mounts there is not even a place: ErrBadPath)
			r, _, err := ns.placeRoot("rename", to, false, actUser)
			if err != nil {
				return "", err
			}
			r.close()
		}
		return "", &os.LinkError{Op: "rename", Old: root.name("."), New: to, Err: syscall.EXDEV}
	}
	return rel, nil
}

// stat describes name below the root, not following it.
func (r *workRoot) stat(name string) (FileInfo, error) {
	var st syscall.Stat_t
	if name == "." {
		if err := syscall.Fstat(r.fd, &st); err != nil {
			return FileInfo{}, &fs.PathError{Op: "stat", Path: name, Err: err}
		}
		return fileInfo(r.name(name), &st), nil
	}
	parent, err := r.openat("stat", path.Dir(name), oPath|syscall.O_DIRECTORY, 0)
	if err != nil {
		return FileInfo{}, err
	}
	defer syscall.Close(parent)
	if err := fstatat(parent, path.Base(name), &st); err != nil {
		return FileInfo{}, &fs.PathError{Op: "stat", Path: name, Err: err}
	}
	return fileInfoIn(parent, r.name(name), &st), nil
}

// removeIn removes name in the directory open as parent, with what it holds if it is a
// directory: each directory is opened from its parent's descriptor without following a
// link, so a link the code swaps in meanwhile is removed, never walked.
func removeIn(parent int, name string) error {
	var st syscall.Stat_t
	if err := fstatat(parent, name, &st); err != nil {
		return err
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFDIR {
		return unlinkatFlags(parent, name, 0)
	}
	// (RESOLVE_NO_XDEV: a mount there, such as a Mount bound under the working directory or
	// /tmp, is the host's files, never emptied by the host on the code's behalf; its mount
	// point's removal then fails.)
	dir, err := openat2(parent, name, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW, 0,
		resolveBeneath|resolveNoSymlinks|resolveNoXdev)
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
			if err := removeIn(dir, child); err != nil && !errors.Is(err, syscall.ENOENT) {
				return fmt.Errorf("%s/%s: %w", name, child, err)
			}
		}
		err = unlinkatFlags(parent, name, _AT_REMOVEDIR)
		if !errors.Is(err, syscall.ENOTEMPTY) || tries == 3 {
			return err
		}
		if _, err := f.Seek(0, 0); err != nil { // the code wrote more meanwhile: again
			return err
		}
	}
}

const _AT_REMOVEDIR = 0x200

func unlinkatFlags(dirfd int, name string, flags int) error {
	p, err := syscall.BytePtrFromString(name)
	if err != nil {
		return err
	}
	_, _, errno := syscall.Syscall(syscall.SYS_UNLINKAT, uintptr(dirfd), uintptr(unsafe.Pointer(p)), uintptr(flags))
	if errno != 0 {
		return errno
	}
	return nil
}
