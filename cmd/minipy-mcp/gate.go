package main

// The gate admits sessions under the caps (-max-sessions, -max-sessions-per-user) and
// drains the server (SIGTERM): no new session, no new call, the running calls finish.
//
// A session is counted from the HTTP request that opens it (a POST without Mcp-Session-Id
// that carries an initialize request, which the SDK answers by making one) until it ends
// (the client deletes it, it idles out, the server closes it). The request carries a ticket in a header of ours; the server's
// receiving middleware sees it in the initialize request (RequestExtra.Header), binds it
// to the session, and releases it when the session ends. A request that made no session
// releases its ticket when it returns.

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// ticketHeader carries a new session's ticket from the HTTP handler to the MCP middleware.
// Whatever a client sends in it is dropped.
const ticketHeader = "Minipy-Session-Ticket"

// retryAfter is the Retry-After (seconds) of a refused session.
const retryAfter = 10

// Why a session was refused (minipy_sessions_rejected_total's label).
const (
	refusedMaxSessions = "max_sessions"
	refusedPerUser     = "max_sessions_per_user"
	refusedDraining    = "draining"
)

var refusals = []string{refusedMaxSessions, refusedPerUser, refusedDraining}

// gate counts sessions and calls. The zero caps mean none.
type gate struct {
	max, perUser int
	rejected     func(reason string) // counts a refused session (metrics), or nil

	mu       sync.Mutex
	open     int
	byUser   map[string]int
	tickets  map[string]*ticket
	draining bool
	calls    int
	posts    int           // requests in progress but GETs (a GET's stream lasts as long as its session)
	idle     chan struct{} // closed when calls reaches 0 while draining

	// halt ends the calls still running when the drain's time is up (stopCalls).
	halt    context.Context
	stopAll context.CancelFunc
}

// ticket is a session's place under the caps, from its first request to its end.
type ticket struct {
	user  string
	bound bool // to a session, which releases it when it ends
}

func newGate(max, perUser int) *gate {
	g := &gate{max: max, perUser: perUser, byUser: map[string]int{}, tickets: map[string]*ticket{}}
	g.halt, g.stopAll = context.WithCancel(context.Background())
	return g
}

// state is the number of sessions and whether the server drains.
func (g *gate) state() (open int, draining bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.open, g.draining
}

// maxSessionlessBody bounds the body of a POST without a session: an initialize request is
// small.
const maxSessionlessBody = 1 << 20

// initializes reports whether a POST's body (a JSON-RPC message or a batch) holds an
// initialize request, the only one that leaves a session open.
func initializes(body []byte) bool {
	var one struct {
		Method string `json:"method"`
	}
	if json.Unmarshal(body, &one) == nil {
		return one.Method == "initialize"
	}
	var batch []struct {
		Method string `json:"method"`
	}
	if json.Unmarshal(body, &batch) == nil {
		for _, m := range batch {
			if m.Method == "initialize" {
				return true
			}
		}
	}
	return false
}

// admit wraps the MCP handler: a request that would open a session past a cap, or while
// the server drains, gets 503 with Retry-After and a message naming the limit.
func (g *gate) admit(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Header.Del(ticketHeader)
		if r.Method != http.MethodGet {
			// The drain waits for these: a call's answer is written after its handler
			// returns, on the request that carried it.
			g.mu.Lock()
			g.posts++
			g.mu.Unlock()
			defer func() {
				g.mu.Lock()
				g.posts--
				g.mu.Unlock()
			}()
		}
		if r.Method != http.MethodPost || r.Header.Get("Mcp-Session-Id") != "" {
			next.ServeHTTP(w, r)
			return
		}
		user := ""
		if info := auth.TokenInfoFromContext(r.Context()); info != nil {
			user = info.UserID
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxSessionlessBody))
		var tooLarge *http.MaxBytesError
		switch {
		case errors.As(err, &tooLarge):
			http.Error(w, "minipy-mcp: the request is too large", http.StatusRequestEntityTooLarge)
			return
		case err != nil:
			http.Error(w, "minipy-mcp: reading the request: "+err.Error(), http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		if !initializes(body) {
			next.ServeHTTP(w, r) // the SDK opens no lasting session for it (server/discover, a bad request)
			return
		}
		id, refusal := g.take(user)
		if refusal != "" {
			w.Header().Set("Retry-After", strconv.Itoa(retryAfter))
			http.Error(w, refusal, http.StatusServiceUnavailable)
			return
		}
		defer g.returnUnbound(id)
		r.Header.Set(ticketHeader, id)
		next.ServeHTTP(w, r)
	})
}

