package main

// Metrics at /metrics (with -http), in the Prometheus text format. The MCP ones follow the
// OpenTelemetry semantic conventions for MCP (mcp.server.operation.duration and
// mcp.server.session.duration, their attributes as labels, named as the OTel Prometheus
// exporter names them); the minipy_ ones are this server's own. minipy, the library, has
// no metrics dependency: the engine's figures come from (*minipy.Isolated).Stats at each
// scrape, and each run's outcome from minipy.ToolResult.Err.

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/minipy-go/minipy"
	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/e2b"
)

// mcpDurationBuckets are the bucket boundaries (seconds) the OTel MCP conventions give for
// their duration histograms.
var mcpDurationBuckets = []float64{0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30, 60, 120, 300}

// runDurationBuckets reach down to a warm run's microseconds and up to the longest timeout.
var runDurationBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10,
	30, 60, 120, 300, 600}

// The outcomes of a run (minipy_runs_total's label), from its ToolResult.Err.
const (
	outcomeOK          = "ok"
	outcomePythonError = "python_error"      // the code raised
	outcomeTimeout     = "timeout"           // stopped at its deadline (its worker may have been killed and rolled back)
	outcomeRolledBack  = "rolled_back"       // its worker crashed or hit a limit; the namespace is as it was before the run
	outcomeWorkerLost  = "worker_lost"       // its worker crashed or hit a limit; the namespace's variables are lost
	outcomeLimit       = "limit"             // it hit a limit and raised (MemoryError under -memory-limit)
	outcomeBadArgs     = "invalid_arguments" // the model's arguments were not a valid call: nothing ran
	outcomeCancelled   = "cancelled"         // the client cancelled the call, or the server is shutting down
	outcomeError       = "error"             // anything else (an engine that could not start a worker, say)
)

var outcomes = []string{outcomeOK, outcomePythonError, outcomeTimeout, outcomeRolledBack, outcomeWorkerLost,
	outcomeLimit, outcomeBadArgs, outcomeCancelled, outcomeError}

// outcome classifies a run's error.
func outcome(err error) string {
	var lost *minipy.WorkerLostError
	var py *minipy.PythonError
	switch {
	case err == nil:
		return outcomeOK
	case errors.Is(err, minipy.ErrBadArguments):
		return outcomeBadArgs
	case errors.Is(err, minipy.ErrTimeout):
		return outcomeTimeout
	case errors.Is(err, context.Canceled):
		return outcomeCancelled
	case errors.As(err, &lost) && lost.RolledBack:
		return outcomeRolledBack
	case errors.As(err, &lost):
		return outcomeWorkerLost
	case errors.Is(err, minipy.ErrLimit):
		return outcomeLimit
	case errors.As(err, &py):
		return outcomePythonError
	default:
		return outcomeError
	}
}

// metrics is the server's collectors, registered in their own registry.
type metrics struct {
	registry   *prometheus.Registry
	runs       *prometheus.CounterVec
	runSeconds prometheus.Histogram
	operations *prometheus.HistogramVec
	sessions   *prometheus.HistogramVec
	rejected   *prometheus.CounterVec
	hostCalls  *prometheus.CounterVec
	unauthed   prometheus.Counter
	transport  string   // network.transport: "tcp" over HTTP, "pipe" over stdio
	tools      []string // the server's tools: the only gen_ai.tool.name values
}

