package minipy

import (
	"runtime"
	"sync"
	"time"
)

// The warm pool (IsolatedConfig.Spares): sandboxes started ahead, so that NewNamespace
// hands out a worker that is already running instead of one the caller waits ~50-150 ms
// for (docs/benchmarks.md, "Starting a sandbox").
const (
	// spareWindow is how far back the adaptive pool counts NewNamespace calls: it holds as
	// many spares as there were calls in the last spareWindow (a burst's size), then
	// shrinks back to one as they age out.
	spareWindow = 10 * time.Second
	// spareMemory is what the adaptive pool reckons a spare holds of the memory budget:
	// most of a sandbox's memory is shared with the template, and an idle one's PSS is
	// ~6-7 MiB with numpy preloaded; this leaves room for a larger Preload. The pool's
	// ceiling keeps spares to a quarter of IsolatedConfig.MemoryBudget at that size.
	spareMemory = 48 << 20
	// maxAdaptiveSpares bounds the adaptive pool whatever the budget.
	maxAdaptiveSpares = 32
	// refillDelay is how long after a NewNamespace the pool waits to start replacements
	// while it still has a spare up: a burst's namespaces run their first code meanwhile,
	// and a start (~60 ms of CPU) would take a core from them. With none up it starts at
	// once.
	refillDelay = 50 * time.Millisecond
	// A spare whose start fails is dropped (the namespace that would take it starts its
	// own, whose first use reports the failure), and the pool starts none for a while:
	// retryFirst, doubling with each failure in a row up to retryMost.
	retryFirst, retryMost = time.Second, 30 * time.Second
)

// sparePool is the engine's spares (Workers 0). Its fields are guarded by the engine's mu.
type sparePool struct {
	fixed    int            // IsolatedConfig.Spares: > 0 that many, < 0 none, 0 adaptive
	ceiling  int            // adaptive's most
	window   time.Duration  // adaptive: spareWindow (tests shorten it)
	parallel int            // starts in flight at most: the CPUs
	spares   []*spareEntry  // oldest first
	arrivals []time.Time    // adaptive: the NewNamespace calls of the last spareWindow
	starting int            // spare starts in flight (of spares taken meanwhile too)
	used     bool           // a NewNamespace was made: the adaptive pool starts
	lastTake time.Time      // the latest NewNamespace
	failures int            // spare starts that failed in a row
	retryAt  time.Time      // after a failure, no spare starts before then
	hits     uint64         // NewNamespace calls that took a spare whose worker had started
	misses   uint64         // those that found none, or one still starting
	wake     chan struct{}  // the keeper looks again (1-buffered)
	keeping  sync.WaitGroup // the keeper and the goroutines it starts (Close waits for them)
	running  bool           // the keeper runs
}

type spareEntry struct {
	slot  *workerSlot
	ready bool // its start has ended with its worker up (a failed one is dropped: started)
}

// init sets the pool up for an engine of cfg (its defaults filled in).
func (p *sparePool) init(cfg IsolatedConfig) {
	p.fixed, p.parallel, p.wake = cfg.Spares, max(runtime.NumCPU(), 1), make(chan struct{}, 1)
	p.ceiling, p.window = maxAdaptiveSpares, spareWindow
	if cfg.MemoryBudget > 0 {
		p.ceiling = max(min(p.ceiling, int(cfg.MemoryBudget/4/spareMemory)), 1)
	}
}

// target is how many spares the pool holds now.
func (p *sparePool) target(now time.Time) int {
	switch {
	case p.fixed != 0:
		return max(p.fixed, 0)
	case !p.used:
		return 0 // an engine that never makes a namespace keeps no idle worker
	}
	cut := 0
	for cut < len(p.arrivals) && now.Sub(p.arrivals[cut]) >= p.window {
		cut++
	}
	p.arrivals = p.arrivals[cut:]
	return min(max(len(p.arrivals), 1), p.ceiling)
}

// take removes a spare from the pool for a new namespace, the first whose start has ended,
// else the oldest: nil when there is none. It records the call (adaptive) and counts a
// hit or a miss. The caller holds the engine's mu.
func (p *sparePool) take(now time.Time) *workerSlot {
	p.used, p.lastTake = true, now
	if p.fixed == 0 {
		if len(p.arrivals) == p.ceiling {
			p.arrivals = p.arrivals[1:]
		}
		p.arrivals = append(p.arrivals, now)
	}
	at := -1
	for i, s := range p.spares {
		if s.ready {
			at = i
			break
		}
	}
	if at < 0 {
		p.misses++
		if len(p.spares) == 0 {
			return nil
		}
		at = 0
	} else {
		p.hits++
	}
	s := p.spares[at].slot
	p.spares = append(p.spares[:at], p.spares[at+1:]...)
	return s
}

