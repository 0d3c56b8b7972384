package cpython

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
)

// findPython returns the python executable named name that belongs to the library at lib:
// the first <dir>/bin/<name> found walking up from lib's directory (the library's install
// prefix: /usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0 gives /usr/bin/python3.11, a
// build in PREFIX gives PREFIX/bin/python3.13), else one in /usr/bin or /usr/local/bin,
// else one on PATH. Only real executables count: a pyenv shim (a shell script) on PATH runs
// whichever Python pyenv selects, not the linked one. lib may be "" (libpython is linked
// statically). It returns "" when nothing is found.
func findPython(lib, name string) string {
	if lib != "" {
		if real, err := filepath.EvalSymlinks(lib); err == nil {
			lib = real
		}
		for dir := filepath.Dir(lib); ; dir = filepath.Dir(dir) {
			if p := filepath.Join(dir, "bin", name); isBinary(p) {
				return p
			}
			if dir == filepath.Dir(dir) {
				break
			}
		}
	}
	for _, dir := range []string{"/usr/bin", "/usr/local/bin"} {
		if p := filepath.Join(dir, name); isBinary(p) {
			return p
		}
	}
	for _, dir := range filepath.SplitList(os.Getenv("PATH")) {
		if dir == "" {
			continue
		}
		if p, err := exec.LookPath(filepath.Join(dir, name)); err == nil && isBinary(p) {
			return p
		}
	}
	return ""
}

// isBinary reports whether path is an executable ELF file (following symlinks).
func isBinary(path string) bool {
	st, err := os.Stat(path)
	if err != nil || !st.Mode().IsRegular() || st.Mode()&0o111 == 0 {
		return false
	}
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	magic := make([]byte, 4)
	if _, err := f.Read(magic); err != nil {
		return false
	}
	return bytes.Equal(magic, []byte("\x7fELF"))
}

// sameFile reports whether a and b name one file.
func sameFile(a, b string) bool {
	sa, err := os.Stat(a)
	if err != nil {
		return false
	}
	sb, err := os.Stat(b)
	return err == nil && os.SameFile(sa, sb)
}
