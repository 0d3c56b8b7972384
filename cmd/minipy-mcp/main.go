// Command minipy-mcp serves minipy as an MCP tool: "minipy" runs Python code in a namespace
// that persists for the client's session, and "reset" empties that namespace. It speaks
// stdio by default, or the Streamable HTTP transport with -http.
//
// Add it to an MCP client's configuration as a stdio server:
//
//	{"mcpServers": {"minipy": {"command": "minipy-mcp", "args": ["-timeout", "2m"]}}}
//
// or serve it over HTTP for remote clients (one namespace per MCP session, in a sandboxed
// worker process and working directory of its own with -backend isolated; a session idle
// for -session-timeout is closed and its namespace freed):
//
//	minipy-mcp -http :8080 -backend isolated -tokens /run/secrets/minipy-tokens
//
// Serving people who do not trust each other (docs/deploy.md): each client sends
// "Authorization: Bearer TOKEN" with a token of the -tokens file, and a session serves only
// the user who opened it. -http on an address beyond loopback refuses to start without
// -tokens, unless -allow-anonymous. -max-sessions and -max-sessions-per-user cap the open
// sessions (past a cap a new session gets 503 with Retry-After). /healthz answers 200 while
// the server serves, /readyz 200 while it takes new sessions, /metrics the Prometheus
// metrics. SIGTERM drains: no new session or call, the running calls get -drain-timeout to
// finish, then the server closes; a second SIGTERM ends it at once. SIGHUP reads the
// -tokens file again.
//
// Flags:
//
//	-backend engine     inprocess, isolated (sandboxed worker processes: hard timeouts,
//	                    crash survival, no network, resource limits), or auto (default:
//	                    isolated on the virtualenv of the current directory's project if it
//	                    has one, else inprocess); -isolated is -backend isolated
//	-timeout duration   default run timeout, also the most a model may ask for (default: the
//	                    tool's 60 s default, up to 600 s on request)
//	-max-output int     character budget of a reply (default 16384)
//	-workers int        with -backend isolated: pack the sessions into this many shared worker
//	                    processes (default 0: a worker process of its own per session)
//	-spares n           with -backend isolated: sandboxes kept started ahead for new sessions
//	                    (default 0: as many as sessions opened in the last 10 s, at least
//	                    one once a session opened, at most 32; -1: none)
//	-memory-limit int   with -backend isolated: bytes of address space per worker
//	                    (default: 4 GiB plus 256 MiB per CPU, for thread pools; 0: none)
//	-processes n        with -backend isolated: processes and threads of a session's
//	                    sandbox (default 256, minipy.DefaultProcesses; 0: none)
//	-cpu-limit d        with -backend isolated: CPU time a run may use (default 1m, or
//	                    -timeout when longer; 0: none)
//	-open-files n       with -backend isolated: file descriptors per worker (default
//	                    1024; 0: none)
//	-limits mode        with -backend isolated: default, or none to lift the four limits
//	                    above (a limit's flag given with it still sets its own); the log
//	                    says at start which are in force
//	-work-size int      bytes a session's working directory may hold with -backend
//	                    isolated: a tmpfs, so memory (default 256 MiB; -1: the host's
//	                    disk, no cap)
//	-http addr          serve Streamable HTTP on addr (host:port) instead of stdio
//	-session-timeout d  with -http: close sessions idle this long (default 30m)
//	-tokens file        with -http or -e2b: one NAME:TOKEN per line (# comments; a user
//	                    may have several tokens; 16 characters at least); read again on
//	                    SIGHUP
//	-allow-anonymous    with -http beyond loopback: serve without -tokens
//	-max-sessions n     with -http or -e2b: sessions open at once, an E2B sandbox's code
//	                    contexts each one (default: the memory the server may use, its
//	                    cgroup's limit or the machine's, / (256 MiB or -memory-limit when
//	                    given, plus -work-size), at least 4; 0: no limit)
//	-max-sessions-per-user n  with -http or -e2b: sessions one user may hold (0: no limit
//	                    but -max-sessions; without -tokens every client is one user)
//	-drain-timeout d    with -http or -e2b: how long SIGTERM waits for running calls
//	                    (default 30s)
//	-conn-idle-timeout d  with -http or -e2b: close a kept-alive connection idle this
//	                    long (default 1m)
//	-e2b addr           serve E2B's API and sandboxes on addr (host:port), beside -http or
//	                    alone: E2B's SDKs run unchanged with E2B_API_URL and E2B_SANDBOX_URL
//	                    set to http://addr and a -tokens token as E2B_API_KEY; needs
//	                    -backend isolated; the sandboxes' working directory is /home/user
//	                    (docs/e2b.md)
//	-e2b-max-timeout d  with -e2b: the longest life a sandbox may ask for (default 1h)
//	-upstream file      code mode: connect to the MCP servers of this mcpServers JSON file
//	                    and give each of their tools to the code as a Python function,
//	                    grouped by server: everything.echo(message="hi")
//
// A client that sends a progress token with a call gets progress notifications carrying
// the run's latest output, about once a second while it prints.
//
// With -upstream, the model calls the upstream servers' tools from its code, filters and
// joins their results in Python, and only what it prints comes back into its context
// ("code mode"). The file has the shape MCP clients use:
//
//	{"mcpServers": {
//	  "everything": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-everything"]},
//	  "search": {"url": "https://example.com/mcp", "headers": {"Authorization": "Bearer ..."}}}}
//
// Names become Python identifiers (get-sum is get_sum). A tool's structured content comes
// back as a dict, text as a str, several items as a list, an error as minipy.HostError. A
// server started from "command" gets HOME, LOGNAME, PATH, SHELL, TERM and USER of this
// process's environment, plus its "env".
//
// Over stdio the code's Python output is captured; anything that writes to file descriptor
// 1 directly (os.write, C extensions, subprocesses) goes to stderr instead, so it cannot
// corrupt the protocol on stdout.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/minipy-go/minipy"
	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/e2b"
	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/mcpfront"
	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/session"
)

