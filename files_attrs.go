package minipy

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// File attributes: a file's user extended attributes ("user." names), which the code sets
// with os.setxattr and the host with SetFileAttrs, and a front keeps its files' metadata
// in (minipy-mcp -e2b: E2B's, under "e2b."). A working directory that is a tmpfs keeps
// them from Linux 6.6 on; where its file system keeps none, an error matching
// ErrNoFileAttrs.

// ErrNoFileAttrs is matched by FileAttrs' and SetFileAttrs' errors where the working
// directory's file system keeps no user extended attributes (a tmpfs before Linux 6.6).
var ErrNoFileAttrs = errors.New("minipy: the working directory's file system keeps no file attributes")

// The bounds of a file's attributes that the host reads or writes: what a file's metadata
// needs, and no more of the host's memory.
const (
	maxFileAttrs     = 64
	maxFileAttrValue = 4096
)

// FileAttrs returns the user extended attributes of the file name (not a symbolic link)
// whose names start with "user." and prefix, by their names without those (a prefix "e2b."
// and an attribute "user.e2b.author" give "author"). At most 64 are read, and values of at
// most 4 KiB: past those, an error.
func (ns *Namespace) FileAttrs(name, prefix string, opts ...FileOption) (map[string]string, error) {
	root, clean, err := ns.fileRoot("getxattr", name, true, opts...)
	if err != nil {
		return nil, err
	}
	defer root.close()
	fd, err := root.openat("getxattr", clean, syscall.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	defer syscall.Close(fd)
	return fileAttrs(fd, clean, "user."+prefix)
}

func fileAttrs(fd int, name, prefix string) (map[string]string, error) {
	list := make([]byte, 64<<10)
	n, err := unix.Flistxattr(fd, list)
	if err != nil {
		return nil, attrError("listxattr", name, err)
	}
	out := map[string]string{}
	value := make([]byte, maxFileAttrValue)
	for _, full := range bytes.Split(list[:n], []byte{0}) {
		key, ok := strings.CutPrefix(string(full), prefix)
		if !ok || key == "" {
			continue
		}
		if len(out) == maxFileAttrs {
			return nil, &fs.PathError{Op: "getxattr", Path: name, Err: fmt.Errorf("more than %d attributes", maxFileAttrs)}
		}
		k, err := unix.Fgetxattr(fd, string(full), value)
		if err == syscall.ENODATA {
			continue // (removed meanwhile)
		}
		if err != nil {
			return nil, attrError("getxattr", name, err)
		}
		out[key] = string(value[:k])
	}
	return out, nil
}

// SetFileAttrs makes attrs the user extended attributes of the file name (not a symbolic
// link) whose names start with "user." and prefix: each key of attrs is set, with "user."
// and prefix before it, and the file's other attributes under prefix are removed (nil:
// all of them). At most 64, each value at most 4 KiB.
func (ns *Namespace) SetFileAttrs(name, prefix string, attrs map[string]string, opts ...FileOption) error {
	if len(attrs) > maxFileAttrs {
		return &fs.PathError{Op: "setxattr", Path: name, Err: fmt.Errorf("%d attributes, past %d", len(attrs), maxFileAttrs)}
	}
	for k, v := range attrs {
		if k == "" || strings.ContainsRune(k, 0) || len(v) > maxFileAttrValue {
			return &fs.PathError{Op: "setxattr", Path: name, Err: fmt.Errorf("%w: attribute %q: a name without NUL, "+
				"a value of at most %d bytes", fs.ErrInvalid, k, maxFileAttrValue)}
		}
	}
	root, clean, err := ns.fileRoot("setxattr", name, true, opts...)
	if err != nil {
		return err
	}
	defer root.close()
	fd, err := root.openat("setxattr", clean, syscall.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer syscall.Close(fd)
	full := "user." + prefix
	old, err := fileAttrs(fd, clean, full)
	if err != nil && len(attrs) > 0 || err != nil && !errors.Is(err, ErrNoFileAttrs) {
		return err
	}
	for k := range old {
		if _, kept := attrs[k]; !kept {
			if err := unix.Fremovexattr(fd, full+k); err != nil && err != syscall.ENODATA {
				return attrError("removexattr", clean, err)
			}
		}
	}
	for k, v := range attrs {
		if err := unix.Fsetxattr(fd, full+k, []byte(v), 0); err != nil {
			return attrError("setxattr", clean, err)
		}
	}
	return nil
}

// attrError is an extended attribute call's error on name: ErrNoFileAttrs where the file
// system keeps none.
func attrError(op, name string, err error) error {
	if err == syscall.ENOTSUP || err == syscall.EOPNOTSUPP {
		err = ErrNoFileAttrs
	}
	return &fs.PathError{Op: op, Path: name, Err: err}
}
