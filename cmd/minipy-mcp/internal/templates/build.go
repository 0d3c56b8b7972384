package templates

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Machine is the sandbox a build runs in: its steps are its commands and its files.
type Machine interface {
	// Run runs the command in the sandbox, gives each line it writes (stdout and stderr) to
	// out, and returns its exit code (a signal's death is 128 and its number, as bash says).
	Run(ctx context.Context, c Cmd, out func(line string)) (int, error)
	// Start starts the command as Run does, and leaves it running.
	Start(c Cmd) error
	// Put writes data at the absolute name in the sandbox, for its user alone.
	Put(name string, data []byte) error
	// RootUser reports whether the sandbox has a root user that commands may run as.
	RootUser() bool
}

// Cmd is a command of a build: the bash command line, run in Dir with Env (KEY=VALUE)
// added to the sandbox's environment, as the sandbox's root if Root, else its user.
type Cmd struct {
	Line, Dir string
	Env       []string
	Root      bool
}

// A build's status (E2B's TemplateBuildStatus).
const (
	Waiting  = "waiting"
	Building = "building"
	Ready    = "ready"
	Failed   = "error"
)

// Bounds of what a build keeps of its logs, and of its ready check.
const (
	maxLogEntries = 10_000
	maxLogLine    = 4 << 10
	// ReadyTimeout bounds the ready command's checks (a failed check is run again after
	// readyDelay until one succeeds).
	ReadyTimeout = 5 * time.Minute
	readyFirst   = 10 * time.Millisecond
	readyEvery   = 500 * time.Millisecond
)

// readyDelay is the wait before the ready command's next check when n have failed: 10 ms,
// doubling, then every readyEvery: a sandbox whose server is up 50 ms after its start
// command answers its create then, not at the second half-second (each sandbox of the
// template runs its start command and waits, where E2B resumes it running).
func readyDelay(n int) time.Duration {
	return min(readyFirst<<min(max(n-1, 0), 16), readyEvery)
}

// LogEntry is a line of a build's log (E2B's BuildLogEntry).
type LogEntry struct {
	Timestamp time.Time `json:"timestamp"`
	Level     string    `json:"level"`
	Message   string    `json:"message"`
	Step      string    `json:"step,omitempty"`
}

// Reason says why a build failed (E2B's BuildStatusReason): the step ("base", its number
// from 1, or "finalize" for the start and ready commands) and the log's last lines.
type Reason struct {
	Message    string     `json:"message"`
	Step       string     `json:"step,omitempty"`
	LogEntries []LogEntry `json:"logEntries"`
}

// Info is a build as E2B's API gives it (TemplateBuildInfo).
type Info struct {
	TemplateID string     `json:"templateID"`
	BuildID    string     `json:"buildID"`
	Status     string     `json:"status"`
	Logs       []string   `json:"logs"`
	LogEntries []LogEntry `json:"logEntries"`
	Reason     *Reason    `json:"reason,omitempty"`
}

// Result is what a build leaves besides the sandbox's files: what every sandbox of the
// template starts with (and a template built on it inherits).
type Result struct {
	Envs     map[string]string `json:"envs,omitempty"`
	Workdir  string            `json:"workdir,omitempty"`
	User     string            `json:"user,omitempty"`
	StartCmd string            `json:"startCmd,omitempty"`
	ReadyCmd string            `json:"readyCmd,omitempty"`
}

// Build is one build of a template: its status and log. Its methods are safe from any
// goroutine.
type Build struct {
	TemplateID, ID string

	mu      sync.Mutex
	status  string
	logs    []LogEntry
	dropped int // entries past maxLogEntries, not kept
	reason  *Reason
}

// NewBuild is a build of templateID, waiting for its steps.
func NewBuild(templateID, id string) *Build {
	return &Build{TemplateID: templateID, ID: id, status: Waiting}
}