// version is the server version reported to clients.
const version = "0.2.0"

func main() {
	f := parseFlags()
	protocol, ln, e2bLn, toks := f.transport()
	eng, cfg, plan := f.engine()
	defer eng.Close()
	// The first signal drains (or ends a stdio session): it ends ctx. A second one ends the
	// process at once (exit status 1), its workers and their directories with it. Both come
	// on one channel, registered before either can: a channel registered once ctx had ended
	// missed a second signal sent right after the drain began (TestServeSecondSignal, under
	// load).
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	signals := make(chan os.Signal, 2)
	signal.Notify(signals, os.Interrupt, syscall.SIGTERM)
	if iso, ok := eng.(*minipy.Isolated); ok && cfg.Egress != nil {
		reloadEgressOnHUP(ctx, &f.egress, iso)
	}
	var forced atomic.Bool
	go func() {
		select {
		case <-signals:
			stop()
		case <-ctx.Done():
			return // (main has returned)
		}
		<-signals
		forced.Store(true)
		log.Printf("minipy-mcp: a second signal: stopping now")
		eng.Close()
		os.Exit(1)
	}()
	defer func() {
		if forced.Load() {
			select {} // the exit is the goroutine's, once the engine is closed
		}
	}()
	var fns []minipy.Function
	if f.upstreamFile != "" {
		up, err := connectUpstreams(ctx, f.upstreamFile)
		if err != nil {
			log.Fatalf("minipy-mcp: -upstream: %v", err)
		}
		defer up.Close()
		fns = up.functions
	}
	opts := &minipy.Options{Timeout: f.timeout, MaxOutput: f.maxOutput}
	var err error
	if protocol != nil {
		server := mcpfront.New(mcpfront.Config{Engine: eng, Options: *opts, Functions: fns, Version: version,
			MaxResourceSize: f.maxResource}).Server()
		err = server.Run(ctx, &mcp.IOTransport{Reader: os.Stdin, Writer: protocol})
	} else {
		err = f.serve(ctx, eng, cfg, opts, fns, listeners{ln, e2bLn}, toks, plan)
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		log.Fatalf("minipy-mcp: %v", err)
	}
}

