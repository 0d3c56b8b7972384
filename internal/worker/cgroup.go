package worker

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// ErrNoCgroup is matched by the error of an engine that cannot make the cgroup it was told
// to use (IsolatedConfig.Cgroup), and by Stats' reason for running without one.
var ErrNoCgroup = errors.New("minipy: no cgroup for the workers")

// errGroupGone is what a group's value says once its sandbox has left it (cgroup.mine).
var errGroupGone = fmt.Errorf("%w: the sandbox's cgroup is gone", ErrNoCgroup)

// Cgroups is an engine's cgroup: a directory made for it in the cgroup2 hierarchy, or in
// both the memory and the pids hierarchies of cgroup v1, under which each sandbox (a
// guardian and everything in it: the worker, its rollback snapshots, its Fork copies and
// what the code starts) gets a group of its own as its worker starts, emptied when its
// guardian has ended, then kept for a next sandbox or removed (Cgroups.spare). A group's
// memory limit (memory.max, memory.limit_in_bytes) counts what RLIMIT_AS cannot: shared
// memory, memfd, the tmpfs files of /tmp, /dev/shm and the working directory that its
// processes write; its pids.max counts every process
// and thread, whoever the user. With a memory limit, a group's memory directory holds two
// groups of its own, the work's and the guardian's (TakeOverReserve). Killing a group
// kills everything in it (cgroup.kill on v2, else every process it and they list),
// whatever the code did to its guardian.
type Cgroups struct {
	// Version is 2 (the unified hierarchy) or 1 (the memory and pids hierarchies).
	Version int
	// Path is the engine's cgroup as /proc/self/cgroup names cgroups (on v1, in both
	// hierarchies).
	Path string
	// Budget is the memory limit of the engine's cgroup, all its groups together (0: none).
	Budget int64

	dirs        []string // the engine's directory in each hierarchy: v2's one; v1's memory, pids
	memoryLimit int64
	processes   int
	bare        bool // no controller (tests on a v2 hierarchy without them): groups place and kill only

	mu     sync.Mutex
	closed bool
	seq    uint64
	// spare are groups that sandboxes have left, empty, with their limits still set, for
	// the next sandboxes to start in (oldest first; reuseGroups at most): making a group
	// and removing it are most of its cost (mkdir and rmdir of three memory cgroups and a
	// pids one on v1), and a memory cgroup removed while a page is still charged to it
	// lives on in the kernel until that page is freed.
	spare []*cgroup
	// made and reused count the groups newGroup made and those it took from spare.
	made, reused atomic.Int64
}

// reuseGroups bounds the empty groups an engine keeps for its next sandboxes.
const reuseGroups = 64

// reuseCharge bounds the memory still charged to an empty group for the group to be
// reused (and no task of its may be counted still: Cgroups.tasks): the next sandbox would
// have that much less of its limit, and its usage would count it. What its last sandbox's
// kernel objects hold is freed a moment after it ends (0.1-1.8 MB charged as its guardian
// has ended, a few hundred kB 20 ms later): a group over the bound is left to cool
// (reuseCool) while new groups are made, then removed if it is still over (a page of a file
// it wrote or read first is charged to it until the page is freed).
const reuseCharge = 1 << 20

// reuseCool is how long a group over reuseCharge, or with a task counted, may cool among
// the spare ones.
const reuseCool = time.Second

// reuseLooks bounds the spare groups newGroup looks at (oldest first): each look reads the
// group's usage.
const reuseLooks = 4

// CgroupOptions say where an engine makes its cgroup and what its sandboxes' groups allow.
type CgroupOptions struct {
	// Parent is the cgroup the engine makes its own under, as /proc/self/cgroup names
	// cgroups ("/system.slice/app.service"); "" is the host process's own cgroup.
	Parent      string
	MemoryLimit int64 // each group's memory (and memory+swap) limit; 0: none
	// Budget is the memory (and memory+swap) limit of the engine's cgroup: what all its
	// groups may hold together, so that however many sandboxes there are, they cannot take
	// the host's memory (0: none).
	Budget    int64
	Processes int // each group's pids.max; 0: none
	// Bare lets a cgroup2 hierarchy without the memory and pids controllers do, for tests
	// of placing and killing on a machine whose controllers are all on v1.
	Bare bool
}

// engineSeq names the engines' cgroups of this process.
var engineSeq atomic.Uint64

// The controllers a sandbox's group needs.
var cgroupControllers = []string{"memory", "pids"}

// OpenCgroups makes the engine's cgroup under o.Parent (or the host process's own), on
// cgroup v2 if its hierarchy offers the memory and pids controllers there, else on v1; the
// error says why neither would do, and matches ErrNoCgroup.
func OpenCgroups(o CgroupOptions) (*Cgroups, error) {
	if o.Parent != "" && (!path.IsAbs(o.Parent) || path.Clean(o.Parent) != o.Parent || strings.ContainsAny(o.Parent, "\n\x00")) {
		return nil, fmt.Errorf("%w: %q is not a cgroup's path (absolute and clean, as /proc/self/cgroup names them)",
			ErrNoCgroup, o.Parent)
	}
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoCgroup, err)
	}
	info, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoCgroup, err)
	}
	return openCgroups(parseProcCgroup(string(self)), parseCgroupMounts(string(info)), o)
}

func openCgroups(self map[string]string, mounts map[string]cgroupMount, o CgroupOptions) (*Cgroups, error) {
	var why []error
	if m, ok := mounts[""]; ok {
		if _, known := self[""]; known || o.Parent != "" {
			c, err := openV2(m, self[""], o)
			if err == nil {
				return c, nil
			}
			why = append(why, fmt.Errorf("cgroup v2: %w", err))
		}
	} else {
		why = append(why, errors.New("cgroup v2: no cgroup2 file system is mounted"))
	}
	if !o.Bare {
		c, err := openV1(self, mounts, o)
		if err == nil {
			return c, nil
		}
		why = append(why, fmt.Errorf("cgroup v1: %w", err))
	}
	format := "%w: " + strings.TrimSuffix(strings.Repeat("%w; ", len(why)), "; ")
	return nil, fmt.Errorf(format, append([]any{ErrNoCgroup}, anys(why)...)...)
}

