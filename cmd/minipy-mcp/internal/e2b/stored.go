package e2b

// Paused sandboxes in a store (Config.Store, minipy-mcp's -state-dir): a pause seals the
// sandbox there, not in the server's memory, so that it outlives the server (a restart, a
// crash after the pause) and any server sharing the store (replicas) resumes it. The
// store's file is the paused sandbox: the server that resumes it claims it (the store's
// lease: two servers never resume one sandbox twice), restores it and removes it; a kill
// removes it. A server keeps in memory only a paused sandbox's place (for the calls on it
// to take turns), checked against the store at each call. The store's TTL (-state-ttl)
// bounds how long a paused sandbox is kept; Config.MaxPausedBytes bounds the store's
// paused sandboxes, all together.

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"time"

	"github.com/minipy-go/minipy"
	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/session"
	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/templates"
)

// storedInfo is what the store's listing shows of a paused sandbox (its Meta.Init).
type storedInfo struct {
	ID string `json:"id"`
	// Token is the sandbox's access token, sealed with the rest (under the key that mints
	// tokens, so it tells nothing the key does not): the sandbox keeps it for its life, as
	// E2B's does, wherever it resumes, and E2B's signed file URLs, which the client signs
	// with it, verify there. (A verifier alone could not check those.)
	Token    string            `json:"token,omitempty"`
	Template string            `json:"template"`
	Metadata map[string]string `json:"metadata"`
	Started  time.Time         `json:"started"`
	End      time.Time         `json:"end,omitzero"` // an idle save's, or a sleep's: when its time ends (idle.go)
	// Asleep: a sleep's save (sleep.go): the sandbox runs for its client until End, and
	// the next request wakes it. AutoPause is its time's end (a pause, else its kill), Life
	// its last timeout, which an autoResume gives it again.
	Asleep     bool          `json:"asleep,omitempty"`
	AutoPause  bool          `json:"autoPause,omitempty"`
	AutoResume bool          `json:"autoResume,omitempty"`
	Life       time.Duration `json:"life,omitempty"`
	// PortsPrivate: its own ports need its token (allowPublicTraffic false), so that a
	// request without it wakes it not.
	PortsPrivate bool `json:"portsPrivate,omitempty"`
}

// storedHead is the start of a paused sandbox's blob (a u32 length, then it): what it
// needs to run again, then each context's save, one after another: streamed, each as
// chunks (chunkWriter), else (a pause of before the streams) of its Size.
type storedHead struct {
	Envs      map[string]string   `json:"envs"`
	AutoPause bool                `json:"autoPause"`
	AutoCold  bool                `json:"autoCold,omitempty"` // sandbox.autoCold
	Cold      bool                `json:"cold,omitempty"`     // paused keeping its files alone (sandbox.cold)
	Ports     portRules           `json:"ports,omitempty"`    // sandbox.ports
	Egress    *minipy.EgressRules `json:"egress,omitempty"`   // sandbox.egress
	Template  *templates.Result   `json:"template,omitempty"` // sandbox.tmpl, a template's snapshot.start
	Contexts  []storedContext     `json:"contexts"`
	Streamed  bool                `json:"streamed,omitempty"`
}

type storedContext struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
	Count    int    `json:"count"`
	Size     int    `json:"size"`              // of its save in the blob
	Default  bool   `json:"default,omitempty"` // pausedContext.byDefault
}

// errStoredCorrupt: the store holds a paused sandbox that cannot be read.
var errStoredCorrupt = errors.New("the paused sandbox's save is damaged")

