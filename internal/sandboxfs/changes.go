package sandboxfs

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

// Changes[K] finds, for Result.Files, the files a run creates or changes under its
// namespace's working directory, without walking the directory: one inotify instance per
// engine (a user may have only 128) watches the directories of every namespace that has
// run, and a run reads the events that came during it. A run that changes nothing costs
// two reads that find nothing. Events that come between runs still add watches for new
// directories, but name no file. Hidden directories (hiddenName) get no watch: their files
// are never named, and one moved to a visible name is watched, and its files named, then.
//
// Watches are kernel memory charged to the host's user, whose budget every process of that
// user shares, and a working directory may hold a directory per inode: so a namespace gets
// at most NSWatchLimit watches, and the engine engineWatches. A namespace with a
// directory that has no watch (past a bound, or the kernel refused one) is capped: the end
// of its runs walks its directory for files whose inode changed since the run began
// (ctime), statting the files of the directories without a watch only, and visiting at most
// WalkLimit entries; a walk that stops there makes MoreFiles minipy.MoreFilesUnknown. Setting
// watches up lists at most ListLimit entries a run (what is not listed gets no watch). A
// capped namespace tries again to watch all its directories when watches were freed. When
// the kernel drops events (its queue overflowed), the namespaces set their watches up again
// at their next run, and the runs that lost events walk their whole directory.
//
// K names a namespace (the engine's binding of it); Open opens its working directory, and
// Key names that directory (Moved). Changes is safe from any goroutine.
type Changes[K comparable] struct {
	Open     func(K) (*Root, error)
	Key      func(K) string
	MaxFiles int // the most files End names (Result.Files' bound)

	mu     sync.Mutex
	fd     int // the inotify instance: 0 before the first use, -1 if the kernel refused one
	dirs   map[int32]*watchedDir[K]
	spaces map[K]*Space[K]
	buf    []byte
	freed  uint64 // counts the watches dropped: a capped namespace with room tries again when it grew
	// The bounds (NSWatchLimit, engineWatches, WalkLimit, ListLimit), set on first use.
	nsLimit, engineLimit, walkLimit, listLimit int
}

// The bounds on what one engine's Result.Files may make the host hold and do. A watch costs
// the kernel about 1 KiB, charged to fs.inotify.max_user_watches: 8,192 before Linux 5.11,
// since then 1% of memory up to 1,048,576, for all the processes of a user (of root, on
// most servers). A working directory of WorkSize 1 GiB may hold 262,144 directories.
const (
	// NSWatchLimit is more directories than code usually makes outside its hidden ones
	// (which get no watch): all of CPython 3.11's standard library holds 978.
	NSWatchLimit = 1024
	// EngineWatchLimit is 16 namespaces at their bound (most hold a few directories);
	// engineWatches makes it at most a quarter of the host user's budget (2,048 of an old
	// kernel's 8,192), which leaves the rest to the host's other processes.
	EngineWatchLimit = 16384
	// WalkLimit bounds the directory entries that one run's walks visit (the directories
	// without a watch, or all after lost events): the host's CPU time, 1 µs for a folder
	// or a file of a watched one, 5 µs for a file whose ctime is read (tmpfs, on a loaded
	// 2-core VM: BenchmarkFileWatchWalk), so at most ~50 ms a run, while the engine's
	// other runs wait for the watches' lock; the 262,144 inodes of a 1 GiB working
	// directory would take over a second, every run.
	WalkLimit = 10000
	// ListLimit bounds the directory entries listed to set watches up, from one run's
	// start to the next's (first watches, watches again after lost events or freed ones,
	// folders made or moved in): 0.75 µs each (BenchmarkFileWatchSetup), so at most
	// ~75 ms, however often the code renames a big folder back and forth. A working
	// directory with more entries than that (hidden ones aside) has folders without a
	// watch.
	ListLimit = 100000
)

// EngineWatches is EngineWatchLimit, and at most a quarter of the host user's budget
// (max, fs.inotify.max_user_watches; <= 0 when it cannot be read).
func EngineWatches(max int) int {
	if max <= 0 {
		return EngineWatchLimit
	}
	return min(EngineWatchLimit, (max+3)/4)
}