func anys(errs []error) []any {
	out := make([]any, len(errs))
	for i, e := range errs {
		out[i] = e
	}
	return out
}

// openV2 makes the engine's cgroup in the cgroup2 hierarchy mounted as m, under the
// parent (the host's own cgroup self by default), with the memory and pids controllers
// handed down to the sandboxes' groups. A parent with processes in it (the host's own
// cgroup, unless it is the hierarchy's root) cannot hand controllers down: v2's rule that
// only leaves hold processes.
func openV2(m cgroupMount, self string, o CgroupOptions) (*Cgroups, error) {
	parent := o.Parent
	if parent == "" {
		parent = self
	}
	dir, ok := m.dirOf(parent)
	if !ok {
		return nil, fmt.Errorf("the cgroup %s is outside the cgroup2 file system mounted at %s", parent, m.dir)
	}
	var need []string
	if !o.Bare {
		need = cgroupControllers
	}
	have, err := readFields(filepath.Join(dir, "cgroup.controllers"))
	if err != nil {
		return nil, err
	}
	var enable []string
	if len(need) > 0 {
		on, err := readFields(filepath.Join(dir, "cgroup.subtree_control"))
		if err != nil {
			return nil, err
		}
		for _, c := range need {
			if !slices.Contains(have, c) {
				return nil, fmt.Errorf("the cgroup %s does not have the %s controller (its cgroup.controllers: %q)",
					parent, c, strings.Join(have, " "))
			}
			if !slices.Contains(on, c) {
				enable = append(enable, "+"+c)
			}
		}
	}
	if len(enable) > 0 {
		err := os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte(strings.Join(enable, " ")), 0)
		if errors.Is(err, syscall.EBUSY) {
			return nil, fmt.Errorf("the cgroup %s holds processes (the host's own?), so it cannot hand the memory and "+
				"pids controllers to cgroups below it (only leaf cgroups hold processes on v2): name a delegated "+
				"cgroup with no process in it in IsolatedConfig.Cgroup (docs/deploy.md)", parent)
		}
		if err != nil {
			return nil, fmt.Errorf("enabling %s in %s's cgroup.subtree_control: %w", strings.Join(enable, " "), parent, err)
		}
	}
	name, own, err := makeEngineDir(dir)
	if err != nil {
		return nil, err
	}
	if len(need) > 0 {
		if err := os.WriteFile(filepath.Join(own, "cgroup.subtree_control"), []byte("+memory +pids"), 0); err != nil {
			os.Remove(own)
			return nil, fmt.Errorf("enabling memory and pids in %s: %w", own, err)
		}
	}
	c := &Cgroups{Version: 2, Path: path.Join(parent, name), dirs: []string{own}, memoryLimit: o.MemoryLimit,
		processes: o.Processes, bare: o.Bare}
	if err := c.setBudget(o.Budget); err != nil {
		os.Remove(own)
		return nil, err
	}
	return c, nil
}

// openV1 makes the engine's cgroup in the memory and in the pids hierarchies of cgroup v1,
// under the parent (by default the host's own cgroup in each). v1 has no rule against
// processes in a cgroup with children.
func openV1(self map[string]string, mounts map[string]cgroupMount, o CgroupOptions) (*Cgroups, error) {
	name := fmt.Sprintf("minipy-%d-%d", os.Getpid(), engineSeq.Add(1))
	c := &Cgroups{Version: 1, memoryLimit: o.MemoryLimit, processes: o.Processes}
	for _, ctl := range cgroupControllers {
		m, ok := mounts[ctl]
		if !ok {
			c.removeDirs()
			return nil, fmt.Errorf("no %s hierarchy is mounted", ctl)
		}
		parent := o.Parent
		if parent == "" {
			if parent, ok = self[ctl]; !ok {
				c.removeDirs()
				return nil, fmt.Errorf("this process's %s cgroup is unknown (/proc/self/cgroup)", ctl)
			}
		}
		dir, ok := m.dirOf(parent)
		if !ok {
			c.removeDirs()
			return nil, fmt.Errorf("the cgroup %s is outside the %s hierarchy mounted at %s", parent, ctl, m.dir)
		}
		SweepDeadEngines(dir)
		own := filepath.Join(dir, name)
		if err := os.Mkdir(own, 0o755); err != nil {
			c.removeDirs()
			return nil, err
		}
		c.dirs = append(c.dirs, own)
		c.Path = path.Join(parent, name)
	}
	if err := c.setBudget(o.Budget); err != nil {
		c.removeDirs()
		return nil, err
	}
	return c, nil
}

// setBudget writes the memory limit of the engine's cgroup (none if budget is 0).
func (c *Cgroups) setBudget(budget int64) error {
	if budget <= 0 || c.bare {
		return nil
	}
	if err := writeMemoryLimit(c.Version, c.dirs[0], budget); err != nil {
		return fmt.Errorf("setting the engine's memory budget: %w", err)
	}
	c.Budget = budget
	return nil
}

// makeEngineDir makes the engine's directory in dir: minipy-PID-N, after removing what
// dead hosts left there (SweepDeadEngines): a host given the pid of one that was killed
// would otherwise find its first name taken.
func makeEngineDir(dir string) (name, own string, err error) {
	SweepDeadEngines(dir)
	name = fmt.Sprintf("minipy-%d-%d", os.Getpid(), engineSeq.Add(1))
	own = filepath.Join(dir, name)
	return name, own, os.Mkdir(own, 0o755)
}

// engineDirName is an engine's directory, minipy-PID-N; its first group is the host's pid.
var engineDirName = regexp.MustCompile(`^minipy-([0-9]+)-[0-9]+$`)

