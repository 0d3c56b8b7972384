package worker

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/minipy-go/minipy/internal/pyrt"
)

// Spec says how an engine's workers start: what the engine's configuration says, with its
// defaults filled in, and the engine's directories. An engine makes one as it starts and
// never changes it, so its methods are safe from any goroutine.
type Spec struct {
	Python       string   // the local workers' executable
	Command      []string // start workers through this command instead (python elsewhere)
	CommandShell bool     // Command passes its arguments through a POSIX shell (ssh)
	Sandbox      bool     // local workers get Linux namespaces (sandboxAttr, sandbox.py)
	Network      bool
	// Egress: sandboxed workers (without Network) bring their loopback up and hand the host
	// a socket listening on it for the egress proxy (Worker.EgressListener).
	Egress bool
	// RootUser: a template's sandboxes have a root of their own that their processes may
	// become (IsolatedConfig.RootUser; sandbox.py's _root_namespace says how). Needs a root
	// host and the template (CheckRootUser).
	RootUser bool
	Env      []string // added to the workers' environment (IsolatedConfig.Env)
	Mounts   []Mount
	Trees    string // the host directory of the trees of working directories
	RootDir  string // sandboxed: the (empty) mount point of a worker's root tmpfs
	Workdir  string // sandboxed: where the code sees its working directory ("": SandboxWorkdir)

	TmpSize       int64
	MemoryLimit   int64
	FileSizeLimit int64
	OpenFiles     int
	Processes     int
	CPULimit      time.Duration
	KickSignal    syscall.Signal
	StartTimeout  time.Duration
	Packed        bool     // several namespaces share each worker (IsolatedConfig.Workers)
	Rollback      bool     // local workers fork a snapshot after each answer
	Preload       []string // modules every worker imports as it starts
	Startup       string   // code every worker runs as it starts, once per process lineage
	// ForkCode is machine code for this machine that local workers fork their rollback
	// snapshots with, and a template its sandboxes (internal/cpython's ForkCode; nil: os.fork).
	ForkCode []byte
	Beats    Beats // Command workers'
	// MaxTransfer caps what a worker sends the host in one answer or host call, in bytes
	// (IsolatedConfig.MaxTransfer; 0: DefaultMaxTransfer): the worker keeps under it, and
	// ReadFrame refuses a frame that claims more.
	MaxTransfer int
	// OnSnapshotDied, if set, is called (from a goroutine of the worker's) when a local
	// worker's guardian reports that its rollback snapshot had ended while it waited
	// (pyrt.ControlSnapshotDied).
	OnSnapshotDied func()
	// Cgroups is the engine's cgroup, nil without one: each local worker's sandbox then
	// gets a group of its own in it (cgroup.go), which bounds its memory and processes and
	// which Kill empties. Without one, a sandboxed worker under a MemoryLimit is told to
	// deny the shared memory that nothing else would count (config deny_shm: DenyShm).
	Cgroups *Cgroups

	// Ready reads the payload of a worker's ready frame ([version, executable, pid, tag,
	// marshal], encoded as pyrt values): an error (an unsupported Python, say) ends the
	// worker's start with it; tag and code, when set, are the runtime as the worker compiled
	// it, which later workers of the same command load instead of compiling it.
	Ready func(payload []byte) (tag string, code []byte, err error)
}

// Mount is a host path bound into sandboxed workers (IsolatedConfig.Mounts, checked).
type Mount struct {
	Source, Target string
	Writable       bool

	userns *os.File // the user namespace of its idmapped mount, if it needs one (PrepareMounts)
}

// Beats are a Command worker's beat interval and the silence after which it ends.
type Beats struct{ Every, Silence time.Duration }

// A Command worker's host sends it a beat (pyrt.FrameBeat) every DefaultBeats.Every; the
// worker ends when, idle, it has heard nothing for DefaultBeats.Silence (worker.py's
// hear_host), so a transport that keeps its stdin open after the host is gone (a relay, a
// half-open connection) does not keep it alive for good.
var DefaultBeats = Beats{Every: 10 * time.Second, Silence: 60 * time.Second}