// flags are minipy-mcp's command line.
type flags struct {
	backend        string
	timeout        time.Duration
	maxOutput      int
	workers        int
	spares         int
	limits         limitFlags
	memory         memoryFlags
	egress         egressFlags
	workSize       int64
	httpAddr       string
	e2bAddr        string
	e2bMaxTimeout  time.Duration
	e2bSleepIdle   time.Duration
	advertise      string
	advertiseHTTP  string
	sessionTimeout time.Duration
	upstreamFile   string
	tokensFile     string
	allowAnonymous bool
	maxSessions    int
	maxPerUser     int
	maxResource    int64
	drainTimeout   time.Duration
	connIdle       time.Duration
	stateDir       string
	stateStore     string
	stateMaxBytes  int64
	stateLease     time.Duration
	stateTTL       time.Duration
	stateIdle      time.Duration
	stateKey       string
	statePrefix    string
}

// parseFlags registers minipy-mcp's flags on the command line's set and parses them.
func parseFlags() *flags {
	f := &flags{}
	flag.StringVar(&f.backend, "backend", minipy.BackendAuto, "`engine`: inprocess, isolated, or auto (isolated on the project's virtualenv if there is one, else inprocess)")
	flag.DurationVar(&f.timeout, "timeout", 0, "default run timeout and the most a model may ask for (0: minipy's tool defaults)")
	flag.IntVar(&f.maxOutput, "max-output", 0, "character budget of a reply (0: minipy.DefaultToolOutput)")
	isolated := flag.Bool("isolated", false, "same as -backend isolated")
	flag.IntVar(&f.workers, "workers", 0, "with -backend isolated: pack the sessions into this many shared worker processes (0: a worker process of its own per session)")
	f.limits.register(flag.CommandLine)
	f.memory.register(flag.CommandLine)
	f.egress.register()
	flag.IntVar(&f.spares, "spares", 0, "with -backend isolated: sandboxes kept started ahead for new sessions (0: adapt to "+
		"the sessions opened in the last 10 s, at least one once one opened, at most 32; N: N; -1: none)")
	flag.Int64Var(&f.workSize, "work-size", defaultWorkSize, "with -backend isolated: the `bytes` a session's working directory may hold, in a tmpfs (memory); -1: on the host's disk, no cap")
	flag.StringVar(&f.httpAddr, "http", "", "serve the Streamable HTTP transport on `addr` (host:port) instead of stdio")
	flag.StringVar(&f.e2bAddr, "e2b", "", "serve E2B's API and sandboxes on `addr` (host:port), beside -http or instead of it: "+
		"E2B's SDKs run against it with E2B_API_URL and E2B_SANDBOX_URL set to http://addr (docs/e2b.md)")
	flag.StringVar(&f.advertise, "advertise", "", "with -e2b and -state-dir or -state-store: this replica's `URL` as the other replicas sharing the store reach it (http://10.0.0.5:8081): a request for a sandbox that another replica runs is forwarded there, so that any replica answers for any sandbox behind a round-robin balancer")
	flag.StringVar(&f.advertiseHTTP, "advertise-http", "", "with -http and -state-dir or -state-store: this replica's MCP `URL` as the other replicas sharing the store reach it (http://10.0.0.5:8080): a request for a session that another live replica holds is forwarded there instead of the session moving through a save and a restore")
	flag.DurationVar(&f.e2bMaxTimeout, "e2b-max-timeout", e2b.DefaultMaxTimeout, "with -e2b: the longest life a sandbox may ask for (its timeout)")
	flag.DurationVar(&f.e2bSleepIdle, "e2b-sleep-idle", 0, "with -e2b: put a sandbox to sleep after this long without a request (its variables and files saved, its processes freed: in memory, or with -state-dir or -state-store in the store), when it loses nothing by it; its next request wakes it, under the same id (0: never; docs/e2b.md)")
	flag.DurationVar(&f.sessionTimeout, "session-timeout", 30*time.Minute, "with -http: close a session (and free its namespace) after this long without a request")
	flag.StringVar(&f.upstreamFile, "upstream", "", "connect to the MCP servers of this mcpServers JSON `file` and give their tools to the code as Python functions (code mode)")
	flag.StringVar(&f.tokensFile, "tokens", "", "with -http: the clients' bearer tokens, one NAME:TOKEN per line in this `file` (read again on SIGHUP); a session belongs to the user who opened it")
	flag.BoolVar(&f.allowAnonymous, "allow-anonymous", false, "with -http on an address beyond loopback: serve without -tokens (anyone who reaches it runs code)")
	flag.IntVar(&f.maxSessions, "max-sessions", -1, "with -http: the most sessions open at once (default: -memory-budget / (256 MiB plus -work-size, or -session-memory when given), at least 4; 0: no limit)")
	flag.IntVar(&f.maxPerUser, "max-sessions-per-user", 0, "with -http: the most sessions one user (one -tokens NAME; all clients without tokens are one user) may hold at once (0: no limit besides -max-sessions)")
	flag.Int64Var(&f.maxResource, "max-resource-size", mcpfront.DefaultMaxResourceSize, "with -backend isolated: the largest file of a session's working directory that resources/read returns, in `bytes`")
	flag.DurationVar(&f.drainTimeout, "drain-timeout", 30*time.Second, "with -http: at SIGTERM, how long running calls may take to finish before the server closes")
	flag.DurationVar(&f.connIdle, "conn-idle-timeout", session.DefaultConnIdle, "with -http or -e2b: close a kept-alive connection after this long without a request")
	flag.StringVar(&f.stateDir, "state-dir", "", "save sessions (variables, functions, files) in this `directory`: -http's when they idle and at SIGTERM, resumed under the same Mcp-Session-Id for the same user; -e2b's paused sandboxes and snapshots, and the sandboxes running at SIGTERM; in this process or another replica sharing it")
	flag.StringVar(&f.stateStore, "state-store", "", "as -state-dir, in this store `URL`: dir://PATH (-state-dir PATH), or redis://[user:pass@]host:port/db (rediss:// for TLS), which replicas on many hosts share")
	flag.Int64Var(&f.stateMaxBytes, "state-max-bytes", defaultStateMaxBytes, "with -state-dir or -state-store: the largest save (a session's variables and files, a paused sandbox) the store takes, in `bytes`")
	flag.DurationVar(&f.stateLease, "state-lease", session.DefaultLease, "with -state-dir or -state-store: how long a replica holds a session without renewing it: one killed hard lets its sessions go to another replica after this")
	flag.DurationVar(&f.stateTTL, "state-ttl", 24*time.Hour, "with -state-dir or -state-store: forget a saved session this long after its last save (0: never)")
	flag.DurationVar(&f.stateIdle, "state-idle", 30*time.Second, "with -state-dir or -state-store: save a session (-http), or with -advertise a running E2B sandbox, this long after a call, if no other call came: a replica killed hard costs what came since")
	flag.StringVar(&f.stateKey, "state-key-file", "", "with -state-dir or -state-store: the `file` of the secret (16 bytes or more) that seals saved sessions; replicas sharing the store share it (default: the store's own, made on first use: DIR/.key, Redis's minipy:key)")
	flag.StringVar(&f.statePrefix, "state-prefix", "", "with -state-dir or -state-store: the `name` of this deployment in a store that others share: its own names, its own Redis keys and key (minipy:NAME:...), and saves that open in no other deployment")
	flag.Parse()
	if *isolated {
		f.backend = minipy.BackendIsolated
	}
	return f
}