// SweepDeadEngines removes from the cgroup directory dir the engines' cgroups whose host
// has died (killed, so its Close never ran: nothing else removes them, and they pile up
// under a server that restarts) and that hold no process any more: the groups in them
// first, then the engine's. A host is dead when no process has its pid, or when the
// process that has it started after the directory last changed (the pid was reused).
// Nothing is killed: a group a process still holds stays, with its engine's directory.
// It returns the directories removed.
func SweepDeadEngines(dir string) []string {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	var removed []string
	for _, ent := range entries {
		m := engineDirName.FindStringSubmatch(ent.Name())
		if m == nil || !ent.IsDir() {
			continue
		}
		own := filepath.Join(dir, ent.Name())
		info, err := os.Stat(own)
		if err != nil {
			continue
		}
		pid, _ := strconv.Atoi(m[1])
		if hostAlive(pid, info.ModTime()) {
			continue
		}
		for _, g := range subgroups(own) {
			for _, sub := range subgroups(g) { // (a group's work and guard)
				syscall.Rmdir(sub) //nolint:errcheck // held: it stays
			}
			syscall.Rmdir(g) //nolint:errcheck // held: it stays
		}
		if syscall.Rmdir(own) == nil {
			removed = append(removed, own)
		}
	}
	return removed
}

// hostAlive says whether the process with this pid may be the host that made a directory
// last changed at changed: it lives, and did not start after (a second's grace for the
// clocks: the boot time is whole seconds).
func hostAlive(pid int, changed time.Time) bool {
	if pid <= 0 {
		return false
	}
	started, ok := processStart(pid)
	if !ok {
		return syscall.Kill(pid, 0) != syscall.ESRCH
	}
	return !started.After(changed.Add(time.Second))
}

// processStart is when process pid started (/proc/PID/stat's starttime after /proc/stat's
// btime); false if it is gone or cannot be read.
func processStart(pid int) (time.Time, bool) {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return time.Time{}, false
	}
	s := string(stat)
	// The fields after the command's name, which may hold spaces and parentheses: state
	// is field 3, starttime field 22.
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(fields) < 20 {
		return time.Time{}, false
	}
	ticks, err1 := strconv.ParseUint(fields[19], 10, 64)
	boot, err2 := bootTime()
	if err1 != nil || err2 != nil {
		return time.Time{}, false
	}
	// USER_HZ, what /proc counts in, is 100 on every Linux architecture.
	return boot.Add(time.Duration(ticks) * (time.Second / 100)), true
}

// bootTime is /proc/stat's btime.
func bootTime() (time.Time, error) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return time.Time{}, err
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "btime "); ok {
			secs, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return time.Unix(secs, 0), err
		}
	}
	return time.Time{}, errors.New("no btime in /proc/stat")
}

// Dirs are the engine's cgroup directories (v2: one; v1: memory's, then pids').
func (c *Cgroups) Dirs() []string { return slices.Clone(c.dirs) }

// Close kills and removes the groups that are left (a sandbox whose end was not seen, or
// whose removal timed out), then the engine's cgroup. Later starts get no group.
func (c *Cgroups) Close() error {
	c.mu.Lock()
	c.closed = true
	c.spare = nil // (their directories are among those removed below)
	c.mu.Unlock()
	var errs []error
	for attempt := 0; attempt < 3; attempt++ {
		errs = errs[:0]
		entries, _ := os.ReadDir(c.dirs[0])
		for _, ent := range entries {
			if ent.IsDir() {
				if err := c.group(ent.Name()).remove(); err != nil {
					errs = append(errs, err)
				}
			}
		}
		for _, d := range c.dirs {
			if err := rmdirCgroup(d); err != nil {
				errs = append(errs, err)
			}
		}
		if len(errs) == 0 {
			return nil
		}
	}
	return fmt.Errorf("minipy: removing the engine's cgroup: %w", errors.Join(errs...))
}

// removeDirs removes the engine's directories (a failed open).
func (c *Cgroups) removeDirs() {
	for _, d := range c.dirs {
		os.Remove(d)
	}
}

// group is the group named name (made or not).
func (c *Cgroups) group(name string) *cgroup {
	g := &cgroup{c: c}
	for _, d := range c.dirs {
		g.dirs = append(g.dirs, filepath.Join(d, name))
	}
	return g
}

// newGroup gives a sandbox that is starting its group, with its limits: one that an
// earlier sandbox left empty (spare) and that has cooled (charged), else a new one.
func (c *Cgroups) newGroup() (*cgroup, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, fmt.Errorf("%w: the engine's cgroup is closed", ErrNoCgroup)
	}
	look := c.spare[:min(len(c.spare), reuseLooks)]
	c.spare = c.spare[len(look):]
	c.mu.Unlock()
	var cooling []*cgroup
	var g *cgroup
	for _, old := range look {
		switch {
		case g != nil:
			cooling = append(cooling, old)
		case c.tasks(old) == 0 && c.charged(old) <= reuseCharge:
			c.reused.Add(1)
			g = &cgroup{c: c, dirs: old.dirs, work: old.work, guard: old.guard, made: true,
				oomBase: old.oomBase + old.final.Load()}
		case time.Since(old.kept) < reuseCool:
			cooling = append(cooling, old)
		default:
			old.rmdirs() //nolint:errcheck // as remove's: an rmdir that fails leaves an empty group, which Close removes
		}
	}
	if len(cooling) > 0 {
		c.mu.Lock()
		if c.closed {
			cooling = nil // (Close removes their directories)
		}
		c.spare = append(cooling, c.spare...)
		c.mu.Unlock()
	}
	if g != nil {
		return g, nil
	}
	// (Made with c.mu held: Close, which takes it to set closed, then removes every group
	// it finds, finds this one.)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, fmt.Errorf("%w: the engine's cgroup is closed", ErrNoCgroup)
	}
	c.seq++
	return c.makeGroup("s" + strconv.FormatUint(c.seq, 10))
}