// Dirs are the directories a worker binds: its tree, Spec.Trees/Tree, and in it the
// working directory Home, of the namespace the worker is started for. The zero Dirs is the
// template's (it binds every tree).
type Dirs struct {
	Tree string // the tree's name under Spec.Trees
	Home string // the working directory's name in the tree
}

func (d Dirs) template() bool { return d.Tree == "" }

// HomePath is the host path of the working directory ("" for the template).
func (s *Spec) HomePath(d Dirs) string {
	if d.template() {
		return ""
	}
	return filepath.Join(s.Trees, d.Tree, d.Home)
}

func (s *Spec) local() bool { return len(s.Command) == 0 }

// DefaultMaxTransfer is Spec.MaxTransfer when it is 0 (IsolatedConfig.MaxTransfer's default).
const DefaultMaxTransfer = 64 << 20

func (s *Spec) maxTransfer() int {
	if s.MaxTransfer <= 0 {
		return DefaultMaxTransfer
	}
	return s.MaxTransfer
}

// DenyShm reports whether sandboxed workers must refuse the code the shared memory that
// only a cgroup counts (config deny_shm=1, for the seccomp filter): memfd_create, whose
// pages RLIMIT_AS counts only while mapped, and SysV shmget, whose segments outlive every
// mapping and the process. (/dev/shm is bounded by TmpSize.) So: a MemoryLimit, the
// sandbox, and no cgroup.
func (s *Spec) DenyShm() bool {
	return s.local() && s.Sandbox && s.Cgroups == nil && s.MemoryLimit > 0
}

// bootstrap is the program a worker's python runs (python -c): it reads worker.py as one
// frame (u32 length, source) from stdin with unbuffered reads, so that no byte of the
// protocol after it is lost in a buffer, and runs it.
const bootstrap = `import os
def _read(n):
    b = b""
    while len(b) < n:
        c = os.read(0, n - len(b))
        if not c:
            os._exit(70)
        b += c
    return b
exec(compile(_read(int.from_bytes(_read(4), "little")), ` + "\"" + pyrt.RuntimeFile + "\"" + `, "exec"), {"__name__": "_minipy_worker", "_read": _read})
`

// Launch starts a worker process with dirs (the template: the zero Dirs), without waiting
// for it to be ready (AwaitReady); with Spec.Cgroups, a local worker (not the template) in
// a new group of its own. epoch is the owner's generation of the worker.
func (s *Spec) Launch(dirs Dirs, epoch uint64) (*Worker, error) {
	cmd, err := s.command(dirs)
	if err != nil {
		return nil, err
	}
	mounts, err := s.mountFiles() // (idmap.go)
	if err != nil {
		return nil, err
	}
	defer closeFiles(mounts...) // the worker's copies are its own once it has started
	f, err := s.openLaunch(dirs)
	if err != nil {
		return nil, err
	}
	f.attach(cmd, mounts)
	if err := f.start(cmd); err != nil {
		if cmd.Process != nil {
			return nil, err // the placement's
		}
		return nil, s.startError(cmd.Path, err)
	}
	w := &Worker{
		Epoch:     epoch,
		cmd:       cmd,
		proc:      &procGuard{},
		stdin:     f.inW,
		kicks:     f.kickW,
		sandboxed: s.local() && s.Sandbox,
		exited:    make(chan struct{}),
		out:       f.outR,
		Known:     map[uint32]bool{pyrt.DefaultNamespace: true},
		ctl:       f.ctl,
		limit:     s.maxTransfer(),
		cg:        f.cg,
	}
	if f.ctl != nil && !dirs.template() {
		// (The template's control socket carries no reports: it answers mounts, AskMount.)
		w.line = newLine(s.OnSnapshotDied)
	}
	w.keepStderr(f.errR)
	go func() {
		w.proc.reap(cmd, !w.sandboxed)
		w.state = cmd.ProcessState
		w.cg.remove() //nolint:errcheck // Close removes what is left
		close(w.exited)
	}()
	if w.line != nil {
		w.line.watch(w)
	}
	s.sendBootstrap(w, dirs)
	return w, nil
}