// watchedDir is a directory with a watch: its namespace and path in its working directory.
type watchedDir[K comparable] struct {
	ns  *Space[K]
	rel string
}

// Space[K] is a namespace's watch state.
type Space[K comparable] struct {
	key        K
	wds        map[int32]string            // its watches: the directory of each
	byPath     map[string]int32            // the same, by directory
	seen       map[int32]bool              // the watches found again, while rewatch runs
	whole      bool                        // its watches were set up (else: at the next run's Begin)
	capped     bool                        // a directory has no watch (a bound, or the kernel refused)
	tried      uint64                      // freed when rewatch last ran
	recording  bool                        // a run is in progress: events name changed files
	changed    map[string]bool             // true: written; false: only closed after writing (see event)
	host       map[string]syscall.Timespec // ctime of the files the host's WriteFile wrote, until a run ends
	walk       bool                        // events were lost during this run: its end walks everything
	budget     int                         // the entries this run's walks may still visit
	listBudget int                         // the entries watchTree may still list, until the next run
	unknown    bool                        // a walk of this run stopped short: there may be more
	since      time.Time                   // the run's start, less the file clock's granularity
	root       *Root                       // open during Begin and End
}

// The events that say a file changed, and those that keep the watches whole.
const (
	watchMask = syscall.IN_CREATE | syscall.IN_MODIFY | syscall.IN_CLOSE_WRITE | syscall.IN_MOVED_TO |
		syscall.IN_MOVED_FROM | syscall.IN_DELETE | syscall.IN_ONLYDIR | syscall.IN_EXCL_UNLINK
	// FileClockSlack covers the coarse clock that file times are taken from (a tick).
	FileClockSlack = 20 * time.Millisecond
)

// Begin starts recording the changes of a run in the namespace b (its caller holds the
// namespace's worker slot); End returns them.
func (fw *Changes[K]) Begin(b K) *Space[K] {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	ns := fw.space(b)
	fw.drain()
	ns.since = time.Now().Add(-FileClockSlack)
	if ns.changed == nil {
		ns.changed = map[string]bool{}
	}
	clear(ns.changed)
	ns.walk, ns.unknown = false, false
	opened := fw.open() // (and the bounds set)
	ns.listBudget = fw.listLimit
	if opened && (!ns.whole || ns.capped && ns.tried != fw.freed && fw.room(ns)) {
		if root, err := fw.Open(b); err == nil {
			ns.root = root
			fw.rewatch(ns)
			root.Close()
			ns.root = nil
		}
	}
	ns.budget = fw.walkLimit
	ns.recording = true
	return ns
}

// space is the watch state of the namespace of b, made on first use.
func (fw *Changes[K]) space(b K) *Space[K] {
	ns := fw.spaces[b]
	if ns == nil {
		ns = &Space[K]{key: b, wds: map[int32]string{}, byPath: map[string]int32{}}
		if fw.spaces == nil {
			fw.spaces, fw.dirs = map[K]*Space[K]{}, map[int32]*watchedDir[K]{}
		}
		fw.spaces[b] = ns
	}
	return ns
}

