package mcpfront

// The sessions' side of -state-dir (statedir.go): what is kept of each session to save it
// and bring it back, when it is saved, and its namespace restored.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/minipy-go/minipy"
	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/session"
)

// keptSession is what sessions keep of a session for -state-dir.
type keptSession struct {
	user string
	init json.RawMessage // its initialize request's params

	mu      sync.Mutex // one save at a time
	dirty   bool       // a call ran since the last save
	timer   *time.Timer
	deleted bool          // the client ended it: its saved state goes with it
	closed  bool          // saved at its close: no more saves
	retry   time.Duration // the wait before the next try of a save that failed
}

// The waits between tries of a save that failed (the store does not answer): doubling
// from the first to the last.
const (
	firstRetry = time.Second
	lastRetry  = 30 * time.Second
)

// saved notes how a save of k went (k.mu held): a save that failed for the store (not for
// the session: ErrFenced, ErrTooLarge, its own error) is tried again, later and later,
// until one goes through or the session closes.
func (k *keptSession) saved(err error, what string) {
	if err == nil {
		k.retry = 0
		return
	}
	k.dirty = true
	log.Printf("minipy-mcp: -state-dir: saving %s: %v", what, err)
	if k.timer == nil || k.closed || errors.Is(err, session.ErrFenced) || errors.Is(err, session.ErrTooLarge) ||
		!errors.Is(err, errStore) {
		return
	}
	k.retry = min(max(2*k.retry, firstRetry), lastRetry)
	k.timer.Reset(k.retry)
}

// keepInitialize (receiving middleware) keeps a session's initialize request and user.
func (s *sessions) keepInitialize(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		if method == "initialize" {
			if ss, ok := req.GetSession().(*mcp.ServerSession); ok {
				k := &keptSession{}
				if js, err := json.Marshal(req.GetParams()); err == nil {
					k.init = js
				}
				if extra := req.GetExtra(); extra != nil && extra.TokenInfo != nil {
					k.user = extra.TokenInfo.UserID
				}
				s.mu.Lock()
				_, back := s.kept[ss.ID()]
				if !back { // (a session brought back keeps what it had)
					s.kept[ss.ID()] = k
				}
				s.mu.Unlock()
				if !back && s.state != nil && s.state.fwd != nil {
					// Held from its start: the other replicas forward its next requests here.
					s.state.TryLease(session.KindSession, ss.ID(), k.user)
				}
			}
		}
		return next(ctx, method, req)
	}
}

// live reports whether session id is open in this process.
func (s *sessions) live(id string) bool {
	for ss := range s.server.Sessions() {
		if ss.ID() == id {
			return true
		}
	}
	return false
}

func (s *sessions) keptOf(id string) *keptSession {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.kept[id]
}

// deleted notes that the client ends session id.
func (s *sessions) deleted(id string) {
	if k := s.keptOf(id); k != nil {
		k.mu.Lock()
		k.deleted = true
		k.mu.Unlock()
	}
}

