package e2b

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/session"
)

// routes sets up the API's and the sandbox ports' handlers.
func (s *Server) routes() {
	s.api = http.NewServeMux()
	for _, prefix := range []string{"", "/v2"} {
		s.api.HandleFunc("POST "+prefix+"/sandboxes", s.authed(s.create))
		s.api.HandleFunc("GET "+prefix+"/sandboxes", s.authed(s.list))
		s.api.HandleFunc("POST "+prefix+"/sandboxes/{id}/connect", s.authed(s.owned(s.awake(s.connect))))
	}
	s.api.HandleFunc("GET "+replicaListPath, s.authed(s.replicaList))
	s.api.HandleFunc("GET "+replicaSignedPath, s.replicaSigned) // (a signed URL carries no key: the forward's mark is the check)
	s.api.HandleFunc("GET /sandboxes/{id}", s.authed(s.owned(s.info)))
	s.api.HandleFunc("DELETE /sandboxes/{id}", s.authed(s.owned(s.remove)))
	s.api.HandleFunc("POST /sandboxes/{id}/timeout", s.authed(s.owned(s.awake(s.timeout))))
	s.api.HandleFunc("PUT /sandboxes/{id}/network", s.authed(s.owned(s.awake(s.updateNetwork))))
	s.api.HandleFunc("POST /sandboxes/{id}/pause", s.authed(s.owned(s.awake(s.pauseRequest))))
	// A fork's body is checked before its key, as E2B's schema check (kin-openapi's) runs
	// before its security check: the SDK's test forks with a made-up key and count 0.
	s.api.HandleFunc("POST /sandboxes/{id}/fork", s.fork)
	s.api.HandleFunc("POST /sandboxes/{id}/snapshots", s.authed(s.owned(s.awake(s.createSnapshot))))
	s.api.HandleFunc("GET /snapshots", s.authed(s.listSnapshots))
	s.api.HandleFunc("GET /sandboxes/{id}/metrics", s.authed(s.owned(s.metricsRequest)))
	s.api.HandleFunc("DELETE /templates/{id}", s.authed(s.deleteSnapshot))
	s.api.HandleFunc("GET /templates/aliases/{alias}", s.authed(s.templateAlias))
	s.api.HandleFunc("POST /v3/templates", s.authed(s.requestBuild))
	s.api.HandleFunc("GET /templates/{id}/files/{hash}", s.authed(s.uploadLink))
	s.api.HandleFunc("PUT /templates/{id}/files/{hash}", s.uploadFiles) // (signed: uploadLink's URL)
	s.api.HandleFunc("POST /v2/templates/{id}/builds/{build}", s.authed(s.startBuild))
	s.api.HandleFunc("GET /templates/{id}/builds/{build}/status", s.authed(s.buildStatus))
	s.api.HandleFunc("POST /templates/tags", s.authed(s.assignTags))
	s.api.HandleFunc("DELETE /templates/tags", s.authed(s.removeTags))
	// (GET /templates/{id}/tags, which a pattern of its own would make ambiguous with
	// /templates/aliases/{alias} for /templates/aliases/tags: that stays the alias "tags")
	s.api.HandleFunc("GET /templates/{id}/{what}", s.authed(s.listTags))
	s.api.HandleFunc("POST /sandboxes/{id}/resume", s.authed(s.owned(s.awake(s.connect)))) // (E2B's former resume)
	s.api.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if s.cfg.Ops != nil && r.Method == http.MethodGet && (r.URL.Path == "/healthz" || r.URL.Path == "/readyz" ||
			r.URL.Path == "/metrics") {
			s.cfg.Ops.ServeHTTP(w, r)
			return
		}
		writeError(w, http.StatusNotFound, r.Method+" "+echo(r.URL.Path)+" is not part of what minipy serves of E2B's API "+
			"(docs/e2b.md lists what is)")
	})
	s.interpreterRoutes()
	s.envdRoutes()
}

type userKey struct{}

// authed answers 401 to an API call without a valid API key, and gives next the key's user.
func (s *Server) authed(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		user := ""
		if s.cfg.Authenticate != nil {
			var ok bool
			if user, ok = s.cfg.Authenticate(r.Header.Get("X-API-KEY")); !ok {
				s.cfg.Metrics.Unauthorized()
				writeError(w, http.StatusUnauthorized, "Invalid API key: give one of the server's -tokens (E2B_API_KEY)")
				return
			}
		}
		next(w, r.WithContext(context.WithValue(r.Context(), userKey{}, user)))
	}
}

