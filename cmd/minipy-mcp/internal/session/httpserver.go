package session

import (
	"net/http"
	"time"
)

// The bounds of a client's connection, on both fronts' HTTP servers (HTTPServer).
const (
	// DefaultConnIdle closes a kept-alive connection that has sent no request for this long
	// (-conn-idle-timeout): idle connections are the server's fds and goroutines, which
	// anyone who reaches it could otherwise hold open for good.
	DefaultConnIdle = time.Minute
	// headerTimeout bounds the time a client takes to send a request's headers (a slow
	// client, or one that never ends them).
	headerTimeout = 10 * time.Second
	// maxHeaderBytes bounds a request's headers.
	maxHeaderBytes = 64 << 10
)

// HTTPServer is an HTTP server of h with the fronts' bounds on connections: idle ones close
// after idle (0: DefaultConnIdle).
func HTTPServer(h http.Handler, idle time.Duration) *http.Server {
	if idle <= 0 {
		idle = DefaultConnIdle
	}
	return &http.Server{Handler: h, ReadHeaderTimeout: headerTimeout, IdleTimeout: idle, MaxHeaderBytes: maxHeaderBytes}
}
