package e2b

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/session"
	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/templates"
)

// E2B's snapshots (sandbox.createSnapshot, Sandbox.listSnapshots, Sandbox.deleteSnapshot,
// and Sandbox.create(snapshotId)): a snapshot is a sandbox's code contexts saved as a
// pause saves them (variables and files, not threads or processes), after the runs in
// progress; the sandbox goes on. New sandboxes start from it, each with a copy of its
// contexts, the sandbox's template and environment (the create request's envs on top), as
// often as its user likes. A snapshot is its user's alone, outlives its sandbox, and lives
// until it is deleted: its bytes count with the paused sandboxes' (Config.MaxPausedBytes, a
// quarter of them per user), and a user holds at most maxSnapshots. Without a store it is
// held in the server's memory, and the server's end forgets it; with one (Config.Store),
// it is sealed there (snapstore.go), and outlives the server.

// maxSnapshots caps one user's snapshots.
const maxSnapshots = 100

// snapshot is one of a user's snapshots.
type snapshot struct {
	id, user, sandboxID, template string
	names                         []string
	envs                          map[string]string
	saved                         []pausedContext // in memory; none when stored
	size                          int64
	created                       time.Time
	stored                        bool // in Config.Store (snapstore.go)
	// start is what a template's build left (templates.go): its sandboxes' working
	// directory and start command; nil for a snapshot of a sandbox. Stored snapshots read
	// it when they are opened.
	start *templates.Result
	// templateID is the template whose build it is (templates.go), which is listed with
	// the templates, not the snapshots; "" for a snapshot of a sandbox. buildID is that
	// build's (its tags', tags.go).
	templateID, buildID string
}

// snapshotBody is a snapshot as the API gives it (E2B's SnapshotInfo).
type snapshotBody struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
}

func (sn *snapshot) body() snapshotBody {
	return snapshotBody{SnapshotID: sn.id, Names: append([]string{}, sn.names...)}
}

// snapshotName checks a snapshot's name: 1 to 128 letters, digits and ._-/:, and not a
// served template's (which a create names first).
func snapshotName(name string) string {
	if !nameOf(name, "/:") {
		return fmt.Sprintf("snapshot name %q: 1 to 128 letters, digits and . _ - / :", echo(name))
	}
	if slices.Contains(Templates, name) {
		return fmt.Sprintf("snapshot name %q is a template's: name it otherwise", name)
	}
	return ""
}

// nameOf reports whether s is a name of 1 to 128 letters, digits, '.', '_', '-' and more.
func nameOf(s, more string) bool {
	return s != "" && len(s) <= 128 &&
		strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-"+more) == ""
}

// createSnapshot is POST /sandboxes/{id}/snapshots: a snapshot of sb (201, its body).
func (s *Server) createSnapshot(w http.ResponseWriter, r *http.Request, sb *sandbox) {
	var req struct {
		Name string `json:"name"`
	}
	if !readJSON(w, r, 1<<16, &req) {
		return
	}
	if req.Name != "" {
		if why := snapshotName(req.Name); why != "" {
			writeError(w, http.StatusBadRequest, why)
			return
		}
	}
	if !sb.running() {
		writeError(w, http.StatusConflict, "sandbox "+sb.id+" is paused, or being paused or resumed: resume it first")
		return
	}
	if held := len(s.userSnapshots(sb.user)); held >= maxSnapshots {
		writeError(w, http.StatusTooManyRequests, fmt.Sprintf("you hold %d snapshots, the most: delete one first", held))
		return
	}
	sb.mu.Lock()
	contexts := slices.Clone(sb.contexts)
	sn := &snapshot{id: randomID(), user: sb.user, sandboxID: sb.id, template: sb.template, envs: maps.Clone(sb.envs),
		created: time.Now(), stored: s.cfg.Store != nil}
	sb.mu.Unlock()
	if req.Name != "" {
		sn.names = []string{req.Name}
	}
	if code, why := s.keepSnapshot(sb, sn, contexts); code != 0 {
		writeError(w, code, why)
		return
	}
	s.mu.Lock()
	body := sn.body() // (under s.mu: another snapshot may take its name)
	s.mu.Unlock()
	s.logf("minipy-mcp: E2B snapshot %s of sandbox %s of user %q (%d bytes)", sn.id, sb.id, sb.user, sn.size)
	writeJSON(w, http.StatusCreated, body)
}