// up is the number of spares whose start has ended. The caller holds the engine's mu.
func (p *sparePool) up() int {
	n := 0
	for _, s := range p.spares {
		if s.ready {
			n++
		}
	}
	return n
}

// started settles the end of spare s's start: it is up, or it failed and is dropped from
// the pool, and the next starts wait (retryAt). It reports whether the caller is to close
// s (failed, and not taken meanwhile).
func (p *sparePool) started(s *workerSlot) (drop bool) {
	s.mu.Lock()
	up := s.started != nil || s.cur != nil
	s.mu.Unlock()
	e := s.e
	e.mu.Lock()
	defer e.mu.Unlock()
	p.starting--
	if up {
		p.failures = 0
	} else if !e.closed {
		p.failures++
		p.retryAt = time.Now().Add(min(retryFirst<<min(p.failures-1, 5), retryMost))
	}
	for i, en := range p.spares {
		if en.slot == s {
			if up {
				en.ready = true
				return false
			}
			p.spares = append(p.spares[:i], p.spares[i+1:]...)
			return true
		}
	}
	return false
}

// has reports whether s is one of the pool's spares. The caller holds the engine's mu.
func (p *sparePool) has(s *workerSlot) bool {
	for _, e := range p.spares {
		if e.slot == s {
			return true
		}
	}
	return false
}

// poke has the keeper look again.
func (p *sparePool) poke() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// keepSpares starts the engine's keeper of spares unless it runs (or the pool is off);
// the caller holds e.mu.
func (e *Isolated) keepSpares() {
	p := &e.pool
	if p.running || p.fixed < 0 || e.closed {
		p.poke()
		return
	}
	p.running = true
	p.keeping.Add(1)
	go e.spareKeeper()
}

// spareKeeper holds the pool at its target: it starts spares (at most parallel at once:
// each start is CPU-bound) and closes those beyond the target, looking again when a
// namespace takes one, a start ends, or (adaptive) a call ages out of the window. It
// returns when the engine closes (Close pokes it).
func (e *Isolated) spareKeeper() {
	p := &e.pool
	defer p.keeping.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		e.mu.Lock()
		if e.closed {
			e.mu.Unlock()
			return
		}
		now := time.Now()
		want := p.target(now)
		var start, trim []*workerSlot
		next := time.Hour
		if wait := refillDelay - now.Sub(p.lastTake); wait > 0 && p.up() > 0 {
			next, want = wait, min(want, len(p.spares)) // (trims, starts nothing yet)
		}
		if wait := p.retryAt.Sub(now); wait > 0 {
			next, want = min(next, wait), min(want, len(p.spares))
		}
		for len(p.spares) < want && p.starting < p.parallel {
			s := &workerSlot{e: e, token: make(turn, 1), own: true, lazyDirs: true}
			e.own[s] = struct{}{}
			p.spares = append(p.spares, &spareEntry{slot: s})
			p.starting++
			start = append(start, s)
		}
		for len(p.spares) > want { // the newest go first: the oldest are the likeliest up
			last := p.spares[len(p.spares)-1]
			p.spares = p.spares[:len(p.spares)-1]
			trim = append(trim, last.slot)
		}
		if p.fixed == 0 && len(p.arrivals) > 1 {
			next = min(next, p.window-now.Sub(p.arrivals[0])+time.Millisecond)
		}
		e.mu.Unlock()
		// (Close waits for these too: the keeper's own count holds the group above zero.)
		p.keeping.Add(len(start) + len(trim))
		for _, s := range start {
			s.startNext()
			done := s.startDone()
			go func() {
				defer p.keeping.Done()
				<-done
				if p.started(s) {
					e.closeOwn(s)
				}
				p.poke()
			}()
		}
		for _, s := range trim {
			go func() {
				defer p.keeping.Done()
				e.closeOwn(s)
			}()
		}
		timer.Reset(next)
		select {
		case <-p.wake:
		case <-timer.C:
		}
	}
}
