package session

// The server's metrics, in the Prometheus text format at /metrics: the minipy_ ones, which
// every front shares (runs, sessions, host calls, the engine's workers). minipy, the
// library, has no metrics dependency: the engine's figures come from
// (*minipy.Isolated).Stats at each scrape, and each run's outcome from
// minipy.ToolResult.Err. A front registers its own beside them (Registry).

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/minipy-go/minipy"
)

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

// Outcome classifies a run's error (minipy_runs_total's label).
func Outcome(err error) string {
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

// Metrics is the server's collectors, registered in their own registry. A nil *Metrics
// counts nothing.
type Metrics struct {
	registry   *prometheus.Registry
	runs       *prometheus.CounterVec
	runSeconds prometheus.Histogram
	rejected   *prometheus.CounterVec
	hostCalls  *prometheus.CounterVec
	unauthed   prometheus.Counter
}

// NewMetrics makes the collectors; eng's figures (an *minipy.Isolated's Stats), g's open
// sessions and drain are read at each scrape. g's refusals are counted from now.
func NewMetrics(eng minipy.Engine, g *Gate) *Metrics {
	m := &Metrics{registry: prometheus.NewRegistry()}
	m.runs = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "minipy_runs_total",
		Help: "Runs of code (the minipy tool, E2B's runCode), by outcome: " + strings.Join(outcomes, ", ") + ".",
	}, []string{"outcome"})
	m.runSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "minipy_run_duration_seconds",
		Help:    "How long runs of code took, waiting for the namespace's worker included.",
		Buckets: runDurationBuckets,
	})
	m.rejected = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "minipy_sessions_rejected_total",
		Help: "New sessions refused, by reason: " + strings.Join(Refusals, ", ") + ".",
	}, []string{"reason"})
	m.hostCalls = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "minipy_host_calls_total",
		Help: "Calls from the code to host functions (the -upstream servers' tools), by function and outcome (ok, error).",
	}, []string{"function", "outcome"})
	m.unauthed = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "minipy_unauthorized_requests_total",
		Help: "HTTP requests refused for a missing or unknown bearer token or API key.",
	})
	// Every known label value from the start, so that a dashboard's rate() sees the first.
	for _, o := range outcomes {
		m.runs.WithLabelValues(o)
	}
	for _, reason := range Refusals {
		m.rejected.WithLabelValues(reason)
	}
	m.registry.MustRegister(m.runs, m.runSeconds, m.rejected, m.hostCalls, m.unauthed,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		&stateCollector{eng: eng, gate: g})
	g.Rejected = func(reason string) { m.rejected.WithLabelValues(reason).Inc() }
	return m
}

// Registry is where the metrics are registered, and a front registers its own.
func (m *Metrics) Registry() *prometheus.Registry { return m.registry }

// Unauthorized counts a request refused for its token or key.
func (m *Metrics) Unauthorized() {
	if m != nil {
		m.unauthed.Inc()
	}
}

// ObserveRun counts a run of code.
func (m *Metrics) ObserveRun(err error, took time.Duration) {
	if m == nil {
		return
	}
	m.runs.WithLabelValues(Outcome(err)).Inc()
	if took > 0 {
		m.runSeconds.Observe(took.Seconds())
	}
}

// CountHostCalls wraps fn's Call to count its calls.
func (m *Metrics) CountHostCalls(fn minipy.Function) minipy.Function {
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

// stateCollector reports, at each scrape, the sessions, the drain and the engine's workers.
type stateCollector struct {
	eng  minipy.Engine
	gate *Gate
}

var (
	descSessions = prometheus.NewDesc("minipy_sessions_active", "Sessions open: MCP sessions and handles, E2B sandboxes and their code contexts (each may hold a namespace).",
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
	descCgroups = prometheus.NewDesc("minipy_cgroups_total",
		"Sandboxes' cgroups by how each sandbox got its own: made (a new group, with its limits) or reused (a "+
			"group an earlier sandbox left, kept empty with its limits).", []string{"how"}, nil)
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
		descMemory, descStarts, descIdleDeaths, descDeaths, descEgress, descEgressBytes, descSpares, descSpareTakes, descCgroups} {
		ch <- d
	}
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	open, draining := c.gate.State()
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
	ch <- prometheus.MustNewConstMetric(descCgroups, prometheus.CounterValue, float64(st.CgroupsMade), "made")
	ch <- prometheus.MustNewConstMetric(descCgroups, prometheus.CounterValue, float64(st.CgroupsReused), "reused")
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
