package minipy

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
	"unsafe"

	"github.com/minipy-go/minipy/internal/worker"
	"golang.org/x/sys/unix"
)

// FileInfo describes a file of a namespace's working directory (Namespace.ListFiles,
// Result.Files).
type FileInfo struct {
	// Name is the file's path relative to the working directory, slash-separated
	// ("out/chart.png"): what ReadFile takes.
	Name string
	// Size is its length in bytes (a symbolic link's: the length of its target's name).
	Size int64
	// ModTime is when its content last changed.
	ModTime time.Time
	// IsDir reports a directory.
	IsDir bool
	// Mode is its type and permission bits, as os.Lstat gives them (fs.ModeSymlink for a
	// symbolic link, which is never followed).
	Mode fs.FileMode
	// Target is a symbolic link's target as the link holds it (os.Readlink's text: it may be
	// relative to the link's directory, or point anywhere); "" for any other file.
	Target string
	// RootOwned reports a file of the sandbox's root (IsolatedConfig.RootUser): its host
	// owner is the one the sandboxes' root users stand for (uid 65533); else it is the
	// sandbox's user's.
	RootOwned bool
}

// Hidden reports a file that Result.Files and minipy-mcp's resources leave out: one with a
// hidden name in its path (".cache/matplotlib/fontlist.json": the working directory is the
// code's HOME, where libraries keep caches and settings) or in a __pycache__ directory.
// ListFiles lists them as any other.
func (f FileInfo) Hidden() bool {
	for part := range strings.SplitSeq(f.Name, "/") {
		if hiddenName(part) {
			return true
		}
	}
	return false
}

// hiddenName reports a name that makes a file Hidden, and a folder whose files Result.Files
// never names (so it gets no watch).
func hiddenName(name string) bool {
	return strings.HasPrefix(name, ".") || name == "__pycache__"
}

// The Namespace file methods work on the host's side, on the namespace's working directory
// (WorkDir), whatever its worker is doing: they neither wait for a run nor start a worker.
// Every name is resolved by the kernel (openat2 with RESOLVE_BENEATH, Linux 5.6) below that
// directory, which is itself opened without following a link: the code may leave links to
// anywhere, and a link that leads out gives ErrBadPath instead of being followed. A link
// that stays inside (relative, as "data.csv -> raw/data.csv") is followed; one with an
// absolute target (even "/work/...", which the code sees) leads out from the host's point
// of view. Files the host makes belong to the workers' user, so the code can change them.
// An absolute name is the sandbox's own path (its working directory, /tmp, /dev/shm:
// files_places.go), resolved the same way below that place.

// WriteFile writes data to the file name, relative to the namespace's working directory,
// making the directories it needs and replacing what the file held. The namespace's code
// sees it at once (under /work when sandboxed). It is WriteFileFrom with a bytes.Reader.
func (ns *Namespace) WriteFile(name string, data []byte, opts ...FileOption) error {
	_, err := ns.WriteFileFrom(name, bytes.NewReader(data), opts...)
	return err
}

// FileOption changes whom a file method acts as (AsRoot).
type FileOption func(*fileOptions)

type fileOptions struct{ root bool }

// AsRoot has a file method act as the sandbox's root (IsolatedConfig.RootUser): it reaches
// what root may in the sandbox's writable layer (root's home, files of mode 0600 of either
// user), and what it makes is root's. Without it a file method acts as the sandbox's user,
// as the code does. It is ErrNoRootUser for a namespace whose sandbox has no root user.
func AsRoot() FileOption { return func(o *fileOptions) { o.root = true } }

// fileActor is whom the host acts as in a namespace's files.
type fileActor int

const (
	actUser   fileActor = iota // the sandbox's user: the code's reach; what the host makes is the user's
	actRoot                    // its root (AsRoot): root's reach over the writable layer; what it makes is root's
	actKeeper                  // Save and Restore in a sandbox with a root user: root's reach, each entry's owner kept
)

