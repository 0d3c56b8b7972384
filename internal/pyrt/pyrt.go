// Package pyrt holds minipy's Python half: the code that runs a cell (last expression,
// output capture, tracebacks, the timeout handler, the value codec). Both engines load
// this same source, the in-process one into the embedded interpreter and the isolated
// one into each worker process, so the rules of a run are written once.
//
// The constants both languages use (request ops, frame kinds, the codec's depth limit, the
// omission marker) are defined here only: Source and WorkerSource carry them on their
// constants line (see prelude), so the Python files never spell them out.
package pyrt

import (
	"fmt"
	"strings"

	_ "embed"
)

//go:embed runtime.py
var runtimeSource string

//go:embed notebook.py
var notebookSource string

//go:embed worker.py
var workerSource string

//go:embed sandbox.py
var sandboxSource string

//go:embed template.py
var templateSource string

//go:embed guardian.py
var guardianSource string

//go:embed proctree.py
var procTreeSource string

//go:embed state.py
var stateSource string

//go:embed pretty.py
var prettySource string

// Source is runtime.py with the shared constants, then notebook.py (IPython's syntax,
// magics, display), pretty.py (the value's text as IPython's pretty printer makes it),
// proctree.py (killing a tree of processes) and state.py (saving and restoring a
// namespace): one module. It must be compiled with the file name RuntimeFile so that the
// runtime's own frames can be told apart from the user's and left out of tracebacks.
var Source = withConstants(runtimeSource) + "\n" + notebookSource + "\n" + prettySource + "\n" + procTreeSource + "\n" +
	stateSource

// WorkerSource is worker.py with the shared constants, then sandbox.py (the sandbox's
// layers), template.py, guardian.py, proctree.py and the call of its main: the isolated
// engine's worker process around the runtime (the protocol, fd-level output capture, kicks,
// resource limits, the sandbox). The Go side sends it to the worker's bootstrap and
// compiles it, like Source, with the file name RuntimeFile.
var WorkerSource = withConstants(workerSource) + "\n" + sandboxSource + "\n" + templateSource + "\n" +
	guardianSource + "\n" + procTreeSource + "\nmain(_read)\n"

// RuntimeFile is the file name the runtime's code objects carry.
const RuntimeFile = "<minipy-runtime>"

// Request ops understood by dispatch() in runtime.py.
const (
	OpRun byte = iota + 1
	OpNew
	OpFree
	OpSet
	OpGet
	OpNames
	OpInfo
	OpRegister // namespace id, [function specs]: bind host functions (see host.go)
	// OpFork is served by an isolated worker itself, not by dispatch: u64 token, u32 source
	// namespace id, u32 copy id. The worker forks a copy of itself (Namespace.Fork;
	// docs/protocol.md, "Fork").
	OpFork
	// OpSave and OpRestore save a namespace's variables and restore them (state.py;
	// Namespace.Save and Restore).
	OpSave
	OpRestore
)

// Flags of a run request. RunLive: its output is sent while it runs (events of kind
// FrameOutput), besides being captured for the result. RunHostCalls: its code may call
// host functions (events of kind FrameCall); otherwise a call fails at once.
const (
	RunLive      = 1
	RunHostCalls = 2
)

// DefaultNamespace is the id of the namespace that runs without Globals use.
const DefaultNamespace = 1

// KickFD is a local worker's control pipe, as it starts (fd 3 is its control socket): the
// host's kicks and host-call replies come there, read by the worker's control thread, and
// its main thread reads its requests on stdin itself (docs/protocol.md, "Frames").
const KickFD = 4

// MaxDepth is how deeply containers may nest in a value of the codec, both ways.
const MaxDepth = 100

// Omitted is the marker put where output was cut, a format for both Go's fmt and Python's
// %: the number of characters left out and the stream's name.
const Omitted = "\n[... %d characters of %s omitted ...]\n"

// Frames between the Go host and a worker are a u32 length (little-endian, counting the kind
// byte), a kind byte, then the payload. Events of a run in progress (output, and host calls
// later) have the same shape on both engines: the in-process engine's C side queues them
// as frames too, so one decoder serves both (see docs/protocol.md).
const (
	FrameRequest = 'R' // host -> worker: u64 run id, u32 deadman ms, u16 n, n x u32 ids, request
	FrameKick    = 'K' // host -> worker: u64 run id, u8 stage
	FrameReady   = 'Y' // worker -> host: codec [version, executable]
	FrameAnswer  = 'A' // worker -> host: u64 run id, u8 flags (Answer*), response
	FrameExit    = 'X' // guardian -> host: i32 wait status, the last frame
	FrameOutput  = 'O' // run event: u64 run id, u8 stream (1 stdout, 2 stderr), bytes
	FrameCall    = 'C' // run event: u64 run id, u64 call id, codec [function id, {arguments}]
	FrameReply   = 'B' // host -> worker: u64 call id, u8 status (Call*), payload
	FrameBeat    = 'H' // host -> Command worker: nothing; it ends after a silence (config silence_ms)
	FramePump    = 'P' // host -> worker: u64 run id: send the run's pending live output (docs/protocol.md)
)

