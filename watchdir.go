package minipy

import (
	"cmp"
	"context"
	"fmt"
	"io/fs"
	"syscall"

	"github.com/minipy-go/minipy/internal/sandboxfs"
)

// FileEventOp is what happened to a file under a watched directory (FileEvent).
type FileEventOp int

// The changes WatchDir reports.
const (
	FileCreated = FileEventOp(sandboxfs.Created) // made, or moved in
	FileWritten = FileEventOp(sandboxfs.Written) // its content changed
	FileRemoved = FileEventOp(sandboxfs.Removed)
	FileRenamed = FileEventOp(sandboxfs.Renamed) // moved away (its new name, if under the directory, comes as FileCreated)
	FileChmod   = FileEventOp(sandboxfs.Chmod)   // its mode, owner or attributes changed
	// FileEventsLost says that events were dropped before this one: the receiver fell
	// watchBuffer events behind, or the kernel's queue overflowed.
	FileEventsLost = FileEventOp(sandboxfs.EventsLost)
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
	watchDirs        = sandboxfs.MaxWatchDirs
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
	defer root.Close()
	e := ns.engine.(*Isolated) // (the one engine with working directories)
	fd, err := root.OpenAt("watch", clean, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	defer syscall.Close(fd)
	if e.dirWatches.Add(1) > engineDirWatches {
		e.dirWatches.Add(-1)
		return nil, &fs.PathError{Op: "watch", Path: clean, Err: fmt.Errorf("the engine has %d directory watches open, "+
			"its most", engineDirWatches)}
	}
	base := cmp.Or(root.Base, ".") // (the place an absolute name reached, again)
	reopen := func() (*sandboxfs.Root, error) { r, _, err := ns.fileRoot("watch", base, true, opts...); return r, err }
	out := make(chan FileEvent, watchBuffer)
	mk := func(ev sandboxfs.Event) FileEvent {
		return FileEvent{Name: ev.Name, Op: FileEventOp(ev.Op), IsDir: ev.IsDir}
	}
	done := func() { e.dirWatches.Add(-1) }
	if err := sandboxfs.WatchDir(ctx, fd, clean, recursive, reopen, out, mk, done); err != nil {
		done()
		return nil, &fs.PathError{Op: "watch", Path: clean, Err: err}
	}
	return out, nil
}