// launchFiles are what a worker process is started with, both ends: its cgroup, its
// stdin, stdout and stderr pipes, and a local worker's control socket and control pipe.
type launchFiles struct {
	cg                               *cgroup
	inR, inW, outR, outW, errR, errW *os.File
	ctl                              *net.UnixConn
	ctlChild, kickR, kickW           *os.File
}

// openLaunch makes the files and the cgroup of a worker about to start.
func (s *Spec) openLaunch(dirs Dirs) (*launchFiles, error) {
	f := &launchFiles{}
	var err error
	if s.Cgroups != nil && s.local() && !dirs.template() {
		// (The template stays in the host's cgroup: it runs no code, and on v2 the engine's
		// cgroup, which hands controllers down, may hold no process itself.)
		if f.cg, err = s.Cgroups.newGroup(); err != nil {
			return nil, err
		}
	}
	p, err := newPipes()
	if err != nil {
		f.cg.remove() //nolint:errcheck // empty
		return nil, err
	}
	f.inR, f.inW, f.outR, f.outW, f.errR, f.errW = p[0], p[1], p[2], p[3], p[4], p[5]
	if !s.local() {
		return f, nil
	}
	if f.ctl, f.ctlChild, err = controlSocket(); err == nil && !dirs.template() {
		// (the template's forks get theirs from Spawn)
		f.kickR, f.kickW, err = os.Pipe()
	}
	if err != nil {
		f.close()
		return nil, err
	}
	return f, nil
}

// attach gives cmd the worker's ends: stdin, stdout and stderr; fd 3, the control socket;
// fd 4, the control pipe (closed in the template); then the idmapped Mounts' (fds 5...:
// sandboxed workers, whose Spec has any).
func (f *launchFiles) attach(cmd *exec.Cmd, mounts []*os.File) {
	cmd.Stdin, cmd.Stdout, cmd.Stderr = f.inR, f.outW, f.errW
	if f.ctlChild != nil {
		cmd.ExtraFiles = append([]*os.File{f.ctlChild, f.kickR}, mounts...)
	}
}

// start starts cmd and places it in the cgroup, before the bootstrap is sent (until then
// the python only waits for it), then closes the worker's ends; on an error, every file
// and the cgroup.
func (f *launchFiles) start(cmd *exec.Cmd) error {
	err := cmd.Start()
	f.closeChildEnds()
	if err == nil && f.cg != nil {
		if err = f.cg.place(cmd.Process.Pid); err != nil {
			cmd.Process.Kill() //nolint:errcheck // just started
			cmd.Wait()         //nolint:errcheck // killed
		}
	}
	if err != nil {
		f.close() // (the cgroup is emptied by the kill)
	}
	return err
}

// closeChildEnds closes the worker's ends, which it has its copies of once it has started.
func (f *launchFiles) closeChildEnds() {
	closeFiles(f.inR, f.outW, f.errW, f.ctlChild, f.kickR)
	f.inR, f.outW, f.errW, f.ctlChild, f.kickR = nil, nil, nil, nil, nil
}

// close closes every file still open and removes the cgroup (empty).
func (f *launchFiles) close() {
	for _, file := range []*os.File{f.inR, f.inW, f.outR, f.outW, f.errR, f.errW, f.ctlChild, f.kickR, f.kickW} {
		if file != nil {
			file.Close()
		}
	}
	if f.ctl != nil {
		f.ctl.Close()
	}
	f.cg.remove() //nolint:errcheck // empty
}

// sendBootstrap writes the bootstrap and config frames while the caller waits for the
// worker's ready frame (or its death, or the start timeout): they may exceed the pipe's
// buffer. A Command worker's beats start after them: one written first would be read as
// worker.py.
func (s *Spec) sendBootstrap(w *Worker, dirs Dirs) {
	cfgFrame := s.configFrame(dirs)
	go func() {
		boot := binary.LittleEndian.AppendUint32(nil, uint32(len(pyrt.WorkerSource)))
		boot = append(boot, pyrt.WorkerSource...)
		if w.Send(append(boot, cfgFrame...)) == nil && !s.local() {
			w.beat(s.Beats.Every)
		}
	}()
}