// decodeStored reads a paused sandbox's blob.
func decodeStored(blob []byte) (storedHead, []pausedContext, error) {
	var head storedHead
	if len(blob) < 4 || int64(binary.LittleEndian.Uint32(blob)) > int64(len(blob)-4) {
		return head, nil, errStoredCorrupt
	}
	n := 4 + int(binary.LittleEndian.Uint32(blob))
	if err := json.Unmarshal(blob[4:n], &head); err != nil || len(head.Contexts) == 0 {
		return head, nil, errStoredCorrupt
	}
	rest := blob[n:]
	var paused []pausedContext
	for _, c := range head.Contexts {
		if c.Size < 0 || c.Size > len(rest) {
			return head, nil, errStoredCorrupt
		}
		paused = append(paused, pausedContext{id: c.ID, language: c.Language, cwd: c.Cwd, count: c.Count, saved: rest[:c.Size],
			byDefault: c.Default})
		rest = rest[c.Size:]
	}
	return head, paused, nil
}

// storePaused saves each of sb's contexts into the store, after its run in progress
// (storeContexts). It returns the bytes saved.
// A sleep's (asleep) fails rather than skip a value, and keeps its time's end.
func (s *Server) storePaused(sb *sandbox, contexts []*codeContext, asleep bool) (int64, error) {
	si := storedInfo{ID: sb.id, Token: sb.token, Template: sb.template, Metadata: sb.metadata, Started: sb.started,
		Asleep: asleep, AutoPause: sb.autoPause, AutoResume: sb.autoResume, Life: sb.life, PortsPrivate: sb.ports.Private}
	if asleep {
		si.End = sb.end
	}
	info, err := json.Marshal(si)
	if err != nil {
		return 0, err
	}
	head := storedHead{Envs: sb.envs, AutoPause: sb.autoPause, AutoCold: sb.autoCold, Cold: sb.cold, Ports: sb.ports,
		Egress: sb.egress, Template: sb.tmpl, Streamed: true}
	return s.storeContexts(session.KindSandbox, sb.id, session.Meta{User: sb.user, Init: info}, head, contexts, asleep)
}

// storeContexts seals head, then each of contexts' saves, into the store as id of kind (a
// paused sandbox, a snapshot: what readStored reads), each after its run in progress,
// within the paused bytes' bounds (MaxPausedBytes and a user's share of it, counting the
// store's paused sandboxes and snapshots together, id's own earlier save aside): each
// Namespace.Save streams through the store's seal into it, and the server holds a chunk of
// it at a time. It returns the bytes saved.
// With whole, a save that skips a value fails (a sleep's: saveWhole).
func (s *Server) storeContexts(kind, id string, meta session.Meta, head storedHead, contexts []*codeContext,
	whole bool) (int64, error) {
	var held, theirs int64
	for _, k := range []string{session.KindSandbox, session.KindSnapshot} {
		for _, one := range s.cfg.Store.List(k) {
			if k == kind && one.ID == id {
				continue
			}
			held += one.Size
			if one.User == meta.User {
				theirs += one.Size
			}
		}
	}
	if err := s.pausedFits(held, theirs, 0); err != nil {
		return 0, err
	}
	// Every context's run in progress first, then each is saved as it stands (none runs
	// meanwhile).
	for _, cc := range contexts {
		cc.mu.Lock()
		defer cc.mu.Unlock()
		head.Contexts = append(head.Contexts, storedContext{ID: cc.id, Language: cc.language, Cwd: cc.cwd,
			Count: cc.count, Default: cc.byDefault})
	}
	js, err := json.Marshal(head)
	if err != nil {
		return 0, err
	}
	room := &pausedRoom{left: min(s.cfg.MaxPausedBytesPerUser-theirs, s.cfg.MaxPausedBytes-held)}
	err = s.cfg.Store.SaveFrom(kind, id, meta, func(w io.Writer) error {
		room.w = w
		if err := binary.Write(room, binary.LittleEndian, uint32(len(js))); err != nil {
			return err
		}
		if _, err := room.Write(js); err != nil {
			return err
		}
		for _, cc := range contexts {
			cw := &chunkWriter{w: room}
			if cc.language != langBash { // (a shell saves nothing: its chunks are none)
				if err := saveWhole(cc.ns.Load(), cw, whole); err != nil {
					if _, lost := session.StateLost(err); lost {
						return &contextLostError{cc: cc, err: err}
					}
					return err
				}
			}
			if err := cw.Close(); err != nil {
				return err
			}
		}
		return nil
	})
	if errors.Is(err, errPausedFull) {
		return 0, s.pausedFits(held, theirs, room.n)
	}
	return room.n, err
}

