package e2b

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"

	"github.com/minipy-go/minipy"
	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/e2b/envd/proto/process"
	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/e2b/envd/proto/process/processconnect"
)

// envd's process service (E2B's process.proto over connect-go): commands.run and the rest.
// A command is minipy's Namespace.Start in the sandbox's default context: a process of the
// sandbox, started by its guardian beside the code, under the sandbox's limits, with the
// sandbox's environment variables and the request's. Its output streams as it comes.

type processService struct {
	processconnect.UnimplementedProcessHandler      // StreamInput: not served
	rootUser                                   bool // the sandboxes have a root user (Config.RootUser)
}

func (s *Server) processRoutes() {
	p, h := processconnect.NewProcessHandler(processService{rootUser: s.cfg.RootUser},
		connect.WithReadMaxBytes(maxEnvdMessage))
	s.envd.Handle(p, h)
}

// maxCommands caps the commands running at once in one sandbox (each holds three pipes
// in the host).
const maxCommands = 16

// keepalive is how often a command's stream says it is alive while it is quiet (E2B's
// SDK asks for 50 s in Keepalive-Ping-Interval).
const keepalive = 50 * time.Second

// command is a command running in a sandbox.
type command struct {
	proc   *minipy.Process
	config *process.ProcessConfig
	tag    *string
	pty    bool       // on a terminal (E2B's pty): its output is the terminal's, its input typed into it
	stdin  sync.Mutex // its writes, and its close
	closed bool
	gone   chan struct{} // closed once it has ended and left the sandbox's commands
	finish func()        // (once) its end: its watchers' streams end, it leaves the sandbox's commands, gone closes
	// watchers are the Connect streams that follow its events besides its own.
	watchers watchers
}

// watchers are the streams that Connect added to a command: each gets its output events
// as they come, then its end. One that cannot keep up (watcherBuffer events behind) is
// dropped, its stream ended: never the command's own stream, nor its output.
type watchers struct {
	mu    sync.Mutex
	chans map[chan *process.ProcessEvent]struct{}
	ended bool
}

// A command's watchers: at most maxWatchers at once, each at most watcherBuffer events
// behind.
const (
	maxWatchers   = 8
	watcherBuffer = 256
)

// add adds a watcher: nil when the command has ended, or has maxWatchers.
func (w *watchers) add() chan *process.ProcessEvent {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ended || len(w.chans) >= maxWatchers {
		return nil
	}
	if w.chans == nil {
		w.chans = map[chan *process.ProcessEvent]struct{}{}
	}
	ch := make(chan *process.ProcessEvent, watcherBuffer)
	w.chans[ch] = struct{}{}
	return ch
}

func (w *watchers) remove(ch chan *process.ProcessEvent) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.chans[ch]; ok {
		delete(w.chans, ch)
		close(ch)
	}
}

// send gives ev to every watcher that has room; the others are dropped.
func (w *watchers) send(ev *process.ProcessEvent) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for ch := range w.chans {
		select {
		case ch <- ev:
		default:
			delete(w.chans, ch)
			close(ch)
		}
	}
}

// end gives every watcher ev (nil: none: the command's own stream ended before it knew its
// end) and ends their streams; no watcher is added after.
func (w *watchers) end(ev *process.ProcessEvent) {
	if ev != nil {
		w.send(ev)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for ch := range w.chans {
		close(ch)
	}
	w.chans, w.ended = nil, true
}

// killWait bounds how long a SIGKILL's call waits for its command to be gone.
const killWait = 5 * time.Second

// commands are a sandbox's commands, by pid.
type commands struct {
	mu   sync.Mutex
	byID map[uint32]*command
}

// count is how many commands run.
func (c *commands) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.byID)
}

func (c *commands) add(pid uint32, cmd *command) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.byID) >= maxCommands {
		return false
	}
	if c.byID == nil {
		c.byID = map[uint32]*command{}
	}
	c.byID[pid] = cmd
	return true
}

func (c *commands) remove(pid uint32) {
	c.mu.Lock()
	delete(c.byID, pid)
	c.mu.Unlock()
}