// actorOf is whom opts have a file method of a namespace of e act as.
func (e *Isolated) actorOf(op, name string, opts []FileOption) (fileActor, error) {
	var o fileOptions
	for _, f := range opts {
		f(&o)
	}
	if !o.root {
		return actUser, nil
	}
	if e == nil || !e.rootUser() {
		return actUser, &fs.PathError{Op: op, Path: name, Err: fmt.Errorf("%w: AsRoot needs a sandbox with a root "+
			"user (IsolatedConfig.RootUser)", ErrNoRootUser)}
	}
	return actRoot, nil
}

// rootUser reports whether e's sandboxes have a root user (IsolatedConfig.RootUser).
func (e *Isolated) rootUser() bool { return e.sandbox && e.cfg.RootUser }

// keeper is whom Save and Restore act as in e's files (nil: not the isolated engine's):
// in a sandbox with a root user they keep which files are root's.
func (e *Isolated) keeper() fileActor {
	if e != nil && e.rootUser() {
		return actKeeper
	}
	return actUser
}

// WriteFileFrom writes what r yields to the file name (see WriteFile), streaming: the host
// holds a buffer, not the file. It returns the bytes written. If writing fails (r's error,
// or ENOSPC past IsolatedConfig.WorkSize) the file is removed. The errors: ErrBadPath for a
// name that is not inside the working directory (or, absolute, one of the sandbox's places
// where it writes: files_places.go), ErrNoFiles for an in-process namespace,
// ErrNamespaceClosed, or an *fs.PathError.
func (ns *Namespace) WriteFileFrom(name string, r io.Reader, opts ...FileOption) (int64, error) {
	root, clean, err := ns.fileRoot("write", name, false, opts...)
	if err != nil {
		return 0, err
	}
	defer root.close()
	return root.write(clean, r)
}

// ReadFile returns the content of the file name, relative to the namespace's working
// directory. A missing file gives an error matching fs.ErrNotExist; a directory, FIFO or
// other file that is not a regular one an *fs.PathError (fs.ErrInvalid), without opening it
// for reading; otherwise as WriteFileFrom.
func (ns *Namespace) ReadFile(name string, opts ...FileOption) ([]byte, error) {
	root, clean, err := ns.fileRoot("read", name, false, opts...)
	if err != nil {
		return nil, err
	}
	defer root.close()
	f, size, err := root.openRead(clean)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if err := root.checkSize(clean, size); err != nil {
		return nil, err
	}
	var b bytes.Buffer
	b.Grow(int(min(size, 1<<30)) + 1) // one allocation unless it grows meanwhile
	if _, err := b.ReadFrom(root.limited(clean, f)); err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			return nil, err
		}
		return nil, &fs.PathError{Op: "read", Path: clean, Err: err}
	}
	return b.Bytes(), nil
}

// ReadFileTo copies the file name (see ReadFile) to w, streaming, and returns the bytes
// copied.
func (ns *Namespace) ReadFileTo(name string, w io.Writer, opts ...FileOption) (int64, error) {
	root, clean, err := ns.fileRoot("read", name, false, opts...)
	if err != nil {
		return 0, err
	}
	defer root.close()
	f, size, err := root.openRead(clean)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	if err := root.checkSize(clean, size); err != nil {
		return 0, err
	}
	n, err := io.Copy(w, root.limited(clean, f))
	var pe *fs.PathError
	if err != nil && !errors.As(err, &pe) {
		err = &fs.PathError{Op: "read", Path: clean, Err: err}
	}
	return n, err
}

// ListFiles lists the directory dir (relative to the working directory; "" is the working
// directory itself), one level, sorted by name: each FileInfo's Name is the entry's path
// relative to the working directory, so that ReadFile takes it. Symbolic links are listed
// as they are, not followed.
func (ns *Namespace) ListFiles(dir string, opts ...FileOption) ([]FileInfo, error) {
	root, clean, err := ns.fileRoot("list", dir, true, opts...)
	if err != nil {
		return nil, err
	}
	defer root.close()
	return root.list(clean)
}

// fileRoot opens the namespace's working directory for a file method, and checks name;
// opts say whom it acts as (AsRoot).
func (ns *Namespace) fileRoot(op, name string, dirOK bool, opts ...FileOption) (*workRoot, string, error) {
	e, _ := ns.engine.(*Isolated)
	as, err := e.actorOf(op, name, opts)
	if err != nil {
		return nil, "", err
	}
	return ns.rootAs(op, name, dirOK, as)
}

