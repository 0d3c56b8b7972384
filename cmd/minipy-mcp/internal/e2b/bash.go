package e2b

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/minipy-go/minipy"
)

// Bash contexts: E2B's code interpreter runs language "bash" in a Jupyter bash kernel (an
// interactive bash whose state lasts from cell to cell). Here a bash context is one bash
// process, a command of the sandbox (Namespace.Start in its default context: its files,
// its user, its limits, the sandbox's envs), started at the context's first cell (or at
// its create, when it asks for a cwd), fed its cells one at a time on its stdin. Each
// cell is eval'd by the shell itself, so that cd, variables, functions, aliases and
// options last; the context holds no namespace of its own (codeContext.ns is nil).
//
// The wire between Go and the shell (cellFrame writes it, cellStream reads it): a cell is
// a few lines of bash on the shell's stdin. The cell's code comes whole in a quoted
// here-document (nothing expanded) whose delimiter is random, then is eval'd with its
// stdin /dev/null (the cell never reads the shell's input) and the shell's two private
// descriptors closed; then the shell writes an end marker, 128 random bits made for that
// cell, on each of stdout and stderr through those descriptors (62 and 63, the shell's
// first stdout and stderr: the cell's own redirections cannot take them away), the one
// on stdout followed by the cell's status. What comes before a marker is the cell's
// output, streamed as it comes; what comes after (a background job's) waits for the next
// cell. A cell cannot end itself early by printing a marker: each cell's is new and
// random, written only in the frame's lines after its code, and in two halves, so that a
// trace of those lines (set -x, set -v, a DEBUG trap) does not show it whole. (Code bent
// on finding it, in the shell's memory or a trap that joins its halves, would only
// confuse its own context, whose timeout still ends its cells.)
//
// The shell is interactive (-i, without line editing): SIGINT then stops the cell's
// commands and the eval they run in, and the shell goes on to the frame's next line (a
// non-interactive shell would die of it); aliases expand, as in E2B's kernel, whose bash
// is interactive too; history is off. A cell past its timeout, or whose request ends,
// gets SIGINT (to the shell's process group: background jobs ignore it, as they do in a
// shell without job control); if its end marker does not come within bashInterruptGrace,
// the shell is killed and the cell's error says its state is lost. A cell that ends the
// shell (exit, set -e, a kill) is told so, and the next cell starts a new shell, in the
// context's cwd; a shell that ended between cells (a restart of the default context ends
// its commands) is replaced at the next cell, which is told so.
//
// A pause (or fork, or snapshot) cannot keep a shell's memory: a bash context keeps its
// id, count, cwd and whether it is its sandbox's default bash context, and a resume gives
// it a new shell at its next cell, in that cwd (not where the old one had cd'd to),
// without the old one's variables, functions, aliases, options and background jobs. Its
// files are the default context's, which the pause keeps.

// langBash is the language of a bash context.
const langBash = "bash"

// bashArgs start a context's shell: interactive, without line editing (its input is the
// frames, not a terminal), reading no startup file: nothing but the sandbox's envs.
var bashArgs = []string{"bash", "--noprofile", "--norc", "--noediting", "-i"}

const (
	// bashInterruptGrace is how long a cell interrupted (SIGINT) has to end before its
	// shell is killed.
	bashInterruptGrace = 3 * time.Second
	// bashStartWait bounds a new shell's first answer.
	bashStartWait = 30 * time.Second
	// bashDrainWait is how long a cell whose shell ended waits for the rest of its output
	// (a background job may hold the pipes open for ever).
	bashDrainWait = 200 * time.Millisecond
	// bashStartOutput caps what a shell that did not start said, kept for its error.
	bashStartOutput = 1 << 10
)

// errBashNoStart: a shell ended, or did not answer, before its first marker.
var errBashNoStart = errors.New("bash did not start")

// bashStatusError is a cell that ended with a status other than 0 (its last command's,
// exit's, or 128 plus the signal that killed its shell). E2B's bash kernel reports it so:
// an error of no name whose value is the status.
type bashStatusError struct{ status int }

