// Package e2b serves E2B's protocols over minipy, so that E2B's SDKs run unchanged against
// it: the API that creates, lists, connects to and kills sandboxes; in each sandbox the code
// interpreter (/execute, streaming NDJSON, and /contexts); and of envd, the sandbox's daemon,
// /health and /files. A sandbox is a minipy namespace (with the isolated engine, a
// sandboxed process of its own), and each further code context one more.
//
// One address serves all of it. E2B's SDKs send the API calls to E2B_API_URL and every
// sandbox call to E2B_SANDBOX_URL, naming the sandbox and its port in the headers
// E2b-Sandbox-Id and E2b-Sandbox-Port (49983 envd, 49999 the code interpreter); with both
// set to this server's URL, the headers route the calls. A request without them whose Host
// is E2B's "PORT-ID.domain" is routed by its Host (a wildcard name and certificate in front,
// for setups that set E2B_DOMAIN).
//
// Who may do what: an API call carries an API key (X-API-KEY), which Config.Authenticate
// turns into a user; a sandbox belongs to the user who created it, and other users' calls
// find no such sandbox. A sandbox's own traffic carries its access token, returned by the
// create call (X-Access-Token or E2B-Traffic-Access-Token): nothing else reaches it.
package e2b

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/minipy-go/minipy"
	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/loopguard"
	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/session"
	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/templates"
	"golang.org/x/time/rate"
)

// The ports of a sandbox that E2B's SDKs address (E2b-Sandbox-Port).
const (
	EnvdPort        = 49983
	InterpreterPort = 49999
)

// EnvdVersion is the envd version a sandbox reports: the SDKs choose their requests by it
// (0.4.0: a file's user is optional; 0.5.2: a command's stdin can be closed; 0.5.7:
// uploads may be a plain, or gzipped, body; 0.6.2: files have metadata, envd.go; 0.6.3: a
// watch's events may carry their entries; 0.6.4: a watch may allow network mounts, of which
// a sandbox has none).
const EnvdVersion = "0.6.4"

// Templates are the template names a sandbox may be created from: the defaults of E2B's
// code interpreter SDK and of its base SDK. Each is the engine's Python, as configured.
var Templates = []string{"code-interpreter-v1", BaseTemplate}

// BaseTemplate is the base SDK's template, and what a template build from E2B's base image
// (fromBaseImage) starts from: the engine's Python, as configured.
const BaseTemplate = "base"

// The defaults of Config.
const (
	DefaultSandboxTimeout = 5 * time.Minute // E2B's
	DefaultMaxTimeout     = time.Hour       // E2B's Hobby tier
	DefaultMaxContexts    = 8
	DefaultMaxUpload      = 1 << 30
)

