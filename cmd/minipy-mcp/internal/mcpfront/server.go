// Package mcpfront is minipy-mcp's MCP front: an MCP server whose minipy tool runs code in
// a namespace per client session (or session handle), over stdio or Streamable HTTP, on
// the server's core (package session: tokens, caps and drain, saved sessions, metrics).
// A call's life: the HTTP handler checks the token (Handler), brings a saved session back
// (-state-dir), admits a new session under the caps; the SDK routes the call to the tool
// (run), which enters the gate (refused while draining), finds the session's namespace,
// runs the code, counts the run and notes the session changed (saved after -state-idle).
package mcpfront

import (
	"context"
	"encoding/json"
	"log"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/minipy-go/minipy"
	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/session"
)

// ResetToolName is the tool that empties the session's namespace.
const ResetToolName = "reset"

// Config is what a Front serves. Its zero value but Engine is a plain server.
type Config struct {
	// Engine runs the code: each session gets a namespace of its own, with Functions
	// registered in it, run with Options (their Globals are ignored).
	Engine    minipy.Engine
	Options   minipy.Options
	Functions []minipy.Function
	// Version is the server version reported to clients.
	Version string
	// Metrics counts runs, host calls and MCP's operations; nil: none. Transport is their
	// network.transport: "tcp" over HTTP, "pipe" over stdio.
	Metrics   *session.Metrics
	Transport string
	// Gate holds sessions to the caps and drains the server; nil: every session and call
	// is let in.
	Gate *session.Gate
	// Tokens authenticate HTTP requests (Handler); nil: none.
	Tokens *session.Tokens
	// MaxResourceSize caps what resources/read returns of a session's file (0:
	// DefaultMaxResourceSize).
	MaxResourceSize int64
	// Store saves sessions and brings them back (-state-dir); nil: none. StateIdle is how
	// long after a call a session is saved, if no other call came (-state-idle).
	Store     *session.Store
	StateIdle time.Duration
	// Handles offers session handles (handles.go; the HTTP server). Idle is how long a
	// session or handle lives idle (-session-timeout), as the tools' descriptions say.
	Handles bool
	Idle    time.Duration
	// ConnIdle closes an HTTP connection kept alive this long without a request (0:
	// session.DefaultConnIdle).
	ConnIdle time.Duration
	// Advertise, with Store, is this replica's MCP URL as the other replicas sharing Store
	// reach it: a request for a session another live replica holds is forwarded there
	// (forward.go) instead of the session moving here. "": none.
	Advertise string
}

// Front is an MCP server over minipy with its sessions.
type Front struct {
	cfg      Config
	server   *mcp.Server
	sessions *sessions
	state    *stateDir  // or nil
	fwd      *forwarder // Config.Advertise's; nil: none
}

// NewServer returns an MCP server with the minipy tool, run on eng with opts (their Globals
// are ignored: each client session gets a namespace of its own, with fns registered in it),
// and the reset tool.
func NewServer(eng minipy.Engine, opts *minipy.Options, fns ...minipy.Function) *mcp.Server {
	return New(Config{Engine: eng, Options: *opts, Functions: fns}).Server()
}

// Server is the front's MCP server.
func (f *Front) Server() *mcp.Server { return f.server }

// Namespaces counts the sessions' namespaces (not the handles').
func (f *Front) Namespaces() int {
	f.sessions.mu.Lock()
	defer f.sessions.mu.Unlock()
	return len(f.sessions.spaces)
}

// New makes the front of cfg.
func New(cfg Config) *Front {
	fns := cfg.Functions
	if cfg.Metrics != nil {
		fns = make([]minipy.Function, len(cfg.Functions))
		for i, fn := range cfg.Functions {
			fns[i] = cfg.Metrics.CountHostCalls(fn)
		}
	}
	f := &Front{cfg: cfg}
	if cfg.Store != nil {
		f.state = &stateDir{Store: cfg.Store}
	}
	s := &sessions{eng: cfg.Engine, opts: cfg.Options, fns: fns, metrics: cfg.Metrics, gate: cfg.Gate,
		spaces: map[*mcp.ServerSession]*minipy.Namespace{}, maxResourceSize: cfg.MaxResourceSize,
		state: f.state, stateIdle: cfg.StateIdle, kept: map[string]*keptSession{},
		handles: map[string]*handleSession{}, users: map[*mcp.ServerSession]string{}}
	if s.maxResourceSize <= 0 {
		s.maxResourceSize = DefaultMaxResourceSize
	}
	f.sessions = s
	var serverOpts *mcp.ServerOptions
	if s.state != nil {
		serverOpts = &mcp.ServerOptions{GetSessionID: s.state.newSessionID}
	}
	server := mcp.NewServer(&mcp.Implementation{Name: "minipy", Version: cfg.Version}, serverOpts)
	s.server, f.server = server, server
	if cfg.Metrics != nil {
		transport := cfg.Transport
		if transport == "" {
			transport = "tcp"
		}
		server.AddReceivingMiddleware(newOpMetrics(cfg.Metrics, transport).middleware)
	}
	if s.state != nil {
		server.AddReceivingMiddleware(s.keepInitialize)
	}
	if cfg.Gate != nil {
		server.AddReceivingMiddleware(bindTickets(cfg.Gate))
	}
	server.AddReceivingMiddleware(s.noteUsers)
	s.addTools(cfg)
	return f
}