// The flags of an answer (FrameAnswer). AnswerChanged says the request may have changed
// the worker's state (it ran code, or created namespaces): a worker with rollback forks a
// new snapshot after it, numbered by the count of such requests, which the guardian
// reports with a death (ControlDied). The host counts these answers too, so that it never
// rolls back to a snapshot older than the last answer it read (docs/protocol.md,
// "Rollback").
const (
	AnswerKicked  = 1 // the run was kicked (interrupted)
	AnswerChanged = 2
)

// The messages of a local worker's control socket (a SOCK_SEQPACKET pair between the host
// and the worker's guardian, or the engine's template): a kind, then its payload; fds ride
// along as SCM_RIGHTS (docs/protocol.md: "Rollback", "Fork", "Template").
const (
	ControlDied = 'D' // guardian -> host: i32 wait status, u8 1 if a snapshot waits to take over, u32 its number
	// ControlSnapshotDied (guardian -> host, no payload): the worker's current snapshot ended
	// while it waited (killed from outside): nothing is lost, the worker's next answer makes
	// another; the host counts it (IsolatedStats.Deaths).
	ControlSnapshotDied = 'S'
	ControlKill         = 'K' // host -> guardian: kill the worker (not its snapshot)
	ControlTakeOver     = 'T' // host -> guardian: the snapshot takes over; 4 fds: its stdin, stdout, stderr, control pipe
	ControlFork         = 'F' // host -> guardian: u64 token; 5 fds: a Fork copy's pipes, control pipe and control socket
	ControlNew          = 'N' // host -> template: TREE NUL HOME; 6 fds: a new worker's pipes, control socket, control pipe, life pipe
	// ControlMount asks the template to mount a tmpfs (IsolatedConfig.WorkSize): a tree's
	// own, or a working directory's, which the host made in it: the tree's and the
	// directory's ("" for the tree) names and the size in bytes, NUL-separated. It answers
	// ControlMount with an O_PATH fd of the tmpfs's root, or ControlRefused and the reason.
	ControlMount   = 'M'
	ControlRefused = 'E'
	// ControlListen (worker's sandbox -> host, once, before its ready frame; with
	// IsolatedConfig.Egress): the fd of a socket listening on 127.0.0.1:EgressPort in the
	// sandbox's network namespace, which the host serves its egress proxy on.
	ControlListen = 'L'
	// ControlStart (host -> guardian): u64 token, u8 flags (StartTerminal); 4 fds: a command's stdin, stdout and
	// stderr, and a pipe holding its spec (the directory, the count of arguments, the
	// arguments, then the environment's KEY=VALUE entries, NUL-separated; the host has
	// written it whole and closed its end); a fifth, with a memory limit: the cgroup.procs
	// of the sandbox's work group, which the child joins first. The guardian starts the command as its child,
	// in a process group of its own (with StartTerminal: a session, whose controlling
	// terminal is its stdin), under the worker's limits, and answers ControlStart, the
	// token and the u32 pid (0 when it could not start: then the reason follows).
	ControlStart = 'P'
	// StartTerminal (ControlStart's flags): the command's stdin, stdout and stderr are a
	// pseudo terminal's, which it takes as its controlling terminal in a session of its own.
	StartTerminal = 1
	// ControlExited (guardian -> host): u32 pid, i32 wait status: a command ended.
	ControlExited = 'Q'
	// ControlSignal (host -> guardian): u32 pid, u8 signal: for a command's process group.
	ControlSignal = 'G'
	// ControlRoot (host -> guardian): u64 token. The guardian answers ControlRoot and the
	// token with an O_PATH fd of its root directory, the sandbox's as its code sees it (none
	// when it could not open it): the host reaches the sandbox's own tmpfs mounts (/tmp,
	// /dev/shm) through it.
	ControlRoot = 'V'
	// ControlConnect (host -> guardian): u64 token, u16 port. The guardian connects a TCP
	// socket to 127.0.0.1:port in the sandbox's network namespace (non-blocking: it never
	// waits on the code's server) and answers ControlConnect, the token and a u32 errno (0:
	// the socket's fd rides along, connected or still connecting).
	ControlConnect = 'J'
)

// EgressPort is where a sandbox with an egress policy finds its proxy: 127.0.0.1 in its own
// network namespace (HTTP_PROXY and the like point there).
const EgressPort = 3128