// Config is what a Server serves with.
type Config struct {
	// Engine runs the sandboxes' code: each sandbox and each code context is a namespace of
	// it.
	Engine minipy.Engine
	// Timeout bounds one execution (0: minipy.MaxToolTimeout): E2B's client waits as
	// long as it likes (60 s by default), and cancelling the request stops the run.
	Timeout time.Duration
	// MaxOutput caps each of an execution's stdout and stderr, in characters (0:
	// minipy.DefaultMaxOutput); the live stream carries all of it up to the cap.
	MaxOutput int
	// Authenticate returns the user an API key belongs to. Nil accepts every key, all as
	// one user. HasUser reports whether a user still has a key: a sandbox of one who has
	// none (revoked) serves nothing more, whatever access token its client holds (nil:
	// every user has).
	Authenticate func(key string) (user string, ok bool)
	HasUser      func(user string) bool
	// Admit reserves the place of a namespace of user under the server's caps: it returns
	// the function that gives it back, or why not (the client gets 429 with the reason).
	// Nil admits everything.
	Admit func(user string) (release func(), refusal string)
	// HoldPaused counts a paused sandbox of user under the user's cap, and returns the
	// function that gives its place back; it is never refused (a pause gives back a place
	// per context, and takes one). Nil: paused sandboxes hold no place.
	HoldPaused func(user string) (release func())
	// Ready reports why the engine cannot start a sandbox now (minipy.Isolated.Ready), nil
	// when it can: a create is refused (503) while it cannot. Nil: never checked.
	Ready func(ctx context.Context) error
	// Full reports whether the server's cap, not a user's, is what Admit refuses now: with
	// SleepIdle, the idlest sandbox is then put to sleep to make room (sleep.go). Nil: never.
	Full func() bool
	// RootUser: the Engine's sandboxes have a root user (minipy.IsolatedConfig.RootUser),
	// which E2B's user "root" is (commands, files, sudo); without it, "root" is refused.
	RootUser bool
	// DefaultTimeout is a sandbox's life when its creator gives none (0:
	// DefaultSandboxTimeout); MaxTimeout the most it may ask for (0: DefaultMaxTimeout).
	// A sandbox is killed when its time ends, as E2B's are.
	DefaultTimeout, MaxTimeout time.Duration
	// MaxContexts caps the code contexts of one sandbox, its default one included (0:
	// DefaultMaxContexts): each is a namespace.
	MaxContexts int
	// MaxPausedBytes caps what the paused sandboxes hold, all together, in the server's
	// memory (0: DefaultMaxPausedBytes); past it a pause is refused (507). A paused sandbox
	// is kept PausedTTL (0: DefaultPausedTTL), then forgotten.
	MaxPausedBytes int64
	PausedTTL      time.Duration
	// MaxPausedBytesPerUser caps what one user's paused sandboxes hold of MaxPausedBytes
	// (0: a quarter of it), so that one user cannot fill it for every other.
	MaxPausedBytesPerUser int64
	// Metrics, if set, counts the executions (minipy_runs_total, by outcome) and the
	// requests refused for their API key or access token.
	Metrics *session.Metrics
	// Store, if set, keeps paused sandboxes instead of the server's memory, for the
	// store's TTL (PausedTTL does not apply), so that they outlive the server and move
	// between servers sharing it; MaxPausedBytes bounds what it holds of them. Close pauses
	// the sandboxes still running into it.
	Store *session.Store
	// CPUCount, MemoryMB and DiskMB are what a sandbox's info reports.
	CPUCount, MemoryMB, DiskMB int
	// MaxUpload bounds an upload's body (envd's POST /files), in bytes (0: DiskMB's,
	// and 1 MiB for a form's headers; DefaultMaxUpload where DiskMB is 0).
	MaxUpload int64
	// Logf, if set, logs sandboxes created and ended.
	Logf func(format string, args ...any)
	// Ops, if set, serves the API's paths that E2B's API does not have: the server's
	// /healthz, /readyz and /metrics.
	Ops http.Handler
	// StateIdle, with Advertise, is how long after a request to a running sandbox ended it
	// is saved into Store, if no other came (idle.go): a replica that dies hard costs its
	// sandboxes what came since. 0: never.
	StateIdle time.Duration
	// SleepIdle is how long a running sandbox may go without a request before it is put
	// to sleep (sleep.go): saved, its processes freed, and woken by its next request. 0:
	// never.
	SleepIdle time.Duration
	// Advertise, with Store, is this replica's URL as the other replicas sharing Store
	// reach it: each sandbox running here is registered in the store, and a request for a
	// sandbox that another replica runs is forwarded there (forward.go). "": none.
	Advertise string
}

// Server serves E2B's API and its sandboxes. Its methods are safe from any goroutine.
type Server struct {
	cfg Config

	mu        sync.Mutex // taken after a sandbox's, never before
	sandboxes map[string]*sandbox
	snapshots map[string]*snapshot // by id (snapshots.go)
	closed    bool                 // no new sandbox: draining or closed
	stats     Stats
	// pausedBytes is what the paused sandboxes hold in memory (within Config.MaxPausedBytes),
	// in all and by user (within MaxPausedBytesPerUser).
	pausedBytes  int64
	pausedByUser map[string]int64

	// templates are the users' templates by id, built or being built (templates.go);
	// uploads the files their builds copy; building counts the builds running.
	templates map[string]*templateRecord
	uploads   *templates.Uploads
	building  sync.WaitGroup
	// spares are the template builds' warm sandboxes by spareKey (spares.go); sparing
	// counts those being made.
	spares  map[string]*spare
	sparing sync.WaitGroup

	api, interpreter, envd *http.ServeMux
	tokens                 accessTokens
	signedLookups          *rate.Limiter // searches for the sandbox of a signed file URL (signed.go)
	stopMetrics            func()        // ends the metrics' sampling (metrics.go)
	fwd                    *forwarder    // forwards to the other replicas (Config.Advertise); nil: none
}

