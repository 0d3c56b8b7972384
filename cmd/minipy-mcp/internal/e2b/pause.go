package e2b

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/session"
)

// Pausing: a paused sandbox is each of its code contexts saved (minipy's Namespace.Save:
// variables, functions, classes, the working directory's files) and its processes ended,
// kept by the server; connect resumes it, each context restored into a fresh namespace. It
// keeps what a notebook's state is, not what E2B's memory snapshot keeps besides (threads,
// processes the code left running, open files and sockets: SaveInfo's skipped values).
// Paused sandboxes live in the server's memory, within Config.MaxPausedBytes, for
// Config.PausedTTL, and the server's end forgets them; or in Config.Store (stored.go).
//
// A pause that keeps no memory (E2B's keepMemory: false, on pause or in the lifecycle's
// onTimeout) saves as much, but its resume is a new boot: each context gets its files
// back (Namespace.RestoreFiles) and none of its variables, its execution count starts
// again, and the sandbox's boot id is a new one (each sandbox process has its own).

// The defaults of Config's pausing.
const (
	DefaultMaxPausedBytes = 1 << 30
	DefaultPausedTTL      = 24 * time.Hour
)

// The states of a sandbox (E2B's, in list and info; and the steps between).
const (
	stateRunning  = "running"
	statePaused   = "paused"
	stateChanging = "changing" // pausing or resuming: neither answers
)

// pausedContext is a code context as its pause saved it: its save in memory (saved), or
// streaming from a store (from).
type pausedContext struct {
	id, language, cwd string
	count             int
	saved             []byte
	from              io.Reader
	byDefault         bool // a bash context, its sandbox's default one (bash.go)
}

// save is the context's save to restore.
func (p pausedContext) save() io.Reader {
	if p.from != nil {
		return p.from
	}
	return bytes.NewReader(p.saved)
}