// command is the command of a worker with dirs (the template: no tree): the python (or
// Command) running the bootstrap, in its directory, with its environment and, local and
// sandboxed, the namespaces of sandboxAttr.
func (s *Spec) command(dirs Dirs) (*exec.Cmd, error) {
	args := append([]string(nil), s.Command...)
	if len(args) == 0 {
		args = []string{s.Python}
		if s.Sandbox {
			// No site before the sandbox exists: sandbox.py's _site_dirs says why, and runs it
			// inside.
			args = append(args, "-S")
		}
	}
	if s.CommandShell {
		args = append(args, "-c", shellQuote(bootstrap))
	} else {
		args = append(args, "-c", bootstrap)
	}
	path, err := exec.LookPath(args[0])
	if err != nil {
		return nil, fmt.Errorf("minipy: the worker executable: %w", err)
	}
	cmd := &exec.Cmd{Path: path, Args: args, SysProcAttr: &syscall.SysProcAttr{Setsid: true}}
	if !s.local() {
		return cmd, nil // (its environment is the command's)
	}
	cmd.Dir = s.HomePath(dirs)
	if s.Sandbox { // the template too
		// Python imports from its working directory ("" on sys.path with -c) as it
		// starts, before the sandbox is built, with the access it starts with (root's on
		// a root host): never from the namespace's directory, where earlier code may have
		// left a signal.py. The trees' directory is the host's, and nobody else may write
		// there; the worker moves to its working directory (/work) in its sandbox.
		cmd.Dir = s.Trees
	}
	cmd.Env = s.env(cmd.Dir)
	if s.Sandbox {
		// Python imports from PYTHONPATH as it starts, before the sandbox exists and with
		// the access it starts with: the worker puts it on sys.path in its sandbox
		// instead (the config's pythonpath), where it may be a directory the code can
		// write to.
		cmd.Env = slices.DeleteFunc(cmd.Env, func(kv string) bool { return strings.HasPrefix(kv, "PYTHONPATH=") })
		cmd.SysProcAttr = sandboxAttr(s.Network, !dirs.template(), s.RootUser)
	}
	return cmd, nil
}

// workdir is where sandboxed code sees its working directory.
func (s *Spec) workdir() string {
	if s.Workdir == "" {
		return SandboxWorkdir
	}
	return s.Workdir
}

// env is a local worker's whole environment (see IsolatedConfig.Env), home its working
// directory on the host.
func (s *Spec) env(home string) []string {
	tmp := os.TempDir()
	if s.Sandbox {
		home, tmp = s.workdir(), "/tmp"
	}
	path := "/usr/local/bin:/usr/bin:/bin"
	if s.Sandbox && s.RootUser {
		path = SudoDir + ":" + path // (before the image's: its sudo, if it has one, cannot work in a sandbox)
	}
	if dir := filepath.Dir(s.Python); filepath.IsAbs(s.Python) && !strings.Contains(":"+path+":", ":"+dir+":") {
		path = dir + ":" + path
	}
	env := []string{"PATH=" + path, "HOME=" + home, "TMPDIR=" + tmp, "LANG=C.UTF-8"}
	if s.Sandbox {
		env = append(env, "USER=user", "LOGNAME=user")
	}
	return append(env, s.Env...)
}

// startError says why a worker's process did not start.
func (s *Spec) startError(path string, err error) error {
	if s.local() && s.Sandbox && errors.Is(err, syscall.EACCES) {
		// The exec was refused (EPERM could be the clone's: the kernel's refusal).
		who := "the host's user"
		if os.Geteuid() == 0 {
			who = "root in a user namespace of their own, which passes root's private directories but not " +
				"another user's"
		}
		return fmt.Errorf("%w: the python %s: %w (sandboxed workers start it as %s)", ErrSandboxAccess, path, err, who)
	}
	return fmt.Errorf("minipy: starting a worker: %w", err)
}

