package sandboxfs

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strconv"
	"syscall"

	"github.com/minipy-go/minipy/internal/worker"
	"golang.org/x/sys/unix"
)

// Sink receives the entries of a working directory as Walk finds them: another
// working directory (Copy) or a tar archive (Save).
type Sink interface {
	dir(rel string, mode uint32) error                           // before the directory's entries
	dirDone(rel string, mode uint32) error                       // after them
	file(rel string, mode uint32, size int64, r io.Reader) error // r: at most size bytes
	symlink(rel, to string) error
}

// Walk walks the directory rel of src, recursively, into sink: directories, regular
// files and symbolic links (never followed), with their permission bits; nothing else
// (FIFOs, sockets). Entries the host's user may not read are left out. Each entry is
// opened from its directory's fd, one name at a time, so a walk takes time in proportion
// to the entries, however deep the tree (a path resolved from the root for each of a chain
// of 1,000 directories cost Restore 11.8 s of the host's CPU).
//
// The files together may claim at most the root's limit (WorkSize): a capped directory
// holds no more, and only sparse files claim more, whose holes read as zeros (8 of just
// under 32 MiB in a 32 MiB directory, each within the limit alone, made a pause read 256
// MiB). What a file claims is its size, counted before it is read: past the limit the walk
// fails (ErrFileTooLarge) having read nothing more.
func Walk(src *Root, rel string, sink Sink) error {
	if src.Limit > 0 { // (first what the files claim, reading none: past the limit, nothing is read)
		if err := (&walker{src: src, measuring: true}).sub(src.FD, rel, rel); err != nil {
			return err
		}
	}
	return (&walker{src: src, sink: sink}).sub(src.FD, rel, rel)
}

// walker is a walk of Walk: its root, its sink, and the bytes its files claimed; a
// measuring walk only claims (it has no sink, and reads no file).
type walker struct {
	src       *Root
	sink      Sink
	claimed   int64
	measuring bool
}

// claim counts size more bytes of files, failing past the root's limit.
func (w *walker) claim(rel string, size int64) error {
	if err := w.src.CheckSize(rel, size); err != nil {
		return err
	}
	w.claimed += size
	if w.src.Limit > 0 && w.claimed > w.src.Limit {
		return &fs.PathError{Op: "read", Path: rel, Err: fmt.Errorf("%w: the files claim %d bytes in all with it, "+
			"past the %d the working directory may hold (WorkSize): sparse files, whose holes would read as zeros",
			ErrFileTooLarge, w.claimed, w.src.Limit)}
	}
	return nil
}