func userOf(r *http.Request) string { return r.Context().Value(userKey{}).(string) }

// owned finds the sandbox {id} of the caller's: another user's is as missing as a killed
// one. With a store, a paused sandbox is found there (and one that left it, here).
func (s *Server) owned(next func(http.ResponseWriter, *http.Request, *sandbox)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id, user := r.PathValue("id"), userOf(r)
		sb := s.lookup(id)
		if s.cfg.Store != nil {
			if sb != nil && sb.user == user && !s.stillStored(sb) {
				sb = nil
			}
			if sb == nil {
				sb = s.fromStore(id, user)
			}
		}
		if sb == nil && s.forward(w, r, id) {
			return // (another replica runs it)
		}
		if sb == nil {
			sb = s.recoverRunning(id, func(_ storedInfo, meta session.Meta) bool { return meta.User == user })
		}
		if sb == nil || sb.user != user {
			writeError(w, http.StatusNotFound, "sandbox "+echo(r.PathValue("id"))+" not found")
			return
		}
		next(w, r, sb)
	}
}

// createRequest is the API's body of a new sandbox (E2B's NewSandbox).
type createRequest struct {
	TemplateID string            `json:"templateID"`
	Timeout    *int              `json:"timeout"` // seconds
	Metadata   map[string]string `json:"metadata"`
	EnvVars    map[string]string `json:"envVars"`
	AutoPause  *bool             `json:"autoPause"`
	// AutoPauseMemory false makes the timeout's pause keep the files alone (E2B's
	// lifecycle onTimeout keepMemory: false): its resume is a new boot.
	AutoPauseMemory *bool `json:"autoPauseMemory"`
	AutoResume      *struct {
		Enabled bool `json:"enabled"`
	} `json:"autoResume"`
	VolumeMounts []any           `json:"volumeMounts"`
	MCP          any             `json:"mcp"`     // (the SDK starts the gateway, a command of the sandbox's: there is none here)
	Network      *networkRequest `json:"network"` // ports.go, network.go
	// AllowInternetAccess false denies every destination (network.go).
	AllowInternetAccess *bool `json:"allowInternetAccess"`
	spare               bool  // (the server's own: a template's warm spare, spares.go)
}

// sandboxBody is the API's answer for a sandbox created or connected to (E2B's Sandbox).
type sandboxBody struct {
	TemplateID         string  `json:"templateID"`
	SandboxID          string  `json:"sandboxID"`
	ClientID           string  `json:"clientID"`
	EnvdVersion        string  `json:"envdVersion"`
	EnvdAccessToken    string  `json:"envdAccessToken"`
	TrafficAccessToken string  `json:"trafficAccessToken"`
	Domain             *string `json:"domain"`
}

// clientID is E2B's former field for the machine of a sandbox.
const clientID = "minipy"

func (sb *sandbox) body() sandboxBody {
	return sandboxBody{TemplateID: sb.template, SandboxID: sb.id, ClientID: clientID, EnvdVersion: EnvdVersion,
		EnvdAccessToken: sb.token, TrafficAccessToken: sb.token}
}

func (s *Server) create(w http.ResponseWriter, r *http.Request) {
	var req createRequest
	if !readJSON(w, r, 1<<20, &req) {
		return
	}
	sn := s.snapshotOf(userOf(r), req.TemplateID) // (a snapshot of the caller's: its sandbox's template)
	if sn != nil {
		req.TemplateID = sn.template
	}
	template, life, why := s.checkCreate(&req)
	if why != "" {
		writeError(w, http.StatusBadRequest, why)
		return
	}
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		writeError(w, http.StatusServiceUnavailable, refusedClosed)
		return
	}
	if why := s.unready(r.Context()); why != "" {
		writeError(w, http.StatusServiceUnavailable, why)
		return
	}
	var sb *sandbox
	var code int
	if sn != nil {
		sb, code, why = s.fromSnapshot(userOf(r), sn, &req, life)
	} else {
		sb, code, why = s.newSandbox(userOf(r), template, &req, life)
	}
	if sb == nil {
		writeError(w, code, why)
		return
	}
	writeJSON(w, http.StatusCreated, sb.body())
}