// keeperRoot opens the namespace's working directory for Save and Restore (op), acting as
// its engine's keeper.
func (ns *Namespace) keeperRoot(op string) (*workRoot, string, error) {
	e, _ := ns.engine.(*Isolated)
	return ns.rootAs(op, ".", true, e.keeper())
}

// rootAs is fileRoot acting as as.
func (ns *Namespace) rootAs(op, name string, dirOK bool, as fileActor) (*workRoot, string, error) {
	ns.mu.Lock()
	err := ns.usable()
	ns.mu.Unlock()
	if err != nil {
		return nil, "", err
	}
	if path.IsAbs(filepath.ToSlash(name)) && !strings.ContainsRune(name, 0) {
		if _, ok := ns.engine.(*Isolated); ok {
			return ns.placeRoot(op, name, dirOK, as)
		}
	}
	clean, err := cleanFileName(op, name, dirOK)
	if err != nil {
		return nil, "", err
	}
	f, ok := ns.engine.(interface {
		workRoot(ns *Namespace, as fileActor) (*workRoot, error)
	})
	if !ok {
		return nil, "", fmt.Errorf("%w: %s runs code in the host process, which shares the host's files (use the os "+
			"package)", ErrNoFiles, ns.engine.name())
	}
	root, err := f.workRoot(ns, as)
	if err != nil {
		return nil, "", err
	}
	return root, clean, nil
}

// cleanFileName checks a name given to a file method: relative, no "..", no NUL. It returns
// it cleaned ("." for the working directory itself, which only dirOK methods take).
func cleanFileName(op, name string, dirOK bool) (string, error) {
	if strings.ContainsRune(name, 0) || filepath.IsAbs(name) || climbs(name) {
		return "", &fs.PathError{Op: op, Path: name, Err: ErrBadPath}
	}
	clean := path.Clean(filepath.ToSlash(name))
	if clean == "." && !dirOK {
		return "", &fs.PathError{Op: op, Path: name, Err: fs.ErrInvalid}
	}
	return clean, nil
}

// climbs reports whether name holds a ".." element.
func climbs(name string) bool {
	return slices.Contains(strings.Split(filepath.ToSlash(name), "/"), "..")
}

// workRoot is a namespace's working directory, open.
type workRoot struct {
	fd    int
	owner int                                       // the workers' host user, who gets what the host makes; -1: the host's own
	wrote func(name string, ctime syscall.Timespec) // tells Result.Files what the host wrote
	// limit is the most bytes the host reads of one file (WorkSize: no file of a capped
	// directory holds more; only a sparse one claims more, its holes read as zeros); 0: none.
	limit int64
	// base is the absolute name the root was reached by (files_places.go), which the names
	// it gives start with; "": names relative to the working directory.
	base string
	// noXdev: no mount below the root is entered (a sandbox's place: what is bound there is
	// the host's, not the sandbox's to have the host change).
	noXdev bool
	// restore undoes actAs, at close.
	restore func()
	// keepRoot: Save and Restore keep which entries are the sandbox's root's (actKeeper).
	keepRoot bool
}

// resolve is the openat2 resolve flags for names below the root.
func (r *workRoot) resolve(extra uint64) uint64 {
	if r.noXdev {
		extra |= resolveNoXdev
	}
	return resolveBeneath | extra
}

func (r *workRoot) close() {
	syscall.Close(r.fd)
	if r.restore != nil {
		r.restore()
	}
}

// workRoot opens the working directory of ns (openWorkDir), acting as as.
func (e *Isolated) workRoot(ns *Namespace, as fileActor) (*workRoot, error) {
	r, err := e.rootOf(bindingOf(ns))
	if err == nil {
		r.actor(as)
	}
	return r, err
}

// actor has the root act as as: what the host makes is root's (actRoot), or each entry
// keeps its owner (actKeeper). (A working directory is the host's, who reaches all of it.)
func (r *workRoot) actor(as fileActor) {
	switch as {
	case actRoot:
		r.owner = worker.RootUID()
	case actKeeper:
		r.keepRoot = true
	}
}

