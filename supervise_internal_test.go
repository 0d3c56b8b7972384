package minipy

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// stuck is a runHandle whose code never stops; it records the kicks' stages, and says
// (queued) that its thread waited for a CPU all the time since its first kick.
type stuck struct {
	mu      sync.Mutex
	stages  []int
	queued  bool
	firstAt time.Time
}

func (s *stuck) wait(d time.Duration) bool {
	if d < 0 {
		panic("supervise waits without a limit for a run past its deadline")
	}
	time.Sleep(d)
	return false
}

func (s *stuck) kick(stage int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.firstAt.IsZero() {
		s.firstAt = time.Now()
	}
	s.stages = append(s.stages, stage)
}

func (*stuck) wake() {}

func (s *stuck) runQueueWaits() map[int]time.Duration {
	if !s.queued {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.firstAt.IsZero() {
		return map[int]time.Duration{1: 0}
	}
	return map[int]time.Duration{1: time.Since(s.firstAt)}
}

// Code that could run gets the grace on the wall clock; code whose thread waited for a CPU
// all along is neither escalated nor abandoned for it, up to abandonCap.
func TestSuperviseCountsTheTimeTheCodeCouldRun(t *testing.T) {
	for _, queued := range []bool{false, true} {
		s := &stuck{queued: queued}
		start := time.Now()
		const after = 10 * time.Millisecond
		stop := supervise(context.Background(), s, deadline{at: start.Add(after)})
		// The stages count from the first kick, which comes at the deadline or later: the
		// lower bounds are from the start (the kick handle notes the kick a moment after
		// supervise does), the upper ones from the kick.
		sinceStart, took := time.Since(start), time.Since(s.firstAt)
		require.True(t, stop.abandoned)
		if !queued {
			assert.GreaterOrEqual(t, sinceStart, after+abandonAfter)
			assert.Less(t, took, abandonCap, "abandoned after the grace")
			assert.Contains(t, s.stages, 2, "escalated after hardStageAfter")
			continue
		}
		assert.GreaterOrEqual(t, sinceStart, after+abandonCap, "a starved run is given up only at the cap")
		assert.Less(t, took, abandonCap+5*time.Second) // generous: a loaded machine
		assert.NotContains(t, s.stages, 2, "a run that never got the CPU is not hit on every line")
	}
}