// find is the command a selector names: by pid, or by tag.
func (c *commands) find(sel *process.ProcessSelector) (uint32, *command) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if pid, ok := sel.GetSelector().(*process.ProcessSelector_Pid); ok {
		return pid.Pid, c.byID[pid.Pid]
	}
	for pid, cmd := range c.byID {
		if cmd.tag != nil && *cmd.tag == sel.GetTag() {
			return pid, cmd
		}
	}
	return 0, nil
}

var errNotRunning = errors.New("the sandbox is not running")

func sandboxFrom(ctx context.Context) *sandbox { return ctx.Value(sandboxKey{}).(*sandbox) }

// Start starts a command and streams its events: its pid, its output, its end.
func (ps processService) Start(ctx context.Context, req *connect.Request[process.StartRequest], stream *connect.ServerStream[process.StartResponse]) error {
	sb := sandboxFrom(ctx)
	root, err := envdUser(ps.rootUser, req.Header(), nil)
	if err != nil {
		return connect.NewError(connect.CodeUnauthenticated, err)
	}
	cmd, pid, err := startCommand(sb, req.Msg, root)
	if err != nil {
		return err
	}
	cmd.finish = sync.OnceFunc(func() {
		cmd.watchers.end(nil)
		sb.cmds.remove(pid)
		close(cmd.gone)
	})
	leaveInflight(ctx) // (a command now: maxCommands bounds its stream)
	send := func(ev *process.ProcessEvent) error { return stream.Send(&process.StartResponse{Event: ev}) }
	if err := send(&process.ProcessEvent{Event: &process.ProcessEvent_Start{Start: &process.ProcessEvent_StartEvent{Pid: pid}}}); err != nil {
		cmd.proc.Signal(syscall.SIGKILL) //nolint:errcheck // its client is gone
		cmd.proc.Stdout.Close()
		cmd.proc.Stderr.Close()
		cmd.finish()
		return err
	}
	return streamCommand(ctx, cmd, send)
}

// startCommand starts what req asks for in sb's default context, as its root if root (in
// root's home unless req says where, as envd starts a user's commands in its home).
func startCommand(sb *sandbox, req *process.StartRequest, root bool) (*command, uint32, error) {
	ns := sb.namespace()
	if ns == nil {
		return nil, 0, connect.NewError(connect.CodeUnavailable, errNotRunning)
	}
	cfg := req.GetProcess()
	env := make([]string, 0, len(sb.envs)+len(cfg.GetEnvs()))
	for _, envs := range []map[string]string{sb.envs, cfg.GetEnvs()} {
		for k, v := range envs {
			env = append(env, k+"="+v)
		}
	}
	if why := checkEnvs(cfg.GetEnvs()); why != "" {
		return nil, 0, connect.NewError(connect.CodeInvalidArgument, errors.New(why))
	}
	mc := minipy.Command{Args: append([]string{cfg.GetCmd()}, cfg.GetArgs()...), Dir: cfg.GetCwd(), Env: env}
	if root {
		mc.User = "root"
	}
	switch {
	case mc.Dir != "":
	case sb.tmpl != nil && sb.tmpl.Workdir != "": // (a template's working directory, as E2B's commands start there)
		mc.Dir = sb.tmpl.Workdir
	case root:
		mc.Dir = RootHome // (root's home, as envd starts a user's commands in its home)
	}
	if req.Pty != nil {
		size := req.Pty.GetSize()
		mc.Terminal = &minipy.TerminalSize{Rows: clampSize(size.GetRows(), 24), Cols: clampSize(size.GetCols(), 80)}
	}
	proc, err := ns.Start(mc)
	if errors.Is(err, minipy.ErrTooManyTerminals) {
		return nil, 0, connect.NewError(connect.CodeResourceExhausted, err)
	}
	if errors.Is(err, minipy.ErrNamespaceClosed) || errors.Is(err, minipy.ErrCommandLost) {
		return nil, 0, connect.NewError(connect.CodeUnavailable, err)
	}
	if err != nil {
		return nil, 0, connect.NewError(connect.CodeInvalidArgument, err)
	}
	cmd := &command{proc: proc, config: cfg, tag: req.Tag, pty: req.Pty != nil, gone: make(chan struct{})}
	if !req.GetStdin() && !cmd.pty { // (a terminal's stdin is its keyboard: its close would be a ^D)
		cmd.closeStdin()
	}
	pid := uint32(proc.Pid)
	if !sb.cmds.add(pid, cmd) {
		proc.Signal(syscall.SIGKILL) //nolint:errcheck // refused
		proc.Stdin.Close()
		return nil, 0, connect.NewError(connect.CodeResourceExhausted,
			fmt.Errorf("the sandbox runs %d commands, its most; wait for one to end", maxCommands))
	}
	return cmd, pid, nil
}