// configFrame is what a worker with dirs (the template: no tree) reads after worker.py: a
// frame of "key=value" lines (the limits, the kick signal, the working directories), then
// a frame with the runtime, then one with the runtime as compiled by an earlier worker.
func (s *Spec) configFrame(dirs Dirs) []byte {
	var b strings.Builder
	workdir, tree := s.HomePath(dirs), ""
	if !dirs.template() {
		tree = filepath.Join(s.Trees, dirs.Tree)
	}
	if s.Sandbox {
		s.sandboxConfig(&b, dirs, workdir, tree)
		workdir, tree = s.workdir(), SandboxTree
	}
	if !s.local() {
		for _, kv := range s.Env {
			fmt.Fprintf(&b, "env=%s\n", kv)
		}
		fmt.Fprintf(&b, "silence_ms=%d\n", s.Beats.Silence.Milliseconds())
	}
	fmt.Fprintf(&b, "kick_signal=%d\nworkdir=%s\nmemory=%d\nfile_size=%d\nopen_files=%d\nprocesses=%d\ncpu_seconds=%d\nmax_transfer=%d\n",
		int(s.KickSignal), workdir, s.MemoryLimit, s.FileSizeLimit, s.OpenFiles, s.Processes,
		int64((s.CPULimit+time.Second-1)/time.Second), s.maxTransfer())
	if tree != "" {
		fmt.Fprintf(&b, "tree=%s\n", tree)
	}
	if s.Packed {
		b.WriteString("packed=1\n")
	}
	if s.local() {
		b.WriteString("control=1\nkicks=1\n") // (kicks: the control pipe, fd 4; the template's forks' too)
		if s.Rollback {
			b.WriteString("rollback=1\n")
		}
		if len(s.ForkCode) > 0 { // (a template's sandboxes fork with it too)
			fmt.Fprintf(&b, "fork_code=%x\nfork_arch=%s\n", s.ForkCode, runtime.GOARCH)
		}
	}
	if len(s.Preload) > 0 {
		fmt.Fprintf(&b, "preload=%s\n", strings.Join(s.Preload, ","))
	}
	if s.Startup != "" {
		fmt.Fprintf(&b, "startup=%x\n", s.Startup) // (hex: the code's lines are not the config's)
	}
	if dirs.template() {
		b.WriteString("template=1\n")
	}
	var tag string
	var code []byte
	if c, ok := compiledRuntimes.Load(s.runtimeKey()); ok {
		tag, code = c.(compiledRuntime).tag, c.(compiledRuntime).code
	}
	if tag != "" && !strings.ContainsAny(tag, "\n\r") {
		fmt.Fprintf(&b, "code_tag=%s\n", tag)
	}
	f := binary.LittleEndian.AppendUint32(nil, uint32(b.Len()))
	f = append(f, b.String()...)
	f = binary.LittleEndian.AppendUint32(f, uint32(len(pyrt.Source)))
	f = append(f, pyrt.Source...)
	f = binary.LittleEndian.AppendUint32(f, uint32(len(code)))
	return append(f, code...)
}