// New returns a server of cfg's sandboxes.
func New(cfg Config) *Server {
	if cfg.DefaultTimeout <= 0 {
		cfg.DefaultTimeout = DefaultSandboxTimeout
	}
	if cfg.MaxTimeout <= 0 {
		cfg.MaxTimeout = DefaultMaxTimeout
	}
	if cfg.MaxContexts <= 0 {
		cfg.MaxContexts = DefaultMaxContexts
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = minipy.MaxToolTimeout
	}
	if cfg.MaxPausedBytes <= 0 {
		cfg.MaxPausedBytes = DefaultMaxPausedBytes
	}
	if cfg.PausedTTL <= 0 {
		cfg.PausedTTL = DefaultPausedTTL
	}
	if cfg.MaxPausedBytesPerUser <= 0 {
		cfg.MaxPausedBytesPerUser = cfg.MaxPausedBytes / 4
	}
	if cfg.MaxUpload <= 0 {
		cfg.MaxUpload = DefaultMaxUpload
		if cfg.DiskMB > 0 {
			cfg.MaxUpload = int64(cfg.DiskMB)<<20 + 1<<20
		}
	}
	s := &Server{cfg: cfg, sandboxes: map[string]*sandbox{}, snapshots: map[string]*snapshot{}, pausedByUser: map[string]int64{},
		tokens: newAccessTokens(cfg.Store), signedLookups: newSignedLookups(), templates: map[string]*templateRecord{},
		spares:  map[string]*spare{},
		uploads: templates.NewUploads(cfg.MaxUpload, cfg.MaxPausedBytesPerUser, cfg.MaxPausedBytes/2)}
	s.routes()
	if cfg.Store != nil && cfg.Advertise != "" {
		s.fwd = newForwarder(s, cfg.Advertise)
	}
	stop := make(chan struct{})
	s.stopMetrics = sync.OnceFunc(func() { close(stop) })
	go s.sampleMetrics(stop)
	if cfg.Store != nil { // (the store's paused sandboxes hold their users' places here too)
		for _, one := range cfg.Store.List(session.KindSandbox) {
			var si storedInfo
			if json.Unmarshal(one.Init, &si) == nil {
				s.fromStore(si.ID, one.User)
			}
		}
	}
	return s
}

func (s *Server) logf(format string, args ...any) {
	if s.cfg.Logf != nil {
		s.cfg.Logf(format, args...)
	}
}

// ServeHTTP routes a request: to a sandbox's port when it names a sandbox, else to the API.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if err := loopguard.Check(r, s.cfg.Authenticate == nil); err != nil { // (DNS rebinding, web pages)
		writeError(w, http.StatusForbidden, err.Error())
		return
	}
	r, ok := s.checkReplica(w, r)
	if !ok {
		return
	}
	id, port := r.Header.Get("E2b-Sandbox-Id"), r.Header.Get("E2b-Sandbox-Port")
	if id == "" {
		id, port = hostSandbox(r.Host)
	}
	if id == "" && isSignedFileURL(r) { // (E2B_SANDBOX_URL: the URL names no sandbox)
		sb, status := s.signedSandbox(r)
		if sb == nil && status == http.StatusUnauthorized && s.forwardSigned(w, r) {
			return // (another replica runs it)
		}
		if sb == nil {
			s.cfg.Metrics.Unauthorized()
			writeError(w, status, "the file URL's signature is no running sandbox's (or too many were tried: wait)")
			return
		}
		id, port = sb.id, strconv.Itoa(EnvdPort)
	}
	// Every body is bounded as it is read, before anything decompresses or parses it.
	r.Body = http.MaxBytesReader(w, r.Body, s.bodyLimit(id, port, r))
	if id == "" {
		s.api.ServeHTTP(w, r)
		return
	}
	sb, answered := s.runningSandbox(w, r, id, port)
	if answered {
		return
	}
	if sb == nil {
		s.notRunning(w, r, id, port)
		return
	}
	s.serveSandbox(w, r, sb, port)
}

