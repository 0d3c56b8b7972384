package main

import (
	"flag"
	"fmt"

	"github.com/minipy-go/minipy"
)

// The memory of -backend isolated: a budget for all the sessions together (the engine's
// cgroup), a share of it for each session's sandbox (its cgroup), and -max-sessions's
// default from the two. What counts is memory in use (pages, tmpfs files, shared memory),
// not -memory-limit's address space, which stops one runaway allocation, not the sum.

// sessionMemory is what -max-sessions's default allows each session's worker: numpy and
// pandas imported, a figure or two, a few frames (115 MB resident with numpy, pandas and a
// matplotlib figure). Its working directory's -work-size comes on top.
const sessionMemory = 256 << 20

// minSessionMemory is the least share of the budget a session may get: a worker with
// numpy imported holds some 40 MB, its snapshot's copies of pages more.
const minSessionMemory = 64 << 20

// defaultWorkSize is -work-size's default: smaller than the library's 1 GiB, since each
// session's working directory is a tmpfs that counts in its share.
const defaultWorkSize = 256 << 20

// memoryFlags are -memory-budget and -session-memory (-1: not given).
type memoryFlags struct {
	budget, session int64
}

func (f *memoryFlags) register(fs *flag.FlagSet) {
	fs.Int64Var(&f.budget, "memory-budget", -1, "with -backend isolated: the `bytes` of memory all sessions may hold "+
		"together (their processes' pages, their files in /tmp and the working directory), the limit of the "+
		"engine's cgroup (default: 3/4 of what this process may use; 0: none)")
	fs.Int64Var(&f.session, "session-memory", -1, "with -backend isolated: the `bytes` of memory each session may "+
		"hold, the limit of its sandbox's cgroup (default: its share, -memory-budget / -max-sessions, or / -workers "+
		"when packed; 0: none but the budget)")
}

// memoryPlan is what the server gives its engine and its gate.
type memoryPlan struct {
	budget      int64 // of all sessions; 0: none
	session     int64 // of each sandbox; 0: none
	maxSessions int   // -max-sessions, its default resolved (-http)
}

// plan resolves the memory flags. none is -limits none, which lifts the defaults; http
// says whether -max-sessions applies, maxSessions is it (-1: its default); workers is
// -workers; workSize -work-size.
func (f memoryFlags) plan(none, http bool, maxSessions, workers int, workSize int64) (memoryPlan, error) {
	if f.budget < -1 || f.session < -1 {
		return memoryPlan{}, fmt.Errorf("%w: -memory-budget and -session-memory must not be negative (0: none)", errLimits)
	}
	p := memoryPlan{budget: f.budget, session: f.session, maxSessions: maxSessions}
	if p.budget < 0 {
		p.budget = 0
		if !none {
			p.budget = minipy.DefaultMemoryBudget()
		}
	}
	if http && p.maxSessions < 0 {
		per := int64(sessionMemory) + max(workSize, 0)
		if f.session > 0 {
			per = f.session
		}
		p.maxSessions = defaultMaxSessions(p.budget, per)
	}
	if p.session >= 0 || none || p.budget == 0 {
		p.session = max(p.session, 0)
		return p, nil
	}
	// Each session's share of the budget.
	p.session = 0
	switch {
	case workers > 0:
		p.session = p.budget / int64(workers)
	case http && p.maxSessions > 0:
		p.session = p.budget / int64(p.maxSessions)
	}
	p.session = p.session >> 20 << 20 // (whole MiB, pages for the kernel and a round number for the log)
	if p.session > 0 && p.session < minSessionMemory {
		return p, fmt.Errorf("%w: each session's share of -memory-budget (%s) would be %s, under %s: raise "+
			"-memory-budget, lower -max-sessions, or give -session-memory", errLimits, byteText(p.budget),
			byteText(p.session), byteText(minSessionMemory))
	}
	return p, nil
}

// apply sets p in cfg: the budget, and each sandbox's memory (Unlimited where p has none, so
// that -memory-limit's address space is not taken for it).
func (p memoryPlan) apply(cfg *minipy.IsolatedConfig) {
	cfg.MemoryBudget, cfg.ResidentLimit = minipy.Unlimited, minipy.Unlimited
	if p.budget > 0 {
		cfg.MemoryBudget = p.budget
	}
	if p.session > 0 {
		cfg.ResidentLimit = p.session
	}
}

// String is the startup log's account of p as the engine enforces it (st).
func (p memoryPlan) describe(st minipy.IsolatedStats) string {
	none := func(n int64) string {
		if n <= 0 {
			return "none"
		}
		return byteText(n)
	}
	text := fmt.Sprintf("all sessions %s (-memory-budget), each session %s (-session-memory)", none(p.budget),
		none(p.session))
	if st.Limits == minipy.LimitsRlimits {
		return text + fmt.Sprintf(", NOT ENFORCED: no cgroup (%v); docs/deploy.md shows how to delegate one",
			st.CgroupError)
	}
	return text + ", in the cgroup " + st.Cgroup
}

// defaultMaxSessions is -max-sessions's default: the memory budget (else what this process
// may use) divided by what a session may hold, at least 4.
func defaultMaxSessions(budget, perSession int64) int {
	if budget <= 0 {
		budget = minipy.HostMemory()
	}
	return int(max(4, budget/perSession))
}
