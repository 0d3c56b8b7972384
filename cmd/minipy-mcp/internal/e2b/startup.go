package e2b

import (
	_ "embed" // (startup)

	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/e2b/charts"
)

// Startup is the Python that makes results as E2B's interpreter does: startup.py, then
// charts.py (package charts: a matplotlib figure's result.chart); the isolated engine's
// IsolatedConfig.Startup for the sandboxes of minipy-mcp -e2b.
var Startup = startup + "\n" + charts.Source

//go:embed startup.py
var startup string