func (e *Isolated) rootOf(b *nsBinding) (*workRoot, error) {
	if b == nil || !e.local() {
		return nil, fmt.Errorf("%w: a Command worker's files are on the far side", ErrNoFiles)
	}
	if e.isClosed() {
		return nil, ErrEngineClosed
	}
	fd, err := e.openWorkDir(b.dirs)
	if err != nil {
		return nil, fmt.Errorf("minipy: opening the working directory: %w", err)
	}
	return &workRoot{fd: fd, owner: e.fileOwner(), limit: e.readLimit(), wrote: func(name string, ctime syscall.Timespec) {
		e.watch.hostWrote(b, name, ctime)
	}}, nil
}

// readLimit is workRoot.limit for e's working directories: WorkSize where it caps them.
func (e *Isolated) readLimit() int64 {
	if e.capped() {
		return e.cfg.WorkSize
	}
	return 0
}

// checkSize refuses a file of size bytes past the root's limit (a sparse file).
func (r *workRoot) checkSize(name string, size int64) error {
	if r.limit > 0 && size > r.limit {
		return &fs.PathError{Op: "read", Path: name, Err: fmt.Errorf("%w: %d bytes, past the %d the working "+
			"directory may hold (WorkSize): a sparse file, whose holes would read as zeros", ErrFileTooLarge, size, r.limit)}
	}
	return nil
}