// transport checks the flags of the transports and opens them: over stdio, the protocol's
// stdout (flags of -http and -e2b are refused); else the listeners of -http and -e2b, and
// the -tokens.
func (f *flags) transport() (protocol *os.File, ln, e2bLn net.Listener, toks *session.Tokens) {
	if f.httpAddr == "" && f.e2bAddr == "" {
		flag.Visit(func(fl *flag.Flag) {
			switch fl.Name {
			case "tokens", "allow-anonymous", "max-sessions", "max-sessions-per-user", "drain-timeout", "session-timeout",
				"state-dir", "state-store", "state-max-bytes", "state-lease", "state-ttl", "state-idle", "state-key-file", "state-prefix",
				"e2b-max-timeout", "advertise", "advertise-http":
				log.Fatalf("minipy-mcp: -%s applies to -http and -e2b; over stdio the client that started the server is "+
					"its only user", fl.Name)
			}
		})
		var err error
		if protocol, err = takeStdout(); err != nil {
			log.Fatalf("minipy-mcp: %v", err)
		}
		return protocol, nil, nil, nil
	}
	if f.httpAddr == "" {
		flag.Visit(func(fl *flag.Flag) {
			switch fl.Name {
			case "session-timeout", "upstream", "advertise-http":
				log.Fatalf("minipy-mcp: -%s applies to MCP sessions (-http); -e2b's sandboxes have their own "+
					"timeouts, and pause into -state-dir (docs/e2b.md)", fl.Name)
			case "state-idle":
				if f.advertise == "" {
					log.Fatalf("minipy-mcp: -state-idle applies to MCP sessions (-http) and, with -advertise, to " +
						"-e2b's running sandboxes")
				}
			}
		})
	}
	if f.e2bAddr == "" {
		flag.Visit(func(fl *flag.Flag) {
			if fl.Name == "e2b-max-timeout" || fl.Name == "advertise" {
				log.Fatalf("minipy-mcp: -%s applies to -e2b", fl.Name)
			}
		})
	}
	if f.tokensFile != "" {
		var err error
		if toks, err = session.LoadTokens(f.tokensFile); err != nil {
			log.Fatalf("minipy-mcp: -tokens: %v", err)
		}
		n, users := toks.Users()
		log.Printf("minipy-mcp: -tokens: %d tokens of %d users", n, users)
	}
	return nil, f.listen("-http", f.httpAddr, "Authorization: Bearer TOKEN"),
		f.listen("-e2b", f.e2bAddr, "their E2B_API_KEY"), toks
}