// sandboxConfig writes the config lines of a sandboxed worker: its root and limits, the
// seccomp filter, the host paths it binds (workdir and tree; the template's, every tree),
// and the Mounts.
func (s *Spec) sandboxConfig(b *strings.Builder, dirs Dirs, workdir, tree string) {
	network := 0
	if s.Network {
		network = 1
	}
	fmt.Fprintf(b, "root=%s\nsandbox_id=%d\nsandbox_refused=%d\nsandbox_access=%d\ntmp_size=%d\nnetwork=%d\n",
		s.RootDir, sandboxID, sandboxRefusedExit, sandboxAccessExit, s.TmpSize, network)
	if s.Egress && !s.Network {
		b.WriteString("egress=1\n")
	}
	if s.RootUser {
		fmt.Fprintf(b, "root_user=%d\n", sandboxRootID)
	}
	if filter, err := SeccompFilter(s.DenyShm()); err == nil { // (else the worker refuses to start: ProbeNamespaces says why)
		fmt.Fprintf(b, "seccomp=%x\n", filter)
	}
	if dirs.template() {
		fmt.Fprintf(b, "host_tree=%s\n", s.Trees) // every tree: a fork binds its own (Spawn)
	} else {
		fmt.Fprintf(b, "host_workdir=%s\nhost_tree=%s\n", workdir, tree)
	}
	for _, kv := range s.Env {
		if pp, ok := strings.CutPrefix(kv, "PYTHONPATH="); ok {
			fmt.Fprintf(b, "pythonpath=%s\n", pp) // (the last one is what Python would read)
		}
	}
	fd := mountFDs // the idmapped Mounts' (Launch)
	for _, m := range s.Mounts {
		mode := "ro"
		if m.Writable {
			mode = "rw"
		}
		fmt.Fprintf(b, "mount=%s %s\t%s", mode, m.Source, m.Target)
		if m.userns != nil {
			fmt.Fprintf(b, "\t%d", fd)
			fd++
		}
		b.WriteByte('\n')
	}
	if s.DenyShm() {
		b.WriteString("deny_shm=1\n")
	}
}

// compiledRuntimes holds, per worker command, the runtime as the first worker of that
// command compiled it (marshal, made before it ran any code), which later workers of the
// command, in any engine of this process, load instead of compiling it again (~5 ms of a
// start); the worker checks the interpreter's tag before using it.
var compiledRuntimes sync.Map // runtimeKey -> compiledRuntime

type compiledRuntime struct {
	tag  string
	code []byte
}

func (s *Spec) runtimeKey() string {
	return strings.Join(append([]string{s.Python}, s.Command...), "\x00")
}

// AwaitReady waits for the ready frame of a worker that is starting (Launch, Spawn) and
// checks it (Spec.Ready). On any failure the worker is killed and the error says what it
// said on its stderr.
func (s *Spec) AwaitReady(w *Worker) (*Worker, error) {
	until := time.Now().Add(s.StartTimeout)
	for {
		body, err := w.ReadFrame(until)
		if err != nil {
			break
		}
		if body[0] != pyrt.FrameReady {
			continue
		}
		tag, code, err := s.Ready(body[1:])
		if err != nil {
			w.Kill()
			w.AwaitExit()
			return nil, err
		}
		if tag != "" && len(code) > 0 {
			compiledRuntimes.LoadOrStore(s.runtimeKey(), compiledRuntime{tag: tag, code: code})
		}
		if err := w.cg.placeGuardian(); err != nil {
			w.Kill()
			w.AwaitExit()
			return nil, err
		}
		return w, nil
	}
	w.Kill()
	w.AwaitExit()
	// What it said before it ended: the pipe's last bytes may still be on their way to
	// keepStderr's copy when its exit is seen.
	select {
	case <-w.stderrDone:
	case <-time.After(time.Second):
	}
	msg := strings.TrimSpace(w.stderr.String())
	if msg == "" {
		msg = "no output"
	}
	how := "forked from the template"
	select {
	case <-w.exited:
		if w.state != nil && !w.exitFrame && w.sandboxed {
			switch w.state.ExitCode() {
			case sandboxRefusedExit:
				return nil, fmt.Errorf("%w: %s", ErrNoSandbox, msg)
			case sandboxAccessExit:
				// The worker could not open a path to bind (its stderr names it): the host's
				// permissions, not the kernel, are in the way.
				return nil, fmt.Errorf("%w (%w): %s", ErrSandboxAccess, fs.ErrPermission, msg)
			}
		}
		if w.state != nil {
			msg = fmt.Sprintf("%v (worker status %v, exit frame %v): %s", w.state, w.exitStatus.ExitStatus(), w.exitFrame, msg)
		}
	default:
		msg = "no ready frame within " + s.StartTimeout.String() + ": " + msg
	}
	if w.cmd != nil {
		how = strings.Join(w.cmd.Args[:len(w.cmd.Args)-2], " ")
	}
	if w.killedStarting() {
		return nil, fmt.Errorf("%w: starting a worker (%s) failed: %s", ErrStartKilled, how, msg)
	}
	return nil, fmt.Errorf("minipy: starting a worker (%s) failed: %s", how, msg)
}