// noteUsers (receiving middleware) notes the user of each session that initializes, until
// it ends, for EndUser.
func (s *sessions) noteUsers(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		if ss, ok := req.GetSession().(*mcp.ServerSession); ok && method == "initialize" {
			user := ""
			if extra := req.GetExtra(); extra != nil && extra.TokenInfo != nil {
				user = extra.TokenInfo.UserID
			}
			s.mu.Lock()
			_, known := s.users[ss]
			s.users[ss] = user
			s.mu.Unlock()
			if !known {
				go func() {
					ss.Wait() //nolint:errcheck // over either way
					s.mu.Lock()
					delete(s.users, ss)
					s.mu.Unlock()
				}()
			}
		}
		return next(ctx, method, req)
	}
}

// EndUser ends the sessions and session handles of user, whose token was revoked: each is
// saved first, with a store (-state-dir), and comes back if the user gets a token again.
// It returns how many it ended.
func (f *Front) EndUser(user string) int {
	s := f.sessions
	s.mu.Lock()
	var theirs []*mcp.ServerSession
	for ss, u := range s.users {
		if u == user {
			theirs = append(theirs, ss)
		}
	}
	var handles []string
	for h, hs := range s.handles {
		if hs.kept.user == user {
			handles = append(handles, h)
		}
	}
	var saves []chan struct{}
	for _, ss := range theirs {
		if done := s.forgotten[ss]; done != nil {
			saves = append(saves, done)
		}
	}
	s.mu.Unlock()
	for _, ss := range theirs {
		ss.Close() //nolint:errcheck // closing anyway
	}
	for _, h := range handles {
		s.closeHandle(h)
	}
	// Saved first: a session the user calls again once it has a token again is found in the
	// store (bounded: a save that hangs does not hold the revocation).
	deadline := time.After(endUserSaves)
	for _, done := range saves {
		select {
		case <-done:
		case <-deadline:
			log.Printf("minipy-mcp: -state-dir: saving user %q's sessions took longer than %v", user, endUserSaves)
			return len(theirs) + len(handles)
		}
	}
	return len(theirs) + len(handles)
}

// endUserSaves bounds EndUser's wait for the saves of the sessions it ends.
const endUserSaves = 30 * time.Second

// addTools adds the minipy tool and the reset tool, and the sessions' files as resources.
func (s *sessions) addTools(cfg Config) {
	described := s.opts
	if len(s.fns) > 0 {
		// The description lists the functions of a namespace that has them.
		described.Globals = s.newNamespace()
		defer described.Globals.Close()
	}
	tool := s.eng.ToolSchemaFor(&described)
	input, resetInput := tool.InputSchema.Map(), map[string]any{"type": "object", "properties": map[string]any{}}
	if cfg.Handles {
		input, resetInput = withHandleProperty(input, cfg.Idle), withHandleProperty(resetInput, cfg.Idle)
	}
	s.server.AddTool(&mcp.Tool{Name: tool.Name, Description: tool.Description, InputSchema: input}, s.run)
	s.server.AddTool(&mcp.Tool{
		Name:        ResetToolName,
		Description: "Empty the Python namespace of the " + tool.Name + " tool: forget every variable, function and import of this session, and its files.",
		InputSchema: resetInput,
	}, s.reset)
	if w, ok := s.eng.(interface{ WorkDir() string }); ok && w.WorkDir() != "" {
		s.addFileResources(s.server) // an isolated engine with local workers: files of their own
	}
}

