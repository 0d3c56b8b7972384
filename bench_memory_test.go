package minipy_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/minipy-go/minipy"
	"github.com/minipy-go/minipy/internal/procstat"
)

// BenchmarkSandboxMemory is where a live sandbox's memory goes (issue 70): 200 sandboxes
// (the engine's default namespace and 199 more, no spares) have each run
// `x = list(range(1000))` once (or 5 times: the pages that the worker's loop copies ahead
// of a run that repeats); then, averaged over the sandboxes, the PSS of their guardians
// (pid 1 of their pid namespaces), workers (the guardians' children) and rollback
// snapshots (the workers' forks) with their anonymous, file and private dirty parts, page
// tables (VmPTE), kernel stacks (16 KiB a thread), processes, threads, page faults, and
// the sandboxes' cgroups (v1: all they are charged, and the kernel's part of it). The
// template's PSS is apart. `go test -run '^$' -bench SandboxMemory -benchtime 1x`.
func BenchmarkSandboxMemory(b *testing.B) {
	const sandboxes = 200
	for _, c := range []struct {
		name string
		cfg  minipy.IsolatedConfig
		runs int
	}{
		{"runs=1", minipy.IsolatedConfig{}, 1},
		{"runs=5", minipy.IsolatedConfig{}, 5},
		{"runs=1-no-rollback", minipy.IsolatedConfig{NoRollback: true}, 1},
	} {
		b.Run(c.name, func(b *testing.B) {
			cfg := c.cfg
			cfg.Spares = -1 // (a spare would be a sandbox of no namespace's)
			for b.Loop() {
				e, err := minipy.NewIsolated(cfg)
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { e.Close() }) // (after a failure; closed below otherwise)
				var spaces []*minipy.Namespace  // kept: a collected namespace is closed
				for i := range sandboxes {
					var ns *minipy.Namespace // (nil, the default namespace, started with the engine)
					if i > 0 {
						ns = e.NewNamespace()
						spaces = append(spaces, ns)
					}
					for range c.runs {
						if _, err := e.Run(context.Background(), "x = list(range(1000))", &minipy.Options{Globals: ns}); err != nil {
							b.Fatal(err)
						}
					}
				}
				// Each worker forks its snapshot after it answers, then copies pages ahead.
				time.Sleep(time.Second)
				m := readSandboxMemory(os.Getpid(), minipy.TemplatePID(e))
				for deadline := time.Now().Add(10 * time.Second); !cfg.NoRollback && m.procs[2] != sandboxes && time.Now().Before(deadline); {
					time.Sleep(100 * time.Millisecond)
					m = readSandboxMemory(os.Getpid(), minipy.TemplatePID(e))
				}
				runtime.KeepAlive(spaces)
				for _, ns := range spaces {
					ns.Close()
				}
				e.Close()
				if m.sandboxes != sandboxes {
					b.Fatalf("%d sandboxes found, want %d", m.sandboxes, sandboxes)
				}
				m.report(b)
			}
		})
	}
}

// procMemory is what /proc says of one process: smaps_rollup and status in kB, faults.
type procMemory struct {
	pss, pssAnon, pssFile, privDirty, pte, threads, minflt, majflt int
}

func (p *procMemory) add(q procMemory) {
	p.pss += q.pss
	p.pssAnon += q.pssAnon
	p.pssFile += q.pssFile
	p.privDirty += q.privDirty
	p.pte += q.pte
	p.threads += q.threads
	p.minflt += q.minflt
	p.majflt += q.majflt
}

// sandboxMemory sums procMemory by kind of process over every sandbox of an engine.
type sandboxMemory struct {
	sandboxes, template int
	kinds               [3]procMemory // guardian, worker, snapshot
	procs               [3]int
	cgroupKmem          int64 // bytes, memory.kmem.usage_in_bytes summed (cgroup v1), -1 if none
	cgroupUsage         int64 // bytes, memory.usage_in_bytes summed
}

var kindNames = [3]string{"guardian", "worker", "snapshot"}

func readProcMemory(pid int) (procMemory, bool) {
	var m procMemory
	dir := "/proc/" + strconv.Itoa(pid) + "/"
	rollup, err := os.ReadFile(dir + "smaps_rollup")
	if err != nil {
		return m, false
	}
	for _, line := range strings.Split(string(rollup), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		v, _ := strconv.Atoi(f[1])
		switch f[0] {
		case "Pss:":
			m.pss = v
		case "Pss_Anon:":
			m.pssAnon = v
		case "Pss_File:":
			m.pssFile = v
		case "Private_Dirty:":
			m.privDirty = v
		}
	}
	status, err := os.ReadFile(dir + "status")
	if err != nil {
		return m, false
	}
	for _, line := range strings.Split(string(status), "\n") {
		if f := strings.Fields(line); len(f) > 1 {
			switch f[0] {
			case "VmPTE:":
				m.pte, _ = strconv.Atoi(f[1])
			case "Threads:":
				m.threads, _ = strconv.Atoi(f[1])
			}
		}
	}
	if stat, err := os.ReadFile(dir + "stat"); err == nil {
		s := string(stat)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		m.minflt, _ = strconv.Atoi(f[7])
		m.majflt, _ = strconv.Atoi(f[9])
	}
	return m, true
}