// unready says why the engine cannot start a sandbox now (Config.Ready: its last worker
// start failed, and so did another, such as at the host's process limit), "" when it can:
// a create is refused then (503), not answered with a sandbox whose every run fails.
func (s *Server) unready(ctx context.Context) string {
	if s.cfg.Ready == nil {
		return ""
	}
	ctx, cancel := context.WithTimeout(ctx, readyWait)
	defer cancel()
	if err := s.cfg.Ready(ctx); err != nil {
		return "the server cannot start a sandbox now: " + err.Error()
	}
	return ""
}

// readyWait bounds a create's wait for the engine's check (Config.Ready), when its last
// worker start failed.
const readyWait = 10 * time.Second

// checkCreate checks a new sandbox's request: its template and life, or why it is refused.
func (s *Server) checkCreate(req *createRequest) (template string, life time.Duration, why string) {
	template = req.TemplateID
	if template == "" {
		template = Templates[0]
	}
	if !slices.Contains(Templates, template) {
		return "", 0, fmt.Sprintf("template %q: minipy serves the templates %s, each its engine's Python "+
			"(what it can import is the server's configuration), and your templates and snapshots", echo(template),
			strings.Join(Templates, ", "))
	}
	switch {
	case len(req.VolumeMounts) > 0:
		return "", 0, "volumes are not served by minipy: a sandbox's files live in its working directory (docs/e2b.md)"
	}
	if why := checkAutoResume(req); why != "" {
		return "", 0, why
	}
	if why := checkEnvs(req.EnvVars); why != "" {
		return "", 0, why
	}
	if why := checkEgress(req.egress()); why != "" {
		return "", 0, why
	}
	life, why = s.life(req.Timeout)
	return template, life, why
}

// checkEnvs refuses environment variables that no process environment can hold.
func checkEnvs(envs map[string]string) string {
	for k, v := range envs {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			return fmt.Sprintf("environment variable %q: a name is not empty and holds no '=' nor NUL, a value no NUL", echo(k))
		}
	}
	return ""
}

// life is a sandbox's life from a request's timeout in seconds (nil: the default).
func (s *Server) life(seconds *int) (time.Duration, string) {
	if seconds == nil {
		return s.cfg.DefaultTimeout, ""
	}
	life := time.Duration(*seconds) * time.Second
	if *seconds <= 0 || life > s.cfg.MaxTimeout {
		return 0, fmt.Sprintf("timeout %d s: a sandbox lives from 1 s to %v (-e2b-max-timeout)", *seconds,
			s.cfg.MaxTimeout)
	}
	return life, ""
}

// listedSandbox is a sandbox as the API lists and describes it (E2B's ListedSandbox and
// SandboxDetail).
type listedSandbox struct {
	TemplateID      string            `json:"templateID"`
	SandboxID       string            `json:"sandboxID"`
	ClientID        string            `json:"clientID"`
	StartedAt       time.Time         `json:"startedAt"`
	EndAt           time.Time         `json:"endAt"`
	CPUCount        int               `json:"cpuCount"`
	MemoryMB        int               `json:"memoryMB"`
	DiskSizeMB      int               `json:"diskSizeMB"`
	Metadata        map[string]string `json:"metadata"`
	State           string            `json:"state"`
	EnvdVersion     string            `json:"envdVersion"`
	EnvdAccessToken string            `json:"envdAccessToken,omitempty"`
	VolumeMounts    []any             `json:"volumeMounts"`
	// RestoredFrom is when the idle save was made that the sandbox was brought back from,
	// its replica dead (idle.go): what came after it is lost. minipy's, not E2B's.
	RestoredFrom *time.Time `json:"minipyRestoredFrom,omitempty"`
	// Lifecycle is what its time's end does (E2B's SandboxDetail's; info alone).
	Lifecycle *lifecycle `json:"lifecycle,omitempty"`
}

func (s *Server) listed(sb *sandbox) listedSandbox {
	sb.mu.Lock()
	end, restored := sb.end, sb.restoredFrom
	sb.mu.Unlock()
	l := listedSandbox{TemplateID: sb.template, SandboxID: sb.id, ClientID: clientID, StartedAt: sb.started.UTC(),
		EndAt: end.UTC(), CPUCount: s.cfg.CPUCount, MemoryMB: s.cfg.MemoryMB, DiskSizeMB: s.cfg.DiskMB,
		Metadata: sb.metadata, State: sb.listedState(), EnvdVersion: EnvdVersion, VolumeMounts: []any{}}
	if !restored.IsZero() {
		at := restored.UTC()
		l.RestoredFrom = &at
	}
	return l
}