// clampSize is a terminal's rows or columns as asked (def if none), at most 1,000.
func clampSize(n uint32, def uint16) uint16 {
	switch {
	case n == 0:
		return def
	case n > 1000:
		return 1000
	}
	return uint16(n)
}

func (c *command) closeStdin() {
	c.stdin.Lock()
	defer c.stdin.Unlock()
	if !c.closed {
		c.closed = true
		c.proc.Stdin.Close()
	}
}

// streamCommand sends cmd's output as it comes, a keepalive while it is quiet, then its
// end (relayEvents), and finishes it.
func streamCommand(ctx context.Context, cmd *command, send func(*process.ProcessEvent) error) (err error) {
	events := make(chan *process.ProcessEvent, 16)
	done := make(chan struct{}) // the relay has returned: the readers stop (not a detached one's)
	var readers sync.WaitGroup
	for _, r := range []struct {
		from io.Reader
		wrap func([]byte) *process.ProcessEvent_DataEvent
	}{
		{cmd.proc.Stdout, func(b []byte) *process.ProcessEvent_DataEvent {
			if cmd.pty { // (what the terminal shows: stdout and stderr as one)
				return &process.ProcessEvent_DataEvent{Output: &process.ProcessEvent_DataEvent_Pty{Pty: b}}
			}
			return &process.ProcessEvent_DataEvent{Output: &process.ProcessEvent_DataEvent_Stdout{Stdout: b}}
		}},
		{cmd.proc.Stderr, func(b []byte) *process.ProcessEvent_DataEvent {
			return &process.ProcessEvent_DataEvent{Output: &process.ProcessEvent_DataEvent_Stderr{Stderr: b}}
		}},
	} {
		readers.Add(1)
		go func() {
			defer readers.Done()
			buf := make([]byte, 32<<10)
			for {
				n, err := r.from.Read(buf)
				if n > 0 {
					ev := &process.ProcessEvent{Event: &process.ProcessEvent_Data{Data: r.wrap(append([]byte(nil), buf[:n]...))}}
					cmd.watchers.send(ev) // (read only from here on: each stream marshals it)
					select {
					case events <- ev:
					case <-done:
						return
					}
				}
				if err != nil {
					return
				}
			}
		}()
	}
	go func() {
		readers.Wait()
		close(events)
	}()
	detached := false
	defer func() { // (also when the relay drops the connection: a panic)
		if !detached {
			close(done)
			cmd.finish()
		}
	}()
	detached, err = relayEvents(ctx, cmd, events, send)
	return err
}

// relayEvents sends events, then cmd's end. A client that goes away leaves the command
// running, as envd does (commands.connect and pty.connect follow it again): the rest is
// followDetached's, in a goroutine of its own, and the request ends (a server's shutdown does
// not wait for a command that runs on). The request's deadline (Connect-Timeout-Ms: the
// SDKs' timeoutMs) is the command's timeout all the same: past it, it is killed.
func relayEvents(ctx context.Context, cmd *command, events <-chan *process.ProcessEvent, send func(*process.ProcessEvent) error) (detached bool, err error) {
	tick := time.NewTicker(keepalive)
	defer tick.Stop()
	deadline, timed := ctx.Deadline()
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				defer cmd.proc.Stdout.Close()
				defer cmd.proc.Stderr.Close()
				st, err := cmd.proc.Wait()
				if err != nil && sandboxFrom(ctx).ctx.Err() != nil {
					// Lost with its sandbox (killed, timed out): the connection drops, as E2B's
					// does, and the SDK raises its TimeoutError ("the sandbox was killed"), not
					// a command's exit.
					panic(http.ErrAbortHandler)
				}
				end := endEvent(st, err)
				cmd.watchers.end(end)
				return false, send(end)
			}
			if err := send(ev); err != nil {
				go followDetached(cmd, events, deadline, timed)
				return true, err
			}
		case <-tick.C:
			send(&process.ProcessEvent{Event: &process.ProcessEvent_Keepalive{Keepalive: &process.ProcessEvent_KeepAlive{}}}) //nolint:errcheck // the next send says
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				cmd.proc.Signal(syscall.SIGKILL) //nolint:errcheck // its time is up; its end follows
			}
			go followDetached(cmd, events, deadline, timed)
			return true, ctx.Err()
		}
	}
}