// serveSandbox serves a request to sb's port, which runs (or ran when it was looked up: a
// sleep that began meanwhile is woken from).
func (s *Server) serveSandbox(w http.ResponseWriter, r *http.Request, sb *sandbox, port string) {
	own, isOwn := userPort(port)
	public := isOwn && !sb.portRules().Private // (E2B's: a sandbox's own ports are public unless it said otherwise)
	signed := !sb.authorized(r) && port == strconv.Itoa(EnvdPort) && sb.signs(r)
	if !public && !signed && !sb.authorized(r) || s.cfg.HasUser != nil && !s.cfg.HasUser(sb.user) {
		s.cfg.Metrics.Unauthorized()
		writeError(w, http.StatusUnauthorized, "a sandbox's requests need its access token (X-Access-Token), "+
			"or a file URL it signed, and its user a key of the server's")
		return
	}
	if signed && signatureExpired(r, time.Now()) {
		s.cfg.Metrics.Unauthorized()
		writeError(w, http.StatusUnauthorized, "signature is already expired") // (E2B's envd's words, which its tests expect)
		return
	}
	// A request holds its place among the sandbox's requests in progress until it ends; a
	// command's (Process/Start) until its command has started: then it is one of the
	// sandbox's commands, which maxCommands bounds.
	select {
	case sb.inflight <- struct{}{}:
	default:
		writeError(w, http.StatusTooManyRequests, fmt.Sprintf("the sandbox has %d requests in progress, its most; "+
			"wait for one to end", maxInflight))
		return
	}
	// A sleep begins only without requests in progress (sleep.go): one that began before
	// this request took its place is woken from, and then none can begin until it ends.
	if !sb.running() {
		if runs, code, why := s.wake(sb, true); !runs {
			<-sb.inflight
			if code != 0 {
				writeError(w, code, why)
			} else {
				s.notRunning(w, r, sb.id, port)
			}
			return
		}
	}
	release := sync.OnceFunc(func() { <-sb.inflight; s.touch(sb) })
	defer release()
	r = r.WithContext(context.WithValue(withSandbox(r.Context(), sb), releaseKey{}, release))
	switch {
	case port == strconv.Itoa(InterpreterPort):
		s.interpreter.ServeHTTP(w, r)
	case port == strconv.Itoa(EnvdPort):
		s.envd.ServeHTTP(w, r)
	case isOwn:
		s.servePort(w, r, sb, own)
	default:
		writeError(w, http.StatusBadGateway, "port "+echo(port)+" of the sandbox: not a port")
	}
}

// runningSandbox is sandbox id, running here for a request to its ports: or the request
// was forwarded to the replica that runs it (answered), or it is brought back here from
// its idle save for a caller with its token (its replica died); nil: it does not run.
func (s *Server) runningSandbox(w http.ResponseWriter, r *http.Request, id, port string) (sb *sandbox, answered bool) {
	sb = s.lookup(id)
	if sb != nil && sb.running() {
		return sb, false
	}
	if sb != nil && s.wakesFor(r, port, sb.token, sb.portRules().Private) {
		if woken, answered := s.wakeAnswering(w, r, sb); woken != nil || answered {
			return woken, answered
		}
	}
	if s.forward(w, r, id) {
		return nil, true
	}
	if back := s.recoverRunning(id, func(si storedInfo, _ session.Meta) bool { return tokenIs(r, si.Token) }); back != nil {
		return back, false
	}
	if sb == nil && s.cfg.Store != nil { // (asleep in the store, or paused with autoResume: sleep.go)
		if sb = s.storedToWake(id, r, port); sb != nil {
			return s.wakeAnswering(w, r, sb)
		}
	}
	return nil, false
}

// notRunning answers a request to a port of sandbox id, which is not running.
func (s *Server) notRunning(w http.ResponseWriter, r *http.Request, id, port string) {
	if _, own := userPort(port); own {
		// (E2B's proxy's answer for a port of a sandbox that is not running, to anyone: a
		// sandbox's own ports are public, and an id is 20 random characters.)
		writeJSON(w, http.StatusBadGateway, struct {
			apiError
			SandboxID string `json:"sandboxId"`
		}{apiError{http.StatusBadGateway, "The sandbox was not found"}, id})
		return
	}
	// E2B's proxy answers 502 for a sandbox that is not running: the SDKs read it as "the
	// sandbox timed out" (and isRunning as false). Only to a token the server made for this
	// id: without one, a sandbox that runs and one that never did answer alike (401), which
	// says nothing of which ids are live.
	if !s.tokens.made(id, r) {
		s.cfg.Metrics.Unauthorized()
		writeError(w, http.StatusUnauthorized, "a sandbox's requests need its access token (X-Access-Token)")
		return
	}
	writeError(w, http.StatusBadGateway, "the sandbox "+echo(id)+" is not running (it was killed, or its time ended)")
}