// listedState is sb's state as E2B lists it: a sandbox being paused or resumed is running.
func (sb *sandbox) listedState() string {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.state == statePaused && !sb.asleep { // (asleep, it runs for its client: sleep.go)
		return statePaused
	}
	return stateRunning
}

func (s *Server) info(w http.ResponseWriter, r *http.Request, sb *sandbox) {
	l := s.listed(sb)
	l.EnvdAccessToken = sb.token
	sb.mu.Lock()
	l.Lifecycle = lifecycleOf(sb.autoPause, sb.autoResume)
	sb.mu.Unlock()
	writeJSON(w, http.StatusOK, l)
}

func (s *Server) remove(w http.ResponseWriter, r *http.Request, sb *sandbox) {
	if sb.storedPaused() {
		if code, why := s.removeStored(sb); code != 0 {
			writeError(w, code, why)
			return
		}
	} else if !s.kill(sb, "killed through the API") {
		writeError(w, http.StatusNotFound, "sandbox "+sb.id+" not found")
		return
	}
	s.count(&s.stats.Killed)
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) timeout(w http.ResponseWriter, r *http.Request, sb *sandbox) {
	life, ok := s.readLife(w, r, true)
	if !ok {
		return
	}
	sb.setLife(life)
	w.WriteHeader(http.StatusNoContent)
}

// connect answers for a sandbox (another process's Sandbox.connect): a paused one is
// resumed (201), to live timeout from now (the default when none is given); a running one
// (200) lives at least timeout from now when one is given.
func (s *Server) connect(w http.ResponseWriter, r *http.Request, sb *sandbox) {
	life, ok := s.readLife(w, r, false)
	if !ok {
		return
	}
	if sb.listedState() == statePaused {
		if life == 0 {
			life = s.cfg.DefaultTimeout
		}
		if code, why := s.resume(sb, life); code != 0 {
			writeError(w, code, why)
			return
		}
		if code, why := s.startTemplate(sb); code != 0 { // (a boot: its processes were not kept)
			s.logf("minipy-mcp: E2B sandbox %s of user %q resumed, but not ready: %s", sb.id, sb.user, why)
		}
		writeJSON(w, http.StatusCreated, sb.body())
		return
	}
	if life > 0 {
		sb.mu.Lock()
		longer := time.Now().Add(life).After(sb.end)
		sb.mu.Unlock()
		if longer {
			sb.setLife(life)
		}
	}
	writeJSON(w, http.StatusOK, sb.body())
}

// readLife reads a body's timeout (seconds) as a sandbox's life (0 when it has none and
// need is false), answering 400 itself when it cannot.
func (s *Server) readLife(w http.ResponseWriter, r *http.Request, need bool) (time.Duration, bool) {
	var req struct {
		Timeout *int `json:"timeout"`
	}
	if !readJSON(w, r, 1<<16, &req) {
		return 0, false
	}
	if req.Timeout == nil {
		if need {
			writeError(w, http.StatusBadRequest, "timeout (seconds) is required")
		}
		return 0, !need
	}
	life, why := s.life(req.Timeout)
	if why != "" {
		writeError(w, http.StatusBadRequest, why)
		return 0, false
	}
	return life, true
}

// listQuery is what a list asks for (E2B's GET /v2/sandboxes).
type listQuery struct {
	metadata      url.Values
	states        []string // (none: every state)
	template      string
	after, before time.Time // startedAfter (at or after), startedBefore (before); zero: none
	asc           bool      // order=asc; E2B's default is newest first
	limit         int
	from          *listPlace // nextToken: the page starts after it
}

// listPlace is a sandbox's place in a list's order, which nextToken carries: a page goes on
// after it even when the sandbox it names has gone meanwhile.
type listPlace struct {
	started time.Time
	id      string
}

func (p listPlace) token() string { return strconv.FormatInt(p.started.UnixNano(), 10) + "." + p.id }

// compare orders sandboxes oldest first, by id among those started at once.
func (p listPlace) compare(o listPlace) int {
	if c := p.started.Compare(o.started); c != 0 {
		return c
	}
	return strings.Compare(p.id, o.id)
}

