// Package procstat reads what Linux's /proc says of processes and threads that the host
// needs at run time: how long they waited for a CPU, and which processes a process started.
package procstat

import (
	"bufio"
	"bytes"
	"os"
	"strconv"
	"strings"
	"time"
)

// TaskWait is how long thread tid of process pid has waited on a run queue, runnable but
// not running, since it started: the second field of its schedstat (CONFIG_SCHED_INFO, on
// in every distribution's kernel). False if the thread is gone or the kernel does not say.
func TaskWait(pid, tid int) (time.Duration, bool) {
	return schedstat("/proc/"+strconv.Itoa(pid)+"/task/"+strconv.Itoa(tid)+"/schedstat", 1)
}

// Waits is TaskWait of the main thread of each of pids that is still there, by pid.
func Waits(pids ...int) map[int]time.Duration {
	m := make(map[int]time.Duration, len(pids))
	for _, pid := range pids {
		if d, ok := TaskWait(pid, pid); ok {
			m[pid] = d
		}
	}
	return m
}

// MostWaited is the largest growth of a wait from before to after (Waits of the same pids
// at two moments), over the pids in both: how long the most starved of them went without a
// CPU in between.
func MostWaited(before, after map[int]time.Duration) time.Duration {
	var most time.Duration
	for pid, a := range after {
		if b, ok := before[pid]; ok {
			most = max(most, a-b)
		}
	}
	return most
}

// CPU is how long the threads of process pid that are still there have run on a CPU (the
// first field of each one's schedstat), in nanoseconds as the scheduler counts them: 0 if
// the process is gone.
func CPU(pid int) time.Duration {
	dir := "/proc/" + strconv.Itoa(pid) + "/task/"
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return 0
	}
	var sum time.Duration
	for _, t := range tasks {
		ran, _ := schedstat(dir+t.Name()+"/schedstat", 0)
		sum += ran
	}
	return sum
}

// schedstat is field i of the schedstat file at path (0: time on a CPU, 1: time waiting
// on a run queue), in nanoseconds.
func schedstat(path string, i int) (time.Duration, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	f := strings.Fields(string(b))
	if len(f) <= i {
		return 0, false
	}
	ns, err := strconv.ParseInt(f[i], 10, 64)
	if err != nil {
		return 0, false
	}
	return time.Duration(ns), true
}

// Tree is pid and its descendants, found through each thread's children file
// (CONFIG_PROC_CHILDREN). A process that ends or starts meanwhile may be missed.
func Tree(pid int) []int {
	out := []int{pid}
	for i := 0; i < len(out); i++ {
		out = append(out, Children(out[i])...)
	}
	return out
}

// Children are the processes that pid's threads started, as Tree finds them.
func Children(pid int) []int {
	var out []int
	dir := "/proc/" + strconv.Itoa(pid) + "/task/"
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	for _, t := range tasks {
		b, err := os.ReadFile(dir + t.Name() + "/children")
		if err != nil {
			continue
		}
		for _, c := range bytes.Fields(b) {
			if n, err := strconv.Atoi(string(c)); err == nil {
				out = append(out, n)
			}
		}
	}
	return out
}

// PSS is process pid's proportional set size in bytes (a page that n processes share
// counts 1/n in each), from its smaps_rollup; 0 if it cannot be read (gone, or not ours to
// read).
func PSS(pid int) int64 {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/smaps_rollup")
	if err != nil {
		return 0
	}
	defer f.Close()
	lines := bufio.NewScanner(f)
	for lines.Scan() {
		if rest, ok := bytes.CutPrefix(lines.Bytes(), []byte("Pss:")); ok {
			kb, _ := strconv.ParseInt(string(bytes.TrimSuffix(bytes.TrimSpace(rest), []byte(" kB"))), 10, 64)
			return kb << 10
		}
	}
	return 0
}