// tasks is the number of tasks the pids controller counts in group g: a process that has
// exited still counts until its parent reaps it (a sandbox's pid 1, which the template
// reaps a moment after it ends), and would take one of the next sandbox's Processes
// (cgroup.procs lists it no more); 0 without a pids controller, more than 0 if it cannot be
// read.
func (c *Cgroups) tasks(g *cgroup) int64 {
	if c.bare {
		return 0
	}
	n, ok := readInt(filepath.Join(g.dirs[len(g.dirs)-1], "pids.current"))
	if !ok {
		return 1
	}
	return n
}

// charged is the memory charged to group g and the groups in it (v1's usage_in_bytes
// counts those below it), or more than reuseCharge if it cannot be read; 0 without a
// memory controller.
func (c *Cgroups) charged(g *cgroup) int64 {
	if c.bare {
		return 0
	}
	file := "memory.current"
	if c.Version == 1 {
		file = "memory.usage_in_bytes"
	}
	n, ok := readInt(filepath.Join(g.dirs[0], file))
	if !ok {
		return reuseCharge + 1
	}
	return n
}

// makeGroup makes the group name, with its limits (c.mu held).
func (c *Cgroups) makeGroup(name string) (*cgroup, error) {
	g := c.group(name)
	g.made = true
	for i, d := range g.dirs {
		if err := os.Mkdir(d, 0o755); err != nil {
			g.dirs = g.dirs[:i]
			g.rmdirs()
			return nil, fmt.Errorf("minipy: making a worker's cgroup: %w", err)
		}
	}
	if err := g.limit(); err != nil {
		g.rmdirs()
		return nil, fmt.Errorf("minipy: setting a worker's cgroup limits: %w", err)
	}
	c.made.Add(1)
	return g, nil
}

// Made is the number of sandboxes' groups the engine has made; Reused, the number of
// sandboxes that started in a group an earlier one left (kept empty, with its limits).
func (c *Cgroups) Made() uint64 { return uint64(c.made.Load()) }

// Reused: see Made.
func (c *Cgroups) Reused() uint64 { return uint64(c.reused.Load()) }

// keep puts g, empty, among the groups the next sandboxes start in, unless the engine is
// closing or keeps enough; false if it did not.
func (c *Cgroups) keep(g *cgroup) bool {
	if !g.made {
		return false // (a group Close or RemoveCgroup found: its work and guard groups are not known)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || len(c.spare) >= reuseGroups {
		return false
	}
	g.kept = time.Now()
	c.spare = append(c.spare, g)
	return true
}

// procsDirs are the directories whose cgroup.procs a sandbox's process joins: the work
// group in the memory hierarchy (where there is one), the group itself in the others.
func (g *cgroup) procsDirs() []string {
	dirs := slices.Clone(g.dirs)
	if g.work != "" {
		dirs[0] = g.work
	}
	return dirs
}

// TakeOverReserve is the memory a sandbox's group holds beyond its MemoryLimit for its
// guardian and for a rollback: with a memory limit, the group's memory directory has two
// groups of its own, "w" (the work: the worker, its snapshots, its Fork copies and what
// the code starts, at MemoryLimit) and "g" (the guardian, and a snapshot while it takes
// over after the worker's death), with the sandbox's group at MemoryLimit plus this. What
// outlives a worker that the limit killed (SysV shared memory, files in its tmpfs) holds
// "w" at its limit; without the reserve the guardian's first Python (it stays in C until
// then) and the snapshot's take-over (~2 MiB together on 3.15) would find no page left
// there, and the OOM killer would take the snapshot: the state the rollback was for.
const TakeOverReserve = 16 << 20

// cgroup is one sandbox's group: a directory in each of the engine's hierarchies. Its
// methods are safe on a nil group (a worker without one) and from any goroutine.
type cgroup struct {
	c    *Cgroups
	dirs []string // v2: one; v1: memory's, pids'
	// work and guard are the memory groups of the sandbox's processes and of its guardian
	// (TakeOverReserve says why); "" without a memory limit.
	work, guard string
	guardian    atomic.Int64 // the guardian's pid (placeGuardian), 0 before
	// held is the guardian held by a pidfd (holdGuardian), nil before, where the kernel
	// has none (or no PIDFD_NONBLOCK: Linux 5.10) and once remove took it: the guardian is
	// pid 1 of the sandbox's pid namespace, so that a SIGKILL to it ends every process
	// there and its end says when they all have (kill, remove).
	held atomic.Pointer[os.File]

	// made is set on a group that newGroup gave: its limits and its work and guard groups
	// are known, and it may be kept for another sandbox once empty (Cgroups.keep).
	made bool
	// oomBase is the OOM kills its directories had counted when it became this sandbox's
	// (the earlier sandboxes' in a reused group): oomCount counts from there.
	oomBase uint64
	kept    time.Time // when it was kept for another sandbox (Cgroups.keep)

	// gone is held for reading by the methods that read or write the group's files while
	// it is the sandbox's, and for writing by remove as it sets removed: once removed, the
	// group may be another sandbox's (Cgroups.spare), and nothing done through this value
	// may list, move or kill that sandbox's processes, nor read its usage.
	gone    sync.RWMutex
	final   atomic.Uint64 // the OOM kills counted when it was removed
	removed atomic.Bool   // emptied, then removed or kept for another sandbox
	once    sync.Once
	err     error // remove's
}

// mine takes gone for reading and reports whether the group is still the sandbox's
// (then the caller releases gone).
func (g *cgroup) mine() bool {
	if g == nil {
		return false
	}
	g.gone.RLock()
	if g.removed.Load() {
		g.gone.RUnlock()
		return false
	}
	return true
}