// pauseRequest pauses sb through the API (its body, which may be empty, says whether to
// keep the memory: E2B's memory, true by default): 409 if it is paused already.
func (s *Server) pauseRequest(w http.ResponseWriter, r *http.Request, sb *sandbox) {
	var req struct {
		Memory *bool `json:"memory"`
	}
	if !readJSON(w, r, 1<<10, &req) { // (an empty body is none)
		return
	}
	code, why := s.pause(sb, req.Memory == nil || *req.Memory)
	if code != 0 {
		writeError(w, code, why)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// pause saves each of sb's contexts and closes them, after their runs in progress; a
// failed save leaves sb running. Without keepMemory, its resume is a new boot. It returns
// an HTTP status and why when it cannot.
func (s *Server) pause(sb *sandbox, keepMemory bool) (int, string) {
	code, why, _ := s.pauseAs(sb, keepMemory, false)
	return code, why
}

// pauseAs is pause, or (asleep) a sleep (sleep.go): its time goes on, it is listed as
// running, and its save fails rather than skip a value. The error is the save's.
func (s *Server) pauseAs(sb *sandbox, keepMemory, asleep bool) (int, string, error) {
	sb.mu.Lock()
	if sb.state != stateRunning {
		state := sb.state
		sb.mu.Unlock()
		if state == statePaused {
			return http.StatusConflict, "sandbox " + sb.id + " is paused already", nil
		}
		return http.StatusConflict, "sandbox " + sb.id + " is being paused or resumed", nil
	}
	if asleep && (len(sb.inflight) > 0 || sb.watching > 0) { // (a request came: sleep.go)
		sb.mu.Unlock()
		return http.StatusConflict, "sandbox " + sb.id + " is in use", nil
	}
	sb.state, sb.cold, sb.asleep = stateChanging, !keepMemory, asleep
	contexts := sb.contexts
	sb.timer.Stop()
	sb.mu.Unlock()
	var paused []pausedContext
	var size int64
	var err error
	if s.cfg.Store != nil {
		size, err = s.storePaused(sb, contexts, asleep)
	} else if paused, size, err = saveContexts(contexts, asleep); err == nil {
		err = s.reservePaused(sb.user, size)
	}
	sb.mu.Lock()
	if err != nil || sb.dead {
		defer sb.mu.Unlock()
		sb.state, sb.asleep = stateRunning, false
		if !sb.dead {
			sb.timer.Reset(time.Until(sb.end))
		}
		if err == nil { // killed meanwhile: its kill closed the contexts
			if s.cfg.Store != nil {
				s.cfg.Store.Remove(session.KindSandbox, sb.id)
			} else {
				s.releasePaused(sb.user, size)
			}
			return http.StatusNotFound, "sandbox " + sb.id + " was killed", nil
		}
		return http.StatusInsufficientStorage, "the sandbox could not be paused: " + err.Error(), err
	}
	s.holdPausedPlace(sb)  // (first: the contexts' places go back as they close)
	closing := sb.contexts // (those saved, but any removed meanwhile)
	sb.contexts, sb.state = nil, statePaused
	if asleep {
		s.count(&s.stats.Slept) // (s.mu after sb.mu)
	}
	if s.cfg.Store != nil {
		sb.stored, sb.from = true, session.KindSandbox
	} else {
		sb.paused, sb.pausedBytes = paused, size
	}
	switch {
	case asleep: // (its time goes on)
	case s.cfg.Store != nil:
		sb.end = s.storedEnd(time.Now())
	default:
		sb.end = time.Now().Add(s.cfg.PausedTTL)
	}
	sb.timer.Reset(time.Until(sb.end))
	sb.mu.Unlock()
	for _, cc := range closing { // (not under sb.mu: a context's restart holds its lock, then takes sb.mu)
		cc.close()
	}
	if s.cfg.Store != nil {
		s.dropRunning(sb) // (its pause's save is newer)
		s.unhold(sb)      // (in the store: any replica resumes it)
	}
	what := "paused"
	if asleep {
		what = "asleep"
	}
	s.logf("minipy-mcp: E2B sandbox %s of user %q %s (%d bytes)", sb.id, sb.user, what, size)
	return 0, "", nil
}

// saveContexts saves each context, after its run in progress; whole: every value, or it
// fails (a sleep's: saveWhole).
func saveContexts(contexts []*codeContext, whole bool) ([]pausedContext, int64, error) {
	var out []pausedContext
	var size int64
	for _, cc := range contexts {
		cc.mu.Lock()
		var b bytes.Buffer
		var err error
		if cc.language != langBash { // (a shell's memory cannot be saved: bash.go)
			err = saveWhole(cc.ns.Load(), &b, whole)
		}
		count := cc.count
		cc.mu.Unlock()
		if err != nil {
			return nil, 0, err
		}
		out = append(out, pausedContext{id: cc.id, language: cc.language, cwd: cc.cwd, count: count, saved: b.Bytes(),
			byDefault: cc.byDefault})
		size += int64(b.Len())
	}
	return out, size, nil
}

// reservePaused counts size more bytes of user's paused sandboxes, if they fit the
// server's bound and the user's share.
func (s *Server) reservePaused(user string, size int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.pausedFits(s.pausedBytes, s.pausedByUser[user], size); err != nil {
		return err
	}
	s.pausedBytes += size
	s.pausedByUser[user] += size
	return nil
}

// pausedFits says why size more bytes of a user's paused sandboxes do not fit, beside all
// and theirs, if they do not.
func (s *Server) pausedFits(all, theirs, size int64) error {
	switch {
	case theirs+size > s.cfg.MaxPausedBytesPerUser:
		return fmt.Errorf("%w: your paused sandboxes and snapshots hold %d bytes, and one user's may hold %d; "+
			"kill or delete one of them first", errPausedFull, theirs, s.cfg.MaxPausedBytesPerUser)
	case all+size > s.cfg.MaxPausedBytes:
		return fmt.Errorf("%w: the server holds its limit of %d bytes of paused sandboxes and snapshots", errPausedFull,
			s.cfg.MaxPausedBytes)
	}
	return nil
}

func (s *Server) releasePaused(user string, size int64) {
	s.mu.Lock()
	s.pausedBytes -= size
	if s.pausedByUser[user] -= size; s.pausedByUser[user] <= 0 {
		delete(s.pausedByUser, user)
	}
	s.mu.Unlock()
}

// resume restores a paused sb's contexts into fresh namespaces (under the caps) and
// makes it live life from now. It returns an HTTP status and why when it cannot; sb stays
// paused then.
func (s *Server) resume(sb *sandbox, life time.Duration) (code int, why string) {
	defer func() {
		if code == 0 {
			s.hold(sb)  // (it runs here now: the other replicas forward to here)
			s.touch(sb) // (and its idle saves are here)
		}
	}()
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return http.StatusServiceUnavailable, refusedClosed
	}
	sb.mu.Lock()
	if sb.state != statePaused {
		sb.mu.Unlock()
		return http.StatusConflict, "sandbox " + sb.id + " is being paused or resumed"
	}
	sb.state = stateChanging
	paused, stored := sb.paused, sb.stored
	sb.dropPausedPlace() // (its contexts take theirs)
	sb.mu.Unlock()
	var contexts []*codeContext
	code, why = 0, ""
	if stored {
		var from io.Closer
		if paused, from, code, why = s.claimStored(sb); paused != nil {
			defer from.Close()
		}
	}
	if paused != nil {
		contexts, code, why = s.restoreContexts(sb, paused)
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if contexts == nil || sb.dead {
		sb.state = statePaused
		for _, cc := range contexts {
			cc.close()
		}
		if !sb.dead {
			s.holdPausedPlace(sb)
		}
		if stored && paused != nil {
			s.cfg.Store.ReleaseLease(sb.from, sb.id)
		}
		if code == http.StatusNotFound && stored {
			go s.forget(sb) // (takes sb.mu)
		}
		if code == 0 {
			return http.StatusNotFound, "sandbox " + sb.id + " was killed"
		}
		return code, why
	}
	if stored && sb.from != session.KindRunning { // (an idle save stays until the next, under the lease now here)
		s.cfg.Store.Remove(sb.from, sb.id)
		s.cfg.Store.ReleaseLease(sb.from, sb.id)
	}
	s.releasePaused(sb.user, sb.pausedBytes)
	sb.contexts, sb.paused, sb.pausedBytes, sb.state, sb.stored, sb.cold = contexts, nil, 0, stateRunning, false, false
	sb.from, sb.asleep = "", false
	sb.end = time.Now().Add(life)
	sb.timer.Reset(life)
	s.logf("minipy-mcp: E2B sandbox %s of user %q resumed", sb.id, sb.user)
	return 0, ""
}

// restoreContexts makes a namespace for each paused context and restores it there: its
// files alone, and its count from zero, when sb was paused without its memory (sb.cold).
func (s *Server) restoreContexts(sb *sandbox, paused []pausedContext) ([]*codeContext, int, string) {
	sb.mu.Lock()
	cold := sb.cold
	sb.mu.Unlock()
	var out []*codeContext
	fail := func(code int, why string) ([]*codeContext, int, string) {
		for _, cc := range out {
			cc.close()
		}
		return nil, code, why
	}
	for _, p := range paused {
		cc, code, why := s.newContext(sb, p.language, "")
		if cc == nil {
			return fail(code, why)
		}
		out = append(out, cc)
		cc.id, cc.count = p.id, p.count
		save := p.save()
		if cc.language == langBash { // (a new shell at its next cell)
			if cold {
				cc.count = 0
			}
			if err := restoredBash(cc, p, save); err != nil {
				return fail(http.StatusInternalServerError, "the sandbox could not be resumed: "+err.Error())
			}
			continue
		}
		restore := cc.ns.Load().Restore
		if cold {
			cc.count, restore = 0, cc.ns.Load().RestoreFiles
		}
		err := restore(save)
		if err == nil {
			_, err = io.Copy(io.Discard, save) // (to the next context's save)
		}
		if err != nil {
			return fail(http.StatusInternalServerError, "the sandbox could not be resumed: "+err.Error())
		}
		if p.cwd != Home {
			if _, err := s.setUp(context.Background(), cc.ns.Load(), nil, p.cwd); err != nil {
				return fail(http.StatusInternalServerError, "the sandbox could not be resumed: "+err.Error())
			}
			cc.cwd = p.cwd
		}
	}
	return out, 0, ""
}

// expired is a sandbox's time ending: a pause if it asked for one (autoPause), else, or
// when the pause fails or it is paused already, its kill.
func (s *Server) expired(sb *sandbox) {
	if sb.asleepNow() {
		s.sleepEnded(sb)
		return
	}
	sb.mu.Lock()
	pause := sb.autoPause && sb.state == stateRunning
	stored := sb.stored && sb.state == statePaused
	sb.mu.Unlock()
	if stored {
		s.forget(sb) // (the store expires it itself)
		return
	}
	if pause {
		sb.mu.Lock()
		keepMemory := !sb.autoCold
		sb.mu.Unlock()
		code, why := s.pause(sb, keepMemory)
		if code == 0 {
			return
		}
		s.logf("minipy-mcp: E2B sandbox %s: its time ended and its pause failed (%s)", sb.id, why)
	}
	if s.kill(sb, "its time ended") {
		s.count(&s.stats.Expired)
	}
}

// running reports whether sb runs (not paused, nor being paused or resumed).
func (sb *sandbox) running() bool {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	return sb.state == stateRunning
}
