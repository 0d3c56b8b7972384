package sandboxfs

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/minipy-go/minipy/internal/worker"
	"golang.org/x/sys/unix"
)

// The errors the minipy package exports as its own (minipy.ErrBadPath, ...).
var (
	// ErrBadPath: a name that is absolute where a relative one is needed, holds "..", or
	// resolves through a symbolic link out of the root. Nothing was read or written.
	ErrBadPath = errors.New("minipy: the name is not a path inside the working directory")
	// ErrFileTooLarge: a file that claims more bytes than its directory may hold (Root.Limit):
	// a sparse file, whose holes would read as zeros.
	ErrFileTooLarge = errors.New("minipy: the file claims more bytes than its working directory may hold")
	// ErrNoAttrs: the file system keeps no user extended attributes (a tmpfs before Linux 6.6).
	ErrNoAttrs = errors.New("minipy: the working directory's file system keeps no file attributes")
)

// Info describes a file below a root. Its fields are minipy.FileInfo's, which converts
// from it (the compiler keeps the two the same).
type Info struct {
	Name      string
	Size      int64
	ModTime   time.Time
	IsDir     bool
	Mode      fs.FileMode
	Target    string
	RootOwned bool
}

// Hidden reports a file with a hidden name in its path (HiddenName).
func (f Info) Hidden() bool {
	for part := range strings.SplitSeq(f.Name, "/") {
		if HiddenName(part) {
			return true
		}
	}
	return false
}

// HiddenName reports a name that makes a file hidden (a dot file, or __pycache__): one
// that Result.Files never names, and a folder that gets no watch.
func HiddenName(name string) bool {
	return strings.HasPrefix(name, ".") || name == "__pycache__"
}

// CleanName checks a name given to a file method: relative, no "..", no NUL. It returns it
// cleaned ("." for the root itself, which only dirOK methods take).
func CleanName(op, name string, dirOK bool) (string, error) {
	if strings.ContainsRune(name, 0) || filepath.IsAbs(name) || Climbs(name) {
		return "", &fs.PathError{Op: op, Path: name, Err: ErrBadPath}
	}
	clean := path.Clean(filepath.ToSlash(name))
	if clean == "." && !dirOK {
		return "", &fs.PathError{Op: op, Path: name, Err: fs.ErrInvalid}
	}
	return clean, nil
}

// Climbs reports whether name holds a ".." element.
func Climbs(name string) bool {
	return slices.Contains(strings.Split(filepath.ToSlash(name), "/"), "..")
}

// Root is a directory the host works in for the code (a working directory, or a sandbox's
// place), open. The names it takes are relative to it, cleaned (CleanName).
type Root struct {
	FD    int
	Owner int                                       // the host user who gets what the host makes; -1: the host's own
	Wrote func(name string, ctime syscall.Timespec) // told what the host wrote (nil: nobody)
	// Limit is the most bytes the host reads of one file, and of all a walk's files
	// (WorkSize: no file of a capped directory holds more; only a sparse one claims more,
	// its holes read as zeros); 0: none.
	Limit int64
	// Base is the absolute name the root was reached by (a sandbox's place), which the
	// names it gives start with; "": names relative to the root.
	Base string
	// NoXdev: no mount below the root is entered (a sandbox's place: what is bound there is
	// the host's, not the sandbox's to have the host change).
	NoXdev bool
	// KeepRoot: walks and untars keep which entries are the sandbox's root's.
	KeepRoot bool

	restore func() // undoes ActAs, at Close
}

// Resolve is the openat2 resolve flags for names below the root.
func (r *Root) Resolve(extra uint64) uint64 {
	if r.NoXdev {
		extra |= ResolveNoXdev
	}
	return ResolveBeneath | extra
}

// Close closes the root's fd, and ends ActAs (on the goroutine that called it).
func (r *Root) Close() {
	syscall.Close(r.FD)
	if r.restore != nil {
		r.restore()
	}
}

func (r *Root) wrote(name string, ctime syscall.Timespec) {
	if r.Wrote != nil {
		r.Wrote(name, ctime)
	}
}

// CheckSize refuses a file of size bytes past the root's limit (a sparse file).
func (r *Root) CheckSize(name string, size int64) error {
	if r.Limit > 0 && size > r.Limit {
		return &fs.PathError{Op: "read", Path: name, Err: fmt.Errorf("%w: %d bytes, past the %d the working "+
			"directory may hold (WorkSize): a sparse file, whose holes would read as zeros", ErrFileTooLarge, size, r.Limit)}
	}
	return nil
}

// Limited reads f to at most the root's limit, and fails past it (a file that grew).
func (r *Root) Limited(name string, f io.Reader) io.Reader {
	if r.Limit <= 0 {
		return f
	}
	return &capReader{r: io.LimitReader(f, r.Limit+1), left: r.Limit, check: func(n int64) error { return r.CheckSize(name, n) }}
}

