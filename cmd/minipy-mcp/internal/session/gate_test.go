package session

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The caps count sessions in all and per user; a ticket's place goes back unless a
// session took it; a refusal is counted by its reason.
func TestGateCaps(t *testing.T) {
	g := NewGate(3, 2)
	var rejected []string
	g.Rejected = func(reason string) { rejected = append(rejected, reason) }
	a1, refusal := g.Take("ann")
	require.Empty(t, refusal)
	require.Empty(t, g.Hold("ann"))
	assert.Contains(t, g.Hold("ann"), "-max-sessions-per-user")
	require.Empty(t, g.Hold("bob"))
	_, refusal = g.Take("carl")
	assert.Contains(t, refusal, "limit of 3 sessions")
	open, draining := g.State()
	assert.Equal(t, 3, open)
	assert.False(t, draining)

	user, ok := g.Bind(a1)
	require.True(t, ok)
	assert.Equal(t, "ann", user)
	_, ok = g.Bind(a1)
	assert.False(t, ok, "bound once")
	g.ReturnUnbound(a1)
	open, _ = g.State()
	assert.Equal(t, 3, open, "a bound ticket's place stays with its session")
	g.Release("ann")
	b2, refusal := g.Take("bob")
	require.Empty(t, refusal)
	g.ReturnUnbound(b2)
	open, _ = g.State()
	assert.Equal(t, 2, open, "an unbound ticket's place goes back")
	assert.Equal(t, []string{RefusedPerUser, RefusedMaxSessions}, rejected)
}

// The drain refuses new sessions and calls, waits for the running ones, and StopCalls
// ends them when its time is up.
func TestGateDrain(t *testing.T) {
	g := NewGate(0, 0)
	ctx, leave, ok := g.EnterCall(context.Background())
	require.True(t, ok)
	done := make(chan int)
	go func() { done <- g.Drain(context.Background()) }()
	require.Eventually(t, func() bool { _, d := g.State(); return d }, 5*time.Second, time.Millisecond)
	_, refusal := g.Take("ann")
	assert.Contains(t, refusal, "shutting down")
	_, _, ok = g.EnterCall(context.Background())
	assert.False(t, ok)
	select {
	case <-done:
		t.Fatal("the drain did not wait for the call")
	case <-time.After(50 * time.Millisecond):
	}
	assert.NoError(t, ctx.Err(), "a call that runs is not stopped by the drain")
	leave()
	assert.Equal(t, 0, <-done)

	g = NewGate(0, 0)
	ctx, leave, _ = g.EnterCall(context.Background())
	defer leave()
	short, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	assert.Equal(t, 1, g.Drain(short), "still running")
	g.StopCalls()
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("StopCalls did not end the call's context")
	}
}
