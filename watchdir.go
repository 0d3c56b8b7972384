package minipy

import (
	"cmp"
	"context"
	"encoding/binary"
	"fmt"
	"io/fs"
	"os"
	"path"
	"strconv"
	"sync/atomic"
	"syscall"
)

// FileEventOp is what happened to a file under a watched directory (FileEvent).
type FileEventOp int

// The changes WatchDir reports.
const (
	FileCreated FileEventOp = iota + 1 // made, or moved in
	FileWritten                        // its content changed
	FileRemoved
	FileRenamed // moved away (its new name, if under the directory, comes as FileCreated)
	FileChmod   // its mode, owner or attributes changed
	// FileEventsLost says that events were dropped before this one: the receiver fell
	// watchBuffer events behind, or the kernel's queue overflowed.
	FileEventsLost
)

// FileEvent is a change under a directory that WatchDir watches.
type FileEvent struct {
	// Name is the file's path relative to the watched directory, slash-separated.
	Name string
	Op   FileEventOp
	// IsDir reports a directory.
	IsDir bool
}

// The bounds of WatchDir: its events at most watchBuffer behind its receiver; at most
// watchDirs directories a watch; at most engineDirWatches watches open at once in an
// engine, each an inotify instance of the host's user, who has 128 by default for all
// its processes.
const (
	watchBuffer      = 1024
	watchDirs        = 1024
	engineDirWatches = 32
)