// dir walks the directory open as fd (rel, for the sink's names), and closes fd.
func (w *walker) dir(fd int, rel string) error {
	sink := w.sink
	dir := os.NewFile(uintptr(fd), rel)
	defer dir.Close()
	names, err := dir.Readdirnames(-1)
	if err != nil {
		return &fs.PathError{Op: "readdir", Path: rel, Err: err}
	}
	var here syscall.Stat_t
	if err := syscall.Fstat(fd, &here); err != nil {
		return &fs.PathError{Op: "stat", Path: rel, Err: err}
	}
	for _, name := range names {
		sub := path.Join(rel, name)
		var st syscall.Stat_t
		if Fstatat(fd, name, &st) != nil {
			continue // gone meanwhile
		}
		if w.src.NoXdev && st.Dev != here.Dev {
			w.mount(rel) // a mount: not the place's (a sandbox's root holds the image's)
			continue
		}
		mode := st.Mode & 0o7777
		if o, ok := sink.(ownerSink); ok && w.src.KeepRoot && !w.measuring {
			o.owner(int(st.Uid) == worker.RootUID())
		}
		switch st.Mode & syscall.S_IFMT {
		case syscall.S_IFDIR:
			if !w.measuring {
				err = sink.dir(sub, mode)
			}
			if err == nil {
				err = w.sub(fd, name, sub)
			}
			if w.src.NoXdev && errors.Is(err, syscall.EXDEV) { // (a mount of the same file system: its
				w.mount(sub) // directory is ended as one that holds a mount)
				err = nil
			}
			if err == nil && !w.measuring {
				err = sink.dirDone(sub, mode)
			}
		case syscall.S_IFREG:
			var f *os.File
			if err = w.claim(sub, st.Size); err == nil && !w.measuring {
				if f, err = openFileAt(fd, name, sub, w.src.Resolve(ResolveNoSymlinks)); err == nil {
					// (What it claimed, no more: a file made sparse and larger meanwhile
					// would read past the sum.)
					err = sink.file(sub, mode, st.Size, io.LimitReader(f, st.Size))
					f.Close()
				}
			}
		case syscall.S_IFLNK:
			var to string
			if w.measuring {
				break
			}
			if to, err = os.Readlink("/proc/self/fd/" + strconv.Itoa(fd) + "/" + name); err == nil {
				err = sink.symlink(sub, to)
			}
		}
		if w.src.NoXdev && errors.Is(err, syscall.EXDEV) {
			w.mount(rel) // a file mounted there
			continue
		}
		if errors.Is(err, fs.ErrPermission) {
			continue // the host's user may not read it (a file of mode 0)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// ownerSink is a sink told, before each entry of a walk that keeps its owners
// (Root.KeepRoot), whether it is the sandbox's root's (TarSink).
type ownerSink interface{ owner(root bool) }

// rootOwner is the user name of a tar entry that is the sandbox's root's (TarSink.owner;
// entries with no user name are its user's).
const rootOwner = "root"

// mountSink is a sink told of the mounts a walk leaves out (TarSink, of a sandbox's root).
type mountSink interface{ mount(dir string) }

// mount tells the sink that the directory dir holds a mount, left out.
func (w *walker) mount(dir string) {
	if m, ok := w.sink.(mountSink); ok && !w.measuring {
		m.mount(dir)
	}
}

// sub walks the subdirectory name of the directory open as parent.
func (w *walker) sub(parent int, name, rel string) error {
	fd, err := Openat2(parent, name, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW, 0,
		w.src.Resolve(ResolveNoSymlinks))
	if err != nil {
		return &fs.PathError{Op: "open", Path: rel, Err: err}
	}
	return w.dir(fd, rel)
}

// openFileAt opens the regular file name of the directory open as dir (rel, for errors)
// for reading, without following a link (resolve: openat2's flags); anything else is
// refused, as openRead does.
func openFileAt(dir int, name, rel string, resolve uint64) (*os.File, error) {
	// O_NONBLOCK: a FIFO that replaced the file meanwhile must not hang the host.
	fd, err := Openat2(dir, name, syscall.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOFOLLOW, 0, resolve)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: rel, Err: err}
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		syscall.Close(fd)
		return nil, &fs.PathError{Op: "open", Path: rel, Err: fmt.Errorf("%w: not a regular file", fs.ErrInvalid)}
	}
	return os.NewFile(uintptr(fd), rel), nil
}

// Copy copies the directory rel of src, recursively, into the same place of dst (the
// sandbox's root's entries kept root's when src keeps owners: Root.KeepRoot).
func Copy(src, dst *Root, rel string) error {
	return Walk(src, rel, &rootSink{r: dst})
}

// rootSink writes the entries into a working directory.
type rootSink struct {
	r    *Root
	root bool // the entry is the sandbox's root's (ownerSink: a walk that keeps owners)
}

func (s *rootSink) owner(root bool) { s.root = root }

// owned makes rel, made without err, the sandbox's root's if the entry is.
func (s *rootSink) owned(rel string, err error) error {
	if err == nil && s.root {
		return s.r.ChownRoot(rel)
	}
	return err
}

func (s *rootSink) dir(rel string, _ uint32) error        { return s.owned(rel, s.r.MkdirAll(rel)) }
func (s *rootSink) dirDone(rel string, mode uint32) error { return s.r.Chmod(rel, mode) }
func (s *rootSink) symlink(rel, to string) error          { return s.owned(rel, s.r.Symlink(to, rel)) }

func (s *rootSink) file(rel string, mode uint32, _ int64, r io.Reader) error {
	if _, err := s.r.Write(rel, r); err != nil {
		return err
	}
	return s.owned(rel, s.r.Chmod(rel, mode))
}

// TarSink writes the entries as a tar archive, counting them.
type TarSink struct {
	w *tar.Writer
	n int
	// Prefix starts the entries' names (a sandbox's place: "tmp"); "": none.
	Prefix string
	// ImageLink, set for the walk of a sandbox's root, says which links are the image's,
	// left out; so is a directory that holds nothing of the code's but mounts (/home, the
	// parents of a bind): its header waits (pending) until an entry of the code's is in it,
	// or it ends empty.
	ImageLink func(rel, to string) bool
	pending   []pendingDir
	// root: the next entry is the sandbox's root's (owner).
	root bool
}

// NewTarSink is a sink that writes a tar archive to w.
func NewTarSink(w io.Writer) *TarSink { return &TarSink{w: tar.NewWriter(w)} }

// Entries is the number of entries written.
func (s *TarSink) Entries() int { return s.n }

// Close ends the archive.
func (s *TarSink) Close() error { return s.w.Close() }

func (s *TarSink) owner(root bool) { s.root = root }

// ownedBy sets h's owner: root's if root (else none: the sandbox's user's), and returns h.
func ownedBy(h *tar.Header, root bool) *tar.Header {
	if root {
		h.Uname, h.Gname = rootOwner, rootOwner
	}
	return h
}

// pendingDir is a directory of a sandbox's root whose header waits (TarSink.imageLink).
type pendingDir struct {
	rel      string
	mode     uint32
	written  bool // its header is written: an entry of the code's is in it
	children bool // it holds something, written or not
	root     bool // the sandbox's root's
}

func (s *TarSink) dir(rel string, mode uint32) error {
	if s.ImageLink != nil {
		s.held()
		s.pending = append(s.pending, pendingDir{rel: rel, mode: mode, root: s.root})
		return nil
	}
	return s.dirHeader(rel, mode, s.root)
}

func (s *TarSink) dirHeader(rel string, mode uint32, root bool) error {
	s.n++
	return s.w.WriteHeader(ownedBy(&tar.Header{Typeflag: tar.TypeDir, Name: path.Join(s.Prefix, rel) + "/",
		Mode: int64(mode)}, root))
}

// held notes that the innermost pending directory holds something.
func (s *TarSink) held() {
	if len(s.pending) > 0 {
		s.pending[len(s.pending)-1].children = true
	}
}

// flush writes the pending directories' headers, outermost first: an entry is written in
// the innermost.
func (s *TarSink) flush() error {
	s.held()
	for i := range s.pending {
		if !s.pending[i].written {
			if err := s.dirHeader(s.pending[i].rel, s.pending[i].mode, s.pending[i].root); err != nil {
				return err
			}
			s.pending[i].written = true
		}
	}
	return nil
}

func (s *TarSink) mount(string) { s.held() }

func (s *TarSink) dirDone(string, uint32) error {
	if s.ImageLink == nil || len(s.pending) == 0 {
		return nil
	}
	d := s.pending[len(s.pending)-1]
	s.pending = s.pending[:len(s.pending)-1]
	if !d.written && !d.children { // (an empty directory: the code's, after those it is in)
		if err := s.flush(); err != nil {
			return err
		}
		return s.dirHeader(d.rel, d.mode, d.root)
	}
	return nil
}

// file streams the file: its header says the size it had when the walk found it, and the
// entry holds that many bytes, zeros after its end if it shrank meanwhile (never more: r
// stops there).
func (s *TarSink) file(rel string, mode uint32, size int64, r io.Reader) error {
	if err := s.flush(); err != nil {
		return err
	}
	s.n++
	hdr := ownedBy(&tar.Header{Typeflag: tar.TypeReg, Name: path.Join(s.Prefix, rel), Mode: int64(mode), Size: size}, s.root)
	if err := s.w.WriteHeader(hdr); err != nil {
		return err
	}
	n, err := io.Copy(s.w, fileReader{rel, r})
	if err != nil {
		return err
	}
	_, err = io.CopyN(s.w, zeros{}, size-n)
	return err
}

// fileReader is the file rel's reader whose errors name it.
type fileReader struct {
	rel string
	r   io.Reader
}

func (f fileReader) Read(b []byte) (int, error) {
	n, err := f.r.Read(b)
	if err != nil && err != io.EOF {
		err = &fs.PathError{Op: "read", Path: f.rel, Err: err}
	}
	return n, err
}

// zeros reads as zeros without end.
type zeros struct{}

func (zeros) Read(b []byte) (int, error) {
	clear(b)
	return len(b), nil
}

func (s *TarSink) symlink(rel, to string) error {
	if s.ImageLink != nil && s.ImageLink(rel, to) {
		s.held()
		return nil
	}
	if err := s.flush(); err != nil {
		return err
	}
	s.n++
	return s.w.WriteHeader(ownedBy(&tar.Header{Typeflag: tar.TypeSymlink, Name: path.Join(s.Prefix, rel), Linkname: to,
		Mode: 0o777}, s.root))
}

// Tar writes the working directory of root to w as a tar archive, and returns the
// number of its entries.
func Tar(root *Root, w io.Writer) (int, error) {
	s := NewTarSink(w)
	if err := Walk(root, ".", s); err != nil {
		return 0, err
	}
	return s.n, s.Close()
}

// Untar writes the entries of the tar archive r (Tar') into the working directory
// of root, replacing files and links of the same names; directories get their modes last,
// so a read-only one is filled first.
func Untar(root *Root, r io.Reader) error {
	return UntarInto(func() (*Root, error) { return root, nil }, r)
}

// UntarInto is Untar into the root that open gives, asked for at the archive's
// first entry (an archive of no entry needs no working directory).
func UntarInto(open func() (*Root, error), r io.Reader) error {
	var root *Root
	return UntarEntries(r, func(name string) (*Root, string, error) {
		if root == nil {
			var err error
			if root, err = open(); err != nil {
				return nil, "", err
			}
		}
		return root, name, nil
	})
}

// UntarEntries writes the entries of the tar archive r each into the root that rootFor
// gives for its name, as the name there (no root, no error: the entry is left out).
// Directories get their modes last, so a read-only one is filled first.
func UntarEntries(r io.Reader, rootFor func(name string) (*Root, string, error)) error {
	tr := tar.NewReader(r)
	type dirMode struct {
		root *Root
		name string
		mode uint32
	}
	var dirs []dirMode
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("the files' archive: %w", err)
		}
		name, err := CleanName("restore", h.Name, true)
		if err != nil || name == "." {
			continue
		}
		root, name, err := rootFor(name)
		if err != nil {
			return err
		}
		if root == nil {
			continue
		}
		mode := uint32(h.Mode) & 0o7777
		switch h.Typeflag {
		case tar.TypeDir:
			err = root.MkdirAll(name)
			dirs = append(dirs, dirMode{root, name, mode})
		case tar.TypeReg:
			if err = root.MkdirAll(path.Dir(name)); err == nil {
				err = root.replace(name)
			}
			if err == nil {
				err = (&rootSink{r: root}).file(name, mode, h.Size, tr)
			}
		case tar.TypeSymlink:
			err = root.untarLink(name, h.Linkname)
		}
		if err == nil && root.KeepRoot && h.Uname == rootOwner {
			err = root.ChownRoot(name)
		}
		if err != nil {
			return err
		}
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := dirs[i].root.Chmod(dirs[i].name, dirs[i].mode); err != nil {
			return err
		}
	}
	return nil
}