// capReader fails once more than left bytes were read.
type capReader struct {
	r     io.Reader
	left  int64
	n     int64
	check func(n int64) error
}

func (c *capReader) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.n += int64(n)
	if c.n > c.left {
		return n, c.check(c.n)
	}
	return n, err
}

// OpenAt opens name below the root, following links only as long as they stay below it.
func (r *Root) OpenAt(op, name string, flags int, mode uint32) (int, error) {
	fd, err := Openat2(r.FD, name, flags, mode, r.Resolve(ResolveNoMagiclinks))
	if err == syscall.EXDEV || err == syscall.ELOOP && flags&syscall.O_NOFOLLOW == 0 {
		return -1, &fs.PathError{Op: op, Path: name, Err: ErrBadPath}
	}
	if err != nil {
		return -1, &fs.PathError{Op: op, Path: name, Err: err}
	}
	return fd, nil
}

// OpenRead opens the regular file name for reading, and returns its size.
func (r *Root) OpenRead(name string) (*os.File, int64, error) {
	// O_NONBLOCK: a FIFO the code left there must not hang the host (it is refused below).
	fd, err := r.OpenAt("open", name, syscall.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, 0, err
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		syscall.Close(fd)
		return nil, 0, &fs.PathError{Op: "stat", Path: name, Err: err}
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		syscall.Close(fd)
		return nil, 0, &fs.PathError{Op: "open", Path: name, Err: fmt.Errorf("%w: not a regular file", fs.ErrInvalid)}
	}
	return os.NewFile(uintptr(fd), name), st.Size, nil
}

// ReadFile returns the content of the regular file name, within the root's limit.
func (r *Root) ReadFile(name string) ([]byte, error) {
	f, size, err := r.OpenRead(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if err := r.CheckSize(name, size); err != nil {
		return nil, err
	}
	var b bytes.Buffer
	b.Grow(int(min(size, 1<<30)) + 1) // one allocation unless it grows meanwhile
	if _, err := b.ReadFrom(r.Limited(name, f)); err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			return nil, err
		}
		return nil, &fs.PathError{Op: "read", Path: name, Err: err}
	}
	return b.Bytes(), nil
}

// ReadFileTo copies the regular file name to w, within the root's limit, and returns the
// bytes copied.
func (r *Root) ReadFileTo(name string, w io.Writer) (int64, error) {
	f, size, err := r.OpenRead(name)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	if err := r.CheckSize(name, size); err != nil {
		return 0, err
	}
	n, err := io.Copy(w, r.Limited(name, f))
	var pe *fs.PathError
	if err != nil && !errors.As(err, &pe) {
		err = &fs.PathError{Op: "read", Path: name, Err: err}
	}
	return n, err
}

// Write writes src to the file name, making its directories, replacing what it held; a
// write that fails leaves no partial file.
func (r *Root) Write(name string, src io.Reader) (int64, error) {
	if err := r.MkdirAll(path.Dir(name)); err != nil {
		return 0, err
	}
	fd, err := r.OpenAt("open", name, syscall.O_WRONLY|syscall.O_CREAT|syscall.O_NONBLOCK, 0o644)
	if errors.Is(err, syscall.ENXIO) { // a FIFO that nothing reads
		return 0, &fs.PathError{Op: "open", Path: name, Err: fmt.Errorf("%w: not a regular file", fs.ErrInvalid)}
	}
	if err != nil {
		return 0, err
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return 0, &fs.PathError{Op: "stat", Path: name, Err: err}
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return 0, &fs.PathError{Op: "open", Path: name, Err: fmt.Errorf("%w: not a regular file", fs.ErrInvalid)}
	}
	if r.Owner >= 0 && int(st.Uid) != r.Owner {
		if err := syscall.Fchown(fd, r.Owner, r.Owner); err != nil {
			return 0, &fs.PathError{Op: "chown", Path: name, Err: err}
		}
	}
	if err := syscall.Ftruncate(fd, 0); err != nil {
		return 0, &fs.PathError{Op: "truncate", Path: name, Err: err}
	}
	n, err := io.Copy(f, src)
	if err == nil {
		if syscall.Fstat(fd, &st) == nil {
			r.wrote(name, st.Ctim)
		}
		return n, nil
	}
	r.removeIfSame(name, &st)
	var pe *fs.PathError
	if !errors.As(err, &pe) {
		err = &fs.PathError{Op: "write", Path: name, Err: err}
	}
	return n, err
}

// removeIfSame removes the entry name if it is still the file st describes (a failed
// write's: no partial file is left).
func (r *Root) removeIfSame(name string, st *syscall.Stat_t) {
	if dir, derr := r.OpenAt("open", path.Dir(name), OPath|syscall.O_DIRECTORY, 0); derr == nil {
		var cur syscall.Stat_t
		base := path.Base(name)
		if Fstatat(dir, base, &cur) == nil && cur.Dev == st.Dev && cur.Ino == st.Ino {
			unlinkat(dir, base)
		}
		syscall.Close(dir)
	}
}