// newMetrics makes the collectors; eng's figures (an *minipy.Isolated's Stats), the open
// sessions and the drain state are read at each scrape.
func newMetrics(eng minipy.Engine, g *gate, transport string) *metrics {
	m := &metrics{registry: prometheus.NewRegistry(), transport: transport, tools: []string{minipy.ToolName, resetToolName}}
	m.runs = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "minipy_runs_total",
		Help: "Runs of the minipy tool, by outcome: " + strings.Join(outcomes, ", ") + ".",
	}, []string{"outcome"})
	m.runSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "minipy_run_duration_seconds",
		Help:    "How long runs of the minipy tool took, waiting for the namespace's worker included.",
		Buckets: runDurationBuckets,
	})
	m.operations = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "mcp_server_operation_duration_seconds",
		Help: "MCP request or notification duration as observed on the receiver from the time it was received " +
			"until the result or ack is sent (OpenTelemetry mcp.server.operation.duration).",
		Buckets: mcpDurationBuckets,
	}, []string{"mcp_method_name", "gen_ai_tool_name", "gen_ai_operation_name", "error_type", "network_transport",
		"mcp_protocol_version"})
	m.sessions = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "mcp_server_session_duration_seconds",
		Help:    "The duration of the MCP session as observed on the MCP server (OpenTelemetry mcp.server.session.duration).",
		Buckets: []float64{1, 10, 30, 60, 300, 600, 1800, 3600, 7200, 14400, 43200, 86400},
	}, []string{"network_transport", "mcp_protocol_version"})
	m.rejected = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "minipy_sessions_rejected_total",
		Help: "New sessions refused, by reason: " + strings.Join(refusals, ", ") + ".",
	}, []string{"reason"})
	m.hostCalls = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "minipy_host_calls_total",
		Help: "Calls from the code to host functions (the -upstream servers' tools), by function and outcome (ok, error).",
	}, []string{"function", "outcome"})
	m.unauthed = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "minipy_unauthorized_requests_total",
		Help: "HTTP requests refused for a missing or unknown bearer token.",
	})
	// Every known label value from the start, so that a dashboard's rate() sees the first.
	for _, o := range outcomes {
		m.runs.WithLabelValues(o)
	}
	for _, reason := range refusals {
		m.rejected.WithLabelValues(reason)
	}
	m.registry.MustRegister(m.runs, m.runSeconds, m.operations, m.sessions, m.rejected, m.hostCalls, m.unauthed,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		&stateCollector{eng: eng, gate: g})
	return m
}

// observeRun counts a run of the minipy tool.
// countE2B adds the E2B server's counts to the metrics.
func (m *metrics) countE2B(srv *e2b.Server) {
	for _, c := range []struct {
		name, help string
		get        func(e2b.Stats) int
		gauge      bool
	}{
		{"minipy_e2b_sandboxes", "E2B sandboxes running.", func(s e2b.Stats) int { return s.Running }, true},
		{"minipy_e2b_sandboxes_paused", "E2B sandboxes paused (held in the server's memory).",
			func(s e2b.Stats) int { return s.Paused }, true},
		{"minipy_e2b_sandboxes_created_total", "E2B sandboxes created.", func(s e2b.Stats) int { return s.Created }, false},
		{"minipy_e2b_sandboxes_expired_total", "E2B sandboxes killed when their time ended.",
			func(s e2b.Stats) int { return s.Expired }, false},
		{"minipy_e2b_sandboxes_killed_total", "E2B sandboxes killed through the API.",
			func(s e2b.Stats) int { return s.Killed }, false},
		{"minipy_e2b_executions_total", "E2B executions (runCode).", func(s e2b.Stats) int { return s.Executed }, false},
	} {
		value := func() float64 { return float64(c.get(srv.Stats())) }
		if c.gauge {
			m.registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: c.name, Help: c.help}, value))
		} else {
			m.registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: c.name, Help: c.help}, value))
		}
	}
}

func (m *metrics) observeRun(res minipy.ToolResult) {
	if m == nil {
		return
	}
	m.runs.WithLabelValues(outcome(res.Err)).Inc()
	if res.Duration > 0 {
		m.runSeconds.Observe(res.Duration.Seconds())
	}
}

// countHostCalls wraps fn's Call to count its calls.
func (m *metrics) countHostCalls(fn minipy.Function) minipy.Function {
	if m == nil {
		return fn
	}
	call := fn.Call
	ok, failed := m.hostCalls.WithLabelValues(fn.Name, "ok"), m.hostCalls.WithLabelValues(fn.Name, "error")
	fn.Call = func(ctx context.Context, args map[string]any) (any, error) {
		done := false
		defer func() {
			if !done { // a panic, which minipy turns into the code's HostError
				failed.Inc()
			}
		}()
		v, err := call(ctx, args)
		done = true
		if err != nil {
			failed.Inc()
		} else {
			ok.Inc()
		}
		return v, err
	}
	return fn
}

