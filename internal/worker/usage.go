package worker

import (
	"bufio"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// CgroupUsage is what the worker's sandbox has used, as its cgroup counts it: the CPU time
// of all its processes, those ended included, and the memory it holds now (its processes'
// pages, page tables, kernel memory, its tmpfs files). ok is false without a cgroup that
// counts them (none; a bare one; v1, whose CPU is not counted in the engine's hierarchies:
// its memory only, cpu 0 and cpuOK false).
func (w *Worker) CgroupUsage() (cpu time.Duration, memory int64, cpuOK, ok bool) {
	g := w.cg
	if g == nil || g.c.bare || !g.mine() {
		return 0, 0, false, false
	}
	defer g.gone.RUnlock()
	dir := g.dirs[0]
	if g.c.Version == 1 {
		memory, ok = readInt(filepath.Join(dir, "memory.usage_in_bytes"))
		return 0, memory, false, ok
	}
	if memory, ok = readInt(filepath.Join(dir, "memory.current")); !ok {
		return 0, 0, false, false
	}
	f, err := os.Open(filepath.Join(dir, "cpu.stat"))
	if err != nil {
		return 0, memory, false, true
	}
	defer f.Close()
	lines := bufio.NewScanner(f)
	for lines.Scan() {
		if v, found := strings.CutPrefix(lines.Text(), "usage_usec "); found {
			us, err := strconv.ParseInt(v, 10, 64)
			return time.Duration(us) * time.Microsecond, memory, err == nil, true
		}
	}
	return 0, memory, false, true
}

// readInt reads a control file that holds one number.
func readInt(file string) (int64, bool) {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0, false
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n, err == nil
}
