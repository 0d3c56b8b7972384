package minipy

import (
	"github.com/minipy-go/minipy/internal/sandboxfs"
)

// Result.Files: the files a run created or changed under its namespace's working
// directory, which one inotify instance per engine finds (sandboxfs.Changes: its bounds and
// how it stays within them are documented there, and in docs/isolated.md).

// newFileWatch is e's watch of its namespaces' working directories.
func (e *Isolated) newFileWatch() *sandboxfs.Changes[*nsBinding] {
	return &sandboxfs.Changes[*nsBinding]{
		Open:     e.rootOf,
		Key:      func(b *nsBinding) string { return b.dirs.keyOrNone() },
		MaxFiles: MaxResultFiles,
	}
}

// beginFiles starts recording the changes of a run in the namespace of b (nil: none, for
// an engine whose workers' files are on the far side); endFiles returns them.
func (e *Isolated) beginFiles(b *nsBinding) *sandboxfs.Space[*nsBinding] {
	if b == nil || !e.local() {
		return nil
	}
	return e.watch.Begin(b)
}

// endFiles returns the files the run that beginFiles began changed, and how many more
// there were (MoreFilesUnknown: a walk stopped at its bound).
func (e *Isolated) endFiles(track *sandboxfs.Space[*nsBinding]) ([]FileInfo, int) {
	if track == nil {
		return nil, 0
	}
	files, more, unknown := e.watch.End(track)
	if unknown {
		more = MoreFilesUnknown
	}
	return fileInfos(files), more
}
