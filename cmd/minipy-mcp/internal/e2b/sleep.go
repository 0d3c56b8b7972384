package e2b

import (
	"encoding/json"
	"errors"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/minipy-go/minipy"
	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/session"
)

// Sleeping (Config.SleepIdle) and waking (sleeping, and E2B's autoResume).
//
// A running sandbox that no request has reached for SleepIdle is put to sleep: paused as a
// pause keeps memory does (each context's variables and files saved, in the server's memory
// or the store, its processes ended), but still running for its client: it is listed and
// described as running, its time goes on, and the next request to it, to any of its ports or
// through the API (its info, list and kill aside), wakes it first under the same id and
// token, with its variables, files and execution counts. Only a sandbox that loses nothing
// by it sleeps: none of its requests in progress, no command running, no live shell of a
// bash context, no watch, and every context's variables saved whole (a save that skips a
// value, a thread, an open file or a socket held in a variable, is no sleep: the sandbox
// stays up, and tries again after its next request). A thread or a process that the code
// started and holds in no variable ends with the sleep, as with a pause (docs/e2b.md).
// When its time ends asleep, it is paused (autoPause) or killed, as when it runs.
//
// autoResume (E2B's lifecycle { onTimeout: 'pause', autoResume: true }): a sandbox that its
// time's end paused wakes at the next request to its ports, to live its last timeout again
// (a boot, as connect's resume is: its template's start command runs again). API calls do
// not wake it (connect resumes it, as any paused sandbox).

// notWholeError: a sleep's save would skip values (minipy.SaveInfo.Skipped).
type notWholeError struct{ names []string }

func (e *notWholeError) Error() string {
	return "its variables " + strings.Join(e.names, ", ") + " cannot be saved"
}

// saveWhole is ns.Save into w, which for a sleep (whole) fails when it skips a value.
func saveWhole(ns *minipy.Namespace, w io.Writer, whole bool) error {
	info, err := ns.Save(w)
	if err == nil && whole && len(info.Skipped) > 0 {
		return &notWholeError{names: info.Skipped}
	}
	return err
}