// Info is the build's status and its log from entry offset on.
func (b *Build) Info(offset int) Info {
	b.mu.Lock()
	defer b.mu.Unlock()
	in := Info{TemplateID: b.TemplateID, BuildID: b.ID, Status: b.status, Logs: []string{}, LogEntries: []LogEntry{}}
	if offset < len(b.logs) && offset >= 0 {
		in.LogEntries = slices.Clone(b.logs[offset:])
	}
	for _, e := range in.LogEntries {
		in.Logs = append(in.Logs, e.Timestamp.Format(time.RFC3339)+" "+e.Message)
	}
	if b.reason != nil {
		r := *b.reason
		in.Reason = &r
	}
	return in
}

// Status is the build's status.
func (b *Build) Status() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.status
}

// Log adds a line to the build's log.
func (b *Build) Log(level, step, msg string) {
	if len(msg) > maxLogLine {
		msg = msg[:maxLogLine] + "..."
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.logs) >= maxLogEntries {
		b.dropped++
		return
	}
	b.logs = append(b.logs, LogEntry{Timestamp: time.Now().UTC(), Level: level, Message: msg, Step: step})
}

// Begin marks the build as running; false if it has ended already (or runs).
func (b *Build) Begin() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.status != Waiting {
		return false
	}
	b.status = Building
	return true
}

// End ends the build: ready when err is nil, else failed at step (see Reason) for err.
func (b *Build) End(step string, err error) {
	b.mu.Lock()
	if b.status == Ready || b.status == Failed {
		b.mu.Unlock()
		return
	}
	if err == nil {
		b.status = Ready
	} else {
		b.status = Failed
		b.reason = &Reason{Message: err.Error(), Step: step, LogEntries: slices.Clone(b.logs[max(0, len(b.logs)-20):])}
	}
	b.mu.Unlock()
	if err == nil {
		b.Log("info", "finalize", "Template is ready")
	} else {
		b.Log("error", step, "Build failed: "+err.Error())
	}
}

// StepError is a build's failure at one of its steps.
type StepError struct {
	Step string // "base", the step's number from 1, or "finalize"
	Err  error
}

func (e *StepError) Error() string { return e.Err.Error() }
func (e *StepError) Unwrap() error { return e.Err }

// Run runs the spec's steps in m, from base (what the template it starts from left), the
// files of its COPY steps from files (by hash): the result (with the spec's start and ready
// commands), or a *StepError. It does not run the start command: Finalize does, where the
// caller says. It does not end the build: the caller keeps what the machine holds first.
func (b *Build) Run(ctx context.Context, sp *Spec, base Result, m Machine, files func(hash string) ([]byte, bool)) (Result, error) {
	r := &runner{b: b, m: m, files: files, res: base, rootOK: m.RootUser()}
	r.res.Envs = maps.Clone(base.Envs)
	if r.res.Envs == nil {
		r.res.Envs = map[string]string{}
	}
	r.res.Workdir = cmp.Or(r.res.Workdir, DefaultWorkdir)
	r.res.User = cmp.Or(r.res.User, DefaultUser)
	for i, st := range sp.Steps {
		step := strconv.Itoa(i + 1)
		b.Log("info", step, fmt.Sprintf("[%d/%d] %s %s", i+1, len(sp.Steps), st.Type, strings.Join(st.Args, " ")))
		if err := r.step(ctx, step, &st); err != nil {
			return Result{}, &StepError{step, err}
		}
	}
	if sp.StartCmd != "" {
		r.res.StartCmd, r.res.ReadyCmd = sp.StartCmd, sp.ReadyCmd
	}
	return r.res, nil
}

// Finalize starts res's start command in m, if it has one, and waits until its ready
// command succeeds (ReadyTimeout at most), as a sandbox of the template will: a
// *StepError ("finalize") otherwise. m is best a copy of the build's machine that is not
// kept: what the start command writes (a file its ready check waits for) would be in
// every sandbox of the template before its own start command ran.
func (b *Build) Finalize(ctx context.Context, m Machine, res Result) error {
	r := &runner{b: b, m: m, res: res, rootOK: m.RootUser()}
	if err := r.start(ctx); err != nil {
		return &StepError{"finalize", err}
	}
	return nil
}

