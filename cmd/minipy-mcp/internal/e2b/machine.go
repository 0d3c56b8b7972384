package e2b

import (
	"bufio"
	"context"
	"io"
	"sync"
	"syscall"

	"github.com/minipy-go/minipy"
	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/templates"
)

// sandboxMachine is a sandbox as the machine a template's build runs in (templates.Machine):
// its commands are those of its default context's namespace (the sandbox's commands), as
// its user or its root (rootUser: the server's sandboxes have one), bash's.
type sandboxMachine struct {
	sb       *sandbox
	rootUser bool
}

func (m sandboxMachine) RootUser() bool { return m.rootUser }

func (m sandboxMachine) start(c templates.Cmd) (*minipy.Process, error) {
	ns := m.sb.namespace()
	if ns == nil {
		return nil, errNotRunning
	}
	mc := minipy.Command{Args: []string{"/bin/bash", "-c", c.Line}, Dir: c.Dir, Env: c.Env}
	if c.Root {
		mc.User = "root"
	}
	return ns.Start(mc)
}

// Run runs c to its end (ctx's end kills it and its children), its output's lines to out.
func (m sandboxMachine) Run(ctx context.Context, c templates.Cmd, out func(string)) (int, error) {
	p, err := m.start(c)
	if err != nil {
		return 0, err
	}
	p.Stdin.Close()
	stop := context.AfterFunc(ctx, func() { p.Signal(syscall.SIGKILL) }) //nolint:errcheck // (it may have ended)
	defer stop()
	var mu sync.Mutex // (one line at a time from both streams)
	var wg sync.WaitGroup
	for _, r := range []io.ReadCloser{p.Stdout, p.Stderr} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer r.Close()
			lines := bufio.NewScanner(r)
			lines.Buffer(make([]byte, 4096), 1<<20)
			for lines.Scan() {
				mu.Lock()
				out(lines.Text())
				mu.Unlock()
			}
			io.Copy(io.Discard, r) //nolint:errcheck // (a line past 1 MiB: the rest unread would stop it)
		}()
	}
	wg.Wait()
	st, err := p.Wait()
	if err != nil {
		return 0, err
	}
	if ctx.Err() != nil {
		return 0, ctx.Err()
	}
	if st.Signaled() {
		return 128 + int(st.Signal()), nil
	}
	return st.ExitStatus(), nil
}

// Start starts c and leaves it running (its output unread: discarded as it comes).
func (m sandboxMachine) Start(c templates.Cmd) error {
	p, err := m.start(c)
	if err != nil {
		return err
	}
	p.Stdin.Close()
	for _, r := range []io.ReadCloser{p.Stdout, p.Stderr} {
		go func() {
			io.Copy(io.Discard, r) //nolint:errcheck // (to its end: the process's or the sandbox's)
			r.Close()
		}()
	}
	go p.Wait() //nolint:errcheck // (reaped when it ends)
	return nil
}

// Put writes data at name in the sandbox (an absolute name: the file methods' places), a
// file of the sandbox's user.
func (m sandboxMachine) Put(name string, data []byte) error {
	ns := m.sb.namespace()
	if ns == nil {
		return errNotRunning
	}
	return ns.WriteFile(name, data)
}