// pausedRoom passes writes to w while they fit in left bytes, counting them (n).
type pausedRoom struct {
	w       io.Writer
	n, left int64
}

var errPausedFull = errors.New("the paused sandboxes' bytes are full")

func (r *pausedRoom) Write(p []byte) (int, error) {
	if r.n += int64(len(p)); r.n > r.left {
		return 0, errPausedFull
	}
	return r.w.Write(p)
}

// chunkWriter writes what is written to it as chunks (a u32 length, then its bytes) of at
// most chunkMax bytes; Close ends them with an empty one. A context's save goes so into a
// paused sandbox's blob, where the next context's follows.
type chunkWriter struct {
	w   io.Writer
	buf []byte
}

const chunkMax = 64 << 10

func (c *chunkWriter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		if c.buf == nil {
			c.buf = make([]byte, 4, 4+chunkMax)
		}
		k := min(len(p), 4+chunkMax-len(c.buf))
		c.buf = append(c.buf, p[:k]...)
		p = p[k:]
		if len(c.buf) == 4+chunkMax {
			if err := c.flush(); err != nil {
				return 0, err
			}
		}
	}
	return n, nil
}

func (c *chunkWriter) flush() error {
	if len(c.buf) <= 4 {
		return nil
	}
	binary.LittleEndian.PutUint32(c.buf, uint32(len(c.buf)-4))
	_, err := c.w.Write(c.buf)
	c.buf = c.buf[:4]
	return err
}

func (c *chunkWriter) Close() error {
	if err := c.flush(); err != nil {
		return err
	}
	_, err := c.w.Write([]byte{0, 0, 0, 0})
	return err
}

// chunkReader reads chunkWriter's chunks from r, until the empty one.
type chunkReader struct {
	r    io.Reader
	left uint32
	done bool
}

func (c *chunkReader) Read(p []byte) (int, error) {
	for c.left == 0 {
		if c.done {
			return 0, io.EOF
		}
		var n [4]byte
		if _, err := io.ReadFull(c.r, n[:]); err != nil {
			return 0, fmt.Errorf("%w: %w", errStoredCorrupt, err)
		}
		c.left = binary.LittleEndian.Uint32(n[:])
		if c.left > chunkMax {
			return 0, errStoredCorrupt
		}
		c.done = c.left == 0
	}
	k, err := c.r.Read(p[:min(len(p), int(c.left))])
	c.left -= uint32(k)
	if err == io.EOF {
		err = fmt.Errorf("%w: cut short", errStoredCorrupt)
	}
	return k, err
}

// storedEnd is when a sandbox paused now leaves the store (the store's TTL), for the API's
// endAt; a store that keeps saves for ever gives a year.
func (s *Server) storedEnd(saved time.Time) time.Time {
	if ttl := s.cfg.Store.TTL(); ttl > 0 {
		return saved.Add(ttl)
	}
	return saved.AddDate(1, 0, 0)
}

// storedOf is what the store holds of sandbox id as kind: its meta and its info; false if
// nothing, or what is there is not id's.
func (s *Server) storedOf(kind, id string) (session.Meta, storedInfo, bool) {
	meta, err := s.cfg.Store.Stat(kind, id)
	var si storedInfo
	ok := err == nil && json.Unmarshal(meta.Init, &si) == nil && si.ID == id
	return meta, si, ok
}

// fromStore is the paused sandbox id of user's that the store holds, given its place in
// memory with its access token, or nil.
func (s *Server) fromStore(id, user string) *sandbox {
	meta, si, ok := s.storedOf(session.KindSandbox, id)
	if !ok || meta.User != user {
		return nil
	}
	return s.placeSandbox(id, user, si, meta.Saved)
}