// WatchDir watches the directory dir, relative to the working directory, and with
// recursive its subdirectories (those made later too), until ctx ends: each change there
// comes on the channel it returns, which closes when ctx ends or dir is removed. A
// receiver that falls 1,024 events behind loses the next ones, and then gets a
// FileEventsLost. A watch covers at most 1,024 directories, and an engine has at most 32
// watches open at once (each an inotify instance of the host's user): past that an error.
// A missing dir gives an error matching fs.ErrNotExist; a file, one matching
// syscall.ENOTDIR. Safe from any goroutine, beside runs.
func (ns *Namespace) WatchDir(ctx context.Context, dir string, recursive bool, opts ...FileOption) (<-chan FileEvent, error) {
	root, clean, err := ns.fileRoot("watch", dir, true, opts...)
	if err != nil {
		return nil, err
	}
	defer root.close()
	e := ns.engine.(*Isolated) // (the one engine with working directories)
	fd, err := root.openat("watch", clean, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	defer syscall.Close(fd)
	if e.dirWatches.Add(1) > engineDirWatches {
		e.dirWatches.Add(-1)
		return nil, &fs.PathError{Op: "watch", Path: clean, Err: fmt.Errorf("the engine has %d directory watches open, "+
			"its most", engineDirWatches)}
	}
	in, err := syscall.InotifyInit1(syscall.IN_NONBLOCK | syscall.IN_CLOEXEC)
	if err != nil {
		e.dirWatches.Add(-1)
		return nil, &fs.PathError{Op: "watch", Path: clean, Err: err}
	}
	w := &dirWatch{in: in, recursive: recursive, dirs: map[int32]string{}, top: clean,
		out: make(chan FileEvent, watchBuffer), count: &e.dirWatches}
	if err := w.add(fd, ""); err != nil {
		syscall.Close(in)
		e.dirWatches.Add(-1)
		return nil, &fs.PathError{Op: "watch", Path: clean, Err: err}
	}
	if recursive {
		w.addBelow(fd, "")
	}
	base := cmp.Or(root.base, ".") // (the place an absolute name reached, again)
	w.reopen = func() (*workRoot, error) { r, _, err := ns.fileRoot("watch", base, true, opts...); return r, err }
	go w.serve(ctx)
	return w.out, nil
}

// dirWatch is one WatchDir: its inotify instance and the directory of each watch.
type dirWatch struct {
	in        int
	recursive bool
	dirs      map[int32]string // watch descriptor -> its directory, relative to the watched one
	top       string           // the watched directory, relative to the working directory
	reopen    func() (*workRoot, error)
	out       chan FileEvent
	lost      bool
	count     *atomic.Int64
}

// (No IN_DONT_FOLLOW: the path is the fd's magic link in /proc, which must be followed;
// the fd was opened without following a link.)
const dirWatchMask = syscall.IN_CREATE | syscall.IN_MODIFY | syscall.IN_DELETE | syscall.IN_MOVED_FROM |
	syscall.IN_MOVED_TO | syscall.IN_ATTRIB | syscall.IN_DELETE_SELF | syscall.IN_ONLYDIR |
	syscall.IN_EXCL_UNLINK

// add watches the directory open as fd, rel below the watched one.
func (w *dirWatch) add(fd int, rel string) error {
	if len(w.dirs) >= watchDirs {
		return fmt.Errorf("more than %d directories", watchDirs)
	}
	wd, err := syscall.InotifyAddWatch(w.in, "/proc/self/fd/"+strconv.Itoa(fd), dirWatchMask)
	if err != nil {
		return err
	}
	w.dirs[int32(wd)] = rel
	return nil
}

// addBelow watches the subdirectories of the directory open as fd (rel), recursively, as
// far as watchDirs allows.
func (w *dirWatch) addBelow(fd int, rel string) {
	d := dupFd(fd)
	if d < 0 {
		return
	}
	list := os.NewFile(uintptr(d), rel)
	names, err := list.Readdirnames(-1)
	list.Close()
	if err != nil {
		return
	}
	for _, name := range names {
		sub, err := openat2(fd, name, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW, 0,
			resolveBeneath|resolveNoSymlinks)
		if err != nil {
			continue // not a directory, or gone
		}
		if w.add(sub, path.Join(rel, name)) == nil {
			w.addBelow(sub, path.Join(rel, name))
		}
		syscall.Close(sub)
	}
}

// dupFd is a duplicate of fd (a directory's, to list it without closing fd).
func dupFd(fd int) int {
	d, err := syscall.Dup(fd)
	if err != nil {
		return -1
	}
	syscall.CloseOnExec(d)
	return d
}

// serve reads the events until ctx ends or the watched directory goes, then closes out.
func (w *dirWatch) serve(ctx context.Context) {
	f := os.NewFile(uintptr(w.in), "inotify") // (non-blocking: Go's poller waits, and Close wakes it)
	defer w.count.Add(-1)
	defer close(w.out)
	stop := context.AfterFunc(ctx, func() { f.Close() })
	defer stop()
	defer f.Close()
	buf := make([]byte, 64<<10)
	for {
		n, err := f.Read(buf)
		if err != nil {
			return
		}
		for off := 0; off+syscall.SizeofInotifyEvent <= n; {
			wd := int32(binary.NativeEndian.Uint32(buf[off:]))
			mask := binary.NativeEndian.Uint32(buf[off+4:])
			size := int(binary.NativeEndian.Uint32(buf[off+12:]))
			name := string(trimNul(buf[off+syscall.SizeofInotifyEvent : min(n, off+syscall.SizeofInotifyEvent+size)]))
			off += syscall.SizeofInotifyEvent + size
			if !w.event(wd, mask, name) {
				return
			}
		}
	}
}

// event handles one inotify event; false when the watched directory is gone.
func (w *dirWatch) event(wd int32, mask uint32, name string) bool {
	dir, known := w.dirs[wd]
	switch {
	case mask&syscall.IN_Q_OVERFLOW != 0:
		w.lost = true
		return true
	case mask&syscall.IN_IGNORED != 0: // (a watch ended: its directory went)
		delete(w.dirs, wd)
		return !known || dir != "" // (the watched directory's own: the watch ends)
	case !known || name == "":
		return true // (an event of a directory itself: its parent's watch reports it)
	}
	ev := FileEvent{Name: path.Join(dir, name), IsDir: mask&syscall.IN_ISDIR != 0}
	switch {
	case mask&(syscall.IN_CREATE|syscall.IN_MOVED_TO) != 0:
		ev.Op = FileCreated
		if ev.IsDir && w.recursive {
			w.watchNew(ev.Name)
		}
	case mask&syscall.IN_MODIFY != 0:
		ev.Op = FileWritten
	case mask&syscall.IN_DELETE != 0:
		ev.Op = FileRemoved
	case mask&syscall.IN_MOVED_FROM != 0:
		ev.Op = FileRenamed
	case mask&syscall.IN_ATTRIB != 0:
		ev.Op = FileChmod
	default:
		return true
	}
	w.send(ev)
	return true
}

// watchNew watches a directory made under the watched one (rel), and what it holds.
func (w *dirWatch) watchNew(rel string) {
	root, err := w.reopen()
	if err != nil {
		return
	}
	defer root.close()
	fd, err := root.openat("watch", path.Join(w.top, rel), syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return
	}
	defer syscall.Close(fd)
	if w.add(fd, rel) == nil {
		w.addBelow(fd, rel)
	}
}

// send gives ev to the receiver, or drops it when the receiver is watchBuffer behind (the
// next one that goes says so).
func (w *dirWatch) send(ev FileEvent) {
	if w.lost {
		select {
		case w.out <- FileEvent{Op: FileEventsLost}:
			w.lost = false
		default:
			return
		}
	}
	select {
	case w.out <- ev:
	default:
		w.lost = true
	}
}

// trimNul is b up to its first NUL (an inotify event's name is padded with them).
func trimNul(b []byte) []byte {
	for i, c := range b {
		if c == 0 {
			return b[:i]
		}
	}
	return b
}