// sessions holds one namespace per client session, made on its first run and freed when
// the session ends.
type sessions struct {
	eng     minipy.Engine
	opts    minipy.Options
	fns     []minipy.Function // host functions of every namespace (the upstream servers' tools)
	metrics *session.Metrics  // or nil
	gate    *session.Gate     // or nil
	// maxResourceSize caps resources/read.
	maxResourceSize int64
	state           *stateDir // or nil
	stateIdle       time.Duration
	server          *mcp.Server
	closing         sync.WaitGroup // forgetWhenClosed calls in progress (their saves)
	mu              sync.Mutex
	spaces          map[*mcp.ServerSession]*minipy.Namespace
	kept            map[string]*keptSession // -state-dir: by session id
	handles         map[string]*handleSession
	users           map[*mcp.ServerSession]string // each session's user, from its initialize (noteUsers)
	// forgotten is closed when a session's forgetWhenClosed is done (saved, freed), for
	// EndUser to wait on; a session gets one with its namespace (forgetLater).
	forgotten map[*mcp.ServerSession]chan struct{}
}

// forgetLater has ss saved and freed when it closes (forgetWhenClosed), once. The caller
// holds s.mu.
func (s *sessions) forgetLater(ss *mcp.ServerSession) {
	if s.forgotten == nil {
		s.forgotten = map[*mcp.ServerSession]chan struct{}{}
	}
	done := make(chan struct{})
	s.forgotten[ss] = done
	s.closing.Add(1)
	go s.forgetWhenClosed(ss, done)
}

// existing is the session's namespace, or nil if it has none yet.
func (s *sessions) existing(ss *mcp.ServerSession) *minipy.Namespace {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.spaces[ss]
}

func (s *sessions) namespace(ss *mcp.ServerSession) *minipy.Namespace {
	s.mu.Lock()
	defer s.mu.Unlock()
	ns, ok := s.spaces[ss]
	if !ok {
		ns = s.newNamespace()
		s.spaces[ss] = ns
		if k := s.kept[ss.ID()]; s.state != nil && k != nil {
			s.state.TryLease(session.KindSession, ss.ID(), k.user) // (a fresh session: nobody else has it)
		}
		s.forgetLater(ss) // reset keeps the entry, so this runs once per session
	}
	return ns
}

// newNamespace makes a namespace with the host functions registered.
func (s *sessions) newNamespace() *minipy.Namespace {
	ns := s.eng.NewNamespace()
	if len(s.fns) > 0 {
		if err := ns.Register(s.fns...); err != nil {
			log.Printf("minipy-mcp: registering the upstream tools: %v", err)
		}
	}
	return ns
}

func (s *sessions) forgetWhenClosed(ss *mcp.ServerSession, done chan struct{}) {
	defer s.closing.Done()
	defer func() {
		s.mu.Lock()
		delete(s.forgotten, ss)
		s.mu.Unlock()
		close(done)
	}()
	ss.Wait() //nolint:errcheck // the session is over either way
	if s.state != nil {
		s.keepClosed(ss) // saved (or, ended by the client, forgotten) before it is freed
	}
	s.mu.Lock()
	ns := s.spaces[ss]
	delete(s.spaces, ss)
	s.mu.Unlock()
	if ns != nil {
		ns.Close() //nolint:errcheck // freeing is best effort
	}
}

// DrainingText is the minipy tool's answer to a call that comes while the server drains.
const DrainingText = "[error]\nThe server is shutting down and runs no more code in this session; its variables " +
	"are lost. Nothing of this call ran.\n"

func (s *sessions) run(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	if s.gate != nil {
		var leave func()
		var ok bool
		if ctx, leave, ok = s.gate.EnterCall(ctx); !ok {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: DrainingText}}, IsError: true}, nil
		}
		defer leave()
	}
	opts := s.opts
	opts.Locals = nil
	h, err := handleOf(req.Params.Arguments)
	if err != nil {
		return errorResult(err.Error()), nil
	}
	var hs *handleSession
	made := false
	// A handle, or a request of a revision without sessions over HTTP (a session of its
	// own that ends with it).
	sessionless := req.Extra != nil && req.Extra.Header != nil && req.Session.ID() == ""
	if h != "" || sessionless {
		made = h == ""
		if h, hs, err = s.acquireHandle(ctx, h, userOf(ctx, req)); err != nil {
			return handleError(h, err), nil
		}
		defer func() { s.releaseHandle(h, hs, true) }()
		opts.Globals = hs.ns
	} else {
		opts.Globals = s.namespace(req.Session)
	}
	if token := req.Params.GetProgressToken(); token != nil {
		p := newProgress(ctx, req.Session, token)
		defer p.stop()
		opts.Stdout, opts.Stderr = p, p
	}
	res := s.eng.CallToolResult(ctx, json.RawMessage(req.Params.Arguments), &opts)
	s.metrics.ObserveRun(res.Err, res.Duration)
	saved := h
	if saved == "" && req.Session != nil {
		saved = req.Session.ID()
	}
	if idle, lost := session.StateLost(res.Err); lost && s.restoreSaved(opts.Globals, saved, userOf(ctx, req)) && idle {
		// Its sandbox's pid 1 died between runs: back as it was at its last save, it runs
		// the code, which did not start. (Died during the run, it is back all the same, and
		// the run's error stands.)
		res = s.eng.CallToolResult(ctx, json.RawMessage(req.Params.Arguments), &opts)
		s.metrics.ObserveRun(res.Err, res.Duration)
	}
	if hs != nil {
		return handleResult(res, h, made), nil
	}
	s.changed(req.Session)
	return toolResult(res), nil
}