// untarLink makes the symbolic link name to to, in place of a file or link there; the same
// link there already is left as it is (a sandbox root's /bin, whose code may be running).
func (r *Root) untarLink(name, to string) error {
	if err := r.MkdirAll(path.Dir(name)); err != nil {
		return err
	}
	if parent, err := r.OpenAt("readlink", path.Dir(name), OPath|syscall.O_DIRECTORY, 0); err == nil {
		buf := make([]byte, len(to)+1)
		n, err := unix.Readlinkat(parent, path.Base(name), buf)
		syscall.Close(parent)
		if err == nil && string(buf[:n]) == to {
			return nil
		}
	}
	if err := r.replace(name); err != nil {
		return err
	}
	return r.Symlink(to, name)
}

// replace removes the entry name (its directory exists) if it is a file or a link, so that
// a file or link of that name can be made in its place; a directory there is an error.
func (r *Root) replace(name string) error {
	parent, err := r.OpenAt("open", path.Dir(name), OPath|syscall.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer syscall.Close(parent)
	var st syscall.Stat_t
	base := path.Base(name)
	if Fstatat(parent, base, &st) != nil {
		return nil // nothing there
	}
	if st.Mode&syscall.S_IFMT == syscall.S_IFDIR {
		return &fs.PathError{Op: "restore", Path: name, Err: fmt.Errorf("%w: a directory is in the way", fs.ErrExist)}
	}
	unlinkat(parent, base)
	return nil
}

// Size is the bytes the files below the root claim (their sizes, summed), reading none;
// past the root's limit, an error (ErrFileTooLarge).
func Size(root *Root) (int64, error) {
	w := &walker{src: root, measuring: true}
	if err := w.sub(root.FD, ".", "."); err != nil {
		return 0, err
	}
	return w.claimed, nil
}
