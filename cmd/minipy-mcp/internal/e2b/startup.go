package e2b

import _ "embed" // (Startup)

// Startup is the Python that makes results as E2B's interpreter does (startup.py): the
// isolated engine's IsolatedConfig.Startup for the sandboxes of minipy-mcp -e2b.
//
//go:embed startup.py
var Startup string
