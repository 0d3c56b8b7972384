package minipy

import (
	"encoding/binary"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// fileWatch finds, for Result.Files, the files a run creates or changes under its
// namespace's working directory, without walking the directory: one inotify instance per
// engine (a user may have only 128) watches every directory of every namespace that has
// run, and a run reads the events that came during it. A run that changes nothing costs
// two reads that find nothing. Events that come between runs still add watches for new
// directories, but name no file. When the kernel drops events (its queue overflowed) or
// refuses a watch (fs.inotify.max_user_watches), the namespace's next runs walk its
// directory instead, for files whose inode changed (ctime) since the run began, until its
// watches are whole again.
type fileWatch struct {
	e      *Isolated
	mu     sync.Mutex
	fd     int // the inotify instance: 0 before the first use, -1 if the kernel refused one
	dirs   map[int32]*watchedDir
	spaces map[*nsBinding]*watchedNS
	buf    []byte
}

// watchedDir is a directory with a watch: its namespace and path in its working directory.
type watchedDir struct {
	ns  *watchedNS
	rel string
}

// watchedNS is a namespace's watch state.
type watchedNS struct {
	b         *nsBinding
	wds       map[int32]string            // its watches, by path
	whole     bool                        // every directory has a watch (else: walk at the end of runs)
	recording bool                        // a run is in progress: events name changed files
	changed   map[string]bool             // true: written; false: only closed after writing (see event)
	host      map[string]syscall.Timespec // ctime of the files the host's WriteFile wrote, until a run ends
	walk      bool                        // events were lost during this run
	since     time.Time                   // the run's start, less the file clock's granularity
	root      *workRoot                   // open during begin and end
}

// The events that say a file changed, and those that keep the watches whole.
const (
	watchMask = syscall.IN_CREATE | syscall.IN_MODIFY | syscall.IN_CLOSE_WRITE | syscall.IN_MOVED_TO |
		syscall.IN_MOVED_FROM | syscall.IN_DELETE | syscall.IN_ONLYDIR | syscall.IN_EXCL_UNLINK
	// fileClockSlack covers the coarse clock that file times are taken from (a tick).
	fileClockSlack = 20 * time.Millisecond
)

// begin starts recording the changes of a run in the namespace of b (its caller holds the
// namespace's worker slot); end returns them.
func (fw *fileWatch) begin(b *nsBinding) *watchedNS {
	if b == nil || !fw.e.local() {
		return nil
	}
	fw.mu.Lock()
	defer fw.mu.Unlock()
	ns := fw.space(b)
	fw.drain()
	ns.since = time.Now().Add(-fileClockSlack)
	if ns.changed == nil {
		ns.changed = map[string]bool{}
	}
	clear(ns.changed)
	ns.walk = false
	if !ns.whole && fw.open() {
		if root, err := fw.e.rootOf(b); err == nil {
			ns.root = root
			ns.whole = fw.watchTree(ns, ".", false)
			root.close()
			ns.root = nil
		}
	}
	ns.recording = true
	return ns
}

// space is the watch state of the namespace of b, made on first use.
func (fw *fileWatch) space(b *nsBinding) *watchedNS {
	ns := fw.spaces[b]
	if ns == nil {
		ns = &watchedNS{b: b, wds: map[int32]string{}}
		if fw.spaces == nil {
			fw.spaces, fw.dirs = map[*nsBinding]*watchedNS{}, map[int32]*watchedDir{}
		}
		fw.spaces[b] = ns
	}
	return ns
}

// hostWrote notes that the host's WriteFile wrote the file name of the namespace of b,
// leaving it with ctime: a worker forked while the host held that file open closes its copy
// of the descriptor when it execs, which looks like the code closing a file it wrote to.
func (fw *fileWatch) hostWrote(b *nsBinding, name string, ctime syscall.Timespec) {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	if fw.fd < 0 {
		return // closed
	}
	ns := fw.space(b)
	if ns.host == nil {
		ns.host = map[string]syscall.Timespec{}
	}
	ns.host[name] = ctime
}

// end stops recording the run's changes and returns the files changed, as they are now.
func (fw *fileWatch) end(ns *watchedNS) (files []FileInfo, more int) {
	if ns == nil {
		return nil, 0
	}
	fw.mu.Lock()
	defer fw.mu.Unlock()
	fw.drain() // (event opens the working directory if a new folder needs watches)
	ns.recording = false
	if len(ns.changed) == 0 && !ns.walk && ns.whole {
		ns.host = nil
		return nil, 0 // the common case: nothing to open, nothing to stat
	}
	root, err := fw.e.rootOf(ns.b)
	if err != nil {
		ns.changed, ns.host = nil, nil
		return nil, 0
	}
	defer root.close()
	if ns.walk || !ns.whole {
		ns.changed = map[string]bool{}
		walkChanged(root.fd, ".", ".", ns.since, ns.changed, 0)
	}
	closedOnly := map[string]bool{}
	names := make([]string, 0, len(ns.changed))
	for name, written := range ns.changed {
		names = append(names, name)
		closedOnly[name] = !written
	}
	host := ns.host
	clear(ns.changed) // kept for the next run
	ns.host = nil
	slices.Sort(names)
	for _, name := range names {
		fd, err := openat2(root.fd, name, oPath|syscall.O_NOFOLLOW, 0, resolveBeneath|resolveNoSymlinks)
		if err != nil {
			continue // removed since, or moved out through a link
		}
		var st syscall.Stat_t
		err = syscall.Fstat(fd, &st)
		syscall.Close(fd)
		info := fileInfo(name, &st)
		if err != nil || info.IsDir || info.Hidden() {
			continue
		}
		if closedOnly[name] {
			if ctime, ok := host[name]; ok && ctime == st.Ctim || time.Unix(st.Ctim.Unix()).Before(ns.since) {
				continue // unchanged since the host's WriteFile, or since before the run
			}
		}
		if len(files) == MaxResultFiles {
			more++
			continue
		}
		files = append(files, info)
	}
	return files, more
}

// forget drops the watches of a namespace that is gone.
func (fw *fileWatch) forget(b *nsBinding) {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	ns := fw.spaces[b]
	if ns == nil {
		return
	}
	delete(fw.spaces, b)
	for wd := range ns.wds {
		fw.unwatch(wd)
	}
}

// moved drops the watches of the working directory key (workDirs.key), whose tmpfs was
// replaced (moveMounts): the next run of its namespaces watches the new one. (The old
// tmpfs's watches end with it, but that event may come after the next run began.)
func (fw *fileWatch) moved(key string) {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	for b, ns := range fw.spaces {
		if b.dirs.tree != nil && b.dirs.key() == key {
			for wd := range ns.wds {
				fw.unwatch(wd)
			}
			ns.whole = false
		}
	}
}

// close ends the inotify instance (the engine is closed).
func (fw *fileWatch) close() {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	if fw.fd > 0 {
		syscall.Close(fw.fd)
	}
	fw.fd = -1
	fw.spaces, fw.dirs = nil, nil
}

// open makes the inotify instance, once; false if the kernel refuses one.
func (fw *fileWatch) open() bool {
	if fw.fd == 0 {
		fd, err := syscall.InotifyInit1(syscall.IN_NONBLOCK | syscall.IN_CLOEXEC)
		if err != nil {
			fd = -1
		}
		fw.fd = fd
	}
	return fw.fd > 0
}

func (fw *fileWatch) unwatch(wd int32) {
	if d := fw.dirs[wd]; d != nil {
		delete(d.ns.wds, wd)
	}
	delete(fw.dirs, wd)
	syscall.InotifyRmWatch(fw.fd, uint32(wd)) //nolint:errcheck // gone already, if the directory is
}

// watchTree adds watches to the directory rel of ns's working directory and all below it
// (ns.root open), naming its files as changed when record. False if the kernel refused a
// watch.
func (fw *fileWatch) watchTree(ns *watchedNS, rel string, record bool) bool {
	fd, err := openat2(ns.root.fd, rel, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW, 0,
		resolveBeneath|resolveNoSymlinks)
	if err != nil {
		return true // gone or replaced meanwhile: its own events say so
	}
	dir := os.NewFile(uintptr(fd), rel)
	defer dir.Close()
	// Through the open directory's magic link, so that the watch is on what was opened.
	wd, err := syscall.InotifyAddWatch(fw.fd, "/proc/self/fd/"+strconv.Itoa(fd), watchMask)
	if err != nil {
		return false
	}
	if old, ok := fw.dirs[int32(wd)]; ok && old.ns != ns {
		delete(old.ns.wds, int32(wd)) // one inode in two namespaces: cannot be (trees are apart)
	}
	fw.dirs[int32(wd)] = &watchedDir{ns: ns, rel: rel}
	ns.wds[int32(wd)] = rel
	ok := true
	entries(dir, fd, func(name string, st *syscall.Stat_t) {
		sub := path.Join(rel, name)
		if st.Mode&syscall.S_IFMT == syscall.S_IFDIR {
			ok = fw.watchTree(ns, sub, record) && ok
		} else if record {
			ns.changed[sub] = true
		}
	})
	return ok
}

// drain reads the events that have come, and acts on them.
func (fw *fileWatch) drain() {
	if fw.fd <= 0 {
		return
	}
	if fw.buf == nil {
		fw.buf = make([]byte, 64<<10)
	}
	for {
		n, err := syscall.Read(fw.fd, fw.buf)
		if err == syscall.EINTR {
			continue
		}
		if err != nil || n <= 0 {
			return // EAGAIN: no more
		}
		for off := 0; off+syscall.SizeofInotifyEvent <= n; {
			wd := int32(binary.NativeEndian.Uint32(fw.buf[off:]))
			mask := binary.NativeEndian.Uint32(fw.buf[off+4:])
			size := int(binary.NativeEndian.Uint32(fw.buf[off+12:]))
			name := strings.TrimRight(string(fw.buf[off+syscall.SizeofInotifyEvent:off+syscall.SizeofInotifyEvent+size]), "\x00")
			off += syscall.SizeofInotifyEvent + size
			fw.event(wd, mask, name)
		}
	}
}

func (fw *fileWatch) event(wd int32, mask uint32, name string) {
	if mask&syscall.IN_Q_OVERFLOW != 0 {
		for _, ns := range fw.spaces {
			ns.whole = false // watches for new directories may be missing: set up again
			ns.walk = ns.walk || ns.recording
		}
		return
	}
	d := fw.dirs[wd]
	if d == nil {
		return
	}
	ns := d.ns
	if mask&syscall.IN_IGNORED != 0 {
		delete(ns.wds, wd)
		delete(fw.dirs, wd)
		if d.rel == "." {
			// The working directory itself went: its tmpfs moved to a new template
			// (moveMounts). The next run watches the new one.
			ns.whole = false
		}
		return
	}
	rel := path.Join(d.rel, name)
	switch {
	case mask&syscall.IN_ISDIR == 0:
		if ns.recording && mask&(syscall.IN_CREATE|syscall.IN_MODIFY|syscall.IN_MOVED_TO) != 0 {
			ns.changed[rel] = true
		} else if ns.recording && mask&syscall.IN_CLOSE_WRITE != 0 && !ns.changed[rel] {
			// A close of a file open for writing that wrote nothing during the run: a write
			// through mmap (which makes no IN_MODIFY), or a copy of one of the host's own
			// descriptors closing at a child's exec (hostWrote). end keeps it if its inode
			// changed during the run, and not by the host.
			ns.changed[rel] = false
		}
	case mask&(syscall.IN_MOVED_FROM|syscall.IN_DELETE) != 0:
		for wd, r := range ns.wds {
			if r == rel || strings.HasPrefix(r, rel+"/") {
				fw.unwatch(wd)
			}
		}
	case mask&(syscall.IN_CREATE|syscall.IN_MOVED_TO) != 0:
		if ns.root == nil {
			root, err := fw.e.rootOf(ns.b)
			if err != nil {
				return
			}
			ns.root = root
			defer func() { root.close(); ns.root = nil }()
		}
		if !fw.watchTree(ns, rel, ns.recording) {
			ns.whole = false
		}
	}
}

// walkChanged adds to changed the files below the directory name of dirfd (rel in the
// working directory) whose inode changed after since, not following links.
func walkChanged(dirfd int, name, rel string, since time.Time, changed map[string]bool, depth int) {
	if depth > 256 {
		return
	}
	fd, err := syscall.Openat(dirfd, name, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	dir := os.NewFile(uintptr(fd), rel)
	defer dir.Close()
	entries(dir, fd, func(name string, st *syscall.Stat_t) {
		sub := path.Join(rel, name)
		if st.Mode&syscall.S_IFMT == syscall.S_IFDIR {
			walkChanged(fd, name, sub, since, changed, depth+1)
		} else if !time.Unix(st.Ctim.Unix()).Before(since) {
			changed[sub] = true
		}
	})
}

// entries calls fn with each entry of the open directory dir (fd) and its lstat, leaving
// out those gone meanwhile.
func entries(dir *os.File, fd int, fn func(name string, st *syscall.Stat_t)) {
	names, _ := dir.Readdirnames(-1)
	for _, name := range names {
		var st syscall.Stat_t
		if fstatat(fd, name, &st) == nil {
			fn(name, &st)
		}
	}
}