func (e *bashStatusError) Error() string { return "bash: exit status " + strconv.Itoa(e.status) }

// bashInterruptedError is a cell stopped: by its timeout (cause minipy.ErrTimeout) or its
// request's end (the context's error). lost: it did not stop on SIGINT, and its shell was
// killed with everything it held.
type bashInterruptedError struct {
	cause error
	after time.Duration
	lost  bool
	cwd   string // where the next shell starts
}

func (e *bashInterruptedError) Error() string {
	what := "timed out"
	if !errors.Is(e.cause, minipy.ErrTimeout) {
		what = "cancelled (" + e.cause.Error() + ")"
	}
	msg := fmt.Sprintf("minipy: bash cell %s after %v: interrupted (SIGINT)", what, e.after.Round(time.Millisecond))
	if e.lost {
		msg += fmt.Sprintf("; it did not stop, so its shell was killed and the shell's state (directory, variables, "+
			"functions) is lost: the next cell starts a new shell in %s", e.cwd)
	}
	return msg
}

func (e *bashInterruptedError) Unwrap() error { return e.cause }

// bashErrorMessage is a cell's error as E2B's stream says it.
func bashErrorMessage(err error) map[string]any {
	var st *bashStatusError
	var ie *bashInterruptedError
	switch {
	case errors.As(err, &st):
		return map[string]any{"type": "error", "name": "", "value": strconv.Itoa(st.status), "traceback": ""}
	case errors.As(err, &ie):
		return map[string]any{"type": "error", "name": "TimeoutError", "value": ie.Error(), "traceback": ""}
	}
	return map[string]any{"type": "error", "name": "SandboxError", "value": err.Error(), "traceback": ""}
}

// bashShell is a bash context's shell: its process, and what it writes as it is read.
type bashShell struct {
	proc *minipy.Process
	ns   *minipy.Namespace // whose command it is: the default context's (a restart of it ends it)
	// chunks are its stdout's and stderr's reads, each closed at its stream's end; held,
	// what was read past the last cell's markers, the next cell's.
	chunks [2]chan []byte
	held   [2][]byte
	// exited is closed once it has ended: status, or lost (Wait's error), then say how.
	exited chan struct{}
	status syscall.WaitStatus
	lost   error

	stop    chan struct{} // closed by kill: the readers give up
	stopped sync.Once
	readers sync.WaitGroup
}