// readListQuery reads a list's query, or says what is wrong with it.
func readListQuery(q url.Values) (*listQuery, string) {
	lq := &listQuery{limit: 100}
	var err error
	if lq.metadata, err = url.ParseQuery(q.Get("metadata")); err != nil {
		return nil, "metadata: " + err.Error()
	}
	if q.Get("state") != "" {
		lq.states = strings.Split(q.Get("state"), ",")
	}
	lq.template = q.Get("template")
	for name, t := range map[string]*time.Time{"startedAfter": &lq.after, "startedBefore": &lq.before} {
		if v := q.Get(name); v != "" {
			if *t, err = time.Parse(time.RFC3339Nano, v); err != nil {
				return nil, name + ": not a date-time (RFC 3339): " + echo(v)
			}
		}
	}
	switch q.Get("order") {
	case "", "desc":
	case "asc":
		lq.asc = true
	default:
		return nil, "order: asc or desc, not " + echo(q.Get("order"))
	}
	if v := q.Get("limit"); v != "" {
		if lq.limit, err = strconv.Atoi(v); err != nil || lq.limit < 1 || lq.limit > 100 {
			return nil, "limit: from 1 to 100, not " + echo(v)
		}
	}
	var why string
	if lq.from, why = readListToken(q.Get("nextToken")); why != "" {
		return nil, why
	}
	return lq, ""
}

// readListToken reads a page's nextToken (a listPlace's token; "": none), or says why not.
func readListToken(tok string) (*listPlace, string) {
	if tok == "" {
		return nil, ""
	}
	ns, id, ok := strings.Cut(tok, ".")
	n, err := strconv.ParseInt(ns, 10, 64)
	if !ok || err != nil {
		return nil, "nextToken: not one this server gave: " + echo(tok)
	}
	return &listPlace{time.Unix(0, n).UTC(), id}, ""
}

// wants reports whether l passes the query's filters.
func (lq *listQuery) wants(l listedSandbox) bool {
	return matches(l.Metadata, lq.metadata) && (lq.states == nil || slices.Contains(lq.states, l.State)) &&
		(lq.template == "" || lq.template == l.TemplateID) && (lq.after.IsZero() || !l.StartedAt.Before(lq.after)) &&
		(lq.before.IsZero() || l.StartedAt.Before(lq.before))
}

// list lists the caller's sandboxes, running and paused, newest first (order=asc: oldest
// first), filtered by the query's metadata (URL encoded key=value pairs), states, template
// and start times, a page of limit (at most 100) after nextToken.
func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	lq, why := readListQuery(r.URL.Query())
	if why != "" {
		writeError(w, http.StatusBadRequest, why)
		return
	}
	all := s.userListed(r)
	if !lq.asc {
		slices.Reverse(all)
	}
	out := []listedSandbox{}
	for _, l := range all {
		at := listPlace{l.StartedAt, l.SandboxID}
		if lq.from != nil && (lq.asc && at.compare(*lq.from) <= 0 || !lq.asc && at.compare(*lq.from) >= 0) {
			continue // on an earlier page
		}
		if !lq.wants(l) {
			continue
		}
		if len(out) == lq.limit {
			last := out[len(out)-1]
			w.Header().Set("X-Next-Token", listPlace{last.StartedAt, last.SandboxID}.token())
			break
		}
		out = append(out, l)
	}
	writeJSON(w, http.StatusOK, out)
}

func matches(metadata map[string]string, want url.Values) bool {
	for k := range want {
		if metadata[k] != want.Get(k) {
			return false
		}
	}
	return true
}

// userListed lists the caller's sandboxes, oldest first: those of this server's memory
// and, with a store, those paused into it, and those the other replicas run (forward.go).
func (s *Server) userListed(r *http.Request) []listedSandbox {
	user := userOf(r)
	all := s.hereListed(user)
	seen := map[string]bool{}
	for _, l := range all {
		seen[l.SandboxID] = true
	}
	for _, l := range s.peersListed(r) {
		if !seen[l.SandboxID] { // (here first: a sandbox that moved meanwhile is listed once)
			seen[l.SandboxID] = true
			all = append(all, l)
		}
	}
	if s.cfg.Store != nil {
		for _, l := range s.storedSandboxes(user) {
			if !seen[l.SandboxID] {
				all = append(all, l)
			}
		}
	}
	slices.SortFunc(all, func(a, b listedSandbox) int {
		return listPlace{a.StartedAt, a.SandboxID}.compare(listPlace{b.StartedAt, b.SandboxID})
	})
	return all
}

// hereListed lists user's sandboxes in this server's memory that are not in the store.
func (s *Server) hereListed(user string) []listedSandbox {
	var all []listedSandbox
	for _, sb := range s.sandboxesOf(user) {
		if !sb.storedPaused() { // (the store's listing has it)
			all = append(all, s.listed(sb))
		}
	}
	return all
}