// listen opens the listener of a transport's flag (nil when it is not given), refusing an
// address beyond loopback without -tokens unless -allow-anonymous.
func (f *flags) listen(name, addr, clients string) net.Listener {
	if addr == "" {
		return nil
	}
	if f.tokensFile == "" && !f.allowAnonymous && !isLoopback(addr) {
		log.Fatalf("minipy-mcp: %s %s listens beyond this machine: give -tokens FILE (one NAME:TOKEN per "+
			"line; clients send %s), or -allow-anonymous to let anyone who reaches it run code", name, addr, clients)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		log.Fatalf("minipy-mcp: %s: %v", name, err)
	}
	return ln
}

// engine starts the engine of -backend with the workers' limits, the memory budget and
// shares, -work-size and the egress policy, and says in the log what the code runs in; also
// the memory plan, whose -max-sessions the gate takes.
func (f *flags) engine() (minipy.Engine, minipy.IsolatedConfig, memoryPlan) {
	if f.workSize == 0 {
		log.Fatalf("minipy-mcp: -work-size 0: give the bytes a session's working directory may hold, or -1 for no cap")
	}
	limits, err := f.limits.resolve(flag.CommandLine, f.timeout)
	if err != nil {
		log.Fatalf("minipy-mcp: %v", err)
	}
	plan, err := f.memory.plan(f.limits.mode == "none", f.httpAddr != "" || f.e2bAddr != "", f.maxSessions, f.workers, f.workSize)
	if err != nil {
		log.Fatalf("minipy-mcp: %v", err)
	}
	if f.spares > 0 && f.workers > 0 {
		log.Fatalf("minipy-mcp: -spares applies to a worker per session (-workers 0)")
	}
	cfg := minipy.IsolatedConfig{Workers: f.workers, Spares: f.spares, WorkSize: f.workSize, OnIdleDeath: logIdleDeath}
	if f.e2bAddr != "" {
		cfg.WorkDirPath = e2b.Home // where E2B's code and SDKs expect the sandbox's files
		cfg.Startup = e2b.Startup  // its results as E2B's interpreter makes them
		// E2B's sandboxes have a root user (sudo, commands and files as "root"): a root host
		// can give each sandbox one of its own (minipy.IsolatedConfig.RootUser).
		cfg.RootUser = f.backend == minipy.BackendIsolated && os.Geteuid() == 0
	}
	limits.apply(&cfg)
	plan.apply(&cfg)
	if f.egress.set() {
		if f.backend != minipy.BackendIsolated {
			log.Fatalf("minipy-mcp: -egress-allow and -egress-allow-file apply to -backend isolated, whose sandboxes " +
				"reach the network only through the egress proxy")
		}
		if cfg.Egress, err = f.egress.policy(); err != nil {
			log.Fatalf("minipy-mcp: %v", err)
		}
		cfg.OnEgress = logEgress
	}
	eng, err := newEngine(f.backend, cfg)
	if err != nil {
		log.Fatalf("minipy-mcp: %v", err)
	}
	if _, ok := eng.(*minipy.Isolated); ok {
		log.Printf("minipy-mcp: running code in the isolated engine's sandboxed workers, each session in a " +
			"working directory of its own")
		log.Printf("minipy-mcp: limits of each worker: %v", limits)
		log.Printf("minipy-mcp: memory: %s", plan.describe(eng.(*minipy.Isolated).Stats()))
		log.Printf("minipy-mcp: %s", describeSpares(f.spares, f.workers))
		if f.e2bAddr != "" && cfg.RootUser {
			log.Printf("minipy-mcp: each sandbox has a root user of its own (sudo; E2B's user \"root\"), root over " +
				"the sandbox alone")
		} else if f.e2bAddr != "" {
			log.Printf("minipy-mcp: the sandboxes have no root user: the server does not run as root (E2B's user " +
				"\"root\" and sudo are refused)")
		}
		if cfg.Egress != nil {
			log.Printf("minipy-mcp: the network of each worker: its egress proxy, %s (-egress-allow)", describeEgress(cfg.Egress))
		} else {
			log.Printf("minipy-mcp: the network of each worker: none (-egress-allow gives some hosts)")
		}
	} else {
		log.Printf("minipy-mcp: running code in this process's embedded interpreter")
	}
	return eng, cfg, plan
}

