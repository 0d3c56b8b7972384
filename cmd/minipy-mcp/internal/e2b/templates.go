package e2b

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/templates"
)

// E2B's templates (the SDK's Template.build, buildInBackground, getBuildStatus, exists,
// delete): POST /v3/templates names a template and gives a build of it; the SDK asks for
// each COPY step's files (GET /templates/{id}/files/{hash}) and uploads those not held to
// the signed URL it gets (PUT, without its key, as to E2B's storage); POST
// /v2/templates/{id}/builds/{build} starts the build, which runs its steps in a sandbox of
// the user's (internal/templates); GET .../status gives its status and log. A template
// built is kept as a snapshot of that sandbox under the template's id and name (E2B's
// snapshots are templates, and Sandbox.create(name) starts one), with its environment,
// working directory and start command: a sandbox of it runs the start command and waits for
// its ready command before its create returns (where E2B resumes the build's memory, with
// the process running). A template's build and bytes count as a snapshot's (maxSnapshots,
// MaxPausedBytes); builds are bounded server-wide and per user, and a build's sandbox is
// the user's, under the same caps, but listed nowhere.

// Bounds of the builds.
const (
	maxBuildsRunning = 4  // at once, server-wide
	maxBuildsPerUser = 2  // at once, a user's
	maxBuildsKept    = 10 // of a template, for their status
)

// templateRecord is one of a user's templates: its name, and its builds, newest last.
type templateRecord struct {
	id, user, name string
	tags           []string
	builds         []*templates.Build
	cancel         context.CancelFunc // its build running, if one is
}

// templateOf is user's template of id (s.mu held), or nil.
func (s *Server) templateOf(user, id string) *templateRecord {
	if t := s.templates[id]; t != nil && t.user == user {
		return t
	}
	return nil
}

// requestBuild is POST /v3/templates: a build of the template of that name (a new one,
// or the user's of that name), to start (202).
func (s *Server) requestBuild(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Name  string   `json:"name"`
		Alias string   `json:"alias"`
		Tags  []string `json:"tags"`
	}
	if !readJSON(w, r, 1<<16, &req) {
		return
	}
	name, tag, _ := strings.Cut(cmp.Or(req.Name, req.Alias), ":")
	if why := snapshotName(name); why != "" {
		writeError(w, http.StatusBadRequest, strings.Replace(why, "snapshot name", "template name", 1))
		return
	}
	tags := slices.Clone(req.Tags)
	if tag != "" {
		tags = append(tags, tag)
	}
	for _, tag := range tags {
		if why := tagName(tag); why != "" {
			writeError(w, http.StatusBadRequest, why)
			return
		}
	}
	user := userOf(r)
	s.mu.Lock()
	var t *templateRecord
	held := 0
	for _, one := range s.templates {
		if one.user == user {
			held++
			if one.name == name {
				t = one
			}
		}
	}
	if t == nil && held >= maxSnapshots {
		s.mu.Unlock()
		writeError(w, http.StatusTooManyRequests, fmt.Sprintf("you hold %d templates, the most: delete one first", held))
		return
	}
	if t == nil {
		t = &templateRecord{id: randomID(), user: user, name: name}
		s.templates[t.id] = t
	}
	if len(tags) == 0 {
		tags = []string{"default"} // (E2B's tag of a build that names none)
	}
	t.tags = tags
	b := templates.NewBuild(t.id, randomID())
	t.builds = append(t.builds, b)
	if len(t.builds) > maxBuildsKept && t.builds[0].Status() != templates.Building {
		t.builds = t.builds[1:]
	}
	s.mu.Unlock()
	writeJSON(w, http.StatusAccepted, map[string]any{"templateID": t.id, "buildID": b.ID, "public": false,
		"names": []string{name}, "aliases": []string{name}, "tags": append([]string{}, tags...)})
}