// The bounds of a request's body (bodyLimit): a connect call's message as sent (envd's
// filesystem and process calls; connect's own bound, maxEnvdMessage, holds it once
// decompressed), an API call's JSON, an execution's (its code: maxCode).
const (
	maxEnvdMessage = 1 << 20
	maxAPIBody     = 1 << 20
)

// bodyLimit is the most that the body of r, to the sandbox id's port (none: the API),
// may hold. An upload (envd's POST /files) may hold what the sandbox's working directory
// can (its size's ENOSPC stops it there anyway, and a gzipped upload inflates into it, not
// into the server's memory).
func (s *Server) bodyLimit(id, port string, r *http.Request) int64 {
	switch {
	case id == "":
		return maxAPIBody
	case port == strconv.Itoa(InterpreterPort):
		return maxCode
	case r.Method == http.MethodPost && r.URL.Path == "/files":
		return s.cfg.MaxUpload
	}
	if _, own := userPort(port); own {
		return s.cfg.MaxUpload // (a request to the code's own server, as an upload)
	}
	return maxEnvdMessage + 64 // (a streaming call's envelope)
}

// hostSandbox reads E2B's sandbox host name, PORT-ID.domain.
func hostSandbox(host string) (id, port string) {
	label, _, ok := strings.Cut(host, ".")
	if !ok {
		return "", ""
	}
	port, id, ok = strings.Cut(label, "-")
	if !ok || id == "" {
		return "", ""
	}
	if _, err := strconv.Atoi(port); err != nil {
		return "", ""
	}
	return id, port
}

func (s *Server) lookup(id string) *sandbox {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sandboxes[id]
}

// Drain refuses new sandboxes from now on (503); the running ones go on until Close.
func (s *Server) Drain() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
}

// Close refuses new sandboxes and ends every one: with a store, each running sandbox is
// paused into it (its runs in progress stopped first), and one whose pause fails is
// killed; without, each is killed (and the paused ones forgotten).
func (s *Server) Close() {
	s.stopMetrics()
	s.mu.Lock()
	s.closed = true
	all := slices.Collect(maps.Values(s.sandboxes))
	var builds []context.CancelFunc
	for _, t := range s.templates {
		if t.cancel != nil {
			builds = append(builds, t.cancel)
		}
	}
	s.mu.Unlock()
	for _, cancel := range builds {
		cancel()
	}
	for _, sb := range all {
		s.end(sb, "the server closed")
	}
	if s.fwd != nil {
		s.fwd.close()
	}
	s.building.Wait() // (each has killed its sandbox)
	s.dropSpares(func(*spare) bool { return true })
	s.sparing.Wait() // (each being made is killed as it is ready: closed)
}

// EndUser ends the sandboxes of user, whose key was revoked: with a store, each running
// one is paused into it (its runs stopped first), to be resumed if the user gets a key
// again; without (or when its pause fails), each is killed, and so is each paused in the
// server's memory; its template builds are stopped and its uploads forgotten. It returns
// how many were paused and killed.
func (s *Server) EndUser(user string) (paused, killed int) {
	s.mu.Lock()
	for _, t := range s.templates {
		if t.user == user && t.cancel != nil {
			t.cancel() // (its build ends, and kills its sandbox)
		}
	}
	s.mu.Unlock()
	s.uploads.Forget(user)
	s.dropSpares(func(sp *spare) bool { return sp.user == user })
	for _, sb := range s.sandboxesOf(user) {
		if s.end(sb, "its user's key was revoked") {
			paused++
		} else {
			killed++
		}
	}
	return paused, killed
}

// sandboxesOf is user's sandboxes in the server's memory.
func (s *Server) sandboxesOf(user string) []*sandbox {
	s.mu.Lock()
	defer s.mu.Unlock()
	var theirs []*sandbox
	for _, sb := range s.sandboxes {
		if sb.user == user {
			theirs = append(theirs, sb)
		}
	}
	return theirs
}