// runner runs one build's steps.
type runner struct {
	b     *Build
	m     Machine
	files func(hash string) ([]byte, bool)
	res   Result
	// rootOK: the machine has a root user, whom steps may run as.
	rootOK bool
}

// Env is the result's environment as KEY=VALUE, by name.
func (res *Result) Env() []string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(res.Envs)) {
		out = append(out, k+"="+res.Envs[k])
	}
	return out
}

// Start is the result's start command, as its user, in its working directory.
func (res *Result) Start() Cmd {
	return Cmd{Line: res.StartCmd, Dir: res.Workdir, Env: res.Env(), Root: res.User == RootUser}
}

// env is the build's environment as KEY=VALUE, and more.
func (r *runner) env(more ...string) []string { return append(r.res.Env(), more...) }

func (r *runner) step(ctx context.Context, step string, st *Step) error {
	switch st.Type {
	case "ENV":
		for i := 0; i < len(st.Args); i += 2 {
			r.res.Envs[st.Args[i]] = st.Args[i+1]
		}
		return nil
	case "USER":
		user, err := checkUser(st.Args[0], "", "set the user", r.rootOK)
		if err == nil {
			r.res.User = user
		}
		return err
	case "WORKDIR":
		dir := inDir(r.res.Workdir, st.Args[0])
		if err := r.run(ctx, step, `mkdir -p -- "$MINIPY_DIR"`, "/", r.res.User, "make the working directory "+dir,
			"MINIPY_DIR="+dir); err != nil {
			return err
		}
		r.res.Workdir = dir
		return nil
	case "RUN":
		what := "run command '" + st.Args[0] + "'"
		user := r.res.User
		if len(st.Args) == 2 {
			var err error
			if user, err = checkUser(st.Args[1], r.res.User, what, r.rootOK); err != nil {
				return err
			}
		}
		return r.run(ctx, step, st.Args[0], r.res.Workdir, user, what)
	case "COPY":
		return r.copy(ctx, step, st)
	}
	return fmt.Errorf("%w: a step of type %q", ErrRefused, st.Type)
}

// run runs line for the step, logging its output; a non-zero exit is an error that says
// what failed.
func (r *runner) run(ctx context.Context, step, line, dir, user, what string, env ...string) error {
	c := Cmd{Line: line, Dir: dir, Env: r.env(env...), Root: user == RootUser}
	code, err := r.m.Run(ctx, c, func(out string) { r.b.Log("info", step, out) })
	if err != nil {
		return fmt.Errorf("failed to %s: %w", what, err)
	}
	if code != 0 {
		return fmt.Errorf("failed to %s: command failed: exit status %d", what, code)
	}
	return nil
}