// uploadLink is GET /templates/{id}/files/{hash}: whether the user's files of that hash
// are held, and the signed URL that takes them (201).
func (s *Server) uploadLink(w http.ResponseWriter, r *http.Request) {
	id, hash := r.PathValue("id"), r.PathValue("hash")
	s.mu.Lock()
	t := s.templateOf(userOf(r), id)
	s.mu.Unlock()
	if t == nil {
		writeError(w, http.StatusNotFound, "template "+echo(id)+" not found")
		return
	}
	if !templates.ValidHash(hash) {
		writeError(w, http.StatusBadRequest, "files hash "+echo(hash)+": hex digits")
		return
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	url := scheme + "://" + r.Host + "/templates/" + id + "/files/" + hash + "?" + s.uploads.Sign(id, hash)
	writeJSON(w, http.StatusCreated, map[string]any{"present": s.uploads.Has(t.user, hash), "url": url})
}

// uploadFiles is PUT /templates/{id}/files/{hash} at a URL that uploadLink signed: the
// files are kept for the template's user (200). No API key: the signature is the
// authority, for that template and hash alone, until it expires.
func (s *Server) uploadFiles(w http.ResponseWriter, r *http.Request) {
	id, hash, q := r.PathValue("id"), r.PathValue("hash"), r.URL.Query()
	s.mu.Lock()
	t := s.templates[id]
	s.mu.Unlock()
	if t == nil || !s.uploads.Check(id, hash, q.Get("expires"), q.Get("signature")) {
		writeError(w, http.StatusForbidden, "the upload URL is not signed for these files, or has expired")
		return
	}
	err := s.uploads.Put(t.user, hash, http.MaxBytesReader(w, r.Body, s.cfg.MaxUpload))
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge) || errors.Is(err, templates.ErrUploadTooLarge):
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("the files are larger than the %d bytes the "+
			"server takes", s.cfg.MaxUpload))
	case errors.Is(err, templates.ErrUploadsFull):
		writeError(w, http.StatusInsufficientStorage, err.Error())
	case err != nil:
		writeError(w, http.StatusBadRequest, "the upload: "+err.Error())
	default:
		w.WriteHeader(http.StatusOK)
	}
}

// buildStatus is GET /templates/{id}/builds/{build}/status: the build's status and its
// log from logsOffset on.
func (s *Server) buildStatus(w http.ResponseWriter, r *http.Request) {
	_, b := s.buildOf(userOf(r), r.PathValue("id"), r.PathValue("build"))
	if b == nil {
		writeError(w, http.StatusNotFound, "build "+echo(r.PathValue("build"))+" of template "+echo(r.PathValue("id"))+
			" not found")
		return
	}
	offset := 0
	if v := r.URL.Query().Get("logsOffset"); v != "" {
		var err error
		if offset, err = strconv.Atoi(v); err != nil || offset < 0 {
			writeError(w, http.StatusBadRequest, "logsOffset: a number from 0, not "+echo(v))
			return
		}
	}
	writeJSON(w, http.StatusOK, b.Info(offset))
}

// buildOf is user's template id and its build, or nils.
func (s *Server) buildOf(user, id, build string) (*templateRecord, *templates.Build) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.templateOf(user, id)
	if t == nil {
		return nil, nil
	}
	for _, b := range t.builds {
		if b.ID == build {
			return t, b
		}
	}
	return nil, nil
}

// startBuild is POST /v2/templates/{id}/builds/{build}: the build's steps, checked, start
// running in a sandbox of the user's (202); the status says how it goes.
func (s *Server) startBuild(w http.ResponseWriter, r *http.Request) {
	user := userOf(r)
	t, b := s.buildOf(user, r.PathValue("id"), r.PathValue("build"))
	if b == nil {
		writeError(w, http.StatusNotFound, "build "+echo(r.PathValue("build"))+" of template "+echo(r.PathValue("id"))+
			" not found: ask for one first (POST /v3/templates)")
		return
	}
	var spec templates.Spec
	if !readJSON(w, r, 8<<20, &spec) {
		return
	}
	base, err := spec.Base(BaseTemplate, Templates)
	if err != nil {
		writeError(w, http.StatusBadRequest, "the template cannot be built: "+err.Error())
		return
	}
	var from *snapshot
	if !slices.Contains(Templates, base) {
		if from = s.snapshotOf(user, base); from == nil {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("fromTemplate %q: no template of that name: minipy serves "+
				"%s, and yours", echo(base), strings.Join(Templates, ", ")))
			return
		}
	}
	ctx, why := s.admitBuild(t)
	if why != "" {
		writeError(w, http.StatusTooManyRequests, why)
		return
	}
	if !b.Begin() {
		s.buildEnded(t)
		writeError(w, http.StatusConflict, "build "+b.ID+" has started already")
		return
	}
	go s.runBuild(ctx, t, b, &spec, base, from)
	w.WriteHeader(http.StatusAccepted)
}