// limit writes the group's limits: memory (swap included, so that shared memory cannot go
// to swap past it) and pids.
func (g *cgroup) limit() error {
	c := g.c
	if c.bare {
		return nil
	}
	mem, pids := g.dirs[0], g.dirs[len(g.dirs)-1]
	if c.processes > 0 {
		if err := writeCgroup(pids, "pids.max", strconv.Itoa(c.processes)); err != nil {
			return err
		}
	}
	if c.memoryLimit <= 0 {
		return nil
	}
	if err := writeMemoryLimit(c.Version, mem, c.memoryLimit+TakeOverReserve); err != nil {
		return err
	}
	if c.Version == 2 { // (v2: a group that hands a controller down holds no process itself)
		if err := writeCgroup(mem, "cgroup.subtree_control", "+memory"); err != nil {
			return err
		}
	}
	work, guard := filepath.Join(mem, "w"), filepath.Join(mem, "g")
	for _, d := range []string{work, guard} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return err
		}
	}
	g.work, g.guard = work, guard
	return writeMemoryLimit(c.Version, work, c.memoryLimit)
}

// writeMemoryLimit sets the memory limit of the memory cgroup dir, swap included, so that
// shared memory cannot go to swap past it.
func writeMemoryLimit(version int, dir string, bytes int64) error {
	limit := strconv.FormatInt(bytes, 10)
	if version == 2 {
		if err := writeCgroup(dir, "memory.max", limit); err != nil {
			return err
		}
		// (No memory.swap.max without swap accounting: nothing can go to swap past it.)
		if err := writeCgroup(dir, "memory.swap.max", "0"); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		return nil
	}
	if err := writeCgroup(dir, "memory.limit_in_bytes", limit); err != nil {
		return err
	}
	// memory.memsw counts memory and swap together (swap accounting on); without it, a
	// swappiness of 0 keeps the group's anonymous and shared memory out of swap.
	if err := writeCgroup(dir, "memory.memsw.limit_in_bytes", limit); err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		writeCgroup(dir, "memory.swappiness", "0") //nolint:errcheck // best effort: no swap is the usual case
	}
	return nil
}

// procsFiles opens the group's cgroup.procs in each hierarchy for writing: a process that
// writes "0" to them joins the group (the kernel checks the opener's credentials, the
// host's, not the writer's).
func (g *cgroup) procsFiles() ([]*os.File, error) {
	if !g.mine() {
		return nil, errGroupGone
	}
	defer g.gone.RUnlock()
	var fs []*os.File
	for _, d := range g.procsDirs() {
		f, err := os.OpenFile(filepath.Join(d, "cgroup.procs"), os.O_WRONLY, 0)
		if err != nil {
			closeFiles(fs...)
			return nil, fmt.Errorf("minipy: opening a worker's cgroup: %w", err)
		}
		fs = append(fs, f)
	}
	return fs, nil
}

// place moves process pid (and the threads it has) into the group (its work group).
func (g *cgroup) place(pid int) error {
	if !g.mine() {
		return errGroupGone
	}
	defer g.gone.RUnlock()
	for _, d := range g.procsDirs() {
		if err := writeCgroup(d, "cgroup.procs", strconv.Itoa(pid)); err != nil {
			return fmt.Errorf("minipy: moving a worker into its cgroup: %w", err)
		}
	}
	return nil
}

// members lists the processes in the group (in any of its hierarchies, and the groups
// in it: its work and guard groups, or, for a left group whose are not known, whatever
// groups its directories hold); none once removed.
func (g *cgroup) members() []int {
	if !g.mine() {
		return nil
	}
	defer g.gone.RUnlock()
	return g.list()
}

// list is members, with gone held or by remove (which alone sets removed).
func (g *cgroup) list() []int {
	var pids []int
	for i, d := range g.dirs {
		pids = appendProcs(pids, d)
		if g.work != "" { // (made by limit: the memory directory's two, and nothing else anywhere)
			if i == 0 {
				pids = appendProcs(appendProcs(pids, g.work), g.guard)
			}
			continue
		}
		for _, sub := range subgroups(d) {
			pids = appendProcs(pids, sub)
		}
	}
	return pids
}

// empty reports whether the group holds no process, from one counter rather than a
// listing of each of its directories (on v1, reading a cgroup.procs builds, sorts and
// caches a list of its pids, which a kernel worker frees later): v1's pids.current (every
// process of a sandbox is in its pids group: each joins it with its memory group, or is
// born there, and nothing moves it out), v2's cgroup.events, "populated 0" (for its groups
// too). false where it cannot tell, or where v1 counts a process that has exited and that
// its parent has not reaped yet (the sandbox's pid 1, until the template reaps it): the
// caller lists the group then, which lists no such process.
func (g *cgroup) empty() bool {
	if g.c.Version == 1 {
		// (a left group RemoveCgroup found: its hierarchy is not known)
		return len(g.dirs) == 2 && !g.c.bare && g.c.tasks(g) == 0
	}
	b, err := os.ReadFile(filepath.Join(g.dirs[0], "cgroup.events"))
	if err != nil {
		return false
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "populated "); ok {
			return v == "0"
		}
	}
	return false
}

// listings counts appendProcs' reads of a cgroup.procs (its tests see how often a group
// is listed).
var listings atomic.Int64

// appendProcs appends the pids that cgroup dir lists and pids does not hold.
func appendProcs(pids []int, dir string) []int {
	listings.Add(1)
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return pids
	}
	for _, f := range strings.Fields(string(b)) {
		if p, err := strconv.Atoi(f); err == nil && !slices.Contains(pids, p) {
			pids = append(pids, p)
		}
	}
	return pids
}

// subgroups are the cgroups directly under dir.
func subgroups(dir string) []string {
	ents, _ := os.ReadDir(dir)
	var out []string
	for _, e := range ents {
		if e.IsDir() {
			out = append(out, filepath.Join(dir, e.Name()))
		}
	}
	return out
}

// workProcs opens the work group's cgroup.procs for a process of the sandbox to join it
// (the kernel checks the opener's credentials); nil without a work group.
func (g *cgroup) workProcs() (*os.File, error) {
	if g == nil || g.work == "" {
		return nil, nil
	}
	if !g.mine() {
		return nil, errGroupGone
	}
	defer g.gone.RUnlock()
	f, err := os.OpenFile(filepath.Join(g.work, "cgroup.procs"), os.O_WRONLY, 0)
	if err != nil {
		return nil, fmt.Errorf("minipy: opening a sandbox's cgroup: %w", err)
	}
	return f, nil
}