// copyScript unpacks a COPY's upload (the SDK's tar of the matched files, by their paths
// in its context) in a stage of its own, as the step's user (whose the files become: the
// owners the archive names are ids of the client's machine), and copies what the source
// pattern matches there to the destination as Docker's COPY does: a directory's contents
// into the destination, a file to it (or into it, when it is a directory, ends in "/", or
// takes several).
const copyScript = `set -e
stage=$(mktemp -d /tmp/.minipy-copy.XXXXXX)
trap 'rm -rf -- "$stage" "$MINIPY_ARCHIVE"' EXIT
tar --no-same-owner -xpf "$MINIPY_ARCHIVE" -C "$stage"
cd "$stage"
shopt -s nullglob dotglob
IFS=
srcs=($MINIPY_SRC)
if [ ${#srcs[@]} -eq 0 ]; then echo "nothing matches $MINIPY_SRC" >&2; exit 1; fi
into=$MINIPY_INTO
if [ ${#srcs[@]} -gt 1 ] || [ -d "$MINIPY_DEST" ]; then into=1; fi
if [ -d "${srcs[0]}" ] && [ ! -L "${srcs[0]}" ]; then into=1; fi
copied=()
if [ -n "$into" ]; then
  mkdir -p -- "$MINIPY_DEST"
  for s in "${srcs[@]}"; do
    if [ -d "$s" ] && [ ! -L "$s" ]; then
      cp -a -- "$s"/. "$MINIPY_DEST"/
      for c in "$s"/*; do copied+=("$MINIPY_DEST/${c##*/}"); done
    else
      cp -a -- "$s" "$MINIPY_DEST"/
      copied+=("$MINIPY_DEST/${s##*/}")
    fi
  done
else
  mkdir -p -- "$(dirname -- "$MINIPY_DEST")"
  cp -a -- "${srcs[0]}" "$MINIPY_DEST"
  copied=("$MINIPY_DEST")
fi
if [ -n "$MINIPY_MODE" ]; then chmod -R -- "$MINIPY_MODE" "${copied[@]}"; fi`

// copy runs a COPY step: its upload put in the sandbox, then copyScript.
func (r *runner) copy(ctx context.Context, step string, st *Step) error {
	what := "copy '" + st.Args[0] + "'"
	user := r.res.User
	if len(st.Args) > 2 {
		var err error
		if user, err = checkUser(st.Args[2], r.res.User, what, r.rootOK); err != nil {
			return err
		}
	}
	data, ok := r.files(st.FilesHash)
	if !ok {
		return fmt.Errorf("failed to %s: its files (hash %s) were not uploaded", what, st.FilesHash)
	}
	archive := "/tmp/.minipy-upload-" + st.FilesHash
	if err := r.m.Put(archive, data); err != nil {
		return fmt.Errorf("failed to %s: %w", what, err)
	}
	mode, into := "", ""
	if len(st.Args) > 3 {
		mode = st.Args[3]
	}
	if strings.HasSuffix(st.Args[1], "/") {
		into = "1"
	}
	return r.run(ctx, step, copyScript, r.res.Workdir, user, what, "MINIPY_ARCHIVE="+archive, "MINIPY_SRC="+st.Args[0],
		"MINIPY_DEST="+inDir(r.res.Workdir, st.Args[1]), "MINIPY_INTO="+into, "MINIPY_MODE="+mode)
}

// start starts the template's start command, if it has one, and waits until its ready
// command succeeds (ReadyTimeout at most).
func (r *runner) start(ctx context.Context) error {
	if r.res.StartCmd == "" {
		return nil
	}
	r.b.Log("info", "finalize", "Running the start command: "+r.res.StartCmd)
	if err := r.m.Start(r.res.Start()); err != nil {
		return fmt.Errorf("failed to start '%s': %w", r.res.StartCmd, err)
	}
	return WaitReady(ctx, r.m, r.res, func(line string) { r.b.Log("info", "finalize", line) })
}

// ErrNotReady is matched by WaitReady's error when the ready command did not succeed in
// time.
var ErrNotReady = errors.New("the ready command did not succeed")

// WaitReady runs res's ready command in m until it succeeds, again after readyDelay, at
// most ReadyTimeout (or until ctx ends); none is ready at once.
func WaitReady(ctx context.Context, m Machine, res Result, out func(string)) error {
	if res.ReadyCmd == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, ReadyTimeout)
	defer cancel()
	c := Cmd{Line: res.ReadyCmd, Dir: res.Workdir, Env: res.Env(), Root: res.User == RootUser}
	for failed := 1; ; failed++ {
		code, err := m.Run(ctx, c, out)
		if err == nil && code == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w in %v: '%s'", ErrNotReady, ReadyTimeout, res.ReadyCmd)
		case <-time.After(readyDelay(failed)):
		}
	}
}