// startBash starts a shell for a context of sb, in cwd if it can enter it (else in the
// working directory, as a Python context does), and returns it and where it is.
func (s *Server) startBash(ctx context.Context, sb *sandbox, cwd string) (*bashShell, string, error) {
	ns := sb.namespace()
	if ns == nil {
		return nil, "", errNotRunning
	}
	env := make([]string, 0, len(sb.envs))
	for k, v := range sb.envs {
		env = append(env, k+"="+v)
	}
	proc, err := ns.Start(minipy.Command{Args: bashArgs, Env: env})
	if err != nil {
		return nil, "", err
	}
	sh := &bashShell{proc: proc, ns: ns, exited: make(chan struct{}), stop: make(chan struct{})}
	for i, r := range []io.Reader{proc.Stdout, proc.Stderr} {
		sh.chunks[i] = make(chan []byte)
		sh.readers.Add(1)
		go sh.pump(r, sh.chunks[i])
	}
	go func() {
		sh.status, sh.lost = proc.Wait()
		close(sh.exited)
	}()

	// Its setup: no history (its lines would pile up) nor history expansion (a "!" in the
	// frame's lines), no prompts (they go to stderr), the descriptors of the markers, its
	// directory; then its first markers, with where it is.
	marker := randomMarker()
	var b strings.Builder
	b.WriteString("\\builtin set +H +o history; \\builtin unset -v HISTFILE PROMPT_COMMAND; PS1= PS2= PS0= __minipy_xv=\n")
	b.WriteString("exec 62>&1 63>&2\n") // (not \builtin exec: a builtin's redirections are undone after it)
	if cwd != "" && cwd != Home {
		fmt.Fprintf(&b, "\\builtin cd -- %s 2>/dev/null\n", shellQuote(cwd))
	}
	fmt.Fprintf(&b, "\\builtin printf '%%s%%s:' %s %s >&62; \\builtin pwd -P >&62; \\builtin printf '%%s%%s:\\n' %s %s >&63\n",
		marker[:16], marker[16:], marker[:16], marker[16:])
	wrote := sh.write(b.String())
	defer func() { <-wrote }()

	said := &cappedBuffer{left: bashStartOutput}
	streams := [2]*cellStream{newCellStream(io.Discard, marker), newCellStream(said, marker)}
	wait := time.NewTimer(bashStartWait)
	defer wait.Stop()
	exited := sh.exited
	var drain <-chan time.Time
	for !streams[0].done || !streams[1].done {
		if drain != nil && streams[0].over() && streams[1].over() {
			break
		}
		select {
		case b, ok := <-sh.chunksFor(0, streams[0]):
			streams[0].take(b, ok)
		case b, ok := <-sh.chunksFor(1, streams[1]):
			streams[1].take(b, ok)
		case <-exited: // (what it said may still be in the pipes)
			exited, drain = nil, time.After(bashDrainWait)
		case <-drain:
			streams[0].closed, streams[1].closed = true, true
		case <-wait.C:
			sh.kill()
			return nil, "", fmt.Errorf("%w: no answer in %v", errBashNoStart, bashStartWait)
		case <-ctx.Done():
			sh.kill()
			return nil, "", ctx.Err()
		}
	}
	if !streams[0].done || !streams[1].done {
		streams[1].flush()
		sh.kill()
		return nil, "", fmt.Errorf("%w (%s): %s", errBashNoStart, sh.end(), strings.TrimSpace(said.String()))
	}
	sh.held = [2][]byte{streams[0].rest, streams[1].rest}
	return sh, streams[0].field, nil
}