// placeGuardian moves the sandbox's guardian into its guard group, once its worker is
// ready and before the code runs (TakeOverReserve says why): of the processes in the work
// group, pid 1 of the sandbox's pid namespace; on a kernel that does not say (NSpid, Linux
// 4.1), the one whose parent is not there (a guardian started as a process of its own is
// the host's child; a template's fork that made pid 1 exits at once, but a loaded machine
// once ran its pid 1 and worker to their ready frame before it exited, and it was taken
// for the guardian). No-op without a guard group.
func (g *cgroup) placeGuardian() error {
	if g == nil || g.guard == "" {
		return nil
	}
	if !g.mine() {
		return errGroupGone
	}
	defer g.gone.RUnlock()
	in := appendProcs(nil, g.work)
	for _, p := range in {
		if first, ok := pidOneOf(p); ok {
			if !first {
				continue
			}
			if err := writeCgroup(g.guard, "cgroup.procs", strconv.Itoa(p)); err != nil {
				return fmt.Errorf("minipy: moving a sandbox's guardian into its cgroup: %w", err)
			}
			g.guardian.Store(int64(p))
			g.holdGuardian(p)
			return nil
		}
	}
	for _, p := range in {
		if pp, ok := parentOf(p); ok && !slices.Contains(in, pp) {
			if err := writeCgroup(g.guard, "cgroup.procs", strconv.Itoa(p)); err != nil {
				return fmt.Errorf("minipy: moving a sandbox's guardian into its cgroup: %w", err)
			}
			g.guardian.Store(int64(p))
			return nil
		}
	}
	return fmt.Errorf("minipy: moving a sandbox's guardian into its cgroup: none of %v is", in)
}

// holdGuardian holds the guardian p, pid 1 of the sandbox's pid namespace, by a pidfd that
// Go's poller can wait on (held): only if, once the pidfd is open, p is still pid 1 of its
// namespace and in the group's guard group (else it ended, and its number may be
// another's). Nothing where the kernel has no such pidfd. (With gone held: placeGuardian's.)
func (g *cgroup) holdGuardian(p int) {
	fd, err := unix.PidfdOpen(p, unix.PIDFD_NONBLOCK) // (a pidfd Go's poller takes; close-on-exec, as every pidfd is)
	if err != nil {
		return
	}
	f := os.NewFile(uintptr(fd), "pidfd")
	if first, ok := pidOneOf(p); !ok || !first || !slices.Contains(appendProcs(nil, g.guard), p) {
		f.Close()
		return
	}
	if !g.held.CompareAndSwap(nil, f) {
		f.Close() // (held already: placed once before)
	}
}

// signalHeld sends sig to the held process f; false if the kernel refused (f closed, say),
// true if it was sent or the process has ended.
func signalHeld(f *os.File, sig syscall.Signal) bool {
	rc, err := f.SyscallConn()
	if err != nil {
		return false
	}
	var sent error
	if err := rc.Control(func(fd uintptr) { sent = unix.PidfdSendSignal(int(fd), sig, nil, 0) }); err != nil {
		return false
	}
	return sent == nil || errors.Is(sent, syscall.ESRCH)
}

// awaitHeld waits until the held process f has ended, or until (remove then looks at the
// group either way).
func awaitHeld(f *os.File, until time.Time) {
	rc, err := f.SyscallConn()
	if err != nil || f.SetReadDeadline(until) != nil {
		return
	}
	// (The poller calls again once the pidfd is readable: the process has ended.)
	rc.Read(func(fd uintptr) bool { //nolint:errcheck // past until: the group is listed as before
		ready := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(ready, 0)
		return err == nil && n > 0
	})
}

// pidOneOf reports whether process pid is pid 1 of its own pid namespace (the last of
// /proc/PID/status's NSpid); ok is false where the kernel does not say (or it ended).
func pidOneOf(pid int) (first, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return false, false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, found := strings.CutPrefix(line, "NSpid:"); found {
			f := strings.Fields(rest)
			return len(f) > 1 && f[len(f)-1] == "1", len(f) > 0
		}
	}
	return false, false
}

// parentOf is process pid's parent (/proc/PID/stat's fourth field).
func parentOf(pid int) (int, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	i := bytes.LastIndexByte(b, ')') // (the command's name may hold spaces and parentheses)
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 {
		return 0, false
	}
	pp, err := strconv.Atoi(f[1])
	return pp, err == nil
}

// lendReserve moves what is in the work group into the guard group, where a rollback's
// snapshot takes over with TakeOverReserve's room (with it, for that moment, the other
// processes of the sandbox: its Fork copies and commands); takeBack ends it.
func (g *cgroup) lendReserve() {
	if g == nil || g.guard == "" || !g.mine() {
		return
	}
	defer g.gone.RUnlock()
	for _, p := range appendProcs(nil, g.work) {
		writeCgroup(g.guard, "cgroup.procs", strconv.Itoa(p)) //nolint:errcheck // may have ended
	}
}

// takeBack moves every process of the guard group but the guardian into the work group,
// after a rollback's take-over: again while it finds any (a process moved may have forked
// meanwhile; pids.max bounds them).
func (g *cgroup) takeBack() {
	if g == nil || g.guard == "" || !g.mine() {
		return
	}
	defer g.gone.RUnlock()
	keep := int(g.guardian.Load())
	for round := 0; round < 10; round++ {
		moved := false
		for _, p := range appendProcs(nil, g.guard) {
			if p != keep {
				writeCgroup(g.work, "cgroup.procs", strconv.Itoa(p)) //nolint:errcheck // may have ended
				moved = true
			}
		}
		if !moved {
			return
		}
	}
}