// listeners are the transports' listeners; nil for a transport not asked for.
type listeners struct{ http, e2b net.Listener }

// serve serves -http and -e2b on their listeners until ctx ends (or one of them fails),
// then drains both: under one gate of sessions' caps, with the same tokens.
func (f *flags) serve(ctx context.Context, eng minipy.Engine, icfg minipy.IsolatedConfig, opts *minipy.Options,
	fns []minipy.Function, lns listeners, toks *session.Tokens, plan memoryPlan) error {
	f.maxSessions = plan.maxSessions
	g := session.NewGate(f.maxSessions, f.maxPerUser)
	m := session.NewMetrics(eng, g)
	log.Printf("minipy-mcp: sessions: %s (-max-sessions), %s per user (-max-sessions-per-user)",
		limitText(f.maxSessions), limitText(f.maxPerUser))
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// A refusal from here on closes the engine first: its sandboxes, cgroups and private
	// directory go with it, as at a normal exit.
	fatal := func(err error) {
		eng.Close()
		log.Fatalf("minipy-mcp: %v", err)
	}
	store, err := f.openStore(ctx, lns.http == nil)
	if err != nil {
		fatal(err)
	}
	if store != nil {
		defer store.Close()
		countStore(m, store)
	}
	var ready func(context.Context) error
	if iso, ok := eng.(*minipy.Isolated); ok {
		ready = iso.Ready
	}
	errs := make(chan error, 2)
	n := 0
	var enders []func(user string) // each front's, for a revoked user
	if lns.e2b != nil {
		if err := checkE2B(eng, f.workers); err != nil {
			fatal(err)
		}
		n++
		ecfg := f.e2bConfig(eng, toks, g, icfg)
		ecfg.Store, ecfg.Metrics, ecfg.Ops, ecfg.Ready = store, m, opsHandler(g, m, ready, store), ready
		if err := checkAdvertise("-advertise", f.advertise, store); err != nil {
			fatal(err)
		}
		ecfg.Advertise, ecfg.StateIdle = f.advertise, f.stateIdle
		srv := e2b.New(ecfg)
		countE2B(m, srv)
		enders = append(enders, func(user string) {
			paused, killed := srv.EndUser(user)
			log.Printf("minipy-mcp: user %q's E2B sandboxes: %d paused into the store, %d killed", user, paused, killed)
		})
		go func() { errs <- serveE2B(ctx, srv, g, lns.e2b, f.drainTimeout, f.connIdle) }()
	}
	if lns.http != nil {
		if err := checkAdvertise("-advertise-http", f.advertiseHTTP, store); err != nil {
			fatal(err)
		}
	}
	if lns.http != nil {
		n++
		front := mcpfront.New(mcpfront.Config{Engine: eng, Options: *opts, Functions: fns, Version: version, Metrics: m,
			Transport: "tcp", Gate: g, Tokens: toks, MaxResourceSize: f.maxResource, Store: store,
			StateIdle: f.stateIdle, Handles: true, Idle: f.sessionTimeout, ConnIdle: f.connIdle, Advertise: f.advertiseHTTP})
		enders = append(enders, func(user string) {
			log.Printf("minipy-mcp: user %q's MCP sessions: %d ended (saved first, with a store)", user, front.EndUser(user))
		})
		go func() { errs <- front.Serve(ctx, lns.http, opsHandler(g, m, ready, store), f.drainTimeout) }()
	}
	if toks != nil {
		reloadTokensOnHUP(ctx, toks, func(user string) {
			for _, end := range enders {
				end(user)
			}
		})
	}
	var first error
	for range n {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
		cancel() // one ended: the other drains too
	}
	return first
}