// middleware times every MCP request and notification the server receives
// (mcp.server.operation.duration).
func (m *metrics) middleware(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		start := time.Now()
		res, err := next(ctx, method, req)
		tool, operation, errType := "", "", ""
		if p, ok := req.GetParams().(*mcp.CallToolParamsRaw); ok {
			tool, operation = known(m.tools, p.Name), "execute_tool"
		}
		var rpcErr *jsonrpc.Error
		switch {
		case errors.As(err, &rpcErr):
			errType = strconv.FormatInt(rpcErr.Code, 10)
		case err != nil:
			errType = "_OTHER"
		default:
			if r, ok := res.(*mcp.CallToolResult); ok && r.IsError {
				errType = "tool_error"
			}
		}
		m.operations.WithLabelValues(known(mcpMethods, method), tool, operation, errType, m.transport,
			protocolVersion(req)).Observe(time.Since(start).Seconds())
		if method == "initialize" && err == nil {
			if ss, ok := req.GetSession().(*mcp.ServerSession); ok {
				version := protocolVersion(req)
				go func() {
					ss.Wait() //nolint:errcheck // over either way
					m.sessions.WithLabelValues(m.transport, version).Observe(time.Since(start).Seconds())
				}()
			}
		}
		return res, err
	}
}

// protocolVersion is the MCP version the request's client asked for, if the SDK knows it
// ("_OTHER" if not: a label takes no value a client makes up).
func protocolVersion(req mcp.Request) string {
	v := ""
	if p, ok := req.GetParams().(*mcp.InitializeParams); ok {
		v = p.ProtocolVersion
	} else if ss, ok := req.GetSession().(*mcp.ServerSession); ok {
		if ip := ss.InitializeParams(); ip != nil {
			v = ip.ProtocolVersion
		}
	}
	if v == "" || slices.Contains(mcp.SupportedProtocolVersions(), v) {
		return v
	}
	return "_OTHER"
}

// mcpMethods are the method names the OTel MCP conventions list.
var mcpMethods = []string{"completion/complete", "elicitation/create", "initialize", "logging/setLevel",
	"notifications/cancelled", "notifications/initialized", "notifications/message", "notifications/progress",
	"notifications/prompts/list_changed", "notifications/resources/list_changed", "notifications/resources/updated",
	"notifications/roots/list_changed", "notifications/tools/list_changed", "ping", "prompts/get", "prompts/list",
	"resources/list", "resources/read", "resources/subscribe", "resources/templates/list", "resources/unsubscribe",
	"roots/list", "sampling/createMessage", "tools/call", "tools/list"}

// known is v if it is one of values, else "_OTHER": label values are never what a client
// makes up, which could grow the metrics without bound.
func known(values []string, v string) string {
	if slices.Contains(values, v) {
		return v
	}
	return "_OTHER"
}

// stateCollector reports, at each scrape, the sessions, the drain and the engine's workers.
type stateCollector struct {
	eng  minipy.Engine
	gate *gate
}