// killedStarting reports whether w, which ended before it was ready, was killed by a signal
// (its guardian's exit frame, or its own status) or ended saying nothing: a start that
// fails on its own (a python that cannot start, a sandbox the kernel refuses) writes why
// on its stderr, and a guardian whose worker was killed ends quietly.
func (w *Worker) killedStarting() bool {
	select {
	case <-w.exited:
	default:
		return false // (still running: the start timed out)
	}
	if strings.TrimSpace(w.stderr.String()) == "" {
		return true
	}
	switch {
	case w.exitFrame:
		return w.exitStatus.Signaled()
	case w.state != nil:
		ws, ok := w.state.Sys().(syscall.WaitStatus)
		return ok && ws.Signaled()
	}
	return false
}

// Spawn has template t fork a worker sandbox with dirs (docs/protocol.md, "Template"): it
// sends the names of its tree and working directory, the new worker's pipes, its control
// socket, its control pipe, its life pipe (whose end the guardian holds until it exits) and, with
// Spec.Cgroups, the cgroup.procs of its sandbox's new group, which the fork joins first,
// over t's control socket. The caller then waits for it with AwaitReady.
func (s *Spec) Spawn(t *Worker, dirs Dirs, epoch uint64) (*Worker, error) {
	f, err := s.openLaunch(dirs)
	if err != nil {
		return nil, err
	}
	var procs []*os.File
	if f.cg != nil {
		if procs, err = f.cg.procsFiles(); err != nil {
			f.close()
			return nil, err
		}
		defer closeFiles(procs...)
	}
	lifeR, lifeW, err := os.Pipe()
	if err != nil {
		f.close()
		return nil, err
	}
	// In the order of the fds the fork's sandbox gives them (_become_tenant): 0-2, the
	// control socket 3, the control pipe 4, the life pipe 5.
	fds := []int{int(f.inR.Fd()), int(f.outW.Fd()), int(f.errW.Fd()), int(f.ctlChild.Fd()), int(f.kickR.Fd()), int(lifeW.Fd())}
	for _, p := range procs {
		fds = append(fds, int(p.Fd())) // the fork joins its group first (_become_tenant)
	}
	_, _, err = t.ctl.WriteMsgUnix(append([]byte{pyrt.ControlNew}, dirs.Tree+"\x00"+dirs.Home...), syscall.UnixRights(fds...), nil)
	lifeW.Close()
	f.closeChildEnds()
	if err != nil {
		lifeR.Close()
		f.close()
		return nil, fmt.Errorf("%w: %w", ErrTemplateGone, err)
	}
	inW, outR, errR, kickW, ctl, cg := f.inW, f.outR, f.errR, f.kickW, f.ctl, f.cg
	w := &Worker{
		Epoch:     epoch,
		stdin:     inW,
		kicks:     kickW,
		sandboxed: true,
		exited:    make(chan struct{}),
		out:       outR,
		Known:     map[uint32]bool{pyrt.DefaultNamespace: true},
		ctl:       ctl,
		line:      newLine(s.OnSnapshotDied),
		limit:     s.maxTransfer(),
		cg:        cg,
	}
	w.keepStderr(errR)
	go func() {
		io.Copy(io.Discard, lifeR) //nolint:errcheck // nothing is written: it ends when the guardian exits
		lifeR.Close()
		// Whatever is left in its sandbox goes with its guardian (or with its life pipe,
		// should the code have closed the guardian's end).
		cg.remove() //nolint:errcheck // Close removes what is left
		close(w.exited)
	}()
	w.line.watch(w)
	return w, nil
}

// shellQuote quotes s as one POSIX shell word.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
