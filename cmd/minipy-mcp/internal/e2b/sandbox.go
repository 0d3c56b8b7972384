package e2b

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/minipy-go/minipy"
	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/templates"
)

// sandbox is a running E2B sandbox: its code contexts, each a namespace, the first the
// default one, and its life's end.
type sandbox struct {
	id, token, user, template string
	metadata, envs            map[string]string
	started                   time.Time

	ctx    context.Context // ends when the sandbox is killed, and the runs in it with it
	cancel context.CancelFunc
	// inflight holds a token per request in progress on the sandbox's ports (but commands'
	// streams, which maxCommands bounds): at most maxInflight, so that a client cannot make
	// the host hold more requests (their bodies: code up to maxCode each, waiting for a
	// context's run) than that.
	inflight chan struct{}
	cmds     commands // its commands running (process.go)

	mu          sync.Mutex
	end         time.Time
	timer       *time.Timer
	contexts    []*codeContext // [0] is the default context; none while paused
	dead        bool
	state       string              // stateRunning, statePaused, stateChanging
	autoPause   bool                // its time's end pauses it (E2B's lifecycle onTimeout: pause)
	autoResume  bool                // ... and a request to its ports then wakes it (sleep.go)
	life        time.Duration       // its last timeout, which an autoResume gives it again
	asleep      bool                // paused by a sleep: running for its client, woken by its next request (sleep.go)
	sleeper     *time.Timer         // its sleep's (sleep.go)
	touched     time.Time           // its last request's end: the idlest sleeps first to make room (sleep.go)
	waking      sync.Mutex          // held by a sleep and a wake: a request waits for a sleep in progress to wake it
	spare       bool                // a template's warm spare being made: its contexts take no place (spares.go)
	autoCold    bool                // ... keeping its files alone (onTimeout's keepMemory: false)
	ports       portRules           // its ports' rules (ports.go)
	egress      *minipy.EgressRules // its network rules (network.go); nil: the server's policy alone
	cold        bool                // paused keeping its files alone: its resume is a new boot (pause.go)
	paused      []pausedContext     // while paused, in memory
	pausedBytes int64
	stored      bool        // paused into Config.Store: its state is there (stored.go)
	from        string      // ... under this kind: session.KindSandbox, or KindRunning (an idle save, idle.go)
	dirty       bool        // a request came since its last idle save (idle.go)
	idle        *time.Timer // its idle save's
	takenOver   bool        // another replica runs it now: its idle save is that replica's
	// restoredFrom is when the idle save was made that it was brought back from (idle.go).
	restoredFrom time.Time
	pausedPlace  func()                  // while paused: gives back its place under its user's cap (places.go)
	metrics      []metricSample          // its last samples, oldest first (metrics.go)
	watchers     map[string]*polledWatch // CreateWatcher's, by id (watch.go)
	watching     int                     // its watches open, both kinds (watch.go)
	// tmpl is what the template it started from left (templates.go): its commands' working
	// directory, and the start command each of its boots runs; nil for a served template.
	tmpl *templates.Result
}

// codeContext is one of a sandbox's code contexts (E2B's Jupyter kernels): a namespace, or
// a shell (bash.go).
type codeContext struct {
	id, language, cwd string

	mu       sync.Mutex                       // held by a run, and by a restart, which replaces ns (or the shell)
	ns       atomic.Pointer[minipy.Namespace] // (files reach it during a run)
	release  func()                           // gives its place back (places.go)
	released sync.Once                        // ... once
	count    int                              // executions so far (Jupyter's execution_count)
	// A bash context (bash.go) has no namespace (ns nil): its shell, while it has one, and
	// whether it is its sandbox's default bash context (byDefault).
	shell     *bashShell
	byDefault bool
}

// maxInflight caps the requests in progress on one sandbox's ports.
const maxInflight = 16

type sandboxKey struct{}

func withSandbox(ctx context.Context, sb *sandbox) context.Context {
	return context.WithValue(ctx, sandboxKey{}, sb)
}

func sandboxOf(r *http.Request) *sandbox { return r.Context().Value(sandboxKey{}).(*sandbox) }

type releaseKey struct{}

// leaveInflight gives up the place of ctx's request among its sandbox's requests in
// progress, before the request ends (a command's stream, once the command has started).
func leaveInflight(ctx context.Context) {
	if release, ok := ctx.Value(releaseKey{}).(func()); ok {
		release()
	}
}

// authorized reports whether r carries the sandbox's access token: envd's header, or the
// one the code interpreter's client sends.
func (sb *sandbox) authorized(r *http.Request) bool { return tokenIs(r, sb.token) }