// MkdirAll makes the directory dir and its parents, as needed, each owned by the owner.
// A directory that exists, or whose parent does (a restore's entries come parents first),
// costs one or two lookups of its path; only a missing parent makes it walk the prefixes.
func (r *Root) MkdirAll(dir string) error {
	if dir == "." {
		return nil
	}
	if fd, err := r.OpenAt("mkdir", dir, OPath|syscall.O_DIRECTORY, 0); err == nil {
		syscall.Close(fd)
		return nil
	}
	if parent, err := r.OpenAt("mkdir", path.Dir(dir), OPath|syscall.O_DIRECTORY, 0); err == nil {
		err = r.mkdirIn(parent, path.Base(dir))
		syscall.Close(parent)
		if err != nil {
			return &fs.PathError{Op: "mkdir", Path: dir, Err: err}
		}
		return nil
	}
	parts := strings.Split(dir, "/")
	for i := range parts {
		sub := strings.Join(parts[:i+1], "/")
		fd, err := r.OpenAt("mkdir", sub, OPath|syscall.O_DIRECTORY, 0)
		if err == nil {
			syscall.Close(fd)
			continue
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		parent, err := r.OpenAt("mkdir", path.Dir(sub), OPath|syscall.O_DIRECTORY, 0)
		if err != nil {
			return err
		}
		err = r.mkdirIn(parent, parts[i])
		syscall.Close(parent)
		if err != nil {
			return &fs.PathError{Op: "mkdir", Path: sub, Err: err}
		}
	}
	return nil
}

// mkdirIn makes the directory name in the directory open as parent, owned by the owner;
// one that is there already is no error.
func (r *Root) mkdirIn(parent int, name string) error {
	err := syscall.Mkdirat(parent, name, 0o755)
	if err == nil && r.Owner >= 0 {
		err = Fchownat(parent, name, r.Owner)
	}
	if err == syscall.EEXIST {
		return nil
	}
	return err
}

// List lists the directory dir below the root, one level, sorted by name.
func (r *Root) List(dir string) ([]Info, error) {
	fd, err := r.OpenAt("open", dir, syscall.O_RDONLY|syscall.O_DIRECTORY, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), dir)
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return nil, &fs.PathError{Op: "readdir", Path: dir, Err: err}
	}
	slices.Sort(names)
	out := make([]Info, 0, len(names))
	for _, name := range names {
		var st syscall.Stat_t
		if Fstatat(fd, name, &st) != nil {
			continue // gone meanwhile
		}
		out = append(out, infoIn(fd, r.Name(path.Join(dir, name)), &st))
	}
	return out, nil
}

// InfoOf is the Info of name, which st describes.
func InfoOf(name string, st *syscall.Stat_t) Info {
	return Info{Name: name, Size: st.Size, ModTime: time.Unix(st.Mtim.Unix()),
		IsDir: st.Mode&syscall.S_IFMT == syscall.S_IFDIR, Mode: fileMode(st.Mode), RootOwned: int(st.Uid) == worker.RootUID()}
}

// infoIn is InfoOf name, which st describes, in the directory open as dir: a symbolic
// link's with its Target (read from the link itself, never followed).
func infoIn(dir int, name string, st *syscall.Stat_t) Info {
	fi := InfoOf(name, st)
	if st.Mode&syscall.S_IFMT == syscall.S_IFLNK {
		buf := make([]byte, min(max(st.Size, 1), 4096)+1)
		if n, err := unix.Readlinkat(dir, path.Base(name), buf); err == nil && n < len(buf) {
			fi.Target = string(buf[:n])
		}
	}
	return fi
}

// fileMode is a stat mode as an fs.FileMode (what os.Lstat makes of it).
func fileMode(m uint32) fs.FileMode {
	mode := fs.FileMode(m & 0o777)
	switch m & syscall.S_IFMT {
	case syscall.S_IFDIR:
		mode |= fs.ModeDir
	case syscall.S_IFLNK:
		mode |= fs.ModeSymlink
	case syscall.S_IFIFO:
		mode |= fs.ModeNamedPipe
	case syscall.S_IFSOCK:
		mode |= fs.ModeSocket
	case syscall.S_IFCHR:
		mode |= fs.ModeDevice | fs.ModeCharDevice
	case syscall.S_IFBLK:
		mode |= fs.ModeDevice
	}
	if m&syscall.S_ISUID != 0 {
		mode |= fs.ModeSetuid
	}
	if m&syscall.S_ISGID != 0 {
		mode |= fs.ModeSetgid
	}
	if m&syscall.S_ISVTX != 0 {
		mode |= fs.ModeSticky
	}
	return mode
}

// Name is the name the file methods give for rel below the root: relative to the working
// directory, or absolute when the root is a place reached by an absolute name.
func (r *Root) Name(rel string) string {
	if r.Base == "" {
		return rel
	}
	return path.Join(r.Base, rel)
}