// defaultStateMaxBytes is -state-max-bytes's default.
const defaultStateMaxBytes = 512 << 20

// openStore opens -state-dir's or -state-store's store, if one is given. MCP's front keeps
// it up (leases, sweeps: Front.Serve); without it, it is swept until ctx ends.
func (f *flags) openStore(ctx context.Context, alone bool) (*session.Store, error) {
	where := f.stateStore
	switch {
	case f.stateDir != "" && f.stateStore != "":
		return nil, errors.New("give -state-dir or -state-store, not both (-state-dir DIR is -state-store dir://DIR)")
	case f.stateDir != "":
		where = "dir://" + f.stateDir
	case where == "":
		return nil, nil
	}
	store, err := session.Open(where, session.StoreOptions{TTL: f.stateTTL, KeyFile: f.stateKey, Prefix: f.statePrefix,
		MaxBytes: f.stateMaxBytes, Lease: f.stateLease})
	if err != nil {
		return nil, err
	}
	shown := where
	if u, err := url.Parse(where); err == nil {
		shown = u.Redacted()
	}
	log.Printf("minipy-mcp: sessions and paused sandboxes are saved in %s and kept for %v (-state-ttl)", shown, f.stateTTL)
	if alone {
		go store.KeepUp(ctx, session.KindSandbox, func() map[string]string { return nil }, func(string) {})
	}
	return store, nil
}

func limitText(n int) string {
	if n <= 0 {
		return "no limit"
	}
	return "at most " + strconv.Itoa(n)
}

// newEngine starts the engine -backend names (auto: for the current directory).
func newEngine(backend string, cfg minipy.IsolatedConfig) (minipy.Engine, error) {
	dir, err := os.Getwd()
	if err != nil {
		return nil, err
	}
	return minipy.NewBackend(backend, dir, cfg)
}

// takeStdout moves the protocol off file descriptor 1: it returns a new descriptor for
// what fd 1 was, and points fd 1 at stderr, so that code writing to fd 1 directly cannot
// interleave bytes with the JSON-RPC messages.
func takeStdout() (*os.File, error) {
	fd, err := syscall.Dup(1)
	if err != nil {
		return nil, fmt.Errorf("duplicating stdout: %w", err)
	}
	syscall.CloseOnExec(fd)
	if err := syscall.Dup3(2, 1, 0); err != nil {
		return nil, fmt.Errorf("pointing stdout at stderr: %w", err)
	}
	return os.NewFile(uintptr(fd), "mcp-protocol"), nil
}

// logIdleDeath logs a worker that ended between runs (counted in /metrics too): what its
// sessions lost, if anything, and how it ended.
func logIdleDeath(d minipy.IdleDeath) {
	switch {
	case d.Namespaces == 0:
		log.Printf("minipy-mcp: a worker that held no session's state ended between runs, and was replaced (%v)", d.How)
	case d.How.RolledBack:
		log.Printf("minipy-mcp: a worker ended between runs; its snapshot took over, and its session lost nothing (%v)",
			d.How)
	default:
		log.Printf("minipy-mcp: a worker ended between runs with no snapshot: its session's variables are lost (%v)", d.How)
	}
}

// describeSpares says what the warm pool keeps (-spares), for the log.
func describeSpares(spares, workers int) string {
	switch {
	case workers > 0:
		return "warm pool: none (-workers packs the sessions into shared workers)"
	case spares > 0:
		return fmt.Sprintf("warm pool: %d sandboxes started ahead for new sessions (-spares)", spares)
	case spares < 0:
		return "warm pool: none, each new session starts its sandbox (-spares -1)"
	}
	return "warm pool: as many sandboxes started ahead as sessions opened in the last 10 s, at least one once a " +
		"session opened (-spares)"
}