// tokenIs reports whether r carries token (in either header the SDKs send it in).
func tokenIs(r *http.Request, token string) bool {
	return sameSecret(r.Header.Get("X-Access-Token"), token) || sameSecret(r.Header.Get("E2B-Traffic-Access-Token"), token)
}

// newSandbox starts a sandbox for user, with its default context; the caller has checked
// the request.
func (s *Server) newSandbox(user, template string, req *createRequest, life time.Duration) (*sandbox, int, string) {
	sb := s.sandboxFor(user, template, req.Metadata, req.EnvVars, req.AutoPause != nil && *req.AutoPause, life)
	sb.autoCold = req.AutoPauseMemory != nil && !*req.AutoPauseMemory
	sb.autoResume = req.AutoResume != nil && req.AutoResume.Enabled
	sb.ports, sb.egress = req.Network.rules(), req.egress()
	cc, code, msg := s.newContext(sb, "python", "")
	if cc == nil {
		sb.cancel()
		return nil, code, msg
	}
	sb.contexts = []*codeContext{cc}
	if code, why := s.register(sb, life); code != 0 {
		return nil, code, why
	}
	s.logf("minipy-mcp: E2B sandbox %s of user %q created (template %s, %v)", sb.id, user, template, life)
	return sb, 0, ""
}

// sandboxFor is a new sandbox of user, running from now for life, with no context yet.
func (s *Server) sandboxFor(user, template string, metadata, envs map[string]string, autoPause bool,
	life time.Duration) *sandbox {
	now := time.Now()
	id := randomID()
	sb := &sandbox{id: id, token: s.tokens.make(id), user: user, template: template, metadata: metadata,
		envs: envs, started: now, end: now.Add(life), state: stateRunning, inflight: make(chan struct{}, maxInflight),
		autoPause: autoPause, life: life}
	if sb.metadata == nil {
		sb.metadata = map[string]string{}
	}
	sb.ctx, sb.cancel = context.WithCancel(context.Background())
	return sb
}

// register makes sb, with its contexts, one of the server's sandboxes, its time running;
// when the server is closing, it closes sb and says why.
func (s *Server) register(sb *sandbox, life time.Duration) (int, string) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		sb.cancel()
		for _, cc := range sb.contexts {
			cc.close()
		}
		return http.StatusServiceUnavailable, refusedClosed
	}
	s.sandboxes[sb.id] = sb
	s.stats.Created++
	sb.timer = time.AfterFunc(life, func() { s.expired(sb) })
	s.mu.Unlock()
	s.hold(sb)
	s.touch(sb) // (its first idle save, unless a request comes first)
	return 0, ""
}

const refusedClosed = "minipy-mcp is shutting down and starts no new sandbox; retry in a moment (on another replica, behind a load balancer)"

// newContext makes a code context of sb: a namespace under the server's caps, with the
// sandbox's environment variables, in cwd if given. It returns nil, an HTTP status and why
// when it cannot.
func (s *Server) newContext(sb *sandbox, language, cwd string) (*codeContext, int, string) {
	if language == langBash {
		return s.newBashContext(sb, cwd)
	}
	release, refusal := s.placeFor(sb)
	if refusal != "" {
		return nil, http.StatusTooManyRequests, refusal
	}
	cc := &codeContext{id: randomID(), language: language, release: release}
	cc.ns.Store(s.cfg.Engine.NewNamespace())
	var err error
	if cc.cwd, err = s.setUpFor(sb, cc.ns.Load(), cwd); err != nil {
		cc.close()
		return nil, http.StatusInternalServerError, "the sandbox did not start: " + err.Error()
	}
	return cc, 0, ""
}

// admit takes a place under the server's caps for a context of user's (Config.Admit): the
// function that gives it back, or why there is none.
// placeFor is admit for a context of sb: none for a spare being made (spares.go), which
// takes its places as it is taken.
func (s *Server) placeFor(sb *sandbox) (release func(), refusal string) {
	if sb.spare {
		return func() {}, ""
	}
	return s.admit(sb.user)
}

// With the server's cap full (Config.Full) and sleeps on, the idlest sandboxes that lose
// nothing by it are put to sleep to make room, before a refusal.
func (s *Server) admit(user string) (release func(), refusal string) {
	if s.cfg.Admit == nil {
		return func() {}, ""
	}
	for tries := 0; ; tries++ {
		release, refusal = s.cfg.Admit(user)
		if refusal == "" || tries == maxRoomTries || s.cfg.SleepIdle <= 0 || s.cfg.Full == nil || !s.cfg.Full() ||
			!s.sleepIdlest() {
			return release, refusal
		}
	}
}