// The status of a host call's reply; its payload is a codec value for CallOK, else the
// UTF-8 message of the exception Python raises.
const (
	CallOK      = 0 // the function's result
	CallError   = 1 // the function returned an error or panicked: minipy.HostError
	CallBadArgs = 2 // the arguments do not match the function's schema: TypeError
	CallStopped = 3 // the run was stopped (deadline, cancel): minipy.TimeoutInterrupt
	CallRefused = 4 // no such function in this run (or no run): minipy.HostError
	CallShow    = 5 // the function's result and displays to show: codec [result, [{MIME type: bytes}, ...]]
)

// OutputChunk is the most output bytes a worker sends in one output event (FrameOutput): a
// run's output is read from its memory files in chunks of that size, and the host refuses a
// larger output frame.
const OutputChunk = 1 << 20

// ImageTypes are the MIME types of displays that count as images: the ones model APIs
// take (Anthropic's image blocks, OpenAI's image_url, MCP's ImageContent). A display with
// one of them is numbered in the model's text ("[image 1: ...]") and its image is sent;
// the first present in this order is the display's image.
var ImageTypes = []string{"image/png", "image/jpeg", "image/gif", "image/webp"}

func quoted(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = fmt.Sprintf("%q", s)
	}
	return strings.Join(q, ", ")
}

// constantsLine is the line of runtime.py and worker.py that withConstants replaces.
const constantsLine = "# @constants: pyrt.go puts the constants shared with Go on this line\n"

// withConstants puts the prelude on src's constants line; one line, so the line numbers of
// the file stay what an editor shows.
func withConstants(src string) string {
	if strings.Count(src, constantsLine) != 1 {
		panic("pyrt: a Python source lacks its constants line")
	}
	return strings.Replace(src, constantsLine, prelude()+"\n", 1)
}

func prelude() string {
	b := func(kind byte) string { return fmt.Sprintf("b%q", string(kind)) }
	defs := []string{
		fmt.Sprintf("RUNTIME_FILE = %q", RuntimeFile),
		fmt.Sprintf("OP_RUN, OP_NEW, OP_FREE, OP_SET, OP_GET, OP_NAMES, OP_INFO, OP_REGISTER, OP_FORK, OP_SAVE, OP_RESTORE = "+
			"%d, %d, %d, %d, %d, %d, %d, %d, %d, %d, %d",
			OpRun, OpNew, OpFree, OpSet, OpGet, OpNames, OpInfo, OpRegister, OpFork, OpSave, OpRestore),
		fmt.Sprintf("RUN_LIVE, RUN_HOST_CALLS = %d, %d", RunLive, RunHostCalls),
		fmt.Sprintf("DEFAULT_NAMESPACE = %d", DefaultNamespace),
		fmt.Sprintf("KICK_FD = %d", KickFD),
		fmt.Sprintf("MAX_DEPTH = %d", MaxDepth),
		fmt.Sprintf("OMITTED = %q", Omitted),
		fmt.Sprintf("F_REQUEST, F_KICK, F_READY, F_ANSWER, F_EXIT, F_OUTPUT, F_CALL, F_REPLY, F_BEAT, F_PUMP = "+
			"%s, %s, %s, %s, %s, %s, %s, %s, %s, %s",
			b(FrameRequest), b(FrameKick), b(FrameReady), b(FrameAnswer), b(FrameExit), b(FrameOutput), b(FrameCall),
			b(FrameReply), b(FrameBeat), b(FramePump)),
		fmt.Sprintf("CALL_OK, CALL_ERROR, CALL_BAD_ARGS, CALL_STOPPED, CALL_REFUSED, CALL_SHOW = %d, %d, %d, %d, %d, %d",
			CallOK, CallError, CallBadArgs, CallStopped, CallRefused, CallShow),
		fmt.Sprintf("IMAGE_TYPES = (%s,)", quoted(ImageTypes)),
		fmt.Sprintf("OUTPUT_CHUNK = %d", OutputChunk),
		fmt.Sprintf("ANSWER_KICKED, ANSWER_CHANGED = %d, %d", AnswerKicked, AnswerChanged),
		fmt.Sprintf("C_DIED, C_KILL, C_TAKE_OVER, C_FORK, C_NEW, C_MOUNT, C_REFUSED, C_LISTEN, C_SNAP_DIED = "+
			"%s, %s, %s, %s, %s, %s, %s, %s, %s",
			b(ControlDied), b(ControlKill), b(ControlTakeOver), b(ControlFork), b(ControlNew), b(ControlMount),
			b(ControlRefused), b(ControlListen), b(ControlSnapshotDied)),
		fmt.Sprintf("C_START, C_EXITED, C_SIGNAL, C_ROOT, C_CONNECT = %s, %s, %s, %s, %s", b(ControlStart),
			b(ControlExited), b(ControlSignal), b(ControlRoot), b(ControlConnect)),
		fmt.Sprintf("START_TERMINAL = %d", StartTerminal),
		fmt.Sprintf("EGRESS_PORT = %d", EgressPort),
	}
	return strings.Join(defs, "; ")
}