// armSleep puts sb to sleep SleepIdle from now, unless a request comes first (touch).
func (s *Server) armSleep(sb *sandbox) {
	if s.cfg.SleepIdle <= 0 {
		return
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.dead {
		return
	}
	sb.touched = time.Now()
	if sb.sleeper == nil {
		sb.sleeper = time.AfterFunc(s.cfg.SleepIdle, func() { s.sleep(sb) })
	} else {
		sb.sleeper.Reset(s.cfg.SleepIdle)
	}
}

// sleep puts sb to sleep if it is idle and loses nothing by it (else it stays up until
// its next request's end arms the sleep again).
func (s *Server) sleep(sb *sandbox) {
	if !sb.waking.TryLock() { // (a wake in progress: a request came)
		return
	}
	defer sb.waking.Unlock()
	if s.sleepless(sb) != "" {
		return
	}
	code, why, err := s.pauseAs(sb, true, true)
	var whole *notWholeError
	// (Else it is in use, or holds a value it cannot save: it stays up, and tries again after
	// its next request.)
	if code == http.StatusInsufficientStorage && !errors.As(err, &whole) {
		s.logf("minipy-mcp: E2B sandbox %s stays up: its sleep failed (%s)", sb.id, why)
	}
}

// maxRoomTries bounds the sleeps that one admission tries to make room with (another
// admission may take the room a sleep made).
const maxRoomTries = 4

// roomWait bounds how long an admission waits for one sleep that makes room for it.
const roomWait = 2 * time.Second

// sleepIdlest puts the running sandbox that has gone longest without a request to sleep,
// of those that lose nothing by it (the server's cap is full: its places make room);
// false when none would sleep.
func (s *Server) sleepIdlest() bool {
	s.mu.Lock()
	all := slices.Collect(maps.Values(s.sandboxes))
	s.mu.Unlock()
	type candidate struct {
		sb      *sandbox
		touched time.Time
	}
	var idle []candidate
	for _, sb := range all {
		if s.sleepless(sb) == "" {
			sb.mu.Lock()
			idle = append(idle, candidate{sb, sb.touched})
			sb.mu.Unlock()
		}
	}
	slices.SortFunc(idle, func(a, b candidate) int { return a.touched.Compare(b.touched) })
	for _, c := range idle[:min(len(idle), maxRoomTries)] {
		// Another user's create waits on this sleep: one whose save the values' own code
		// holds up (until the engine stops it: two minutes, for any namespace operation)
		// is left to go on alone.
		done := make(chan struct{})
		go func() {
			defer close(done)
			s.sleep(c.sb)
		}()
		select {
		case <-done:
		case <-time.After(roomWait):
			continue
		}
		if c.sb.sleeping() {
			s.count(&s.stats.SleptForRoom)
			return true
		}
	}
	return false
}

// sleepless says why sb cannot sleep now ("": it can): the state that a sleep would lose.
func (s *Server) sleepless(sb *sandbox) string {
	if n := sb.cmds.count(); n > 0 {
		return strconv.Itoa(n) + " commands running"
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	switch {
	case sb.dead || sb.spare || sb.state != stateRunning:
		return "not running"
	case len(sb.inflight) > 0:
		return "requests in progress"
	case sb.watching > 0:
		return "watches open"
	}
	for _, cc := range sb.contexts {
		if sh := cc.shell; sh != nil && !sh.ended() {
			return "a live shell"
		}
	}
	return ""
}

// wake makes sb run again if it sleeps, or (byTraffic: a request to its ports) if its time's
// end paused it and it asked for autoResume; it waits for a sleep or a wake in progress. It
// reports whether sb runs; when it does not because its wake failed, an HTTP status and why
// (the caps are full: 429), else 0.
func (s *Server) wake(sb *sandbox, byTraffic bool) (runs bool, code int, why string) {
	sb.waking.Lock()
	defer sb.waking.Unlock()
	sb.mu.Lock()
	state, asleep, auto, dead := sb.state, sb.asleep, sb.autoResume && byTraffic && !sb.cold, sb.dead
	left, life := time.Until(sb.end), sb.life
	sb.mu.Unlock()
	switch {
	case dead:
		return false, 0, ""
	case state == stateRunning:
		return true, 0, ""
	case state != statePaused || !asleep && !auto:
		return false, 0, ""
	case asleep && left > 0:
		life = left
	case !auto:
		return false, 0, "" // (its time ended meanwhile, and expired() ends it)
	}
	start := time.Now()
	if code, why := s.resume(sb, life); code != 0 {
		s.logf("minipy-mcp: E2B sandbox %s could not be woken: %s", sb.id, why)
		return false, code, "the sandbox is asleep, and could not be woken: " + why
	}
	if !asleep { // (autoResume: a boot, as connect's resume is)
		if code, why := s.startTemplate(sb); code != 0 {
			s.logf("minipy-mcp: E2B sandbox %s woken, but not ready: %s", sb.id, why)
		}
	}
	took := time.Since(start)
	s.mu.Lock()
	s.stats.Woken++
	s.stats.WakeTime += took
	s.mu.Unlock()
	s.logf("minipy-mcp: E2B sandbox %s of user %q woken in %v", sb.id, sb.user, took.Round(time.Microsecond))
	return true, 0, ""
}

// wakeAnswering wakes sb for request r to its ports (wake): sb when it runs (or the copy
// that wakeFailed woke); when its wake failed, the request answered.
func (s *Server) wakeAnswering(w http.ResponseWriter, r *http.Request, sb *sandbox) (woken *sandbox, answered bool) {
	runs, code, why := s.wake(sb, true)
	switch {
	case runs:
		return sb, false
	case code == 0:
		return nil, false
	}
	return s.wakeFailed(w, r, sb, code, why, true)
}

// wakeFailed answers request r for sb, whose wake failed with code and why. When sb was in
// the store, another replica's wake may have claimed its save (two asked at once): for
// wokenElsewhereWait, r is forwarded to the replica that runs it, or, should that one have
// put it to sleep again meanwhile, it is woken here (woken: the caller serves r with it).
// Else, or then, r is answered with why.
func (s *Server) wakeFailed(w http.ResponseWriter, r *http.Request, sb *sandbox, code int, why string,
	byTraffic bool) (woken *sandbox, answered bool) {
	if !sb.inStore() || s.fwd == nil {
		writeError(w, code, why)
		return nil, true
	}
	end := time.Now().Add(wokenElsewhereWait)
	for {
		if owner, held := s.cfg.Store.Holder(session.KindRunning, sb.id); held && owner != s.cfg.Store.Owner() {
			if s.forward(w, r, sb.id) {
				s.forget(sb) // (its place here: it runs there)
				return nil, true
			}
		} else if again := s.storedAgain(sb.id); again != nil {
			if runs, _, _ := s.wake(again, byTraffic); runs {
				return again, false
			}
		}
		if time.Now().After(end) {
			break
		}
		select {
		case <-r.Context().Done():
			return nil, true
		case <-time.After(20 * time.Millisecond):
		}
	}
	writeError(w, code, why)
	return nil, true
}

// storedAgain is sandbox id placed here if the store holds it asleep (again), for a
// request that was let wake it.
func (s *Server) storedAgain(id string) *sandbox {
	meta, si, ok := s.storedOf(session.KindSandbox, id)
	if !ok || !si.Asleep {
		return nil
	}
	return s.placeSandbox(id, meta.User, si, meta.Saved)
}

// wokenElsewhereWait bounds the wait for another replica's wake of a sandbox whose claim
// this one lost: its restore was done when the claim found the save gone, and its lease
// follows at once.
const wokenElsewhereWait = 2 * time.Second

// asleepNow reports whether sb sleeps (or is going to sleep) and runs for its client.
func (sb *sandbox) asleepNow() bool {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	return sb.asleep && sb.state != stateRunning && !sb.dead
}

// inStore reports whether sb's save is in the store (paused or asleep there).
func (sb *sandbox) inStore() bool {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	return sb.stored
}

// sleeping reports whether sb sleeps: its processes freed.
func (sb *sandbox) sleeping() bool {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	return sb.asleep && sb.state == statePaused && !sb.dead
}

// asleepBytes is what sb's save holds while it sleeps: in the server's memory, or in the
// store.
func (s *Server) asleepBytes(sb *sandbox) int64 {
	sb.mu.Lock()
	stored, held := sb.stored, sb.pausedBytes
	sb.mu.Unlock()
	if !stored {
		return held
	}
	for _, one := range s.cfg.Store.List(session.KindSandbox) {
		if one.ID == sb.id {
			return one.Size
		}
	}
	return 0
}

// awake is next, for a sandbox that sleeps no more: one asleep is woken first, and none
// goes to sleep while next runs (it holds a place among sb's requests in progress, when
// one is free).
func (s *Server) awake(next func(http.ResponseWriter, *http.Request, *sandbox)) func(http.ResponseWriter, *http.Request, *sandbox) {
	return func(w http.ResponseWriter, r *http.Request, sb *sandbox) {
		select {
		case sb.inflight <- struct{}{}:
			defer func() { <-sb.inflight; s.touch(sb) }()
		default:
		}
		if sb.asleepNow() {
			if runs, code, why := s.wake(sb, false); !runs && code != 0 {
				if woken, answered := s.wakeFailed(w, r, sb, code, why, false); !answered {
					// (a copy placed again: it holds a place among its requests as sb did)
					select {
					case woken.inflight <- struct{}{}:
						defer func() { <-woken.inflight; s.touch(woken) }()
					default:
					}
					next(w, r, woken)
				}
				return
			}
		}
		next(w, r, sb)
	}
}

// sleepEnded is the end of the time of sb, asleep: paused (autoPause), as a running
// sandbox's is, or killed.
func (s *Server) sleepEnded(sb *sandbox) {
	sb.mu.Lock()
	if !sb.dead && sb.asleep && sb.state == stateChanging { // (going to sleep: its end comes after)
		sb.timer.Reset(50 * time.Millisecond)
	}
	if sb.dead || !sb.asleep || sb.state != statePaused {
		sb.mu.Unlock()
		return
	}
	if sb.autoPause {
		sb.asleep = false
		if sb.stored {
			sb.end = s.storedEnd(time.Now())
		} else {
			sb.end = time.Now().Add(s.cfg.PausedTTL)
		}
		sb.timer.Reset(time.Until(sb.end))
		sb.mu.Unlock()
		s.logf("minipy-mcp: E2B sandbox %s of user %q paused: its time ended asleep", sb.id, sb.user)
		return
	}
	stored := sb.stored
	sb.mu.Unlock()
	if stored {
		if code, _ := s.removeStored(sb); code == 0 {
			s.count(&s.stats.Expired)
		}
		return
	}
	if s.kill(sb, "its time ended") {
		s.count(&s.stats.Expired)
	}
}

// checkAutoResume refuses an autoResume that cannot be served: one whose pause keeps no
// memory (E2B's API refuses it too: such a sandbox is resumed explicitly), or without a
// pause at all.
func checkAutoResume(req *createRequest) string {
	if req.AutoResume == nil || !req.AutoResume.Enabled {
		return ""
	}
	switch {
	case req.AutoPause == nil || !*req.AutoPause:
		return "autoResume needs autoPause (lifecycle onTimeout 'pause'): it wakes a paused sandbox"
	case req.AutoPauseMemory != nil && !*req.AutoPauseMemory:
		return "autoResume cannot be combined with autoPauseMemory false: a pause that keeps the files alone is " +
			"resumed explicitly (Sandbox.connect)"
	}
	return ""
}

// lifecycle is a sandbox's lifecycle as its info shows it (E2B's SandboxLifecycle).
type lifecycle struct {
	AutoResume bool   `json:"autoResume"`
	OnTimeout  string `json:"onTimeout"`
}

func lifecycleOf(autoPause, autoResume bool) *lifecycle {
	l := &lifecycle{AutoResume: autoResume, OnTimeout: "kill"}
	if autoPause {
		l.OnTimeout = "pause"
	}
	return l
}

// state is the state of a sandbox stored as si: running while a sleep's time goes on,
// paused after it with autoPause (and a pause's), "" after it without: it ended asleep,
// and its save is to be removed.
func (si storedInfo) state(now time.Time) string {
	switch {
	case !si.Asleep:
		return statePaused
	case now.Before(si.End):
		return stateRunning
	case si.AutoPause:
		return statePaused
	}
	return ""
}

// storedState is the state of a sandbox the store lists (storedInfo.state); "" for a save
// that is no sandbox's.
func storedState(one session.Saved) string {
	var si storedInfo
	if json.Unmarshal(one.Init, &si) != nil {
		return ""
	}
	return si.state(time.Now())
}

// wakesFor reports whether request r to port of a sandbox whose access token is token may
// wake it: it carries the token, or a file URL the token signed that has not expired (to
// envd's port, as serveSandbox takes it), or is to one of the sandbox's own ports, which
// any request reaches unless they are private (allowPublicTraffic false).
func (s *Server) wakesFor(r *http.Request, port, token string, private bool) bool {
	_, own := userPort(port)
	return own && !private || tokenIs(r, token) ||
		port == strconv.Itoa(EnvdPort) && signedWith(r, token) && !signatureExpired(r, time.Now())
}

// storedToWake is the sandbox id that the store holds asleep, or paused with autoResume,
// placed here for request r to port to wake it; nil if there is none.
func (s *Server) storedToWake(id string, r *http.Request, port string) *sandbox {
	meta, si, ok := s.storedOf(session.KindSandbox, id)
	if !ok || !s.tokens.isFor(id, si.Token) || !s.wakesFor(r, port, si.Token, si.PortsPrivate) ||
		!si.Asleep && !si.AutoResume || s.cfg.HasUser != nil && !s.cfg.HasUser(meta.User) {
		return nil
	}
	return s.placeSandbox(id, meta.User, si, meta.Saved)
}
