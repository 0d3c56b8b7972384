package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/minipy-go/minipy"
)

// putSpec is one --put LOCAL[:NAME]: a local file or directory, and its name in the run's
// working directory.
type putSpec struct {
	arg   string // as given, for messages
	local string
	name  string
	dir   bool // local is a directory
}

// parsePut parses --put's LOCAL[:NAME] and checks LOCAL, so that a missing one is a usage
// error before anything starts. A LOCAL whose own name holds ':' is taken whole when it
// exists. NAME is the name the file or directory gets: by default LOCAL's base name; one
// ending in '/' is a directory to put it in, under its base name; "." for a directory is
// the working directory itself (its files go in at the top).
func parsePut(v string) (putSpec, error) {
	p := putSpec{arg: v, local: v}
	if _, err := os.Lstat(v); err != nil {
		p.local, p.name, _ = strings.Cut(v, ":")
	}
	if p.local == "" {
		return p, errors.New("want LOCAL[:NAME]")
	}
	info, err := os.Stat(p.local) // a link given by hand is followed, as cp does
	var pe *fs.PathError
	if errors.As(err, &pe) {
		if p.local == v {
			return p, pe.Err // "--put x: no such file or directory"
		}
		return p, fmt.Errorf("%s: %w", p.local, pe.Err)
	}
	if err != nil {
		return p, err
	}
	switch {
	case info.IsDir():
		p.dir = true
	case !info.Mode().IsRegular():
		return p, fmt.Errorf("%s is not a regular file or a directory", p.local)
	}
	abs, err := filepath.Abs(p.local)
	if err != nil {
		return p, err
	}
	base := filepath.Base(abs)
	switch {
	case p.name == "":
		p.name = base
	case strings.HasSuffix(p.name, "/"), p.name == "." && !p.dir:
		p.name = path.Join(p.name, base)
	}
	if !putNameOK(p.name) {
		return p, badPutName(p.name)
	}
	p.name = path.Clean(p.name)
	return p, nil
}

// putNameOK reports whether a --put NAME is inside the working directory, as the library's
// file methods take names: relative, without "..".
func putNameOK(name string) bool {
	if name == "" || strings.ContainsRune(name, 0) || path.IsAbs(name) || filepath.IsAbs(name) {
		return false
	}
	for _, part := range strings.Split(name, "/") {
		if part == ".." {
			return false
		}
	}
	return true
}

// badPutName is the error of a --put whose NAME would not be inside the working directory.
func badPutName(name string) error {
	base := path.Base(name)
	return fmt.Errorf("NAME %q is not inside the run's working directory: give a path relative to it "+
		"(the code starts there; in the sandbox it is /work), such as %s or data/%s", name, base, base)
}

// relativeName reports whether name is a clean slash-separated relative path that stays
// below its directory: not absolute, no "..", "." or empty parts, no NUL. --out writes
// only such names.
func relativeName(name string) bool {
	return name != "." && putNameOK(name) && path.Clean(name) == name
}

// usageError is an error of the command line's making (exit status 2).
type usageError struct{ error }

func (e usageError) Unwrap() error { return e.error }

