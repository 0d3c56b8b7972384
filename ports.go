package minipy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/minipy-go/minipy/internal/pyrt"
)

// Ports: a server that the code or a command starts in its sandbox (python -m http.server,
// a notebook, a web app being built) listens in the sandbox's own network namespace, which
// nothing outside reaches. Namespace.DialPort connects the host to it: the sandbox's
// guardian, which the code cannot reach, connects a socket to 127.0.0.1:port inside and
// hands it over (pyrt.ControlConnect); the host then holds a connection to that port and to
// nothing else of the sandbox's network. E2B's getHost(port) is served with it.

// ErrNoPorts is matched by Namespace.DialPort's error for a namespace whose sandbox has no
// ports of its own for the host to reach: in-process namespaces, Command workers, packed
// workers (IsolatedConfig.Workers), unsandboxed workers, and IsolatedConfig.Network, whose
// sandbox shares the host's network (its 127.0.0.1 is the host's).
var ErrNoPorts = errors.New("minipy: this namespace's sandbox has no network of its own whose ports the host reaches")

// ErrTooManyConnections is matched by Namespace.DialPort's error when the engine has
// maxPortConns connections to sandboxes' ports open: each holds a descriptor of the host's.
var ErrTooManyConnections = errors.New("minipy: the engine has 1024 connections to sandboxes' ports open, its most")

// maxPortConns bounds the connections to sandboxes' ports open at once, engine-wide.
const maxPortConns = 1024

// dialPortTimeout bounds DialPort without a deadline: the guardian's answer, then the
// connection's completion (at once on a loopback, unless the server's backlog is full).
const dialPortTimeout = 10 * time.Second

// DialPort connects to port on 127.0.0.1 inside the namespace's sandbox, where a server
// that its code or one of its commands started listens (on 127.0.0.1 or on every
// address). Nothing listening there gives an error matching syscall.ECONNREFUSED. The
// connection is the caller's to close; an engine has at most 1,024 open
// (ErrTooManyConnections), and the namespace's Close, or the loss of its sandbox, ends
// them. ctx bounds the connecting (10 s without a deadline), not the connection. Safe from
// any goroutine, beside runs.
func (ns *Namespace) DialPort(ctx context.Context, port int) (net.Conn, error) {
	if port <= 0 || port > 65535 {
		return nil, fmt.Errorf("minipy: port %d: not a TCP port", port)
	}
	e, err := ns.isolated(ErrNoPorts, "dial it directly")
	if err != nil {
		return nil, err
	}
	return e.dialPort(ctx, ns, port)
}

func (e *Isolated) dialPort(ctx context.Context, ns *Namespace, port int) (net.Conn, error) {
	b := bindingOf(ns)
	switch {
	case b == nil || !b.slot.own || !e.local() || !e.sandbox:
		return nil, fmt.Errorf("%w: its worker is shared (Workers), runs elsewhere (Command) or unsandboxed", ErrNoPorts)
	case e.cfg.Network:
		return nil, fmt.Errorf("%w: with Network its 127.0.0.1 is the host's", ErrNoPorts)
	case e.cfg.Egress != nil && port == pyrt.EgressPort:
		return nil, fmt.Errorf("minipy: port %d is the sandbox's egress proxy's, not a server of its own", port)
	}
	if e.portConns.Add(1) > maxPortConns {
		e.portConns.Add(-1)
		return nil, ErrTooManyConnections
	}
	c, err := e.connectPort(ctx, b, port)
	if err != nil {
		e.portConns.Add(-1)
		return nil, err
	}
	return &portConn{Conn: c, done: sync.OnceFunc(func() { e.portConns.Add(-1) })}, nil
}

// connectPort has b's guardian connect to port, and waits for the connection to complete.
func (e *Isolated) connectPort(ctx context.Context, b *nsBinding, port int) (net.Conn, error) {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(dialPortTimeout)
	}
	w, err := b.slot.current()
	if err != nil {
		return nil, err
	}
	f, err := w.ConnectPort(uint16(port), max(time.Until(deadline), time.Millisecond))
	if err != nil {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", err)}
	}
	defer f.Close()
	c, err := net.FileConn(f)
	if err != nil {
		return nil, err
	}
	if err := connected(ctx, c, deadline); err != nil {
		c.Close()
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: err}
	}
	return c, nil
}

// connected waits until c's non-blocking connect has completed (writable), by deadline or
// ctx's end, and returns how it ended (SO_ERROR).
func connected(ctx context.Context, c net.Conn, deadline time.Time) error {
	raw, err := c.(syscall.Conn).SyscallConn()
	if err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() { c.SetWriteDeadline(time.Unix(1, 0)) })
	defer stop()
	c.SetWriteDeadline(deadline)
	defer c.SetWriteDeadline(time.Time{})
	var soErr error
	err = raw.Write(func(fd uintptr) bool {
		n, err := syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_ERROR)
		switch {
		case err != nil:
			soErr = err
		case n != 0:
			soErr = os.NewSyscallError("connect", syscall.Errno(n))
		default:
			if _, err := syscall.Getpeername(int(fd)); err == syscall.ENOTCONN {
				return false // still connecting: wait until it is writable
			}
		}
		return true
	})
	if err == nil {
		err = soErr
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// portConn is a connection DialPort made, which gives its place back when closed.
type portConn struct {
	net.Conn
	done func()
}

func (c *portConn) Close() error {
	c.done()
	return c.Conn.Close()
}