// end ends sb: with a store, paused into it if it runs (its runs stopped first) and
// forgotten here, or forgotten if it is there already; else, or when the pause fails,
// killed (why says why). True: it is in the store.
func (s *Server) end(sb *sandbox, why string) (stored bool) {
	sb.waking.Lock() // (after a sleep or a wake in progress)
	defer sb.waking.Unlock()
	if s.cfg.Store != nil {
		if sb.storedPaused() {
			s.forget(sb)
			return true
		}
		if sb.running() {
			sb.cancel()                       // (the runs still going)
			code, failed := s.pause(sb, true) // (the server's move, not the user's pause: it keeps everything)
			if code == 0 {
				s.forget(sb)
				return true
			}
			s.logf("minipy-mcp: E2B sandbox %s: pausing it as %s failed (%s)", sb.id, why, failed)
		}
	}
	s.kill(sb, why)
	return false
}

// Stats are a server's counts of sandboxes, for its metrics.
type Stats struct {
	Running  int // sandboxes running now
	Paused   int // sandboxes paused now
	Created  int // sandboxes created so far
	Expired  int // killed when their time ended
	Killed   int // killed through the API
	Executed int // executions (runCode) so far
	// Forwarded are the requests sent on to the replica that runs their sandbox so far
	// (Config.Advertise).
	Forwarded int
	// Recovered are the sandboxes brought back from their idle saves, their replica dead;
	// Restored the code contexts brought back so, their processes dead.
	Recovered, Restored int
	// FromSpare are the sandboxes created from a template's warm spare so far (spares.go),
	// Spares the spares ready now.
	FromSpare, Spares int
	// Asleep are the sandboxes asleep now (sleep.go: counted in Running, not in Paused),
	// Slept those put to sleep so far, Woken those woken (from a sleep, or by autoResume),
	// and WakeTime the time their wakes took, in all.
	Asleep, Slept, Woken int
	WakeTime             time.Duration
	// SleptForRoom are the sleeps (of Slept) that made room under the server's cap for
	// another sandbox (Config.Full).
	SleptForRoom int
}

// Stats returns the server's counts.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	st := s.stats
	all := slices.Collect(maps.Values(s.sandboxes))
	for _, sp := range s.spares {
		if sp.sb != nil {
			st.Spares++
		}
	}
	s.mu.Unlock()
	for _, sb := range all { // (a sandbox's lock is never taken under the server's)
		switch {
		case sb.storedPaused(): // (counted from the store)
		case sb.listedState() == statePaused:
			st.Paused++
		default:
			st.Running++
			if sb.sleeping() {
				st.Asleep++
			}
		}
	}
	if s.cfg.Store != nil {
		for _, one := range s.cfg.Store.List(session.KindSandbox) {
			switch storedState(one) {
			case stateRunning:
				st.Running++
				st.Asleep++
			case statePaused:
				st.Paused++
			}
		}
	}
	return st
}

// count adds to one of the counts.
func (s *Server) count(field *int) {
	s.mu.Lock()
	*field++
	s.mu.Unlock()
}

// apiError is the body of an error answer, as E2B's API sends it.
type apiError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func writeError(w http.ResponseWriter, code int, message string) {
	writeJSON(w, code, apiError{Code: code, Message: message})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v) //nolint:errcheck // the client went away
}

// readJSON decodes a request's JSON body (at most limit bytes; an empty body is v's zero
// value), answering 400 itself when it cannot.
func readJSON(w http.ResponseWriter, r *http.Request, limit int64, v any) bool {
	err := json.NewDecoder(http.MaxBytesReader(w, r.Body, limit)).Decode(v)
	if err == nil || errors.Is(err, io.EOF) {
		return true
	}
	writeError(w, http.StatusBadRequest, "the request's body is not the JSON expected: "+err.Error())
	return false
}

// randomID is 20 characters of [a-z2-7] (100 bits) from crypto/rand, E2B's length.
func randomID() string { return strings.ToLower(rand.Text()[:20]) }

// sameSecret compares a secret in constant time.
func sameSecret(got, want string) bool {
	return got != "" && subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}