// kill sends SIGKILL to everything in the group: at once through cgroup.kill (v2, Linux
// 5.14+); else, once its guardian is held (holdGuardian), to the guardian, pid 1 of the
// sandbox's pid namespace, where the kernel then kills the rest and lets nothing fork
// again (what else a group can hold, the template's fork T on its way out, remove finds);
// else to each process it lists, each held by a pidfd opened before the group is listed
// again, so that a pid reused meanwhile by a process of another group is never signalled
// (a sandbox's first round kills its guardian too).
func (g *cgroup) kill() {
	if !g.mine() {
		return
	}
	defer g.gone.RUnlock()
	g.killAll()
}

// killAll is kill, with gone held or by remove.
func (g *cgroup) killAll() {
	if g.c.Version == 2 {
		if err := writeCgroup(g.dirs[0], "cgroup.kill", "1"); err == nil {
			return
		}
	}
	if f := g.held.Load(); f != nil && signalHeld(f, syscall.SIGKILL) {
		return // (the kernel ends the rest of its pid namespace; remove checks the group)
	}
	held := map[int]int{}
	for _, p := range g.list() {
		fd, _, errno := syscall.Syscall(sysPidfdOpen, uintptr(p), 0, 0)
		switch errno {
		case 0:
			syscall.CloseOnExec(int(fd))
			held[p] = int(fd)
		case syscall.ENOSYS:
			held[p] = -1 // (a kernel before 5.3: checked again below, then killed by pid)
		}
	}
	for _, p := range g.list() {
		if fd, ok := held[p]; ok {
			if fd >= 0 {
				syscall.Syscall6(sysPidfdSendSignal, uintptr(fd), uintptr(syscall.SIGKILL), 0, 0, 0, 0) //nolint:errcheck // may have ended
			} else {
				syscall.Kill(p, syscall.SIGKILL) //nolint:errcheck // may have ended
			}
		}
	}
	for _, fd := range held {
		if fd >= 0 {
			syscall.Close(fd)
		}
	}
}

// removeWait bounds how long remove waits for the group's processes to end.
const removeWait = 5 * time.Second

// remove kills what is left in the group, waits (removeWait at most) until it holds no
// process, notes its OOM kills, and keeps it for another sandbox (Cgroups.keep) or
// removes its directories; once (later calls return the first's error).
func (g *cgroup) remove() error {
	if g == nil {
		return nil
	}
	g.once.Do(func() {
		until := time.Now().Add(removeWait)
		if f := g.held.Swap(nil); f != nil {
			// Its end is the end of its pid namespace's every process (the kernel ends
			// pid 1 once the others have been reaped): one look at the group then, not
			// one every few milliseconds until it is empty.
			if signalHeld(f, syscall.SIGKILL) {
				awaitHeld(f, until)
			}
			f.Close()
		}
		for pause := time.Millisecond; ; pause = min(2*pause, 50*time.Millisecond) {
			if g.empty() || len(g.list()) == 0 {
				break
			}
			if time.Now().After(until) {
				g.err = fmt.Errorf("minipy: a worker's cgroup %s still holds processes %v", g.dirs[0], g.list())
				return
			}
			g.killAll()
			time.Sleep(pause)
		}
		// Empty: nothing of this sandbox's can join it again (what could, its processes and
		// its template's fork T, has ended; its cgroup.procs fds were theirs), so it may be
		// another sandbox's from here on.
		g.gone.Lock()
		g.final.Store(g.ooms())
		g.removed.Store(true)
		g.gone.Unlock()
		if g.c.keep(g) {
			return
		}
		g.err = g.rmdirs()
	})
	return g.err
}