// placeSandbox is placeStored for a paused sandbox or a sleeping one (sleep.go), saved at
// saved; nil for one whose time ended asleep, whose save goes.
func (s *Server) placeSandbox(id, user string, si storedInfo, saved time.Time) *sandbox {
	switch si.state(time.Now()) {
	case "":
		if s.cfg.Store.TakeLease(context.Background(), session.KindSandbox, id, user, 0) {
			s.cfg.Store.Remove(session.KindSandbox, id)
			s.cfg.Store.ReleaseLease(session.KindSandbox, id)
		}
		return nil
	case stateRunning:
		return s.placeStored(id, user, si, session.KindSandbox, si.End)
	}
	si.Asleep = false // (its time ended asleep: a pause)
	return s.placeStored(id, user, si, session.KindSandbox, s.storedEnd(saved))
}

// placeStored gives the sandbox of user that the store holds as si under kind a place in
// memory, paused, to end at end; or the one placed there meanwhile.
func (s *Server) placeStored(id, user string, si storedInfo, kind string, end time.Time) *sandbox {
	token := si.Token
	if !s.tokens.isFor(id, token) { // (a pause of before the tokens were kept: a fresh one)
		token = s.tokens.make(id)
	}
	sb := &sandbox{id: id, token: token, user: user, template: si.Template, metadata: si.Metadata,
		started: si.Started, end: end, state: statePaused, stored: true, from: kind,
		inflight: make(chan struct{}, maxInflight), asleep: si.Asleep, autoPause: si.AutoPause,
		autoResume: si.AutoResume, life: si.Life, ports: portRules{Private: si.PortsPrivate}}
	if sb.metadata == nil {
		sb.metadata = map[string]string{}
	}
	sb.ctx, sb.cancel = context.WithCancel(context.Background())
	s.holdPausedPlace(sb) // (sb is this call's alone yet)
	sb.timer = time.AfterFunc(time.Until(sb.end), func() { s.expired(sb) })
	s.mu.Lock()
	defer s.mu.Unlock()
	if other := s.sandboxes[id]; other != nil { // (another call placed it meanwhile)
		sb.timer.Stop()
		sb.cancel()
		sb.dropPausedPlace()
		return other
	}
	s.sandboxes[id] = sb
	return sb
}

// stillStored reports whether sb, paused into the store, is still there (another server
// may have resumed or killed it); a sandbox that is not is forgotten here.
func (s *Server) stillStored(sb *sandbox) bool {
	sb.mu.Lock()
	stored := sb.stored && sb.state == statePaused
	sb.mu.Unlock()
	if !stored {
		return true
	}
	if meta, err := s.cfg.Store.Stat(session.KindSandbox, sb.id); err == nil && meta.User == sb.user {
		return true
	}
	s.forget(sb)
	return false
}

// forget drops sb's place in memory, if it is still paused into the store.
func (s *Server) forget(sb *sandbox) {
	sb.mu.Lock()
	if !sb.stored || sb.state != statePaused || sb.dead {
		sb.mu.Unlock()
		return
	}
	sb.dead = true
	sb.timer.Stop()
	sb.dropPausedPlace()
	sb.mu.Unlock()
	sb.cancel()
	s.mu.Lock()
	if s.sandboxes[sb.id] == sb {
		delete(s.sandboxes, sb.id)
	}
	s.mu.Unlock()
}

// claimStored takes a paused sandbox out of the store to resume it: its contexts, whose
// saves stream from the store in their order (close the closer once they are restored),
// or an HTTP status and why. The claim's lease is the caller's to give up.
func (s *Server) claimStored(sb *sandbox) ([]pausedContext, io.Closer, int, string) {
	_, blob, err := s.cfg.Store.ClaimOpen(sb.ctx, sb.from, sb.id, sb.user)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, nil, http.StatusNotFound, "sandbox " + sb.id + " not found (resumed or killed elsewhere, or expired)"
	case errors.Is(err, session.ErrHeld):
		return nil, nil, http.StatusConflict, "sandbox " + sb.id + " is being resumed or killed by another server"
	case err != nil:
		return nil, nil, http.StatusInternalServerError, "the sandbox could not be resumed: " + err.Error()
	}
	head, paused, err := readStored(blob)
	if err != nil {
		blob.Close()
		s.cfg.Store.ReleaseLease(sb.from, sb.id)
		return nil, nil, http.StatusInternalServerError, "the sandbox could not be resumed: " + err.Error()
	}
	sb.mu.Lock()
	sb.envs, sb.autoPause, sb.autoCold, sb.cold = head.Envs, head.AutoPause, head.AutoCold, head.Cold
	sb.ports, sb.egress, sb.tmpl = head.Ports, head.Egress, head.Template
	sb.mu.Unlock()
	return paused, blob, 0, ""
}