// admitBuild takes a place among the builds running for a build of t, if there is one: its
// context, which Close and the template's delete end; else why not.
func (s *Server) admitBuild(t *templateRecord) (context.Context, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	running, theirs := 0, 0
	for _, one := range s.templates {
		if one.cancel != nil {
			running++
			if one.user == t.user {
				theirs++
			}
		}
	}
	switch {
	case s.closed:
		return nil, refusedClosed
	case t.cancel != nil:
		return nil, "template " + t.name + " is being built: wait for its build to end"
	case theirs >= maxBuildsPerUser:
		return nil, fmt.Sprintf("you run %d builds, the most at once: wait for one to end", theirs)
	case running >= maxBuildsRunning:
		return nil, fmt.Sprintf("the server runs %d builds, the most at once: retry in a moment", running)
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.MaxTimeout)
	t.cancel = cancel
	s.building.Add(1)
	return ctx, ""
}

// buildEnded gives t's place among the builds running back.
func (s *Server) buildEnded(t *templateRecord) {
	s.mu.Lock()
	cancel := t.cancel
	t.cancel = nil
	s.mu.Unlock()
	if cancel != nil {
		cancel()
		s.building.Done()
	}
}

// runBuild runs build b of t in a sandbox of base (a served template) or from (one of the
// user's), then keeps the sandbox as the template, and ends the build once its sandbox is
// gone and its place among the builds given back: a client that learns of its end may
// start another at once.
func (s *Server) runBuild(ctx context.Context, t *templateRecord, b *templates.Build, spec *templates.Spec,
	base string, from *snapshot) {
	step, err := s.build(ctx, t, b, spec, base, from)
	s.buildEnded(t)
	if err == nil {
		s.logf("minipy-mcp: E2B template %s (%s) of user %q built (build %s)", t.id, t.name, t.user, b.ID)
	}
	b.End(step, err)
}

// build is runBuild's work: the step that failed and why, or none.
func (s *Server) build(ctx context.Context, t *templateRecord, b *templates.Build, spec *templates.Spec,
	base string, from *snapshot) (string, error) {
	b.Log("info", "base", "Starting from template "+base+" (minipy's image: the server's)")
	sb, code, why := s.buildSandbox(t.user, base, from)
	if sb == nil {
		return "base", fmt.Errorf("the build's sandbox did not start (%d): %s", code, why)
	}
	defer s.kill(sb, "its template's build ended")
	stop := context.AfterFunc(ctx, func() { s.kill(sb, "its template's build was stopped") })
	defer stop()
	var start templates.Result
	if sb.tmpl != nil {
		start = *sb.tmpl
	}
	start.Envs = sb.envs
	res, err := b.Run(ctx, spec, start, sandboxMachine{sb: sb, rootUser: s.cfg.RootUser}, func(hash string) ([]byte, bool) {
		return s.uploads.Get(t.user, hash)
	})
	if err == nil {
		err = s.finalize(ctx, sb, b, res)
	}
	if err != nil {
		var se *templates.StepError
		if errors.As(err, &se) {
			return se.Step, err
		}
		return "base", err
	}
	b.Log("info", "finalize", "Saving the template's files")
	s.mu.Lock()
	deleted := s.templates[t.id] != t
	s.mu.Unlock()
	if deleted || ctx.Err() != nil { // (deleted, or the server closing, meanwhile: nothing kept)
		return "finalize", errors.New("the build was stopped: its template was deleted, or the server is closing")
	}
	if err := s.keepTemplate(sb, t, b.ID, res); err != nil {
		return "finalize", err
	}
	return "", nil
}

// finalize runs the template's start command and waits for its ready check (b.Finalize) in
// a copy of the build's sandbox (its contexts saved and restored in a sandbox of their own,
// as a fork's), which is not kept: the template keeps the sandbox as its steps left it, so
// that what the start command writes (the file a waitForFile check waits for) is not in a
// new sandbox before its own start command ran (E2B's sandboxes resume with the process
// running; minipy's run it again).
func (s *Server) finalize(ctx context.Context, sb *sandbox, b *templates.Build, res templates.Result) error {
	if res.StartCmd == "" {
		return nil
	}
	sb.mu.Lock()
	contexts := slices.Clone(sb.contexts)
	sb.mu.Unlock()
	saved, _, err := saveContexts(contexts, false)
	var c *sandbox
	if err == nil {
		var why string
		if c, _, why = s.copyOf(sb, saved, s.cfg.MaxTimeout); c == nil {
			err = errors.New(why)
		}
	}
	if err != nil {
		return &templates.StepError{Step: "finalize", Err: fmt.Errorf("the build's sandbox could not be copied to "+
			"run its start command in: %w", err)}
	}
	defer s.kill(c, "its template's start command was checked")
	stop := context.AfterFunc(ctx, func() { s.kill(c, "its template's build was stopped") })
	defer stop()
	return b.Finalize(ctx, sandboxMachine{sb: c, rootUser: s.cfg.RootUser}, res)
}