// changed notes that a call ran in ss: it is saved after -state-idle without another.
func (s *sessions) changed(ss *mcp.ServerSession) {
	if s.state == nil {
		return
	}
	k := s.keptOf(ss.ID())
	if k == nil {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.dirty = true
	if k.timer == nil {
		k.timer = time.AfterFunc(s.stateIdle, func() { s.save(ss, k) })
	} else {
		k.timer.Reset(s.stateIdle)
	}
}

// save saves ss if a call ran since its last save.
func (s *sessions) save(ss *mcp.ServerSession, k *keptSession) {
	s.mu.Lock()
	ns := s.spaces[ss]
	s.mu.Unlock()
	k.mu.Lock()
	defer k.mu.Unlock()
	if !k.dirty || k.deleted || ns == nil {
		return
	}
	k.dirty = false
	info, err := saveNamespace(s.state.Store, ss.ID(), session.Meta{User: k.user, Init: k.init}, ns)
	if _, lost := session.StateLost(err); lost {
		// Its processes died since its last call (the save found its namespace empty): it
		// comes back from its last save now, before a call or a save finds it empty.
		s.restoreSaved(ns, ss.ID(), k.user)
		return
	}
	k.saved(err, "a session")
	if err == nil && len(info.Skipped) > 0 {
		log.Printf("minipy-mcp: -state-dir: saved a session without %v, which cannot be saved", info.Skipped)
	}
}

// keepClosed saves ss as it closes (the client's idle timeout, the drain) and gives up its
// lease; a session its client ended is forgotten instead.
func (s *sessions) keepClosed(ss *mcp.ServerSession) {
	id := ss.ID()
	k := s.keptOf(id)
	if k == nil {
		return
	}
	k.mu.Lock()
	if k.timer != nil {
		k.timer.Stop()
	}
	deleted := k.deleted
	k.closed = true // (its last save is tried once)
	k.mu.Unlock()
	if deleted {
		s.state.Remove(session.KindSession, id)
	} else {
		s.save(ss, k)
	}
	s.state.ReleaseLease(session.KindSession, id)
	s.mu.Lock()
	delete(s.kept, id)
	s.mu.Unlock()
}

// restore gives session id, just made again by its replayed initialize request, its saved
// namespace (with the host functions registered first).
func (s *sessions) restore(id string, meta session.Meta, blob io.Reader) error {
	var ss *mcp.ServerSession
	for one := range s.server.Sessions() {
		if one.ID() == id {
			ss = one
		}
	}
	if ss == nil {
		return errNoSession
	}
	ns := s.newNamespace()
	if err := ns.Restore(blob); err != nil {
		ns.Close() //nolint:errcheck // freeing is best effort
		ss.Close() //nolint:errcheck // it cannot go on
		return err
	}
	s.mu.Lock()
	s.kept[id] = &keptSession{user: meta.User, init: meta.Init}
	old := s.spaces[ss]
	s.spaces[ss] = ns
	if old == nil {
		s.forgetLater(ss)
	}
	s.mu.Unlock()
	if old != nil {
		old.Close() //nolint:errcheck // freeing is best effort
	}
	return nil
}

// keptIDs lists the sessions and handles whose leases this replica renews, with their users.
func (s *sessions) keptIDs() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	ids := make(map[string]string, len(s.kept)+len(s.handles))
	for id, k := range s.kept {
		ids[id] = k.user
	}
	for h, hs := range s.handles {
		ids[h] = hs.kept.user
	}
	return ids
}

// giveUp lets another replica have session (or handle) id: it is saved and ended here.
// A protocol session's client then reaches it there, under the same id.
func (s *sessions) giveUp(id string) {
	s.mu.Lock()
	hs, handle := s.handles[id]
	busy := handle && hs.inUse > 0
	s.mu.Unlock()
	if busy {
		return // a call runs in it here: asked again at the next look
	}
	if handle {
		s.closeHandle(id)
		return
	}
	for ss := range s.server.Sessions() {
		if ss.ID() == id {
			ss.Close() //nolint:errcheck // forgetWhenClosed saves it and gives up its lease
		}
	}
}

// awaitSaves waits (up to wait) for the sessions that closed to be saved.
func (s *sessions) awaitSaves(wait time.Duration) {
	done := make(chan struct{})
	go func() {
		s.closing.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(wait):
		log.Printf("minipy-mcp: -state-dir: saving the sessions took longer than %v", wait)
	}
}

var errNoSession = errors.New("the session was not made again")

// errStore marks an error of the store's, not the namespace's (saveNamespace).
var errStore = errors.New("the state store")

// saveNamespace saves ns as session id (KindSession) in store, streamed into it; an error
// of the store's own matches errStore, one of the namespace's Save does not (nor
// session.ErrTooLarge, which stops a save past the store's cap as it is written).
func saveNamespace(store *session.Store, id string, meta session.Meta, ns *minipy.Namespace) (minipy.SaveInfo, error) {
	var info minipy.SaveInfo
	var saveErr error
	err := store.SaveFrom(session.KindSession, id, meta, func(w io.Writer) error {
		info, saveErr = ns.Save(w)
		return saveErr
	})
	if err != nil && err == saveErr { //nolint:errorlint // (SaveFrom returns the writer's own error as it is)
		return info, err
	}
	if err != nil {
		return info, fmt.Errorf("%w: %w", errStore, err)
	}
	return info, nil
}

// restoreSaved brings the namespace ns of session id (or handle), whose process tree died
// and which is empty again, back from the session's last save in the store, for user:
// false when there is none. A death then costs what came after that save, as a replica's
// death does.
func (s *sessions) restoreSaved(ns *minipy.Namespace, id, user string) bool {
	if s.state == nil || id == "" || ns == nil {
		return false
	}
	meta, blob, err := s.state.Open(session.KindSession, id)
	if err != nil {
		return false
	}
	defer blob.Close()
	if meta.User != user {
		return false
	}
	if err := ns.Restore(blob); err != nil {
		log.Printf("minipy-mcp: -state-dir: a session whose processes died could not be brought back: %v", err)
		return false
	}
	log.Printf("minipy-mcp: -state-dir: a session whose processes died was brought back from its save of %s",
		meta.Saved.Format(time.RFC3339))
	return true
}
