// Command minipy-mcp serves minipy as an MCP tool over stdio: "minipy" runs Python code in a
// namespace that persists for the client's session, and "reset" empties that namespace.
//
// Add it to an MCP client's configuration as a stdio server:
//
//	{"mcpServers": {"minipy": {"command": "minipy-mcp", "args": ["-timeout", "2m"]}}}
//
// Flags:
//
//	-timeout duration   default run timeout, also the most a model may ask for (default: the
//	                    tool's 60 s default, up to 600 s on request)
//	-max-output int     character budget of a reply (default 16384)
//	-isolated           run the code in worker processes (minipy.NewIsolated): hard
//	                    timeouts, crash survival, no network, resource limits
//	-workers int        worker processes with -isolated (default 2)
//	-memory-limit int   bytes of memory per worker with -isolated (0: none)
//
// The code's Python output is captured; anything that writes to file descriptor 1 directly
// (os.write, C extensions, subprocesses) goes to stderr instead, so it cannot corrupt the
// protocol on stdout.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"syscall"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/minipy-go/minipy"
)

// version is the server version reported to clients.
const version = "0.1.0"

func main() {
	timeout := flag.Duration("timeout", 0, "default run timeout and the most a model may ask for (0: minipy's tool defaults)")
	maxOutput := flag.Int("max-output", 0, "character budget of a reply (0: minipy.DefaultToolOutput)")
	isolated := flag.Bool("isolated", false, "run the code in worker processes with hard limits instead of in this process")
	workers := flag.Int("workers", 2, "worker processes with -isolated")
	memoryLimit := flag.Int64("memory-limit", 0, "bytes of memory per worker with -isolated (0: no limit)")
	flag.Parse()
	protocol, err := takeStdout()
	if err != nil {
		log.Fatalf("minipy-mcp: %v", err)
	}
	eng := minipy.InProcess()
	if *isolated {
		iso, err := minipy.NewIsolated(minipy.IsolatedConfig{Workers: *workers, MemoryLimit: *memoryLimit})
		if err != nil {
			log.Fatalf("minipy-mcp: %v", err)
		}
		defer iso.Close()
		eng = iso
	}
	opts := &minipy.Options{Timeout: *timeout, MaxOutput: *maxOutput}
	transport := &mcp.IOTransport{Reader: os.Stdin, Writer: protocol}
	if err := newServer(eng, opts).Run(context.Background(), transport); err != nil {
		log.Fatalf("minipy-mcp: %v", err)
	}
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