// keepSnapshot saves sb's contexts as sn, in the store or in the server's memory, sn's
// name moving to it: 0, or the status and why it is not kept.
func (s *Server) keepSnapshot(sb *sandbox, sn *snapshot, contexts []*codeContext) (int, string) {
	var err error
	if sn.stored {
		if err = s.storeSnapshot(sb, sn, contexts); err == nil {
			return 0, ""
		}
		if sb.ctx.Err() == nil && errors.Is(err, errPausedFull) {
			return http.StatusInsufficientStorage, "the snapshot could not be kept: " + err.Error()
		}
	} else {
		sn.saved, sn.size, err = saveContexts(contexts, false)
	}
	if err != nil {
		if sb.ctx.Err() != nil {
			return http.StatusNotFound, "sandbox " + sb.id + " was killed"
		}
		return http.StatusInternalServerError, "the snapshot could not be made: " + err.Error()
	}
	if err := s.reservePaused(sb.user, sn.size); err != nil {
		return http.StatusInsufficientStorage, "the snapshot could not be kept: " + err.Error()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, other := range s.snapshotsOf(sb.user) { // (the name moves to the new snapshot, as E2B's does to a new build)
		other.names = slices.DeleteFunc(other.names, func(n string) bool { return slices.Contains(sn.names, n) })
	}
	s.snapshots[sn.id] = sn
	return 0, ""
}

// snapshotsOf is user's snapshots, newest first (s.mu held: their names change under it).
func (s *Server) snapshotsOf(user string) []*snapshot {
	var out []*snapshot
	for _, sn := range s.snapshots {
		if sn.user == user {
			out = append(out, sn)
		}
	}
	slices.SortFunc(out, func(a, b *snapshot) int {
		return -listPlace{a.created, a.id}.compare(listPlace{b.created, b.id})
	})
	return out
}

// userSnapshots is user's snapshots, newest first: in the store, or in memory (copies,
// taken under s.mu: their names change under it).
func (s *Server) userSnapshots(user string) []*snapshot {
	if s.cfg.Store != nil {
		return s.storedSnapshots(user)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*snapshot
	for _, sn := range s.snapshotsOf(user) {
		c := *sn
		c.names = slices.Clone(sn.names)
		out = append(out, &c)
	}
	return out
}

// snapshotOf is user's snapshot of id or name, or nil; none for a served template's name
// (a create of one looks for no snapshot). In the store, an id is one save's head to read;
// a name, the user's snapshots' heads.
func (s *Server) snapshotOf(user, ref string) *snapshot {
	if ref == "" || slices.Contains(Templates, ref) {
		return nil
	}
	if s.cfg.Store != nil {
		if sn := s.storedSnapshot(user, ref); sn != nil {
			return sn
		}
	}
	for _, sn := range s.userSnapshots(user) {
		if sn.id == ref || slices.Contains(sn.names, ref) {
			return sn
		}
	}
	return nil
}

// listSnapshots is GET /snapshots: the caller's snapshots, newest first, those of a
// sandbox (sandboxID) or of a name or id (name), a page of limit (1 to 100) after
// nextToken.
func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit := 100
	if v := q.Get("limit"); v != "" {
		var err error
		if limit, err = strconv.Atoi(v); err != nil || limit < 1 || limit > 100 {
			writeError(w, http.StatusBadRequest, "limit: from 1 to 100, not "+echo(v))
			return
		}
	}
	from, why := readListToken(q.Get("nextToken"))
	if why != "" {
		writeError(w, http.StatusBadRequest, why)
		return
	}
	all := s.userSnapshots(userOf(r))
	out := []snapshotBody{}
	var last *snapshot
	for _, sn := range all {
		at := listPlace{sn.created, sn.id}
		if sn.templateID != "" || from != nil && at.compare(*from) >= 0 ||
			q.Get("sandboxID") != "" && sn.sandboxID != q.Get("sandboxID") ||
			q.Get("name") != "" && sn.id != q.Get("name") && !slices.Contains(sn.names, q.Get("name")) {
			continue
		}
		if len(out) == limit {
			w.Header().Set("X-Next-Token", listPlace{last.created, last.id}.token())
			break
		}
		out, last = append(out, sn.body()), sn
	}
	writeJSON(w, http.StatusOK, out)
}

// deleteSnapshot is DELETE /templates/{id}: the caller's template of that id or name goes,
// every build of it and its build running (by name:tag, that build alone), or else the
// caller's snapshot of that id or name (204); 404 when there is neither.
func (s *Server) deleteSnapshot(w http.ResponseWriter, r *http.Request) {
	user, ref := userOf(r), r.PathValue("id")
	sn := s.snapshotOf(user, ref)
	building := s.forgetTemplate(user, ref)
	drop := s.templateSnapshots(user, ref) // (a template's builds, all its tags: by its id or name)
	if len(drop) == 0 && sn != nil {
		drop = []*snapshot{sn}
	}
	if len(drop) == 0 && !building {
		writeError(w, http.StatusNotFound, "template "+echo(ref)+" not found: minipy's templates are "+
			"those you built and your snapshots (the image is the server's)")
		return
	}
	for _, sn := range drop {
		s.dropSnapshot(sn)
	}
	w.WriteHeader(http.StatusNoContent)
}

// dropSnapshot forgets sn (none: nothing), in the store or in memory.
func (s *Server) dropSnapshot(sn *snapshot) {
	if sn == nil {
		return
	}
	s.dropSpares(func(sp *spare) bool { return sp.snap == sn.id })
	if sn.stored {
		s.cfg.Store.Remove(session.KindSnapshot, sn.id)
		return
	}
	s.mu.Lock()
	_, there := s.snapshots[sn.id]
	delete(s.snapshots, sn.id)
	s.mu.Unlock()
	if there {
		s.releasePaused(sn.user, sn.size)
	}
}

// fromSnapshot starts a sandbox of user from sn, as req asks (its metadata, envs on top
// of the snapshot's, autoPause), to live life; a template's runs its start command, and
// is ready first.
func (s *Server) fromSnapshot(user string, sn *snapshot, req *createRequest, life time.Duration) (*sandbox, int, string) {
	if sb := s.takeSpare(user, sn, req, life); sb != nil {
		s.logf("minipy-mcp: E2B sandbox %s of user %q created from a warm spare of snapshot %s (%v)", sb.id, user, sn.id, life)
		s.refillSpare(user, sn)
		return sb, 0, ""
	}
	sb, code, why := s.snapshotSandbox(user, sn, req, life)
	if sb == nil {
		return nil, code, why
	}
	if code, why := s.startTemplate(sb); code != 0 {
		sb.cancel()
		for _, cc := range sb.contexts {
			cc.close()
		}
		return nil, code, why
	}
	if code, why := s.register(sb, life); code != 0 {
		return nil, code, why
	}
	s.logf("minipy-mcp: E2B sandbox %s of user %q created from snapshot %s (%v)", sb.id, user, sn.id, life)
	s.refillSpare(user, sn)
	return sb, 0, ""
}

// snapshotSandbox is a sandbox of user from sn, as fromSnapshot's, not yet registered nor
// started.
func (s *Server) snapshotSandbox(user string, sn *snapshot, req *createRequest, life time.Duration) (*sandbox, int, string) {
	saved, start := sn.saved, sn.start
	if sn.stored {
		var from io.Closer
		var err error
		var head storedHead
		if head, saved, from, err = s.openSnapshot(sn); errors.Is(err, fs.ErrNotExist) {
			return nil, http.StatusNotFound, "snapshot " + sn.id + " not found (deleted meanwhile, or expired)"
		} else if err != nil {
			return nil, http.StatusInternalServerError, "the snapshot could not be opened: " + err.Error()
		}
		defer from.Close()
		sn.envs, start = head.Envs, head.Template
	}
	envs := maps.Clone(sn.envs)
	if envs == nil {
		envs = map[string]string{}
	}
	maps.Copy(envs, req.EnvVars)
	sb := s.sandboxFor(user, sn.template, req.Metadata, envs, req.AutoPause != nil && *req.AutoPause, life)
	sb.spare = req.spare
	sb.autoCold = req.AutoPauseMemory != nil && !*req.AutoPauseMemory
	sb.ports, sb.egress, sb.tmpl = req.Network.rules(), req.egress(), start
	contexts, code, why := s.restoreContexts(sb, saved)
	if code != 0 {
		sb.cancel()
		return nil, code, why
	}
	sb.contexts = contexts
	return sb, 0, ""
}

// templateAlias is GET /templates/aliases/{alias} (Template.exists): the served templates
// are public, a snapshot's name is its user's (E2B's snapshots are templates, their names
// aliases); anything else is 404.
func (s *Server) templateAlias(w http.ResponseWriter, r *http.Request) {
	alias := r.PathValue("alias")
	if slices.Contains(Templates, alias) {
		writeJSON(w, http.StatusOK, map[string]any{"templateID": alias, "public": true})
		return
	}
	if sn := s.snapshotOf(userOf(r), alias); sn != nil && slices.Contains(sn.names, alias) {
		writeJSON(w, http.StatusOK, map[string]any{"templateID": sn.id, "public": false})
		return
	}
	writeError(w, http.StatusNotFound, "template alias "+echo(alias)+" not found: minipy serves "+
		strings.Join(Templates, ", ")+" and your templates and snapshots")
}