// readStored reads a paused sandbox's head from blob, and gives its contexts: streamed,
// each reads its save from blob in turn; else (a pause of before the streams) read whole.
func readStored(blob io.Reader) (storedHead, []pausedContext, error) {
	var n uint32
	if err := binary.Read(blob, binary.LittleEndian, &n); err != nil || n > 1<<20 {
		return storedHead{}, nil, errStoredCorrupt
	}
	js := make([]byte, n)
	if _, err := io.ReadFull(blob, js); err != nil {
		return storedHead{}, nil, errStoredCorrupt
	}
	var head storedHead
	if err := json.Unmarshal(js, &head); err != nil || len(head.Contexts) == 0 {
		return head, nil, errStoredCorrupt
	}
	if !head.Streamed {
		rest, err := io.ReadAll(blob)
		if err != nil {
			return head, nil, err
		}
		return decodeStored(append(binary.LittleEndian.AppendUint32(nil, n), append(js, rest...)...))
	}
	var paused []pausedContext
	for _, c := range head.Contexts {
		paused = append(paused, pausedContext{id: c.ID, language: c.Language, cwd: c.Cwd, count: c.Count,
			from: &chunkReader{r: blob}, byDefault: c.Default})
	}
	return head, paused, nil
}

// removeStored ends a sandbox paused into the store: its save goes, once no other server
// is resuming it. It returns an HTTP status and why when it cannot.
func (s *Server) removeStored(sb *sandbox) (int, string) {
	if !s.cfg.Store.TakeLease(sb.ctx, session.KindSandbox, sb.id, sb.user, session.LeaseWait) {
		return http.StatusConflict, "sandbox " + sb.id + " is being resumed by another server"
	}
	defer s.cfg.Store.ReleaseLease(session.KindSandbox, sb.id)
	if _, err := s.cfg.Store.Stat(session.KindSandbox, sb.id); err != nil {
		s.forget(sb)
		return http.StatusNotFound, "sandbox " + sb.id + " not found"
	}
	s.cfg.Store.Remove(session.KindSandbox, sb.id)
	s.forget(sb)
	s.logf("minipy-mcp: E2B sandbox %s of user %q ended: killed through the API while paused", sb.id, sb.user)
	return 0, ""
}

// storedSandboxes lists user's sandboxes paused into the store, as the API lists them.
func (s *Server) storedSandboxes(user string) []listedSandbox {
	var out []listedSandbox
	now := time.Now()
	for _, one := range s.cfg.Store.List(session.KindSandbox) {
		var si storedInfo
		if one.User != user || json.Unmarshal(one.Init, &si) != nil {
			continue
		}
		state, end := si.state(now), s.storedEnd(one.Saved)
		switch state {
		case "":
			continue // (it ended asleep)
		case stateRunning:
			end = si.End
		}
		if si.Metadata == nil {
			si.Metadata = map[string]string{}
		}
		out = append(out, listedSandbox{TemplateID: si.Template, SandboxID: si.ID, ClientID: clientID,
			StartedAt: si.Started.UTC(), EndAt: end.UTC(), CPUCount: s.cfg.CPUCount,
			MemoryMB: s.cfg.MemoryMB, DiskSizeMB: s.cfg.DiskMB, Metadata: si.Metadata, State: state,
			EnvdVersion: EnvdVersion, VolumeMounts: []any{}})
	}
	return out
}