// buildSandbox starts the sandbox a build runs in: a sandbox of user (under the user's
// caps), of the served template base or from the user's template from, known to no list.
func (s *Server) buildSandbox(user, base string, from *snapshot) (*sandbox, int, string) {
	if from != nil {
		return s.snapshotSandbox(user, from, &createRequest{}, s.cfg.MaxTimeout)
	}
	sb := s.sandboxFor(user, base, nil, nil, false, s.cfg.MaxTimeout)
	cc, code, why := s.newContext(sb, "python", "")
	if cc == nil {
		sb.cancel()
		return nil, code, why
	}
	sb.contexts = []*codeContext{cc}
	return sb, 0, ""
}

// keepTemplate keeps the build's sandbox as a snapshot of t's, what res says with it,
// named by t's name and each of its tags as name:tag (the names move to it); t's earlier
// builds that no name holds any more are dropped.
func (s *Server) keepTemplate(sb *sandbox, t *templateRecord, buildID string, res templates.Result) error {
	if cc := sb.context(""); cc != nil {
		cc.mu.Lock()
		cc.cwd = res.Workdir // (where the template's sandboxes' code starts)
		cc.mu.Unlock()
	}
	sb.mu.Lock()
	contexts := slices.Clone(sb.contexts)
	sb.mu.Unlock()
	names := []string{t.name}
	for _, tag := range t.tags {
		names = append(names, t.name+":"+tag)
	}
	sn := &snapshot{id: randomID(), user: t.user, sandboxID: sb.id, template: sb.template, envs: res.Envs,
		names: names, created: time.Now(), stored: s.cfg.Store != nil, start: &res, templateID: t.id, buildID: buildID}
	if code, why := s.keepSnapshot(sb, sn, contexts); code != 0 {
		return errors.New(why)
	}
	for _, old := range s.templateSnapshots(t.user, t.id) {
		if old.id != sn.id && len(old.names) == 0 {
			s.dropSnapshot(old)
		}
	}
	return nil
}

// templateSnapshots is user's builds of the template of id or name ref (name:tag: that
// build alone).
func (s *Server) templateSnapshots(user, ref string) []*snapshot {
	var out []*snapshot
	for _, sn := range s.userSnapshots(user) {
		if sn.templateID != "" && (sn.templateID == ref || slices.ContainsFunc(sn.names, func(n string) bool {
			return n == ref || !strings.Contains(ref, ":") && strings.HasPrefix(n, ref+":")
		})) {
			out = append(out, sn)
		}
	}
	return out
}

// startTemplate runs the start command of sb's template, if it has one, and waits for its
// ready command (templates.ReadyTimeout at most): 0, or why the sandbox is not ready.
func (s *Server) startTemplate(sb *sandbox) (int, string) {
	if sb.tmpl == nil || sb.tmpl.StartCmd == "" {
		return 0, ""
	}
	res := *sb.tmpl
	res.Envs = sb.envs
	m := sandboxMachine{sb: sb, rootUser: s.cfg.RootUser}
	if err := m.Start(res.Start()); err != nil {
		return http.StatusInternalServerError, "the template's start command did not start: " + err.Error()
	}
	if err := templates.WaitReady(sb.ctx, m, res, func(string) {}); err != nil {
		return http.StatusInternalServerError, "the sandbox is not ready: " + err.Error()
	}
	return 0, ""
}

// forgetTemplate forgets user's template of id or name ref (its delete) and stops its
// build, if one runs; it reports whether there was one.
func (s *Server) forgetTemplate(user, ref string) bool {
	s.mu.Lock()
	var cancel context.CancelFunc
	found := false
	for id, t := range s.templates {
		if t.user == user && (t.id == ref || t.name == ref) {
			delete(s.templates, id)
			cancel, found = t.cancel, true
		}
	}
	s.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	return found
}