var (
	descSessions = prometheus.NewDesc("minipy_sessions_active", "MCP sessions open (each may hold a namespace).",
		nil, nil)
	descDraining = prometheus.NewDesc("minipy_draining",
		"1 while the server drains (SIGTERM): it takes no new session and lets running calls finish.", nil, nil)
	descNamespaces = prometheus.NewDesc("minipy_namespaces",
		"Open namespaces of the isolated engine (sessions that have run code).", nil, nil)
	descWorkers = prometheus.NewDesc("minipy_workers",
		"Worker processes serving namespaces or started ahead for the next ones (minipy_spares).", nil, nil)
	descProcesses = prometheus.NewDesc("minipy_worker_processes",
		"Processes of the isolated engine: template, guardians, workers, rollback snapshots, what the code started.",
		nil, nil)
	descMemory = prometheus.NewDesc("minipy_worker_memory_bytes",
		"Memory of the isolated engine's processes: their proportional set sizes (PSS), summed.", nil, nil)
	descStarts = prometheus.NewDesc("minipy_worker_starts_total", "Worker starts, by result (ok, failed).",
		[]string{"result"}, nil)
	descIdleDeaths = prometheus.NewDesc("minipy_worker_idle_deaths_total",
		"Workers that ended between runs (killed, crashed by a thread left running; spares included), by what "+
			"their namespaces kept: kept (a snapshot took over: nothing lost) or lost (their variables).",
		[]string{"state"}, nil)
	descSpares = prometheus.NewDesc("minipy_spares",
		"Sandboxes started ahead for the next sessions (-spares), ready or still starting.", nil, nil)
	descSpareTakes = prometheus.NewDesc("minipy_spare_takes_total",
		"New sessions by what they found: hit (a spare whose start had ended), miss (none, or one still "+
			"starting: the session's first call waited for the rest of a sandbox's start).", []string{"result"}, nil)
	descDeaths = prometheus.NewDesc("minipy_process_deaths_total",
		"Processes of the isolated engine that ended between runs, not ended by the server (killed from outside, "+
			"the OOM killer, a crash), by kind: template, spare, worker, snapshot (nothing lost: replaced, or a "+
			"snapshot takes over), sandbox (a sandbox's pid 1, its guardian: the session's variables go with it).",
		[]string{"kind"}, nil)
	descEgress = prometheus.NewDesc("minipy_egress_total",
		"Connections and requests through the sandboxes' egress proxies (-egress-allow), by result (allowed, refused: "+
			"by the policy or cut by a cap).", []string{"result"}, nil)
	descEgressBytes = prometheus.NewDesc("minipy_egress_bytes_total",
		"Bytes moved through the sandboxes' egress proxies, both ways.", nil, nil)
)

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descSessions, descDraining, descNamespaces, descWorkers, descProcesses,
		descMemory, descStarts, descIdleDeaths, descDeaths, descEgress, descEgressBytes, descSpares, descSpareTakes} {
		ch <- d
	}
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	open, draining := c.gate.state()
	ch <- prometheus.MustNewConstMetric(descSessions, prometheus.GaugeValue, float64(open))
	ch <- prometheus.MustNewConstMetric(descDraining, prometheus.GaugeValue, map[bool]float64{true: 1}[draining])
	iso, ok := c.eng.(*minipy.Isolated)
	if !ok {
		return
	}
	st := iso.Stats()
	ch <- prometheus.MustNewConstMetric(descNamespaces, prometheus.GaugeValue, float64(st.Namespaces))
	ch <- prometheus.MustNewConstMetric(descWorkers, prometheus.GaugeValue, float64(st.Workers))
	ch <- prometheus.MustNewConstMetric(descProcesses, prometheus.GaugeValue, float64(st.Processes))
	ch <- prometheus.MustNewConstMetric(descMemory, prometheus.GaugeValue, float64(st.MemoryBytes))
	ch <- prometheus.MustNewConstMetric(descSpares, prometheus.GaugeValue, float64(st.Spares))
	ch <- prometheus.MustNewConstMetric(descSpareTakes, prometheus.CounterValue, float64(st.SpareHits), "hit")
	ch <- prometheus.MustNewConstMetric(descSpareTakes, prometheus.CounterValue, float64(st.SpareMisses), "miss")
	ch <- prometheus.MustNewConstMetric(descStarts, prometheus.CounterValue, float64(st.Starts-st.StartFailures), "ok")
	ch <- prometheus.MustNewConstMetric(descStarts, prometheus.CounterValue, float64(st.StartFailures), "failed")
	ch <- prometheus.MustNewConstMetric(descIdleDeaths, prometheus.CounterValue, float64(st.IdleDeaths-st.IdleStateLost), "kept")
	ch <- prometheus.MustNewConstMetric(descIdleDeaths, prometheus.CounterValue, float64(st.IdleStateLost), "lost")
	for kind, n := range map[string]uint64{"template": st.Deaths.Template, "spare": st.Deaths.Spare,
		"worker": st.Deaths.Worker, "snapshot": st.Deaths.Snapshot, "sandbox": st.Deaths.Sandbox} {
		ch <- prometheus.MustNewConstMetric(descDeaths, prometheus.CounterValue, float64(n), kind)
	}
	ch <- prometheus.MustNewConstMetric(descEgress, prometheus.CounterValue, float64(st.EgressAllowed), "allowed")
	ch <- prometheus.MustNewConstMetric(descEgress, prometheus.CounterValue, float64(st.EgressRefused), "refused")
	ch <- prometheus.MustNewConstMetric(descEgressBytes, prometheus.CounterValue, float64(st.EgressBytes))
}
