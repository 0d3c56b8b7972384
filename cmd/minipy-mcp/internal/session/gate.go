package session

// The gate admits sessions under the caps (-max-sessions, -max-sessions-per-user) and
// drains the server (SIGTERM): no new session, no new call, the running calls finish.
// Every front counts its sessions here: an MCP session, a session handle, an E2B sandbox
// and each of its code contexts.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log"
	"sync"
	"time"
)

// RetryAfter is the Retry-After (seconds) of a refused session.
const RetryAfter = 10

// Why a session was refused (minipy_sessions_rejected_total's label).
const (
	RefusedMaxSessions = "max_sessions"
	RefusedPerUser     = "max_sessions_per_user"
	RefusedDraining    = "draining"
)

// Refusals are the reasons a session may be refused.
var Refusals = []string{RefusedMaxSessions, RefusedPerUser, RefusedDraining}

// Gate counts sessions and calls. The zero caps mean none. Its methods are safe from any
// goroutine.
type Gate struct {
	max, perUser int
	// Rejected counts a refused session (metrics), or is nil. Set it before the gate is
	// used.
	Rejected func(reason string)

	mu       sync.Mutex
	open     int
	byUser   map[string]int
	tickets  map[string]*ticket
	draining bool
	calls    int
	requests int           // requests in progress whose answers the drain waits for (EnterRequest)
	idle     chan struct{} // closed when calls reaches 0 while draining

	// halt ends the calls still running when the drain's time is up (StopCalls).
	halt    context.Context
	stopAll context.CancelFunc
}

// ticket is a session's place under the caps, from the request that opens it until a
// session is bound to it (Bind) or the request returns it (ReturnUnbound).
type ticket struct {
	user  string
	bound bool
}

// NewGate returns a gate with at most max sessions in all and perUser per user (0: no cap).
func NewGate(max, perUser int) *Gate {
	g := &Gate{max: max, perUser: perUser, byUser: map[string]int{}, tickets: map[string]*ticket{}}
	g.halt, g.stopAll = context.WithCancel(context.Background())
	return g
}

// State is the number of sessions and whether the server drains.
func (g *Gate) State() (open int, draining bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.open, g.draining
}

// Take reserves a place for a session of user that is about to be made: a ticket, which
// Bind gives to the session and ReturnUnbound returns if none took it; or why not.
func (g *Gate) Take(user string) (id, refusal string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	reason := ""
	switch {
	case g.draining:
		reason, refusal = RefusedDraining, "minipy-mcp is shutting down and takes no new session; connect again in a moment "+
			"(to another replica, behind a load balancer)"
	case g.max > 0 && g.open >= g.max:
		reason, refusal = RefusedMaxSessions, fmt.Sprintf("minipy-mcp holds its limit of %d sessions (-max-sessions); "+
			"end a session or retry later", g.max)
	case g.perUser > 0 && g.byUser[user] >= g.perUser:
		reason, refusal = RefusedPerUser, fmt.Sprintf("you hold the limit of %d sessions per user "+
			"(-max-sessions-per-user); end one of your sessions or retry later", g.perUser)
	}
	if refusal != "" {
		if g.Rejected != nil {
			g.Rejected(reason)
		}
		return "", refusal
	}
	var b [16]byte
	rand.Read(b[:]) //nolint:errcheck // crypto/rand.Read does not fail
	id = hex.EncodeToString(b[:])
	g.tickets[id] = &ticket{user: user}
	g.open++
	g.byUser[user]++
	return id, ""
}

// Hold counts a session of user that no ticket stands for (a session handle, an E2B
// sandbox), which gives its place back with Release; or says why it may not open.
func (g *Gate) Hold(user string) (refusal string) {
	id, refusal := g.Take(user)
	if refusal == "" {
		g.mu.Lock()
		delete(g.tickets, id)
		g.mu.Unlock()
	}
	return refusal
}

// Full reports whether the server's cap (-max-sessions) is what refuses a new place now,
// not a user's: another session's place freed (an E2B sandbox put to sleep) makes room.
func (g *Gate) Full() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return !g.draining && g.max > 0 && g.open >= g.max
}

// HoldUser counts a place of user's that is no session (a paused E2B sandbox: no process,
// but its user's) under the per-user cap alone; it is never refused. The function it
// returns gives the place back, once.
func (g *Gate) HoldUser(user string) (release func()) {
	g.mu.Lock()
	g.byUser[user]++
	g.mu.Unlock()
	return sync.OnceFunc(func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		if g.byUser[user]--; g.byUser[user] <= 0 {
			delete(g.byUser, user)
		}
	})
}

// Held is the number of places user holds (sessions, and places of HoldUser).
func (g *Gate) Held(user string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.byUser[user]
}

// Bind gives ticket id's place to the session just made: it returns the ticket's user, whose
// place the session gives back with Release when it ends. False: no such ticket, or bound
// already.
func (g *Gate) Bind(id string) (user string, ok bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	t := g.tickets[id]
	if t == nil || t.bound {
		return "", false
	}
	t.bound = true
	return t.user, true
}

// ReturnUnbound forgets ticket id, and gives its place back if no session took it.
func (g *Gate) ReturnUnbound(id string) {
	g.mu.Lock()
	t := g.tickets[id]
	delete(g.tickets, id)
	g.mu.Unlock()
	if t != nil && !t.bound {
		g.Release(t.user)
	}
}

// Release gives back the place of a session of user.
func (g *Gate) Release(user string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.open--
	if g.byUser[user]--; g.byUser[user] <= 0 {
		delete(g.byUser, user)
	}
}

// EnterRequest counts in a request whose answer the drain waits for (a call's answer may
// be written after its handler returns, on the request that carried it); the function it
// returns counts it out.
func (g *Gate) EnterRequest() (leave func()) {
	g.mu.Lock()
	g.requests++
	g.mu.Unlock()
	return func() {
		g.mu.Lock()
		g.requests--
		g.mu.Unlock()
	}
}

// EnterCall counts a call in: it returns the call's context, which StopCalls ends too,
// and the function that counts it out; ok is false while the server drains (the call must
// not start).
func (g *Gate) EnterCall(ctx context.Context) (_ context.Context, leave func(), ok bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.draining {
		return ctx, nil, false
	}
	g.calls++
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(g.halt, cancel)
	return ctx, func() {
		stop()
		cancel()
		g.leaveCall()
	}, true
}

func (g *Gate) leaveCall() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.calls--
	if g.calls == 0 && g.idle != nil {
		close(g.idle)
		g.idle = nil
	}
}

// StopCalls stops the calls still running (their contexts are cancelled).
func (g *Gate) StopCalls() { g.stopAll() }

// Drain refuses new sessions and calls from now on, and waits until the running calls have
// finished and the requests that carry their answers have returned, or ctx ends; it
// reports how many calls were still running.
func (g *Gate) Drain(ctx context.Context) (unfinished int) {
	g.mu.Lock()
	g.draining = true
	n := g.calls
	if n > 0 && g.idle == nil {
		g.idle = make(chan struct{})
	}
	idle := g.idle
	g.mu.Unlock()
	if n > 0 {
		log.Printf("minipy-mcp: draining: waiting for %d running calls", n)
		select {
		case <-idle:
		case <-ctx.Done():
			g.mu.Lock()
			defer g.mu.Unlock()
			return g.calls
		}
	}
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		g.mu.Lock()
		requests := g.requests
		g.mu.Unlock()
		if requests == 0 {
			return 0
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return 0
		}
	}
}