// pump passes r's reads to ch until r ends or the shell is killed.
func (sh *bashShell) pump(r io.Reader, ch chan<- []byte) {
	defer sh.readers.Done()
	defer close(ch)
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			select {
			case ch <- bytes.Clone(buf[:n]):
			case <-sh.stop:
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// chunksFor is stream i's chunks while c wants them (nil: a select waits on it no more).
func (sh *bashShell) chunksFor(i int, c *cellStream) <-chan []byte {
	if c.done || c.closed {
		return nil
	}
	return sh.chunks[i]
}

// write writes s to the shell's stdin, and says when it is done: a cell's frame may be
// more than a pipe holds, and the shell reads it only as it parses it.
func (sh *bashShell) write(s string) <-chan error {
	done := make(chan error, 1)
	go func() {
		_, err := io.WriteString(sh.proc.Stdin, s)
		done <- err
	}()
	return done
}

// ended reports whether the shell has ended.
func (sh *bashShell) ended() bool {
	select {
	case <-sh.exited:
		return true
	default:
		return false
	}
}

// end says how the shell ended (once exited).
func (sh *bashShell) end() string {
	switch {
	case sh.lost != nil:
		return "lost with its sandbox"
	case sh.status.Signaled():
		return "killed by " + sh.status.Signal().String()
	default:
		return "exit status " + strconv.Itoa(sh.status.ExitStatus())
	}
}

// endStatus is the shell's end as a status: its exit status, or 128 plus its signal.
func (sh *bashShell) endStatus() int {
	switch {
	case sh.lost != nil:
		return 128 + int(syscall.SIGKILL)
	case sh.status.Signaled():
		return 128 + int(sh.status.Signal())
	default:
		return sh.status.ExitStatus()
	}
}

// kill ends the shell and what it started (its process group), and waits for its readers
// and, within killWait, for its end.
func (sh *bashShell) kill() {
	sh.proc.Signal(syscall.SIGKILL) //nolint:errcheck // ended already, or with its sandbox
	sh.proc.Stdin.Close()
	sh.proc.Stdout.Close()
	sh.proc.Stderr.Close()
	sh.stopped.Do(func() { close(sh.stop) })
	sh.readers.Wait()
	t := time.NewTimer(killWait)
	defer t.Stop()
	select {
	case <-sh.exited:
	case <-t.C:
	}
}

// stopShell kills cc's shell, if it has one (cc.mu held).
func (cc *codeContext) stopShell() {
	if cc.shell != nil {
		cc.shell.kill()
		cc.shell = nil
	}
}

// restartShell is a bash context's restart: its shell ends, after the cell in progress,
// and its next cell starts a new one.
func (cc *codeContext) restartShell() {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	cc.stopShell()
	cc.count = 0
}

// newBashContext makes a bash context of sb under the server's caps. Given a cwd, its
// shell starts now, there if it can enter it (its cwd then says where it is); else at its
// first cell, in the working directory.
func (s *Server) newBashContext(sb *sandbox, cwd string) (*codeContext, int, string) {
	release, refusal := s.placeFor(sb)
	if refusal != "" {
		return nil, http.StatusTooManyRequests, refusal
	}
	cc := &codeContext{id: randomID(), language: langBash, cwd: Home, release: release}
	if cwd == "" {
		return cc, 0, ""
	}
	sh, dir, err := s.startBash(sb.ctx, sb, cwd)
	if err != nil {
		cc.close()
		return nil, bashStartStatus(err), "the context's bash did not start: " + err.Error()
	}
	cc.shell, cc.cwd = sh, dir
	return cc, 0, ""
}

// bashStartStatus is the HTTP status of a shell's failed start.
func bashStartStatus(err error) int {
	switch {
	case errors.Is(err, minipy.ErrNoCommands):
		return http.StatusBadRequest // (this server's engine runs Python alone)
	case errors.Is(err, errNotRunning), errors.Is(err, minipy.ErrNamespaceClosed), errors.Is(err, minipy.ErrCommandLost):
		return http.StatusBadGateway
	}
	return http.StatusInternalServerError
}

// defaultBash is sb's default bash context, made at its first cell that names bash and
// no context, as E2B's server makes a language's default kernel; or nil, an HTTP status
// and why.
func (s *Server) defaultBash(sb *sandbox) (*codeContext, int, string) {
	find := func() *codeContext {
		i := slices.IndexFunc(sb.contexts, func(cc *codeContext) bool { return cc.byDefault && cc.language == langBash })
		if i < 0 {
			return nil
		}
		return sb.contexts[i]
	}
	sb.mu.Lock()
	cc := find()
	sb.mu.Unlock()
	if cc != nil {
		return cc, 0, ""
	}
	made, code, why := s.newBashContext(sb, "")
	if made == nil {
		return nil, code, why
	}
	made.byDefault = true
	sb.mu.Lock()
	switch cc = find(); {
	case cc != nil: // (another request made it meanwhile)
	case sb.dead || sb.state != stateRunning:
		code, why = http.StatusBadGateway, "the sandbox "+sb.id+" was killed or paused meanwhile"
	case len(sb.contexts) >= s.cfg.MaxContexts:
		code, why = http.StatusTooManyRequests, fmt.Sprintf("a sandbox holds at most %d code contexts, and its "+
			"default bash context would be one more; remove one first", s.cfg.MaxContexts)
	default:
		sb.contexts = append(sb.contexts, made)
		sb.mu.Unlock()
		return made, 0, ""
	}
	sb.mu.Unlock()
	made.close()
	return cc, code, why
}

// restoredBash gives a bash context made again (resume, fork, snapshot) what its pause
// kept; its save holds nothing, and is read to its end (the next context's follows).
func restoredBash(cc *codeContext, p pausedContext, save io.Reader) error {
	cc.cwd, cc.byDefault = p.cwd, p.byDefault
	_, err := io.Copy(io.Discard, save)
	return err
}

// executeBash runs a cell in bash context cc (cc.mu held) and streams what it does as
// E2B's /execute does.
func (s *Server) executeBash(ctx context.Context, w http.ResponseWriter, r *http.Request, sb *sandbox, cc *codeContext,
	code string, envs map[string]string) {
	for k := range envs {
		if !shellName(k) {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("environment variable %q: bash's names are letters, "+
				"digits and _, not starting with a digit", echo(k)))
			return
		}
	}
	sb.mu.Lock()
	held := sb.holds(cc) // (a shell started for a context closed meanwhile would outlive it)
	sb.mu.Unlock()
	if !held {
		writeError(w, http.StatusNotFound, "context "+echo(cc.id)+" was removed, or its sandbox killed or paused, meanwhile")
		return
	}
	var note string
	if sh := cc.shell; sh != nil && (sh.ended() || sh.ns != sb.namespace()) { // (killed meanwhile)
		why := "the sandbox's default context restarted, and its commands ended"
		if sh.ended() {
			why = sh.end()
		}
		note = fmt.Sprintf("minipy: this context's bash had ended (%s); this cell runs in a new one, in %s, without "+
			"what the old one held (its directory, variables, functions)\n", why, cc.cwd)
		cc.stopShell()
	}
	if cc.shell == nil {
		sh, _, err := s.startBash(ctx, sb, cc.cwd)
		if err != nil {
			writeError(w, bashStartStatus(err), "the context's bash did not start: "+err.Error())
			return
		}
		cc.shell = sh
	}
	cc.count++
	out := &stream{w: w}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	out.send(map[string]any{"type": "number_of_executions", "execution_count": cc.count})
	stderr := out.writer("stderr")
	if note != "" {
		stderr.Write([]byte(note)) //nolint:errcheck // (a stream's writes do not fail)
	}
	start := time.Now()
	err := s.cell(ctx, sb, cc, code, envs, out.writer("stdout"), stderr)
	s.cfg.Metrics.ObserveRun(err, time.Since(start))
	if ctx.Err() != nil && r.Context().Err() != nil {
		return // the client went away: nobody reads the rest
	}
	if err != nil {
		if sb.ctx.Err() != nil {
			panic(http.ErrAbortHandler) // (killed during the cell: as execute says)
		}
		out.send(bashErrorMessage(err))
	}
}

// cell runs code in cc's shell (cc.mu held), with envs exported for it alone, its output
// live on stdout and stderr. Its error is a bashStatusError or bashInterruptedError, or
// the context's when its sandbox ended.
func (s *Server) cell(ctx context.Context, sb *sandbox, cc *codeContext, code string, envs map[string]string,
	stdout, stderr *streamWriter) error {
	sh := cc.shell
	marker := randomMarker()
	wrote := sh.write(cellFrame(code, envs, "MINIPY_"+randomMarker(), marker))
	defer func() { <-wrote }() // (done: the shell has read it all, or its stdin is closed)
	streams := [2]*cellStream{newCellStream(stdout, marker), newCellStream(stderr, marker)}
	defer stdout.flush()
	defer stderr.flush()
	for i := range streams {
		streams[i].take(sh.held[i], true)
	}
	var timeout <-chan time.Time
	if s.cfg.Timeout > 0 {
		t := time.NewTimer(s.cfg.Timeout)
		defer t.Stop()
		timeout = t.C
	}
	start := time.Now()
	var interrupted error      // why it was interrupted, once it is
	var grace <-chan time.Time // from the interrupt
	var drain <-chan time.Time // from the shell's end
	exited := sh.exited
	for !streams[0].done || !streams[1].done {
		if drain != nil && streams[0].over() && streams[1].over() {
			break
		}
		select {
		case b, ok := <-sh.chunksFor(0, streams[0]):
			streams[0].take(b, ok)
		case b, ok := <-sh.chunksFor(1, streams[1]):
			streams[1].take(b, ok)
		case <-exited: // (what it wrote last may still be in the pipes)
			exited, drain = nil, time.After(bashDrainWait)
		case <-drain:
			streams[0].closed, streams[1].closed = true, true
		case <-timeout:
			timeout = nil
			if interrupted == nil {
				interrupted, grace = minipy.ErrTimeout, time.After(bashInterruptGrace)
				sh.proc.Signal(syscall.SIGINT) //nolint:errcheck // ended meanwhile: its end says
			}
		case <-ctx.Done():
			if sb.ctx.Err() != nil { // (killed: nothing to keep)
				cc.stopShell()
				return ctx.Err()
			}
			if interrupted == nil {
				interrupted, grace = ctx.Err(), time.After(bashInterruptGrace)
				sh.proc.Signal(syscall.SIGINT) //nolint:errcheck // ended meanwhile: its end says
			}
		case <-grace:
			cc.stopShell()
			return &bashInterruptedError{cause: interrupted, after: time.Since(start), lost: true, cwd: cc.cwd}
		}
	}
	return cellOutcome(cc, streams, interrupted, time.Since(start), stdout, stderr)
}

// cellOutcome is what a cell came to once its streams are done (its markers came) or over
// (the shell ended with it: exit, set -e, a kill): nil, or its error; interrupted says why
// it was interrupted, if it was, after how long.
func cellOutcome(cc *codeContext, streams [2]*cellStream, interrupted error, after time.Duration,
	stdout, stderr *streamWriter) error {
	sh := cc.shell
	if streams[0].done && streams[1].done {
		sh.held = [2][]byte{streams[0].rest, streams[1].rest}
		if interrupted != nil {
			return &bashInterruptedError{cause: interrupted, after: after}
		}
		if status, err := strconv.Atoi(streams[0].field); err == nil && status != 0 {
			return &bashStatusError{status: status}
		}
		return nil
	}
	for _, c := range streams {
		c.flush()
	}
	stdout.flush()
	cc.stopShell()
	if interrupted != nil {
		return &bashInterruptedError{cause: interrupted, after: after, lost: true, cwd: cc.cwd}
	}
	fmt.Fprintf(stderr, "minipy: bash ended (%s): the context's next cell starts a new shell, in %s, without this "+
		"one's directory, variables and functions\n", sh.end(), cc.cwd)
	if status := sh.endStatus(); status != 0 {
		return &bashStatusError{status: status}
	}
	return nil
}

// cellFrame is the bash that runs a cell (see the wire above): code read whole from a
// here-document ended by delim; envs exported for it; the user's -x and -v set again for
// it; then, on the eval's own line (read before -v is on, and run unless SIGINT stopped
// the eval, which drops the rest of its line), its status and options taken and -x, -v
// and the prompts turned off, so that the frame's next lines are neither traced, echoed
// nor prompted for; the next line does so after an interrupt; envs put back as they were
// (unset if they were); the markers. Every command is \builtin (no alias nor function of
// the cell's takes its place) but the { } that keeps -x quiet, and no line holds a "!".
func cellFrame(code string, envs map[string]string, delim, marker string) string {
	const quiet = "__minipy_xv=$-; \\builtin set +xv; } 2>/dev/null; PS1= PS2= PS0=; \\builtin unset -v PROMPT_COMMAND\n"
	var b strings.Builder
	fmt.Fprintf(&b, "IFS= \\builtin read -r -d '' __minipy_code <<'%s' || \\builtin true; \\builtin unset -v __minipy_s\n%s\n%s\n",
		delim, code, delim)
	names := make([]string, 0, len(envs))
	for k := range envs {
		names = append(names, k)
	}
	slices.Sort(names)
	for i, k := range names {
		fmt.Fprintf(&b, "__minipy_r%d=${%s+${%s@A}}; \\builtin export %s=%s\n", i, k, k, k, shellQuote(envs[k]))
	}
	b.WriteString("\\builtin set \"-${__minipy_xv-}\"; \\builtin eval \"${__minipy_code-}\" </dev/null 62>&- 63>&-; " +
		"{ __minipy_s=$? " + quiet)
	b.WriteString("\\builtin test -n \"${__minipy_s+1}\" || { __minipy_s=130 " + quiet)
	for i, k := range names {
		fmt.Fprintf(&b, "\\builtin unset -v %s; \\builtin eval \"${__minipy_r%d-}\"; \\builtin unset -v __minipy_r%d\n", k, i, i)
	}
	fmt.Fprintf(&b, "__minipy_xv=${__minipy_xv//[^xv]/}; \\builtin printf '%%s%%s:%%s\\n' %s %s \"$__minipy_s\" >&62; "+
		"\\builtin printf '%%s%%s:\\n' %s %s >&63; \\builtin unset -v __minipy_code __minipy_s; \\builtin set +H\n",
		marker[:16], marker[16:], marker[:16], marker[16:])
	return b.String()
}

// cellStream reads one of a shell's streams for a cell: what comes before the cell's
// marker goes to its writer; the marker's line (the marker, ":", a field: the status on
// stdout, then a line end) ends it, and what follows is rest.
type cellStream struct {
	to     io.Writer
	marker []byte // the marker and its ":"
	pend   []byte // read, not yet passed on: what may be the start of the marker
	done   bool   // its marker came
	closed bool   // the stream ended first
	field  string
	rest   []byte
}

func newCellStream(to io.Writer, marker string) *cellStream {
	return &cellStream{to: to, marker: []byte(marker + ":")}
}

// take is a read of the stream (ok false: its end).
func (c *cellStream) take(b []byte, ok bool) {
	if !ok {
		c.closed = true
		return
	}
	c.pend = append(c.pend, b...)
	if i := bytes.Index(c.pend, c.marker); i >= 0 {
		c.to.Write(c.pend[:i]) //nolint:errcheck // (a stream's writes do not fail)
		c.pend = c.pend[i:]
		line := bytes.IndexByte(c.pend, '\n')
		if line < 0 {
			return // (the rest of its line comes next)
		}
		c.field, c.rest, c.done = string(c.pend[len(c.marker):line]), c.pend[line+1:], true
		c.pend = nil
		return
	}
	keep := 0 // the longest end of pend that starts the marker
	for k := min(len(c.marker)-1, len(c.pend)); k > 0; k-- {
		if bytes.HasSuffix(c.pend, c.marker[:k]) {
			keep = k
			break
		}
	}
	c.to.Write(c.pend[:len(c.pend)-keep]) //nolint:errcheck // (a stream's writes do not fail)
	c.pend = append(c.pend[:0], c.pend[len(c.pend)-keep:]...)
}

// over reports whether the stream has nothing more for the cell.
func (c *cellStream) over() bool { return c.done || c.closed }

// flush passes on what the stream held back, at its end without its marker.
func (c *cellStream) flush() {
	if !c.done && len(c.pend) > 0 {
		c.to.Write(c.pend) //nolint:errcheck // (a stream's writes do not fail)
		c.pend = nil
	}
}

// cappedBuffer keeps the first left bytes written to it.
type cappedBuffer struct {
	buf  bytes.Buffer
	left int
}

func (c *cappedBuffer) Write(p []byte) (int, error) {
	k := min(len(p), c.left)
	c.left -= k
	c.buf.Write(p[:k])
	return len(p), nil
}

func (c *cappedBuffer) String() string { return c.buf.String() }

// randomMarker is 128 random bits, in hex.
func randomMarker() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// shellQuote is s as one word of bash, quoted: nothing in it is expanded.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// shellName reports whether k is a name bash can export.
func shellName(k string) bool {
	for i, c := range k {
		if !(c == '_' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || i > 0 && '0' <= c && c <= '9') {
			return false
		}
	}
	return k != ""
}
