// Command minipy-mcp serves minipy as an MCP tool: "minipy" runs Python code in a namespace
// that persists for the client's session, and "reset" empties that namespace. It speaks
// stdio by default, or the Streamable HTTP transport with -http.
//
// Add it to an MCP client's configuration as a stdio server:
//
//	{"mcpServers": {"minipy": {"command": "minipy-mcp", "args": ["-timeout", "2m"]}}}
//
// or serve it over HTTP for remote clients (one namespace per MCP session; a session idle
// for -session-timeout is closed and its namespace freed):
//
//	minipy-mcp -http :8080 -backend isolated
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
//	-memory-limit int   bytes of memory per worker with -backend isolated (0: none)
//	-http addr          serve Streamable HTTP on addr (host:port) instead of stdio
//	-session-timeout d  with -http: close sessions idle this long (default 30m)
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
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/minipy-go/minipy"
)

// version is the server version reported to clients.
const version = "0.2.0"

func main() {
	backend := flag.String("backend", minipy.BackendAuto, "`engine`: inprocess, isolated, or auto (isolated on the project's virtualenv if there is one, else inprocess)")
	timeout := flag.Duration("timeout", 0, "default run timeout and the most a model may ask for (0: minipy's tool defaults)")
	maxOutput := flag.Int("max-output", 0, "character budget of a reply (0: minipy.DefaultToolOutput)")
	isolated := flag.Bool("isolated", false, "same as -backend isolated")
	workers := flag.Int("workers", 0, "with -backend isolated: pack the sessions into this many shared worker processes (0: a worker process of its own per session)")
	memoryLimit := flag.Int64("memory-limit", 0, "bytes of memory per worker with -backend isolated (0: no limit)")
	httpAddr := flag.String("http", "", "serve the Streamable HTTP transport on `addr` (host:port) instead of stdio")
	sessionTimeout := flag.Duration("session-timeout", 30*time.Minute, "with -http: close a session (and free its namespace) after this long without a request")
	upstreamFile := flag.String("upstream", "", "connect to the MCP servers of this mcpServers JSON `file` and give their tools to the code as Python functions (code mode)")
	flag.Parse()
	if *isolated {
		*backend = minipy.BackendIsolated
	}
	var protocol *os.File
	if *httpAddr == "" {
		var err error
		if protocol, err = takeStdout(); err != nil {
			log.Fatalf("minipy-mcp: %v", err)
		}
	}
	eng, err := newEngine(*backend, minipy.IsolatedConfig{Workers: *workers, MemoryLimit: *memoryLimit})
	if err != nil {
		log.Fatalf("minipy-mcp: %v", err)
	}
	defer eng.Close()
	if iso, ok := eng.(*minipy.Isolated); ok {
		log.Printf("minipy-mcp: running code in the isolated engine's sandboxed workers (working directory %s)", iso.WorkDir())
	} else {
		log.Printf("minipy-mcp: running code in this process's embedded interpreter")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var fns []minipy.Function
	if *upstreamFile != "" {
		up, err := connectUpstreams(ctx, *upstreamFile)
		if err != nil {
			log.Fatalf("minipy-mcp: -upstream: %v", err)
		}
		defer up.Close()
		fns = up.functions
	}
	server := newServer(eng, &minipy.Options{Timeout: *timeout, MaxOutput: *maxOutput}, fns...)
	if *httpAddr != "" {
		err = serveHTTP(ctx, server, *httpAddr, *sessionTimeout)
	} else {
		err = server.Run(ctx, &mcp.IOTransport{Reader: os.Stdin, Writer: protocol})
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		log.Fatalf("minipy-mcp: %v", err)
	}
}

// newEngine starts the engine -backend names (auto: for the current directory).
func newEngine(backend string, cfg minipy.IsolatedConfig) (minipy.Engine, error) {
	dir, err := os.Getwd()
	if err != nil {
		return nil, err
	}
	return minipy.NewBackend(backend, dir, cfg)
}

// serveHTTP serves server's Streamable HTTP transport on addr until ctx ends. Each MCP
// session gets its own namespace (see sessions); idle sessions close after idle.
func serveHTTP(ctx context.Context, server *mcp.Server, addr string, idle time.Duration) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: httpHandler(server, idle), ReadHeaderTimeout: 10 * time.Second}
	log.Printf("minipy-mcp: serving MCP over HTTP at http://%s/mcp", ln.Addr())
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(shutdown) //nolint:errcheck // exiting anyway
	}()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return ctx.Err()
}

// httpHandler is server's Streamable HTTP transport, at /mcp (and /), with sessions closed
// after idle without a request.
func httpHandler(server *mcp.Server, idle time.Duration) http.Handler {
	return mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server },
		&mcp.StreamableHTTPOptions{SessionTimeout: idle})
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