// rmdirs removes the group's directories (an empty cgroup may still be busy for a moment
// while its last process is torn down).
func (g *cgroup) rmdirs() error {
	var errs []error
	for _, d := range g.dirs {
		for _, sub := range subgroups(d) {
			if err := rmdirCgroup(sub); err != nil {
				errs = append(errs, err)
			}
		}
		if err := rmdirCgroup(d); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// rmdirCgroup removes an empty cgroup's directory, retrying while the kernel says it is busy
// (a process that has exited but is still leaving it); one already gone is no error.
func rmdirCgroup(dir string) error {
	var err error
	for pause := time.Millisecond; pause < time.Second; pause *= 2 {
		err = syscall.Rmdir(dir)
		if err == nil || errors.Is(err, syscall.ENOENT) {
			return nil
		}
		if !errors.Is(err, syscall.EBUSY) {
			break
		}
		time.Sleep(pause)
	}
	return &os.PathError{Op: "rmdir", Path: dir, Err: err}
}

// oomCount is the number of processes the OOM killer has killed in the group (v1
// memory.oom_control, v2 memory.events: "oom_kill N"); after remove, the count it had.
func (g *cgroup) oomCount() uint64 {
	if g == nil {
		return 0
	}
	if !g.mine() {
		return g.final.Load()
	}
	defer g.gone.RUnlock()
	return g.ooms()
}

// ooms is oomCount, with gone held or by remove.
func (g *cgroup) ooms() uint64 {
	if g.c.bare {
		return 0
	}
	file := "memory.events"
	if g.c.Version == 1 {
		file = "memory.oom_control"
	}
	// Its work and guard groups' too: v1 counts a kill in the group where it happened only
	// (v2's memory.events counts those below; counted twice, the count still only grows,
	// which is all that OOMKilled asks of it).
	n := oomKills(filepath.Join(g.dirs[0], file))
	for _, sub := range []string{g.work, g.guard} {
		if sub != "" {
			n += oomKills(filepath.Join(sub, file))
		}
	}
	if n < g.oomBase { // (counts never fall; a group's directories are never made again under its name)
		return 0
	}
	return n - g.oomBase
}

// oomKills reads the "oom_kill N" line of a memory cgroup's file (0 if none).
func oomKills(file string) uint64 {
	f, err := os.Open(file)
	if err != nil {
		return 0
	}
	defer f.Close()
	lines := bufio.NewScanner(f)
	for lines.Scan() {
		if n, ok := strings.CutPrefix(lines.Text(), "oom_kill "); ok {
			v, _ := strconv.ParseUint(n, 10, 64)
			return v
		}
	}
	return 0
}

// writeCgroup writes value to the control file name of cgroup dir (no O_CREAT, no
// O_TRUNC: the kernel's files take one write each).
func writeCgroup(dir, name, value string) error {
	f, err := os.OpenFile(filepath.Join(dir, name), os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(value)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// readFields reads a control file's space-separated words.
func readFields(file string) ([]string, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	return strings.Fields(string(b)), nil
}

// parseProcCgroup reads /proc/self/cgroup: the cgroup2 path under "", each v1
// controller's path under its name.
func parseProcCgroup(text string) map[string]string {
	out := map[string]string{}
	for _, line := range strings.Split(text, "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[0] == "0" && parts[1] == "" {
			out[""] = parts[2]
			continue
		}
		for _, ctl := range strings.Split(parts[1], ",") {
			out[ctl] = parts[2]
		}
	}
	return out
}

// cgroupMount is a mounted cgroup hierarchy: where, and which of its cgroups is mounted
// there (a container's own, say).
type cgroupMount struct{ dir, root string }

// dirOf is the directory of cgroup p (a path as /proc/self/cgroup names it); false when it
// is outside what is mounted.
func (m cgroupMount) dirOf(p string) (string, bool) {
	if m.root == "/" {
		return filepath.Join(m.dir, p), true
	}
	if p == m.root {
		return m.dir, true
	}
	if rest, ok := strings.CutPrefix(p, m.root+"/"); ok {
		return filepath.Join(m.dir, rest), true
	}
	return "", false
}

// parseCgroupMounts reads /proc/self/mountinfo: the first cgroup2 mount under "", the first
// mount of each v1 hierarchy holding memory or pids under the controller's name.
func parseCgroupMounts(text string) map[string]cgroupMount {
	out := map[string]cgroupMount{}
	for _, line := range strings.Split(text, "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		fields, after := strings.Fields(pre), strings.Fields(post)
		if !ok || len(fields) < 5 || len(after) < 3 {
			continue
		}
		m := cgroupMount{dir: unescapeMount(fields[4]), root: unescapeMount(fields[3])}
		switch after[0] {
		case "cgroup2":
			if _, ok := out[""]; !ok {
				out[""] = m
			}
		case "cgroup":
			for _, opt := range strings.Split(after[2], ",") {
				if _, ok := out[opt]; !ok && slices.Contains(cgroupControllers, opt) {
					out[opt] = m
				}
			}
		}
	}
	return out
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// LeftCgroups lists the engines' cgroups that process pid made under this process's own
// cgroups (the default parent, in each hierarchy) and did not remove: a test binary must
// leave none, and a test whose host it killed removes the host's (RemoveCgroup). An engine
// whose host was killed leaves its cgroup, empty once its workers have ended: nothing
// else removes it.
func LeftCgroups(pid int) []string {
	self, err1 := os.ReadFile("/proc/self/cgroup")
	info, err2 := os.ReadFile("/proc/self/mountinfo")
	if err1 != nil || err2 != nil {
		return nil
	}
	paths, mounts := parseProcCgroup(string(self)), parseCgroupMounts(string(info))
	var left []string
	for _, key := range append([]string{""}, cgroupControllers...) {
		m, ok1 := mounts[key]
		p, ok2 := paths[key]
		if !ok1 || !ok2 {
			continue
		}
		if dir, ok := m.dirOf(p); ok {
			found, _ := filepath.Glob(filepath.Join(dir, fmt.Sprintf("minipy-%d-*", pid)))
			left = append(left, found...)
		}
	}
	return left
}

// RemoveCgroup kills everything in an engine's cgroup dir (a left one) and removes it
// with its groups.
func RemoveCgroup(dir string) error {
	entries, _ := os.ReadDir(dir)
	c := &Cgroups{Version: 1, dirs: []string{dir}, bare: true}
	var errs []error
	for _, ent := range entries {
		if ent.IsDir() {
			errs = append(errs, c.group(ent.Name()).remove())
		}
	}
	return errors.Join(append(errs, rmdirCgroup(dir))...)
}

// HostMemory is the memory this process may use: the machine's (MemTotal), or less where
// its memory cgroup, or one above it, has a lower limit (v2's memory.max, v1's
// memory.limit_in_bytes); 0 if none of it can be read.
func HostMemory() int64 {
	var total int64
	if data, err := os.ReadFile("/proc/meminfo"); err == nil {
		total = memTotal(string(data))
	}
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return total
	}
	info, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return total
	}
	if limit := cgroupMemoryLimit(parseProcCgroup(string(self)), parseCgroupMounts(string(info))); limit > 0 &&
		(total == 0 || limit < total) {
		total = limit
	}
	return total
}

// memTotal reads MemTotal from /proc/meminfo's text, in bytes (0 if it is not there).
func memTotal(meminfo string) int64 {
	for _, line := range strings.Split(meminfo, "\n") {
		if rest, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// cgroupMemoryLimit is the lowest memory limit on this process's memory cgroup and those
// above it, as far as the hierarchy is mounted (v2's if this process is in it, else v1's
// memory hierarchy); 0 for none.
func cgroupMemoryLimit(self map[string]string, mounts map[string]cgroupMount) int64 {
	key, file := "", "memory.max"
	if _, ok := self[""]; !ok || mounts[""] == (cgroupMount{}) {
		key, file = "memory", "memory.limit_in_bytes"
	}
	p, ok := self[key]
	m, mounted := mounts[key]
	if !ok || !mounted {
		return 0
	}
	var lowest int64
	for {
		if dir, ok := m.dirOf(p); ok {
			if data, err := os.ReadFile(filepath.Join(dir, file)); err == nil {
				// ("max" on v2, and v1's "no limit", a page-rounded 2^63-1, parse as none.)
				if n, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64); err == nil && n > 0 &&
					n < 1<<62 && (lowest == 0 || n < lowest) {
					lowest = n
				}
			}
		}
		if p == "/" || p == "" || p == m.root {
			return lowest
		}
		p = path.Dir(p)
	}
}