// setUp gives a new namespace the sandbox's environment variables and its working
// directory, and returns that directory. Without either to set, it runs nothing: the
// namespace starts in Home (IsolatedConfig.WorkDirPath, which minipy-mcp -e2b sets), and
// a run would cost its first execution the rollback snapshot of this one (~10 ms: a run's
// first after a snapshot copies the pages it writes).
func (s *Server) setUp(ctx context.Context, ns *minipy.Namespace, envs map[string]string, cwd string) (string, error) {
	if len(envs) == 0 && cwd == "" {
		return Home, nil
	}
	env := make(map[string]any, len(envs))
	for k, v := range envs {
		env[k] = v
	}
	if err := ns.Set("_e2b_setup", map[string]any{"env": env, "cwd": cwd}); err != nil {
		return "", err
	}
	res, err := s.cfg.Engine.Run(ctx, setUpCode, &minipy.Options{Globals: ns, Timeout: time.Minute})
	if err != nil {
		return "", err
	}
	dir, _ := res.Value.(string)
	return dir, nil
}

// setUpFor sets a new namespace of sb's up: its network rules (network.go), then its
// environment and cwd (setUp).
func (s *Server) setUpFor(sb *sandbox, ns *minipy.Namespace, cwd string) (string, error) {
	if err := narrow(sb, ns); err != nil {
		return "", err
	}
	return s.setUp(sb.ctx, ns, sb.envs, cwd)
}

// setUpCode is the setup's run: it leaves no name behind. A cwd it cannot enter (E2B's
// /root, which minipy's sandbox has not) leaves the context where it is, as E2B's %cd does:
// the context's cwd says where it is.
const setUpCode = `import os as _e2b_os
_e2b_os.environ.update(_e2b_setup["env"])
if _e2b_setup["cwd"]:
    try:
        _e2b_os.chdir(_e2b_setup["cwd"])
    except OSError:
        pass
del _e2b_setup, _e2b_os
__import__("os").getcwd()`

// close closes the context's namespace, or ends its shell, after the run in progress
// (which the sandbox's end has stopped, if that is why), and gives its place back.
func (cc *codeContext) close() {
	cc.mu.Lock()
	if ns := cc.ns.Load(); ns != nil {
		ns.Close() //nolint:errcheck // closing a namespace does not fail
	}
	cc.stopShell()
	cc.mu.Unlock()
	cc.released.Do(cc.release) // (once: a context removed while its sandbox pauses is closed twice)
}

// kill ends sb, if it still runs: its runs stop, its namespaces close, their places free.
func (s *Server) kill(sb *sandbox, why string) bool {
	s.mu.Lock()
	if s.sandboxes[sb.id] == sb {
		delete(s.sandboxes, sb.id)
	}
	s.mu.Unlock()
	sb.mu.Lock()
	if sb.dead {
		sb.mu.Unlock()
		return false
	}
	sb.dead = true
	if sb.timer != nil {
		sb.timer.Stop()
	}
	if sb.sleeper != nil {
		sb.sleeper.Stop()
	}
	contexts := sb.contexts
	sb.contexts, sb.paused = nil, nil
	s.releasePaused(sb.user, sb.pausedBytes)
	sb.dropPausedPlace()
	sb.mu.Unlock()
	sb.cancel()
	for _, cc := range contexts {
		cc.close()
	}
	s.dropRunning(sb)
	s.unhold(sb)
	s.logf("minipy-mcp: E2B sandbox %s of user %q ended: %s", sb.id, sb.user, why)
	return true
}

// storedPaused reports whether sb is paused into the store.
func (sb *sandbox) storedPaused() bool {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	return sb.stored && sb.state == statePaused
}

// setLife makes sb end life from now (the API's timeout call), if it runs.
func (sb *sandbox) setLife(life time.Duration) {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.dead || sb.state != stateRunning {
		return
	}
	sb.end, sb.life = time.Now().Add(life), life
	sb.timer.Reset(life)
}

// namespace is the namespace of sb's default context, whose working directory the files
// API reaches; nil once sb is killed.
func (sb *sandbox) namespace() *minipy.Namespace {
	if cc := sb.context(""); cc != nil {
		return cc.ns.Load()
	}
	return nil
}

// context returns sb's code context id ("": the default one), or nil.
func (sb *sandbox) context(id string) *codeContext {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	for _, cc := range sb.contexts {
		if cc.id == id || id == "" {
			return cc
		}
	}
	return nil
}