// take reserves a place for a new session of user: a ticket id, or why not.
func (g *gate) take(user string) (id, refusal string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	reason := ""
	switch {
	case g.draining:
		reason, refusal = refusedDraining, "minipy-mcp is shutting down and takes no new session; connect again in a moment "+
			"(to another replica, behind a load balancer)"
	case g.max > 0 && g.open >= g.max:
		reason, refusal = refusedMaxSessions, fmt.Sprintf("minipy-mcp holds its limit of %d sessions (-max-sessions); "+
			"end a session or retry later", g.max)
	case g.perUser > 0 && g.byUser[user] >= g.perUser:
		reason, refusal = refusedPerUser, fmt.Sprintf("you hold the limit of %d sessions per user "+
			"(-max-sessions-per-user); end one of your sessions or retry later", g.perUser)
	}
	if refusal != "" {
		if g.rejected != nil {
			g.rejected(reason)
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

// hold counts a session of user that no request's ticket stands for (a handle, which
// releases it when it ends), or says why it may not open.
func (g *gate) hold(user string) (refusal string) {
	id, refusal := g.take(user)
	if refusal == "" {
		g.mu.Lock()
		delete(g.tickets, id)
		g.mu.Unlock()
	}
	return refusal
}

// returnUnbound gives the place of ticket id back if no session took it.
func (g *gate) returnUnbound(id string) {
	g.mu.Lock()
	t := g.tickets[id]
	delete(g.tickets, id)
	g.mu.Unlock()
	if t != nil && !t.bound {
		g.release(t.user)
	}
}

func (g *gate) release(user string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.open--
	if g.byUser[user]--; g.byUser[user] <= 0 {
		delete(g.byUser, user)
	}
}

// middleware binds the ticket of an initialize request to its session, which gives its
// place back when it ends.
func (g *gate) middleware(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		if method == "initialize" {
			if extra := req.GetExtra(); extra != nil && extra.Header != nil {
				g.bind(extra.Header.Get(ticketHeader), req.GetSession())
			}
		}
		return next(ctx, method, req)
	}
}

func (g *gate) bind(id string, session mcp.Session) {
	ss, ok := session.(*mcp.ServerSession)
	if id == "" || !ok {
		return
	}
	g.mu.Lock()
	t := g.tickets[id]
	if t == nil || t.bound {
		g.mu.Unlock()
		return
	}
	t.bound = true
	g.mu.Unlock()
	go func() {
		ss.Wait() //nolint:errcheck // over either way
		g.release(t.user)
	}()
}

// enterCall counts a tool call in: it returns the call's context, which stopCalls ends
// too, and the function that counts it out; ok is false while the server drains (the call
// must not start).
func (g *gate) enterCall(ctx context.Context) (_ context.Context, leave func(), ok bool) {
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

func (g *gate) leaveCall() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.calls--
	if g.calls == 0 && g.idle != nil {
		close(g.idle)
		g.idle = nil
	}
}

// stopCalls stops the calls still running (their runs see their context cancelled).
func (g *gate) stopCalls() { g.stopAll() }

// drain refuses new sessions and calls from now on, and waits until the running calls have
// finished and their answers have gone out, or ctx ends; it reports how many calls were
// still running.
func (g *gate) drain(ctx context.Context) (unfinished int) {
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
		posts := g.posts
		g.mu.Unlock()
		if posts == 0 {
			return 0
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return 0
		}
	}
}
