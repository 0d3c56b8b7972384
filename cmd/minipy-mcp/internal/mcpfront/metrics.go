package mcpfront

// MCP's metrics, beside the server's (session.Metrics): they follow the OpenTelemetry
// semantic conventions for MCP (mcp.server.operation.duration and
// mcp.server.session.duration, their attributes as labels, named as the OTel Prometheus
// exporter names them).

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/minipy-go/minipy"
	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/session"
)

// mcpDurationBuckets are the bucket boundaries (seconds) the OTel MCP conventions give for
// their duration histograms.
var mcpDurationBuckets = []float64{0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30, 60, 120, 300}

// opMetrics times MCP's operations and sessions.
type opMetrics struct {
	operations *prometheus.HistogramVec
	sessions   *prometheus.HistogramVec
	transport  string   // network.transport: "tcp" over HTTP, "pipe" over stdio
	tools      []string // the server's tools: the only gen_ai.tool.name values
}

// newOpMetrics registers MCP's histograms in m's registry.
func newOpMetrics(m *session.Metrics, transport string) *opMetrics {
	o := &opMetrics{transport: transport, tools: []string{minipy.ToolName, ResetToolName}}
	o.operations = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "mcp_server_operation_duration_seconds",
		Help: "MCP request or notification duration as observed on the receiver from the time it was received " +
			"until the result or ack is sent (OpenTelemetry mcp.server.operation.duration).",
		Buckets: mcpDurationBuckets,
	}, []string{"mcp_method_name", "gen_ai_tool_name", "gen_ai_operation_name", "error_type", "network_transport",
		"mcp_protocol_version"})
	o.sessions = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "mcp_server_session_duration_seconds",
		Help:    "The duration of the MCP session as observed on the MCP server (OpenTelemetry mcp.server.session.duration).",
		Buckets: []float64{1, 10, 30, 60, 300, 600, 1800, 3600, 7200, 14400, 43200, 86400},
	}, []string{"network_transport", "mcp_protocol_version"})
	m.Registry().MustRegister(o.operations, o.sessions)
	return o
}

// middleware times every MCP request and notification the server receives
// (mcp.server.operation.duration).
func (m *opMetrics) middleware(next mcp.MethodHandler) mcp.MethodHandler {
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