// limited reads f to at most the root's limit, and fails past it (a file that grew).
func (r *workRoot) limited(name string, f io.Reader) io.Reader {
	if r.limit <= 0 {
		return f
	}
	return &capReader{r: io.LimitReader(f, r.limit+1), left: r.limit, check: func(n int64) error { return r.checkSize(name, n) }}
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

// openat opens name below the root, following links only as long as they stay below it.
func (r *workRoot) openat(op, name string, flags int, mode uint32) (int, error) {
	fd, err := openat2(r.fd, name, flags, mode, r.resolve(resolveNoMagiclinks))
	if err == syscall.EXDEV || err == syscall.ELOOP && flags&syscall.O_NOFOLLOW == 0 {
		return -1, &fs.PathError{Op: op, Path: name, Err: ErrBadPath}
	}
	if err != nil {
		return -1, &fs.PathError{Op: op, Path: name, Err: err}
	}
	return fd, nil
}

// openRead opens the regular file name for reading, and returns its size.
func (r *workRoot) openRead(name string) (*os.File, int64, error) {
	// O_NONBLOCK: a FIFO the code left there must not hang the host (it is refused below).
	fd, err := r.openat("open", name, syscall.O_RDONLY|syscall.O_NONBLOCK, 0)
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

// write writes r to the file name, making its directories.
func (r *workRoot) write(name string, src io.Reader) (int64, error) {
	if err := r.mkdirAll(path.Dir(name)); err != nil {
		return 0, err
	}
	fd, err := r.openat("open", name, syscall.O_WRONLY|syscall.O_CREAT|syscall.O_NONBLOCK, 0o644)
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
	if r.owner >= 0 && int(st.Uid) != r.owner {
		if err := syscall.Fchown(fd, r.owner, r.owner); err != nil {
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
	// Leave no partial file: remove the entry if it is still this file.
	if dir, derr := r.openat("open", path.Dir(name), oPath|syscall.O_DIRECTORY, 0); derr == nil {
		var cur syscall.Stat_t
		base := path.Base(name)
		if fstatat(dir, base, &cur) == nil && cur.Dev == st.Dev && cur.Ino == st.Ino {
			unlinkat(dir, base)
		}
		syscall.Close(dir)
	}
	var pe *fs.PathError
	if !errors.As(err, &pe) {
		err = &fs.PathError{Op: "write", Path: name, Err: err}
	}
	return n, err
}

// mkdirAll makes the directory dir and its parents, as needed, each owned by the owner.
// A directory that exists, or whose parent does (a restore's entries come parents first),
// costs one or two lookups of its path; only a missing parent makes it walk the prefixes.
func (r *workRoot) mkdirAll(dir string) error {
	if dir == "." {
		return nil
	}
	if fd, err := r.openat("mkdir", dir, oPath|syscall.O_DIRECTORY, 0); err == nil {
		syscall.Close(fd)
		return nil
	}
	if parent, err := r.openat("mkdir", path.Dir(dir), oPath|syscall.O_DIRECTORY, 0); err == nil {
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
		fd, err := r.openat("mkdir", sub, oPath|syscall.O_DIRECTORY, 0)
		if err == nil {
			syscall.Close(fd)
			continue
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		parent, err := r.openat("mkdir", path.Dir(sub), oPath|syscall.O_DIRECTORY, 0)
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
func (r *workRoot) mkdirIn(parent int, name string) error {
	err := mkdirat(parent, name, 0o755)
	if err == nil && r.owner >= 0 {
		err = fchownat(parent, name, r.owner)
	}
	if err == syscall.EEXIST {
		return nil
	}
	return err
}

// list lists the directory dir below the root.
func (r *workRoot) list(dir string) ([]FileInfo, error) {
	fd, err := r.openat("open", dir, syscall.O_RDONLY|syscall.O_DIRECTORY, 0)
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
	out := make([]FileInfo, 0, len(names))
	for _, name := range names {
		var st syscall.Stat_t
		if fstatat(fd, name, &st) != nil {
			continue // gone meanwhile
		}
		out = append(out, fileInfoIn(fd, r.name(path.Join(dir, name)), &st))
	}
	return out, nil
}

func fileInfo(name string, st *syscall.Stat_t) FileInfo {
	return FileInfo{Name: name, Size: st.Size, ModTime: time.Unix(st.Mtim.Unix()),
		IsDir: st.Mode&syscall.S_IFMT == syscall.S_IFDIR, Mode: fileMode(st.Mode), RootOwned: int(st.Uid) == worker.RootUID()}
}

// fileInfoIn is fileInfo of name, which st describes, in the directory open as dir: a
// symbolic link's with its Target (read from the link itself, never followed).
func fileInfoIn(dir int, name string, st *syscall.Stat_t) FileInfo {
	fi := fileInfo(name, st)
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

// openat2 and its flags (linux/openat2.h), which the syscall package lacks (and the core
// module's go line keeps golang.org/x/sys, which has them, at a version too old to).
const (
	sysOpenat2          = 437 // the same on every architecture
	resolveNoMagiclinks = 0x02
	resolveNoSymlinks   = 0x04
	resolveBeneath      = 0x08
)

type openHow struct{ flags, mode, resolve uint64 }

func openat2(dirfd int, name string, flags int, mode uint32, resolve uint64) (int, error) {
	p, err := syscall.BytePtrFromString(name)
	if err != nil {
		return -1, err
	}
	how := openHow{flags: uint64(flags | syscall.O_CLOEXEC), mode: uint64(mode), resolve: resolve}
	for tries := 0; ; tries++ {
		fd, _, errno := syscall.Syscall6(sysOpenat2, uintptr(dirfd), uintptr(unsafe.Pointer(p)),
			uintptr(unsafe.Pointer(&how)), unsafe.Sizeof(how), 0, 0)
		switch {
		case errno == 0:
			return int(fd), nil
		case errno == syscall.EINTR, errno == syscall.EAGAIN && tries < 100: // EAGAIN: a rename raced the walk
			continue
		case errno == syscall.ENOSYS:
			return -1, fmt.Errorf("the kernel has no openat2 (Linux 5.6 or later is needed): %w", errno)
		}
		return -1, errno
	}
}

// oPath is O_PATH, which syscall lacks: the same on every architecture Go runs Linux on
// (only alpha, parisc and sparc differ).
const oPath = 0x200000

const _AT_SYMLINK_NOFOLLOW = 0x100

func mkdirat(dirfd int, name string, mode uint32) error {
	return syscall.Mkdirat(dirfd, name, mode)
}

func fchownat(dirfd int, name string, id int) error {
	return syscall.Fchownat(dirfd, name, id, id, _AT_SYMLINK_NOFOLLOW)
}

func unlinkat(dirfd int, name string) {
	syscall.Unlinkat(dirfd, name) //nolint:errcheck // best effort: a partial file
}