// followDetached follows a command whose client went away until it ends (killed at deadline,
// if timed), its output going to the streams that follow it alone; then finishes it.
func followDetached(cmd *command, events <-chan *process.ProcessEvent, deadline time.Time, timed bool) {
	defer cmd.finish()
	defer cmd.proc.Stdout.Close()
	defer cmd.proc.Stderr.Close()
	var timeout <-chan time.Time
	if timed {
		t := time.NewTimer(time.Until(deadline))
		defer t.Stop()
		timeout = t.C
	}
	for {
		select {
		case _, ok := <-events: // (each reached the watchers as it was read)
			if !ok {
				cmd.watchers.end(endEvent(cmd.proc.Wait()))
				return
			}
		case <-timeout:
			cmd.proc.Signal(syscall.SIGKILL) //nolint:errcheck // its time is up; its end follows
			timeout = nil
		}
	}
}

// endEvent is a command's end as envd reports it (Go's ProcessState.String for status).
func endEvent(st syscall.WaitStatus, err error) *process.ProcessEvent {
	end := &process.ProcessEvent_EndEvent{}
	switch {
	case err != nil:
		end.ExitCode, end.Status = -1, "lost"
		why := err.Error()
		end.Error = &why
	case st.Signaled():
		end.ExitCode, end.Status = -1, "signal: "+st.Signal().String()
	default:
		end.ExitCode, end.Exited, end.Status = int32(st.ExitStatus()), true, fmt.Sprintf("exit status %d", st.ExitStatus())
	}
	return &process.ProcessEvent{Event: &process.ProcessEvent_End{End: end}}
}

