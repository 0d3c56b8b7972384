package minipy

import (
	"github.com/minipy-go/minipy/internal/sandboxfs"
)

// File attributes: a file's user extended attributes ("user." names), which the code sets
// with os.setxattr and the host with SetFileAttrs, and a front keeps its files' metadata
// in (minipy-mcp -e2b: E2B's, under "e2b."). A working directory that is a tmpfs keeps
// them from Linux 6.6 on; where its file system keeps none, an error matching
// ErrNoFileAttrs.

// ErrNoFileAttrs is matched by FileAttrs' and SetFileAttrs' errors where the working
// directory's file system keeps no user extended attributes (a tmpfs before Linux 6.6).
var ErrNoFileAttrs = sandboxfs.ErrNoAttrs

// FileAttrs returns the user extended attributes of the file name (not a symbolic link)
// whose names start with "user." and prefix, by their names without those (a prefix "e2b."
// and an attribute "user.e2b.author" give "author"). At most 64 are read, and values of at
// most 4 KiB: past those, an error.
func (ns *Namespace) FileAttrs(name, prefix string, opts ...FileOption) (map[string]string, error) {
	root, clean, err := ns.fileRoot("getxattr", name, true, opts...)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	return root.Attrs(clean, prefix)
}

// SetFileAttrs makes attrs the user extended attributes of the file name (not a symbolic
// link) whose names start with "user." and prefix: each key of attrs is set, with "user."
// and prefix before it, and the file's other attributes under prefix are removed (nil:
// all of them). At most 64, each value at most 4 KiB.
func (ns *Namespace) SetFileAttrs(name, prefix string, attrs map[string]string, opts ...FileOption) error {
	if err := sandboxfs.CheckAttrs(name, attrs); err != nil {
		return err
	}
	root, clean, err := ns.fileRoot("setxattr", name, true, opts...)
	if err != nil {
		return err
	}
	defer root.Close()
	return root.SetAttrs(clean, prefix, attrs)
}
