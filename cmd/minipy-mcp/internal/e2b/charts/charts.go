// Package charts is E2B's result.chart for minipy-mcp -e2b: charts.py reads a matplotlib
// figure as E2B's code interpreter does (its kind, title, labels, units, scales, ticks and
// elements) and registers that reading as the e2b/chart display formatter.
package charts

import _ "embed" // (Source)

// Source is charts.py, Python because the figure it reads lives in the sandbox's
// interpreter: run after startup.py in every worker (e2b.Startup), it registers the
// e2b/chart formatter through minipy's __minipy__.display_formatter, which the notebook
// calls on each figure it shows. It stands alone (its names are _chart_*), so its tests
// run it in a plain python3.
//
//go:embed charts.py
var Source string