// innerPid is the last NSpid of pid: its pid in its own pid namespace.
func innerPid(pid int) int {
	status, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	for _, line := range strings.Split(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, "NSpid:"); ok {
			f := strings.Fields(rest)
			n, _ := strconv.Atoi(f[len(f)-1])
			return n
		}
	}
	return 0
}

// readSandboxMemory finds root's descendants whose pid in their pid namespace is 1 (the
// guardians) and sorts what is below each: its children are workers, their descendants
// snapshots.
func readSandboxMemory(root, template int) sandboxMemory {
	var m sandboxMemory
	if tm, ok := readProcMemory(template); ok {
		m.template = tm.pss
	}
	for _, g := range procstat.Tree(root)[1:] {
		if g == template || innerPid(g) != 1 {
			continue
		}
		m.sandboxes++
		gm, _ := readProcMemory(g)
		m.kinds[0].add(gm)
		m.procs[0]++
		for _, w := range procstat.Children(g) {
			wm, ok := readProcMemory(w)
			if !ok {
				continue
			}
			m.kinds[1].add(wm)
			m.procs[1]++
			for _, snap := range procstat.Tree(w)[1:] {
				if sm, ok := readProcMemory(snap); ok {
					m.kinds[2].add(sm)
					m.procs[2]++
				}
			}
		}
		if m.cgroupKmem >= 0 {
			kmem, usage, ok := cgroupMemory(g)
			if !ok {
				m.cgroupKmem = -1
			}
			m.cgroupKmem += kmem
			m.cgroupUsage += usage
		}
	}
	return m
}

// cgroupMemory reads the v1 memory cgroup of pid: kernel memory and all it is charged.
func cgroupMemory(pid int) (kmem, usage int64, ok bool) {
	cg, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		return 0, 0, false
	}
	for _, line := range strings.Split(string(cg), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 || !slices.Contains(strings.Split(f[1], ","), "memory") || f[2] == "/" {
			continue
		}
		dir := "/sys/fs/cgroup/memory" + f[2] + "/"
		k, err1 := os.ReadFile(dir + "memory.kmem.usage_in_bytes")
		u, err2 := os.ReadFile(dir + "memory.usage_in_bytes")
		if err1 != nil || err2 != nil {
			return 0, 0, false
		}
		kmem, _ = strconv.ParseInt(strings.TrimSpace(string(k)), 10, 64)
		usage, _ = strconv.ParseInt(strings.TrimSpace(string(u)), 10, 64)
		return kmem, usage, true
	}
	return 0, 0, false
}

func (m sandboxMemory) report(b *testing.B) {
	n := float64(m.sandboxes)
	var all procMemory
	procs := 0
	var table strings.Builder
	fmt.Fprintf(&table, "per sandbox (%d), kB: %-8s %6s %6s %6s %6s %6s %6s %6s %7s %7s\n", m.sandboxes,
		"kind", "procs", "PSS", "anon", "file", "privD", "PTE", "kstack", "threads", "minflt")
	for i, k := range m.kinds {
		all.add(k)
		procs += m.procs[i]
		fmt.Fprintf(&table, "%28s %-8s %6.2f %6.0f %6.0f %6.0f %6.0f %6.0f %6.0f %7.2f %7.0f\n", "", kindNames[i],
			float64(m.procs[i])/n, float64(k.pss)/n, float64(k.pssAnon)/n, float64(k.pssFile)/n,
			float64(k.privDirty)/n, float64(k.pte)/n, float64(k.threads)*16/n, float64(k.threads)/n, float64(k.minflt)/n)
		b.ReportMetric(float64(k.pss)/n, kindNames[i]+"-PSS-kB/sandbox")
	}
	fmt.Fprintf(&table, "%28s %-8s %6.2f %6.0f %6.0f %6.0f %6.0f %6.0f %6.0f %7.2f %7.0f\n", "", "all",
		float64(procs)/n, float64(all.pss)/n, float64(all.pssAnon)/n, float64(all.pssFile)/n,
		float64(all.privDirty)/n, float64(all.pte)/n, float64(all.threads)*16/n, float64(all.threads)/n, float64(all.minflt)/n)
	if m.cgroupKmem >= 0 {
		fmt.Fprintf(&table, "cgroup per sandbox, kB: usage %.0f, kmem %.0f; template PSS %d kB",
			float64(m.cgroupUsage)/1024/n, float64(m.cgroupKmem)/1024/n, m.template)
		b.ReportMetric(float64(m.cgroupKmem)/1024/n, "cgroup-kmem-kB/sandbox")
	} else {
		fmt.Fprintf(&table, "no cgroup per sandbox; template PSS %d kB", m.template)
	}
	b.Log("\n" + table.String())
	b.ReportMetric(float64(all.pss)/n, "PSS-kB/sandbox")
	b.ReportMetric(float64(all.pss+all.pte+all.threads*16)/n, "PSS+PTE+kstack-kB/sandbox")
	b.ReportMetric(float64(procs)/n, "processes/sandbox")
	b.ReportMetric(float64(all.threads)/n, "threads/sandbox")
	b.ReportMetric(float64(all.minflt)/n, "minflt/sandbox")
}
