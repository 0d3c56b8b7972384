package sandboxfs

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path"
	"strconv"
	"syscall"
)

// Op is what happened to a file under a watched directory (minipy.FileEventOp, whose
// constants are these).
type Op int

// The changes WatchDir reports.
const (
	Created    Op = iota + 1 // made, or moved in
	Written                  // its content changed
	Removed                  //
	Renamed                  // moved away (its new name, if under the directory, comes as Created)
	Chmod                    // its mode, owner or attributes changed
	EventsLost               // events were dropped before this one
)

// Event is a change under a watched directory: the file's path relative to it, and
// whether it is a directory.
type Event struct {
	Name  string
	Op    Op
	IsDir bool
}

// MaxWatchDirs is the most directories one WatchDir watches.
const MaxWatchDirs = 1024

// WatchDir watches the directory open as fd (top: its name below the roots that reopen
// opens, to watch the directories made later), and with recursive what is below it, until
// ctx ends or the directory goes; then it calls done. Each change is sent on out as mk
// makes it; when out is full, changes are dropped, and the next one that goes is preceded
// by one of Op EventsLost.
func WatchDir[E any](ctx context.Context, fd int, top string, recursive bool, reopen func() (*Root, error),
	out chan E, mk func(Event) E, done func()) error {
	in, err := syscall.InotifyInit1(syscall.IN_NONBLOCK | syscall.IN_CLOEXEC)
	if err != nil {
		return err
	}
	w := &dirWatch[E]{in: in, recursive: recursive, dirs: map[int32]string{}, top: top, reopen: reopen,
		out: out, mk: mk}
	if err := w.add(fd, ""); err != nil {
		syscall.Close(in)
		return err
	}
	if recursive {
		w.addBelow(fd, "")
	}
	go func() {
		defer done()
		w.serve(ctx)
	}()
	return nil
}

// dirWatch is one WatchDir: its inotify instance and the directory of each watch.
type dirWatch[E any] struct {
	in        int
	recursive bool
	dirs      map[int32]string // watch descriptor -> its directory, relative to the watched one
	top       string           // the watched directory, relative to the root
	reopen    func() (*Root, error)
	out       chan E
	mk        func(Event) E
	lost      bool
}

// (No IN_DONT_FOLLOW: the path is the fd's magic link in /proc, which must be followed;
// the fd was opened without following a link.)
const dirWatchMask = syscall.IN_CREATE | syscall.IN_MODIFY | syscall.IN_DELETE | syscall.IN_MOVED_FROM |
	syscall.IN_MOVED_TO | syscall.IN_ATTRIB | syscall.IN_DELETE_SELF | syscall.IN_ONLYDIR |
	syscall.IN_EXCL_UNLINK

// add watches the directory open as fd, rel below the watched one.
func (w *dirWatch[E]) add(fd int, rel string) error {
	if len(w.dirs) >= MaxWatchDirs {
		return fmt.Errorf("more than %d directories", MaxWatchDirs)
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
func (w *dirWatch[E]) addBelow(fd int, rel string) {
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
		sub, err := Openat2(fd, name, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW, 0,
			ResolveBeneath|ResolveNoSymlinks)
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
func (w *dirWatch[E]) serve(ctx context.Context) {
	f := os.NewFile(uintptr(w.in), "inotify") // (non-blocking: Go's poller waits, and Close wakes it)
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
func (w *dirWatch[E]) event(wd int32, mask uint32, name string) bool {
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
	ev := Event{Name: path.Join(dir, name), IsDir: mask&syscall.IN_ISDIR != 0}
	switch {
	case mask&(syscall.IN_CREATE|syscall.IN_MOVED_TO) != 0:
		ev.Op = Created
		if ev.IsDir && w.recursive {
			w.watchNew(ev.Name)
		}
	case mask&syscall.IN_MODIFY != 0:
		ev.Op = Written
	case mask&syscall.IN_DELETE != 0:
		ev.Op = Removed
	case mask&syscall.IN_MOVED_FROM != 0:
		ev.Op = Renamed
	case mask&syscall.IN_ATTRIB != 0:
		ev.Op = Chmod
	default:
		return true
	}
	w.send(ev)
	return true
}

// watchNew watches a directory made under the watched one (rel), and what it holds.
func (w *dirWatch[E]) watchNew(rel string) {
	root, err := w.reopen()
	if err != nil {
		return
	}
	defer root.Close()
	fd, err := root.OpenAt("watch", path.Join(w.top, rel), syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return
	}
	defer syscall.Close(fd)
	if w.add(fd, rel) == nil {
		w.addBelow(fd, rel)
	}
}

// send gives ev to the receiver, or drops it when out is full (the
// next one that goes says so).
func (w *dirWatch[E]) send(ev Event) {
	if w.lost {
		select {
		case w.out <- w.mk(Event{Op: EventsLost}):
			w.lost = false
		default:
			return
		}
	}
	select {
	case w.out <- w.mk(ev):
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
