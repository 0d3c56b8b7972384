package minipy

import (
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"syscall"

	"github.com/minipy-go/minipy/internal/sandboxfs"
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
	defer root.Close()
	info, err := root.Stat(clean)
	return FileInfo(info), err
}

// MakeDir makes the directory name, relative to the working directory, and its parents as
// needed; one that is there already is no error, a file of another kind there is.
func (ns *Namespace) MakeDir(name string, opts ...FileOption) error {
	root, clean, err := ns.fileRoot("mkdir", name, false, opts...)
	if err != nil {
		return err
	}
	defer root.Close()
	return root.MakeDir(clean)
}

// Remove removes the file name, relative to the working directory: a file, a symbolic link
// (not what it points to), or a directory with everything in it. A missing file gives an
// error matching fs.ErrNotExist; the working directory itself cannot be removed.
func (ns *Namespace) Remove(name string, opts ...FileOption) error {
	root, clean, err := ns.fileRoot("remove", name, false, opts...)
	if err != nil {
		return err
	}
	defer root.Close()
	return root.Remove(clean)
}

// Rename moves the file from to the name to, both relative to the working directory,
// making to's parent directories as needed and replacing what to was (an empty directory,
// if from is one), as rename(2) does.
func (ns *Namespace) Rename(from, to string, opts ...FileOption) error {
	root, src, err := ns.fileRoot("rename", from, false, opts...)
	if err != nil {
		return err
	}
	defer root.Close()
	dst, err := ns.renameTarget(root, to)
	if err != nil {
		return err
	}
	return root.Rename(src, dst)
}

// renameTarget is Rename's to below root, the from's: a relative name where root is the
// working directory, an absolute one in the same place (a rename does not cross file
// systems).
func (ns *Namespace) renameTarget(root *sandboxfs.Root, to string) (string, error) {
	abs := path.IsAbs(filepath.ToSlash(to))
	e, _ := ns.engine.(*Isolated)
	switch {
	case !abs && (root.Base == "" || e != nil && root.Base == e.cfg.WorkDirPath):
		return sandboxfs.CleanName("rename", to, false)
	case !abs || e == nil:
		return "", &fs.PathError{Op: "rename", Path: to, Err: fmt.Errorf("%w: not in %s, where the file is", ErrBadPath, root.Base)}
	}
	_, _, place, rel, err := ns.placeOf("rename", to, false)
	if err != nil {
		return "", err
	}
	if place != root.Base && !(place == e.cfg.WorkDirPath && root.Base == "") {
		if place == "/" { // (a name in what the image mounts there is not even a place: ErrBadPath)
			r, _, err := ns.placeRoot("rename", to, false, actUser)
			if err != nil {
				return "", err
			}
			r.Close()
		}
		return "", &os.LinkError{Op: "rename", Old: root.Name("."), New: to, Err: syscall.EXDEV}
	}
	return rel, nil
}
