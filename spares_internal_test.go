package minipy

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// The pool's target: fixed, none, or adaptive (the calls of the window, at least one once
// a NewNamespace was made, at most the ceiling, which the memory budget lowers).
func TestSparePoolTarget(t *testing.T) {
	now := time.Now()
	pool := func(spares int, budget int64) *sparePool {
		p := &sparePool{}
		p.init(IsolatedConfig{Spares: spares, MemoryBudget: budget})
		return p
	}
	assert.Equal(t, 5, pool(5, 0).target(now))
	assert.Equal(t, 0, pool(-1, 0).target(now))

	p := pool(0, 0)
	assert.Equal(t, 0, p.target(now), "no NewNamespace yet")
	assert.Nil(t, p.take(now))
	assert.Equal(t, 1, p.target(now))
	for i := range 6 {
		p.take(now.Add(time.Duration(i) * time.Second))
	}
	assert.Equal(t, 7, p.target(now.Add(5*time.Second)))
	assert.Equal(t, 2, p.target(now.Add(spareWindow+3*time.Second)), "the calls older than the window age out")
	assert.Equal(t, 1, p.target(now.Add(time.Hour)))
	for range 100 {
		p.take(now)
	}
	assert.Equal(t, maxAdaptiveSpares, p.target(now))

	p = pool(0, 512<<20) // a quarter of it holds two at spareMemory
	for range 10 {
		p.take(now)
	}
	assert.Equal(t, int(512<<20/4/spareMemory), p.target(now))
	p = pool(0, 64<<20)
	p.take(now)
	p.take(now)
	assert.Equal(t, 1, p.target(now), "never below one")

	// take prefers a spare whose start has ended, and counts hits and misses.
	p = pool(0, 0)
	a, b := &workerSlot{}, &workerSlot{}
	p.spares = []*spareEntry{{slot: a}, {slot: b, ready: true}}
	assert.Same(t, b, p.take(now))
	assert.Same(t, a, p.take(now))
	assert.Nil(t, p.take(now))
	assert.Equal(t, uint64(1), p.hits)
	assert.Equal(t, uint64(2), p.misses)
}