// toolResult is a run's result as MCP content: the text first, then each image it names
// ("[image N: ...]" is the Nth ImageContent after the text), then a resource link to each
// file it created or changed.
func toolResult(res minipy.ToolResult) *mcp.CallToolResult {
	links, note := fileLinks(res)
	content := make([]mcp.Content, 0, 1+len(res.Images)+len(links))
	content = append(content, &mcp.TextContent{Text: joinLines(res.Text, note)})
	for _, img := range res.Images {
		content = append(content, &mcp.ImageContent{Data: img.Data, MIMEType: img.MIMEType}) // the SDK base64-encodes Data
	}
	content = append(content, links...)
	return &mcp.CallToolResult{Content: content, IsError: res.IsError}
}

// joinLines appends line (if any) to text on a line of its own.
func joinLines(text, line string) string {
	if line == "" {
		return text
	}
	if text != "" && !strings.HasSuffix(text, "\n") {
		text += "\n"
	}
	return text + line
}

func (s *sessions) reset(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	if h, err := handleOf(req.Params.Arguments); err != nil {
		return errorResult(err.Error()), nil
	} else if h != "" {
		return s.resetHandle(ctx, req, h), nil
	}
	s.mu.Lock()
	old := s.spaces[req.Session]
	if old != nil {
		s.spaces[req.Session] = s.newNamespace()
	}
	s.mu.Unlock()
	if old != nil {
		old.Close() //nolint:errcheck // freeing is best effort
		s.changed(req.Session)
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{
		Text: "[reset]\nThe namespace is empty: every variable, function, import and file of this session is gone.\n"}}}, nil
}

// progressEvery is how often a run that prints sends a progress notification, and
// progressTail how much of its latest output the notification carries.
const (
	progressEvery = time.Second
	progressTail  = 2000
)

// progress turns a run's live output into MCP progress notifications: at most one per
// progressEvery while new output comes, whose message is the output's last progressTail
// bytes and whose progress counts the bytes printed so far.
type progress struct {
	ctx     context.Context
	session *mcp.ServerSession
	token   any

	mu    sync.Mutex
	tail  []byte
	total int
	sent  int
	done  chan struct{}
}

func newProgress(ctx context.Context, ss *mcp.ServerSession, token any) *progress {
	p := &progress{ctx: ctx, session: ss, token: token, done: make(chan struct{})}
	go p.loop()
	return p
}

// Write takes output of the run (stdout and stderr alike, in order).
func (p *progress) Write(b []byte) (int, error) {
	p.mu.Lock()
	p.total += len(b)
	p.tail = append(p.tail, b...)
	if over := len(p.tail) - progressTail; over > 0 {
		p.tail = append(p.tail[:0], p.tail[over:]...)
	}
	p.mu.Unlock()
	return len(b), nil
}

func (p *progress) loop() {
	tick := time.NewTicker(progressEvery)
	defer tick.Stop()
	for {
		select {
		case <-p.done:
			return
		case <-p.ctx.Done():
			return
		case <-tick.C:
			p.notify()
		}
	}
}

// notify sends what came since the last notification, if anything did.
func (p *progress) notify() {
	p.mu.Lock()
	if p.total == p.sent {
		p.mu.Unlock()
		return
	}
	p.sent = p.total
	params := &mcp.ProgressNotificationParams{ProgressToken: p.token, Progress: float64(p.total),
		Message: strings.ToValidUTF8(string(p.tail), "\uFFFD")}
	p.mu.Unlock()
	p.session.NotifyProgress(p.ctx, params) //nolint:errcheck // progress is best effort
}

func (p *progress) stop() { close(p.done) }