// HostWrote notes that the host's WriteFile wrote the file name of the namespace of b,
// leaving it with ctime: a worker forked while the host held that file open closes its copy
// of the descriptor when it execs, which looks like the code closing a file it wrote to.
func (fw *Changes[K]) HostWrote(b K, name string, ctime syscall.Timespec) {
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

// End stops recording the run's changes and returns the files changed, as they are now;
// more counts those past MaxFiles; unknown says a walk stopped at its bound (there may be more).
func (fw *Changes[K]) End(ns *Space[K]) (files []Info, more int, unknown bool) {
	if ns == nil {
		return nil, 0, false
	}
	fw.mu.Lock()
	defer fw.mu.Unlock()
	fw.drain() // (event opens the working directory if a new folder needs watches)
	ns.recording = false
	walk := ns.walk || !ns.whole || ns.capped
	if len(ns.changed) == 0 && !walk && !ns.unknown {
		ns.host = nil
		return nil, 0, false // the common case: nothing to open, nothing to stat
	}
	root, err := fw.Open(ns.key)
	if err != nil {
		clear(ns.changed)
		ns.host = nil
		return nil, 0, false
	}
	defer root.Close()
	if walk {
		// Without lost events, a watched directory's files are its events'.
		fw.walkChanged(ns, root.FD, ".", ".", ns.since, ns.whole && !ns.walk, 0)
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
		fd, err := Openat2(root.FD, name, OPath|syscall.O_NOFOLLOW, 0, ResolveBeneath|ResolveNoSymlinks)
		if err == syscall.ENAMETOOLONG {
			ns.unknown = true
		}
		if err != nil {
			continue // removed since, or moved out through a link
		}
		var st syscall.Stat_t
		err = syscall.Fstat(fd, &st)
		syscall.Close(fd)
		info := InfoOf(name, &st)
		if err != nil || info.IsDir || info.Hidden() {
			continue
		}
		if ctime, ok := host[name]; ok && ctime == st.Ctim {
			continue // unchanged since the host's WriteFile (a walk finds those just before the run)
		}
		if closedOnly[name] && changedBefore(st.Ctim, ns.since) {
			continue // unchanged since before the run
		}
		if len(files) == fw.MaxFiles {
			more++
			continue
		}
		files = append(files, info)
	}
	return files, more, ns.unknown
}

// Forget drops the watches of a namespace that is gone.
func (fw *Changes[K]) Forget(b K) {
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

// Moved drops the watches of the working directory key (workDirs.key), whose tmpfs was
// replaced (moveMounts): the next run of its namespaces watches the new one. (The old
// tmpfs's watches end with it, but that event may come after the next run began.)
func (fw *Changes[K]) Moved(key string) {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	for b, ns := range fw.spaces {
		if fw.Key(b) == key {
			for wd := range ns.wds {
				fw.unwatch(wd)
			}
			ns.whole = false
		}
	}
}

// Close ends the inotify instance (the engine is closed).
func (fw *Changes[K]) Close() {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	if fw.fd > 0 {
		syscall.Close(fw.fd)
	}
	fw.fd = -1
	fw.spaces, fw.dirs = nil, nil
}

// open makes the inotify instance, once; false if the kernel refuses one. It sets the
// bounds that are not set yet.
func (fw *Changes[K]) open() bool {
	if fw.nsLimit == 0 {
		fw.nsLimit = NSWatchLimit
	}
	if fw.walkLimit == 0 {
		fw.walkLimit = WalkLimit
	}
	if fw.listLimit == 0 {
		fw.listLimit = ListLimit
	}
	if fw.engineLimit == 0 {
		max := -1
		if b, err := os.ReadFile("/proc/sys/fs/inotify/max_user_watches"); err == nil {
			if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				max = n
			}
		}
		fw.engineLimit = EngineWatches(max)
	}
	if fw.fd == 0 {
		fd, err := syscall.InotifyInit1(syscall.IN_NONBLOCK | syscall.IN_CLOEXEC)
		if err != nil {
			fd = -1
		}
		fw.fd = fd
	}
	return fw.fd > 0
}

// room reports whether ns may have another watch.
func (fw *Changes[K]) room(ns *Space[K]) bool {
	return len(ns.wds) < fw.nsLimit && len(fw.dirs) < fw.engineLimit
}

// add notes the watch wd of the directory rel of ns.
func (fw *Changes[K]) add(ns *Space[K], wd int32, rel string) {
	if old := fw.dirs[wd]; old != nil && (old.ns != ns || old.rel != rel) {
		// The directory moved while events were lost (or, in two namespaces: cannot be).
		delete(old.ns.wds, wd)
		if old.ns.byPath[old.rel] == wd {
			delete(old.ns.byPath, old.rel)
		}
	}
	if prev, ok := ns.byPath[rel]; ok && prev != wd {
		fw.unwatch(prev) // another directory was there (events were lost)
	}
	fw.dirs[wd] = &watchedDir[K]{ns: ns, rel: rel}
	ns.wds[wd] = rel
	ns.byPath[rel] = wd
	if ns.seen != nil {
		ns.seen[wd] = true
	}
}

// drop forgets the watch wd, which the kernel dropped or is told to.
func (fw *Changes[K]) drop(wd int32) *watchedDir[K] {
	d := fw.dirs[wd]
	if d == nil {
		return nil
	}
	delete(fw.dirs, wd)
	delete(d.ns.wds, wd)
	if d.ns.byPath[d.rel] == wd {
		delete(d.ns.byPath, d.rel)
	}
	fw.freed++
	return d
}

func (fw *Changes[K]) unwatch(wd int32) {
	fw.drop(wd)
	syscall.InotifyRmWatch(fw.fd, uint32(wd)) //nolint:errcheck // gone already, if the directory is
}

// rewatch sets up the watches of ns's working directory (ns.root open) anew, within the
// bounds, and drops those of directories no longer there (when it listed them all).
func (fw *Changes[K]) rewatch(ns *Space[K]) {
	ns.capped = false
	ns.seen = map[int32]bool{}
	fw.watchTree(ns, ".", false)
	if ns.listBudget > 0 {
		for wd := range ns.wds {
			if !ns.seen[wd] {
				fw.unwatch(wd)
			}
		}
	}
	ns.seen = nil
	ns.whole, ns.tried = true, fw.freed
}

// watchTree adds watches to the directory rel of ns's working directory and all below it
// (ns.root open), naming its files as changed when record, while the bounds allow. A
// directory past them makes ns capped; when record, its files are named all the same. It
// lists at most ns.listBudget entries: past that, ns is capped, and unknown when record.
func (fw *Changes[K]) watchTree(ns *Space[K], rel string, record bool) {
	if rel != "." && HiddenName(path.Base(rel)) {
		return
	}
	if _, ok := ns.byPath[rel]; !ok && !fw.room(ns) {
		ns.capped = true
		if record {
			fw.walkChanged(ns, ns.root.FD, rel, rel, time.Time{}, false, 0)
		}
		return
	}
	fd, err := Openat2(ns.root.FD, rel, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW, 0,
		ResolveBeneath|ResolveNoSymlinks)
	switch err {
	case nil:
	case syscall.ENOENT, syscall.ENOTDIR, syscall.ELOOP, syscall.EXDEV:
		return // gone or replaced meanwhile: its own events say so
	default:
		ns.capped = true // one the host cannot read (mode 0), a name too long: walked instead
		return
	}
	dir := os.NewFile(uintptr(fd), dirName(fd))
	defer dir.Close()
	// Through the open directory's magic link, so that the watch is on what was opened.
	wd, err := syscall.InotifyAddWatch(fw.fd, dir.Name(), watchMask)
	if err != nil {
		ns.capped = true // the kernel's bound (ENOSPC), or its memory
		if record {
			fw.walkChanged(ns, ns.root.FD, rel, rel, time.Time{}, false, 0)
		}
		return
	}
	fw.add(ns, int32(wd), rel)
	entries(dir, func(name string, isDir bool) bool {
		if ns.listBudget <= 0 {
			// The directories below that are not listed have no watch.
			ns.capped, ns.unknown = true, ns.unknown || record
			return false
		}
		ns.listBudget--
		if isDir {
			fw.watchTree(ns, path.Join(rel, name), record)
		} else if record {
			ns.changed[path.Join(rel, name)] = true
		}
		return true
	})
}

// drain reads the events that have come, and acts on them.
func (fw *Changes[K]) drain() {
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

func (fw *Changes[K]) event(wd int32, mask uint32, name string) {
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
		fw.drop(wd)
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
		if HiddenName(name) {
			return
		}
		if !fw.room(ns) && (!ns.recording || mask&syscall.IN_MOVED_TO == 0) {
			// Past a bound, a directory made during a run is walked at its end, and its
			// files have the run's ctime; one moved in keeps its files' times, so they are
			// named now.
			ns.capped = true
			return
		}
		if ns.root == nil {
			root, err := fw.Open(ns.key)
			if err != nil {
				return
			}
			ns.root = root
			defer func() { root.Close(); ns.root = nil }()
		}
		fw.watchTree(ns, rel, ns.recording)
	}
}

// walkChanged adds to ns.changed the files below the directory name of dirfd (rel in the
// working directory) whose inode changed at or after since (all of them if since is zero),
// not following links, leaving out hidden names, and those of watched directories when
// trusted (their events named them). It visits at most ns.budget entries, and makes ns
// unknown if it stops short.
func (fw *Changes[K]) walkChanged(ns *Space[K], dirfd int, name, rel string, since time.Time, trusted bool, depth int) {
	if ns.unknown {
		return
	}
	if depth > 256 {
		ns.unknown = true
		return
	}
	// (name is a path from the working directory when watchTree walks what it cannot watch.)
	fd, err := Openat2(dirfd, name, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW, 0,
		ResolveBeneath|ResolveNoSymlinks)
	switch err {
	case nil:
	case syscall.ENOENT, syscall.ENOTDIR, syscall.ELOOP, syscall.EXDEV:
		return // gone or replaced meanwhile
	default:
		ns.unknown = true // a folder the host cannot read (mode 0), a name too long
		return
	}
	dir := os.NewFile(uintptr(fd), dirName(fd))
	defer dir.Close()
	_, watched := ns.byPath[rel]
	watched = watched && trusted
	entries(dir, func(name string, isDir bool) bool {
		if ns.budget <= 0 {
			ns.unknown = true
			return false
		}
		ns.budget--
		if HiddenName(name) || watched && !isDir {
			return true // (a watched directory's files: its events named them)
		}
		sub := path.Join(rel, name)
		var st syscall.Stat_t
		switch {
		case isDir:
			from := since
			if !watched && !since.IsZero() && Fstatat(fd, name, &st) == nil &&
				!changedBefore(st.Ctim, since) && changedBefore(st.Mtim, since) {
				// Its inode changed, its entries did not: moved here whole (or its mode
				// changed). Its files keep their times, and are all new here.
				from = time.Time{}
			}
			fw.walkChanged(ns, fd, name, sub, from, trusted, depth+1)
		case since.IsZero():
			if _, ok := ns.changed[sub]; !ok {
				ns.changed[sub] = true
			}
		case Fstatat(fd, name, &st) == nil && !changedBefore(st.Ctim, since):
			if _, ok := ns.changed[sub]; !ok {
				ns.changed[sub] = true
			}
		}
		return !ns.unknown
	})
}

func changedBefore(t syscall.Timespec, since time.Time) bool {
	return time.Unix(t.Unix()).Before(since)
}

// dirName names the open directory fd by its magic link, which reaches it from anywhere.
func dirName(fd int) string {
	return "/proc/self/fd/" + strconv.Itoa(fd)
}

// entries calls fn with the name of each entry of the open directory dir (named by
// dirName: os reaches an entry through it when the file system does not say its type),
// and whether it is a directory, until fn returns false.
func entries(dir *os.File, fn func(name string, isDir bool) bool) {
	for {
		list, err := dir.ReadDir(256)
		for _, entry := range list {
			if !fn(entry.Name(), entry.IsDir()) {
				return
			}
		}
		if err != nil {
			return // io.EOF, or the directory went
		}
	}
}

// The hooks of tests and benchmarks.

// SetLimits sets the bounds on watches (per namespace, for the engine), on the directory
// entries a run's walk may visit and on those listed to set watches up (0: the default).
func (fw *Changes[K]) SetLimits(perNS, perEngine, walk, list int) {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	fw.nsLimit, fw.engineLimit, fw.walkLimit, fw.listLimit = perNS, perEngine, walk, list
}

// FD is the inotify instance's fd (<= 0: none).
func (fw *Changes[K]) FD() int {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	return fw.fd
}

// ForgetHostWrites drops what HostWrote said of the namespace b.
func (fw *Changes[K]) ForgetHostWrites(b K) {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	if ns := fw.spaces[b]; ns != nil {
		ns.host = nil
	}
}

// Unwatch has the next run of the namespace b set its watches up anew.
func (fw *Changes[K]) Unwatch(b K) {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	if ns := fw.spaces[b]; ns != nil {
		ns.whole = false
	}
}

// Backdate moves the start of the run ns back by d: what changed within d before it counts.
func (ns *Space[K]) Backdate(d time.Duration) { ns.since = ns.since.Add(-d) }
