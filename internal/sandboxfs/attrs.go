package sandboxfs

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// File attributes: a file's user extended attributes ("user." names). A tmpfs keeps them
// from Linux 6.6 on; where the file system keeps none, an error matching ErrNoAttrs.

// The bounds of a file's attributes that the host reads or writes: what a file's metadata
// needs, and no more of the host's memory.
const (
	MaxAttrs     = 64
	MaxAttrValue = 4096
)

// Attrs returns the user extended attributes of name (not a symbolic link) whose names
// start with "user." and prefix, by their names without those.
func (r *Root) Attrs(name, prefix string) (map[string]string, error) {
	fd, err := r.OpenAt("getxattr", name, syscall.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	defer syscall.Close(fd)
	return fileAttrs(fd, name, "user."+prefix)
}

func fileAttrs(fd int, name, prefix string) (map[string]string, error) {
	list := make([]byte, 64<<10)
	n, err := unix.Flistxattr(fd, list)
	if err != nil {
		return nil, attrError("listxattr", name, err)
	}
	out := map[string]string{}
	value := make([]byte, MaxAttrValue)
	for _, full := range bytes.Split(list[:n], []byte{0}) {
		key, ok := strings.CutPrefix(string(full), prefix)
		if !ok || key == "" {
			continue
		}
		if len(out) == MaxAttrs {
			return nil, &fs.PathError{Op: "getxattr", Path: name, Err: fmt.Errorf("more than %d attributes", MaxAttrs)}
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

// CheckAttrs refuses attributes past the bounds: more than MaxAttrs, a name with NUL or
// empty, a value longer than MaxAttrValue.
func CheckAttrs(name string, attrs map[string]string) error {
	if len(attrs) > MaxAttrs {
		return &fs.PathError{Op: "setxattr", Path: name, Err: fmt.Errorf("%d attributes, past %d", len(attrs), MaxAttrs)}
	}
	for k, v := range attrs {
		if k == "" || strings.ContainsRune(k, 0) || len(v) > MaxAttrValue {
			return &fs.PathError{Op: "setxattr", Path: name, Err: fmt.Errorf("%w: attribute %q: a name without NUL, "+
				"a value of at most %d bytes", fs.ErrInvalid, k, MaxAttrValue)}
		}
	}
	return nil
}

// SetAttrs makes attrs (checked: CheckAttrs) the user extended attributes of name (not a
// symbolic link) whose names start with "user." and prefix; its other attributes under
// prefix are removed.
func (r *Root) SetAttrs(name, prefix string, attrs map[string]string) error {
	fd, err := r.OpenAt("setxattr", name, syscall.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer syscall.Close(fd)
	full := "user." + prefix
	old, err := fileAttrs(fd, name, full)
	if err != nil && len(attrs) > 0 || err != nil && !errors.Is(err, ErrNoAttrs) {
		return err
	}
	for k := range old {
		if _, kept := attrs[k]; !kept {
			if err := unix.Fremovexattr(fd, full+k); err != nil && err != syscall.ENODATA {
				return attrError("removexattr", name, err)
			}
		}
	}
	for k, v := range attrs {
		if err := unix.Fsetxattr(fd, full+k, []byte(v), 0); err != nil {
			return attrError("setxattr", name, err)
		}
	}
	return nil
}

// attrError is an extended attribute call's error on name: ErrNoAttrs where the file
// system keeps none.
func attrError(op, name string, err error) error {
	if err == syscall.ENOTSUP || err == syscall.EOPNOTSUPP {
		err = ErrNoAttrs
	}
	return &fs.PathError{Op: op, Path: name, Err: err}
}
