package e2b

import (
	"encoding/json"
	"errors"
	"io"
	"slices"
	"time"

	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/session"
)

// Idle saves and a replica's hard death (Config.StateIdle, with replicas: Config.Advertise).
// A running sandbox is saved into the store StateIdle after its creation and after each
// request to it ended, when no other request came meanwhile: each context, its files and
// environment, as a pause saves them, under session.KindRunning, the name of the lease its
// replica holds, so that a replica that lost the lease cannot write it (session.ErrFenced:
// it then ends its copy, which another replica runs). When its replica dies hard (SIGKILL,
// a lost node), the next request for the sandbox on another replica, once the lease has
// expired (-state-lease), brings it back there from that save (recoverRunning): the same
// id and access token, its variables and files as they were at the save, its processes
// not (a boot: its template's start command runs again). A kill removes the save; a pause
// into the store replaces it.

// touch notes a request to sb that ended (or its start): an idle save follows StateIdle
// later, and a sleep SleepIdle later (sleep.go), unless another request comes first.
func (s *Server) touch(sb *sandbox) {
	s.armSleep(sb)
	if s.fwd == nil || s.cfg.StateIdle <= 0 {
		return
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	sb.dirty = true
	if sb.idle == nil {
		sb.idle = time.AfterFunc(s.cfg.StateIdle, func() { s.idleSave(sb) })
	} else {
		sb.idle.Reset(s.cfg.StateIdle)
	}
}

// idleSave saves sb into the store if it changed since its last save and no request to
// it is in progress (else later).
func (s *Server) idleSave(sb *sandbox) {
	sb.mu.Lock()
	if sb.dead || sb.state != stateRunning || !sb.dirty {
		sb.mu.Unlock()
		return
	}
	if len(sb.inflight) > 0 { // (its end touches it again)
		sb.mu.Unlock()
		return
	}
	sb.dirty = false
	contexts := slices.Clone(sb.contexts)
	sb.mu.Unlock()
	_, err := s.storeRunning(sb, contexts)
	var lost *contextLostError
	switch {
	case errors.As(err, &lost):
		// A context's processes died since its last request (the save found it empty): it
		// comes back from the last save now, before a run or a save finds it empty.
		lost.cc.mu.Lock()
		s.restoreFromIdle(sb, lost.cc)
		lost.cc.mu.Unlock()
	case errors.Is(err, session.ErrFenced):
		sb.mu.Lock()
		sb.takenOver = true
		sb.mu.Unlock()
		s.kill(sb, "another replica runs it now (its lease here had expired)")
	case err != nil:
		s.logf("minipy-mcp: E2B sandbox %s: its idle save failed: %v", sb.id, err)
		s.touch(sb) // (again, a while later)
	}
}

// storeRunning saves sb's contexts into the store as the running sandbox's idle save.
func (s *Server) storeRunning(sb *sandbox, contexts []*codeContext) (int64, error) {
	sb.mu.Lock()
	si := storedInfo{ID: sb.id, Token: sb.token, Template: sb.template, Metadata: sb.metadata, Started: sb.started,
		End: sb.end}
	head := storedHead{Envs: sb.envs, AutoPause: sb.autoPause, AutoCold: sb.autoCold, Ports: sb.ports,
		Egress: sb.egress, Template: sb.tmpl, Streamed: true}
	sb.mu.Unlock()
	info, err := json.Marshal(si)
	if err != nil {
		return 0, err
	}
	return s.storeContexts(session.KindRunning, sb.id, session.Meta{User: sb.user, Init: info}, head, contexts, false)
}

// dropRunning removes sb's idle save (it ended, or is paused into the store), unless
// another replica took it over.
func (s *Server) dropRunning(sb *sandbox) {
	if s.fwd == nil {
		return
	}
	sb.mu.Lock()
	takenOver := sb.takenOver
	if sb.idle != nil {
		sb.idle.Stop()
	}
	sb.mu.Unlock()
	if !takenOver {
		s.cfg.Store.Remove(session.KindRunning, sb.id)
	}
}

// recoverRunning brings back sandbox id from its idle save, when no live replica holds it
// (its replica died hard) and may (the caller's check of the save: its user, its token):
// it resumes here, under the same id and token, to live as long as it had left. Nil when
// there is none to bring back.
func (s *Server) recoverRunning(id string, may func(si storedInfo, meta session.Meta) bool) *sandbox {
	if s.fwd == nil {
		return nil
	}
	if _, held := s.cfg.Store.Holder(session.KindRunning, id); held {
		return nil // (alive elsewhere: the forward failed)
	}
	meta, si, ok := s.storedOf(session.KindRunning, id)
	if !ok || !s.tokens.isFor(id, si.Token) || !may(si, meta) {
		return nil
	}
	life := time.Until(si.End)
	if life <= 0 {
		s.cfg.Store.Remove(session.KindRunning, id) // (its time ended with its replica)
		return nil
	}
	sb := s.placeStored(id, meta.User, si, session.KindRunning, si.End)
	if sb.from != session.KindRunning {
		return sb // (placed here meanwhile)
	}
	if code, why := s.resume(sb, life); code != 0 {
		s.logf("minipy-mcp: E2B sandbox %s could not be brought back from its idle save: %s", id, why)
		s.forget(sb)
		return nil
	}
	if code, why := s.startTemplate(sb); code != 0 { // (a boot: its processes were not kept)
		s.logf("minipy-mcp: E2B sandbox %s brought back, but not ready: %s", id, why)
	}
	sb.mu.Lock()
	sb.restoredFrom = meta.Saved
	sb.mu.Unlock()
	s.count(&s.stats.Recovered)
	s.logf("minipy-mcp: E2B sandbox %s of user %q brought back from its idle save of %s (its replica died)",
		id, meta.User, meta.Saved.Format(time.RFC3339))
	return sb
}

// isDirty reports whether a request came since sb's last idle save.
func (sb *sandbox) isDirty() bool {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	return sb.dirty
}

// restoreFromIdle brings context cc of sb, whose process tree died, back from
// sb's last idle save, into its namespace (fresh, empty: the engine started a new worker),
// as a resume restores it; false when there is no save to bring it back from (no replicas,
// no save yet, a shell). Its caller holds cc.mu.
func (s *Server) restoreFromIdle(sb *sandbox, cc *codeContext) bool {
	if s.fwd == nil || cc.language == langBash {
		return false
	}
	meta, blob, err := s.cfg.Store.Open(session.KindRunning, sb.id)
	if err != nil {
		return false
	}
	defer blob.Close()
	_, paused, err := readStored(blob)
	if err != nil || meta.User != sb.user {
		return false
	}
	for _, p := range paused {
		save := p.save()
		if p.id != cc.id {
			if _, err := io.Copy(io.Discard, save); err != nil {
				return false
			}
			continue
		}
		ns := cc.ns.Load()
		if err := ns.Restore(save); err != nil {
			s.logf("minipy-mcp: E2B sandbox %s: context %s could not be brought back from its idle save: %v", sb.id, cc.id, err)
			return false
		}
		if _, err := s.setUpFor(sb, ns, p.cwd); err != nil {
			s.logf("minipy-mcp: E2B sandbox %s: context %s brought back, but not set up: %v", sb.id, cc.id, err)
		}
		s.count(&s.stats.Restored)
		s.logf("minipy-mcp: E2B sandbox %s: context %s, whose processes died, brought back from its idle save of %s",
			sb.id, cc.id, meta.Saved.Format(time.RFC3339))
		return true
	}
	return false
}

// contextLostError: a save found a context whose processes had died (its namespace's
// state lost, minipy.ErrStateLost).
type contextLostError struct {
	cc  *codeContext
	err error
}

func (e *contextLostError) Error() string { return "context " + e.cc.id + ": " + e.err.Error() }
func (e *contextLostError) Unwrap() error { return e.err }