// putFiles copies the --put files into ns's working directory, streaming each file, and
// calls written with each name it wrote. A directory's regular files go in under its name,
// with their relative paths; symbolic links, sockets, FIFOs and devices in it are skipped,
// and empty directories are not made. A bad --put (its NAME, or a local file that cannot be
// read) gives a usageError.
func putFiles(ns *minipy.Namespace, puts []putSpec, written func(name string)) error {
	for _, p := range puts {
		if !p.dir {
			if err := putFile(ns, p, p.local, p.name, written); err != nil {
				return err
			}
			continue
		}
		root, err := filepath.EvalSymlinks(p.local) // walk a linked directory given by hand
		if err != nil {
			return usageError{fmt.Errorf("--put %s: %w", p.arg, err)}
		}
		err = filepath.WalkDir(root, func(file string, d fs.DirEntry, err error) error {
			if err != nil {
				return usageError{fmt.Errorf("--put %s: %w", p.arg, err)}
			}
			if !d.Type().IsRegular() {
				return nil // a directory (walked), a link or a special file (skipped)
			}
			rel, err := filepath.Rel(root, file)
			if err != nil {
				return usageError{fmt.Errorf("--put %s: %w", p.arg, err)}
			}
			return putFile(ns, p, file, path.Join(p.name, filepath.ToSlash(rel)), written)
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// putFile streams the local file to name in ns's working directory.
func putFile(ns *minipy.Namespace, p putSpec, local, name string, written func(string)) error {
	f, err := os.Open(local)
	if err != nil {
		return usageError{fmt.Errorf("--put %s: %w", p.arg, err)}
	}
	defer f.Close()
	if _, err := ns.WriteFileFrom(name, f); err != nil {
		if errors.Is(err, minipy.ErrBadPath) {
			return usageError{fmt.Errorf("--put %s: %w", p.arg, badPutName(name))}
		}
		return fmt.Errorf("--put %s: writing %s: %w", p.arg, name, err)
	}
	written(name)
	return nil
}

// fileSource is where --out copies files from: a namespace (an interface for the tests).
type fileSource interface {
	ReadFileTo(name string, w io.Writer, opts ...minipy.FileOption) (int64, error)
	ListFiles(dir string, opts ...minipy.FileOption) ([]minipy.FileInfo, error)
}

// outSlack is how long before a run's start a file's modification time may be and still
// count as the run's, when --out looks for the files Result.Files left out (MoreFiles): file
// times come from a clock coarser than the one the start is taken from.
const outSlack = time.Second

// outFile is a file a run created or changed, and where --out wrote it ("" if nowhere).
type outFile struct {
	name string
	size int64
	path string
}

// outCopier copies the files runs create or change into --out's directory.
type outCopier struct {
	dir string
	// put are the names --put wrote: files the run left unchanged are not the run's, even
	// when they are newer than its start less outSlack.
	put map[string]bool
}

// copyResult copies res.Files from src into the directory (making it and the folders
// under it, overwriting files that are there) and, when res.MoreFiles says some were or
// may have been left out, every other file of src modified since started less outSlack. It returns the files
// it copied, with where each went, and the notes to report: on the files it left (a name
// out of the directory, a link out of the working directory, not a regular file) and on
// each it failed to write. err is the first of those failures (the rest were tried).
func (o *outCopier) copyResult(src fileSource, res *minipy.Result, started time.Time) (files []outFile, notes []string, err error) {
	if o == nil || res == nil {
		return nil, nil, nil
	}
	infos := res.Files
	if res.MoreFiles != 0 { // (MoreFilesUnknown: some may be)
		listed := make(map[string]bool, len(infos))
		for _, fi := range infos {
			listed[fi.Name] = true
		}
		infos = append([]minipy.FileInfo(nil), infos...)
		var walkErr error
		walkFiles(src, "", func(fi minipy.FileInfo) {
			switch {
			case listed[fi.Name], fi.ModTime.Before(started.Add(-outSlack)):
			case o.put[fi.Name] && fi.ModTime.Before(started):
			default:
				infos = append(infos, fi)
			}
		}, &walkErr)
		if walkErr != nil {
			notes = append(notes, fmt.Sprintf("listing the working directory for the files the run's result left out: %v", walkErr))
		}
	}
	var root *os.Root
	defer func() {
		if root != nil {
			root.Close()
		}
	}()
	for _, fi := range infos {
		if fi.IsDir {
			continue
		}
		if !relativeName(fi.Name) {
			notes = append(notes, fmt.Sprintf("not saved %q: the name leads out of %s", fi.Name, o.dir))
			continue
		}
		if root == nil {
			// Made on the first file, not up front: runs that write nothing leave no trace.
			err = os.MkdirAll(o.dir, 0o755)
			if err == nil {
				root, err = os.OpenRoot(o.dir)
			}
			if err != nil {
				return files, append(notes, fmt.Sprintf("saving files: %v", err)), err
			}
		}
		n, e := copyOut(src, root, fi.Name)
		var se sourceError
		switch {
		case e == nil:
			files = append(files, outFile{name: fi.Name, size: n, path: filepath.Join(o.dir, filepath.FromSlash(fi.Name))})
		case errors.As(e, &se):
			notes = append(notes, fmt.Sprintf("not saved %s: %s", fi.Name, se.reason()))
		default:
			notes = append(notes, fmt.Sprintf("saving %s: %v", fi.Name, e))
			if err == nil {
				err = e
			}
		}
	}
	return files, notes, err
}

// walkFiles calls f with each file below dir in src that is not Hidden, depth first, in name order; the first
// error listing a directory goes to *err, and the walk goes on with the rest.
func walkFiles(src fileSource, dir string, f func(minipy.FileInfo), err *error) {
	infos, e := src.ListFiles(dir)
	if e != nil && *err == nil {
		*err = e
	}
	for _, fi := range infos {
		if fi.Hidden() {
			continue // as Result.Files leaves them out: the libraries' caches in HOME
		}
		if fi.IsDir {
			walkFiles(src, fi.Name, f, err)
		} else {
			f(fi)
		}
	}
}

// sourceError is an error of copyOut that comes from the working directory's side before
// anything was written: the file is gone, is not a regular file, or leads out through a link.
type sourceError struct{ error }

func (e sourceError) Unwrap() error { return e.error }

// reason says why the file was left.
func (e sourceError) reason() string {
	switch {
	case errors.Is(e, minipy.ErrBadPath):
		return "a symbolic link out of the working directory"
	case errors.Is(e, fs.ErrInvalid):
		return "not a regular file"
	case errors.Is(e, fs.ErrNotExist):
		return "gone since the run"
	}
	return e.Error()
}

// copyOut streams the file name from src to the same name below root, making the folders it
// needs; root keeps every write below it, even through links that are there. The local file
// is opened only once the source is (a file that cannot be read leaves what is there as it
// is), and removed if the copy fails half-way.
func copyOut(src fileSource, root *os.Root, name string) (int64, error) {
	local := filepath.FromSlash(name)
	if dir := filepath.Dir(local); dir != "." {
		parts := strings.Split(dir, string(filepath.Separator))
		for i := range parts {
			sub := filepath.Join(parts[:i+1]...)
			if err := root.Mkdir(sub, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
				return 0, err
			}
		}
	}
	w := &lazyFile{open: func() (*os.File, error) {
		return root.OpenFile(local, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	}}
	n, err := src.ReadFileTo(name, w)
	if err == nil && w.f == nil {
		_, err = w.Write(nil) // an empty file: make it
	}
	if w.f != nil {
		if cerr := w.f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			root.Remove(local) //nolint:errcheck // a partial copy is worse than none
		}
	}
	switch {
	case err != nil && w.f == nil && w.err == nil:
		// Nothing was written: the source could not be opened (gone, not a regular file, a
		// link out of the working directory).
		return n, sourceError{err}
	case w.err != nil:
		return n, w.err // the local side's, rather than as the source's read wrapped it
	}
	return n, err
}

// lazyFile is a local file opened on the first write.
type lazyFile struct {
	open func() (*os.File, error)
	f    *os.File
	err  error // the local side's error, if any
}

func (l *lazyFile) Write(p []byte) (int, error) {
	if err := l.ensure(); err != nil {
		return 0, err
	}
	n, err := l.f.Write(p)
	if err != nil {
		l.err = err
	}
	return n, err
}

// ReadFrom lets io.Copy hand the file over whole (copy_file_range between files).
func (l *lazyFile) ReadFrom(r io.Reader) (int64, error) {
	if err := l.ensure(); err != nil {
		return 0, err
	}
	return l.f.ReadFrom(r)
}

func (l *lazyFile) ensure() error {
	if l.f == nil && l.err == nil {
		l.f, l.err = l.open()
	}
	return l.err
}

// sizeText is a file's size as the reports give it: "10 bytes", "23 KB", "1.2 MB".
func sizeText(n int64) string {
	switch {
	case n == 1:
		return "1 byte"
	case n < 1024:
		return fmt.Sprintf("%d bytes", n)
	case n < 1<<20:
		return fmt.Sprintf("%d KB", (n+512)/1024)
	}
	return fmt.Sprintf("%.1f MB", float64(n)/(1<<20))
}

// runFiles is what --put and --out ask of the runs: nil when neither was given.
type runFiles struct {
	puts []putSpec
	out  *outCopier // nil: no --out
}

// put copies the --put files into ns, and remembers their names. It returns the exit
// status of a failure, with the error.
func (rf *runFiles) put(ns *minipy.Namespace) (int, error) {
	if rf == nil || len(rf.puts) == 0 {
		return 0, nil
	}
	written := func(string) {}
	if rf.out != nil {
		rf.out.put = map[string]bool{}
		written = func(name string) { rf.out.put[name] = true }
	}
	err := putFiles(ns, rf.puts, written)
	switch {
	case err == nil:
		return 0, nil
	case errors.As(err, new(usageError)):
		return 2, err
	}
	return 1, err
}

// collect copies a run's files out (--out), and reports them on errOut: each file saved,
// then the notes. It returns false when saving failed.
func (rf *runFiles) collect(ns *minipy.Namespace, res *minipy.Result, started time.Time, errOut *tailWriter) bool {
	if rf == nil || rf.out == nil {
		return true
	}
	files, notes, err := rf.out.copyResult(ns, res, started)
	reportFiles(rf.out.dir, files, notes, errOut)
	return err == nil
}

// maxFileLines caps the "saved" lines of one run on the terminal.
const maxFileLines = 100

// reportFiles says on errOut where each file went, then the notes.
func reportFiles(dir string, files []outFile, notes []string, errOut *tailWriter) {
	if len(files) > 0 || len(notes) > 0 {
		errOut.startLine()
	}
	for i, f := range files {
		if i == maxFileLines && len(files) > maxFileLines+1 {
			fmt.Fprintf(errOut, "minipy: saved %d more files to %s\n", len(files)-i, dir)
			break
		}
		fmt.Fprintf(errOut, "minipy: saved %s (%s) to %s\n", f.name, sizeText(f.size), f.path)
	}
	for _, note := range notes {
		fmt.Fprintf(errOut, "minipy: %s\n", note)
	}
}