// Connect follows a running command (commands.connect): its start (its pid), the output it
// writes from now on, its end. The stream's end leaves the command running; a command
// ended, or not the sandbox's, is NotFound.
func (processService) Connect(ctx context.Context, req *connect.Request[process.ConnectRequest], stream *connect.ServerStream[process.ConnectResponse]) error {
	pid, cmd := sandboxFrom(ctx).cmds.find(req.Msg.GetProcess())
	var ch chan *process.ProcessEvent
	if cmd != nil {
		ch = cmd.watchers.add()
	}
	if ch == nil {
		if cmd != nil {
			return connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("the command has %d streams following it, "+
				"its most, or has ended", maxWatchers))
		}
		return connect.NewError(connect.CodeNotFound, fmt.Errorf("no running command %s",
			strings.TrimSpace(req.Msg.GetProcess().String())))
	}
	defer cmd.watchers.remove(ch)
	leaveInflight(ctx) // (maxWatchers and maxCommands bound these streams)
	send := func(ev *process.ProcessEvent) error { return stream.Send(&process.ConnectResponse{Event: ev}) }
	if err := send(&process.ProcessEvent{Event: &process.ProcessEvent_Start{Start: &process.ProcessEvent_StartEvent{Pid: pid}}}); err != nil {
		return err
	}
	tick := time.NewTicker(keepalive)
	defer tick.Stop()
	for {
		select {
		case ev, ok := <-ch:
			if !ok {
				return nil // (ended, or dropped for falling behind)
			}
			if err := send(ev); err != nil {
				return err
			}
		case <-tick.C:
			send(&process.ProcessEvent{Event: &process.ProcessEvent_Keepalive{Keepalive: &process.ProcessEvent_KeepAlive{}}}) //nolint:errcheck // the next send says
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// List lists the sandbox's running commands.
func (processService) List(ctx context.Context, _ *connect.Request[process.ListRequest]) (*connect.Response[process.ListResponse], error) {
	sb := sandboxFrom(ctx)
	sb.cmds.mu.Lock()
	out := &process.ListResponse{}
	for pid, cmd := range sb.cmds.byID {
		out.Processes = append(out.Processes, &process.ProcessInfo{Config: cmd.config, Pid: pid, Tag: cmd.tag})
	}
	sb.cmds.mu.Unlock()
	sort.Slice(out.Processes, func(i, j int) bool { return out.Processes[i].Pid < out.Processes[j].Pid })
	return connect.NewResponse(out), nil
}

// selected is the command a request names, or NotFound.
func selected(ctx context.Context, sel *process.ProcessSelector) (*command, error) {
	if _, cmd := sandboxFrom(ctx).cmds.find(sel); cmd != nil {
		return cmd, nil
	}
	return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("no running command %s", strings.TrimSpace(sel.String())))
}

// SendSignal sends SIGTERM or SIGKILL to a command's process group.
func (processService) SendSignal(ctx context.Context, req *connect.Request[process.SendSignalRequest]) (*connect.Response[process.SendSignalResponse], error) {
	cmd, err := selected(ctx, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	sig := syscall.SIGKILL
	if req.Msg.GetSignal() == process.Signal_SIGNAL_SIGTERM {
		sig = syscall.SIGTERM
	}
	if err := cmd.proc.Signal(sig); err != nil {
		return nil, connect.NewError(connect.CodeUnavailable, err)
	}
	if sig == syscall.SIGKILL {
		// A kill's answer means it is gone: out of commands.list, its place under the cap
		// free for the next start (a SIGTERM may be caught: its answer waits for nothing).
		t := time.NewTimer(killWait)
		defer t.Stop()
		select {
		case <-cmd.gone:
		case <-t.C:
		case <-ctx.Done():
		}
	}
	return connect.NewResponse(&process.SendSignalResponse{}), nil
}

// SendInput writes to a command's stdin, or types into its terminal.
func (processService) SendInput(ctx context.Context, req *connect.Request[process.SendInputRequest]) (*connect.Response[process.SendInputResponse], error) {
	cmd, err := selected(ctx, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	input := req.Msg.GetInput().GetStdin()
	if pty := req.Msg.GetInput().GetPty(); pty != nil {
		if !cmd.pty {
			return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("the command has no terminal (start it with a pty)"))
		}
		input = pty
	}
	cmd.stdin.Lock()
	defer cmd.stdin.Unlock()
	if cmd.closed {
		return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("the command's stdin is closed"))
	}
	if _, err := cmd.proc.Stdin.Write(input); err != nil {
		return nil, connect.NewError(connect.CodeFailedPrecondition, err)
	}
	return connect.NewResponse(&process.SendInputResponse{}), nil
}

// Update resizes a command's terminal.
func (processService) Update(ctx context.Context, req *connect.Request[process.UpdateRequest]) (*connect.Response[process.UpdateResponse], error) {
	cmd, err := selected(ctx, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if size := req.Msg.GetPty().GetSize(); size != nil {
		err := cmd.proc.Resize(minipy.TerminalSize{Rows: clampSize(size.GetRows(), 24), Cols: clampSize(size.GetCols(), 80)})
		if errors.Is(err, minipy.ErrNoTerminal) {
			return nil, connect.NewError(connect.CodeFailedPrecondition, err)
		}
		if err != nil {
			return nil, connect.NewError(connect.CodeUnavailable, err)
		}
	}
	return connect.NewResponse(&process.UpdateResponse{}), nil
}

// CloseStdin gives a command's stdin its end.
func (processService) CloseStdin(ctx context.Context, req *connect.Request[process.CloseStdinRequest]) (*connect.Response[process.CloseStdinResponse], error) {
	cmd, err := selected(ctx, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	cmd.closeStdin()
	return connect.NewResponse(&process.CloseStdinResponse{}), nil
}
