package worker

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/minipy-go/minipy/internal/cpython"
	"github.com/minipy-go/minipy/internal/pyrt"
)

// plainSpec is the Spec of unsandboxed local workers of the linked Python, with one tree
// ("1", holding "work") made under a temporary directory.
func plainSpec(t *testing.T) (*Spec, Dirs) {
	t.Helper()
	python := cpython.LinkedPython()
	if python == "" {
		python = "python3"
	}
	s := &Spec{
		Python: python, Trees: t.TempDir(), KickSignal: syscall.SIGUSR1, StartTimeout: 30 * time.Second,
		Beats: DefaultBeats,
		Ready: func([]byte) (string, []byte, error) { return "", nil, nil },
	}
	d := Dirs{Tree: "1", Home: "work"}
	require.NoError(t, os.MkdirAll(s.HomePath(d), 0o700))
	return s, d
}

// configLines is the first frame of configFrame, as lines.
func configLines(t *testing.T, f []byte) []string {
	t.Helper()
	require.GreaterOrEqual(t, len(f), 4)
	n := binary.LittleEndian.Uint32(f)
	return strings.Split(strings.TrimSuffix(string(f[4:4+n]), "\n"), "\n")
}

// TestLaunchAndKill: a plain worker starts, says it is ready (Spec.Ready sees the payload),
// and Kill ends it and its children; its status says it was killed.
func TestLaunchAndKill(t *testing.T) {
	s, d := plainSpec(t)
	var ready []byte
	s.Ready = func(p []byte) (string, []byte, error) { ready = p; return "", nil, nil }
	w, err := s.Launch(d, 7)
	require.NoError(t, err)
	w, err = s.AwaitReady(w)
	require.NoError(t, err)
	assert.NotEmpty(t, ready, "Ready got the ready frame's payload")
	assert.Equal(t, uint64(7), w.Epoch)
	assert.True(t, w.Known[pyrt.DefaultNamespace])
	assert.True(t, w.Controlled(), "a local worker has a guardian")
	pid := w.Pid()
	require.NotZero(t, pid)
	children := ReadTree().Below(pid)
	require.NotEmpty(t, children, "the guardian runs the worker as its child")
	assert.False(t, w.Gone())

	w.Kill()
	w.AwaitExit()
	assert.True(t, w.Gone())
	ws, ok := w.Status()
	require.True(t, ok)
	assert.True(t, ws.Signaled() && ws.Signal() == syscall.SIGKILL, "status %v", ws)
	for _, p := range append(children, pid) {
		assert.NoError(t, waitGone(p), "process %d outlived Kill", p)
	}
}

// waitGone waits (a bounded time) until pid is no more, or a zombie.
func waitGone(pid int) error { return waitGoneWithin(pid, 5*time.Second) }

// waitGoneWithin waits up to d (at least one look) until pid is no more, or a zombie.
func waitGoneWithin(pid int, d time.Duration) error {
	for end := time.Now().Add(d); ; time.Sleep(10 * time.Millisecond) {
		stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			return nil
		}
		if i := strings.LastIndexByte(string(stat), ')'); i > 0 && strings.HasPrefix(string(stat[i+1:]), " Z") {
			return nil
		}
		if time.Now().After(end) {
			return errors.New("still running")
		}
	}
}

// TestAwaitReadyRefused: a ready frame that Spec.Ready refuses fails the start with its
// error, and the worker is killed.
func TestAwaitReadyRefused(t *testing.T) {
	s, d := plainSpec(t)
	refused := errors.New("too old")
	s.Ready = func([]byte) (string, []byte, error) { return "", nil, refused }
	w, err := s.Launch(d, 1)
	require.NoError(t, err)
	_, err = s.AwaitReady(w)
	require.ErrorIs(t, err, refused)
	assert.True(t, w.Gone(), "a refused worker is killed")
}

// TestStartFailureSaysWhy: a "python" that is no Python fails the start with what it said
// on its stderr; one that does not exist fails Launch.
func TestStartFailureSaysWhy(t *testing.T) {
	s, d := plainSpec(t)
	sh, err := exec.LookPath("sh")
	require.NoError(t, err)
	s.Python = sh // sh -c BOOTSTRAP: "import: not found"
	w, err := s.Launch(d, 1)
	require.NoError(t, err)
	_, err = s.AwaitReady(w)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "starting a worker")
	assert.Contains(t, err.Error(), "import")

	s.Python = filepath.Join(t.TempDir(), "no-such-python")
	_, err = s.Launch(d, 1)
	require.ErrorIs(t, err, os.ErrNotExist)
}

// TestCompiledRuntimeIsShared: the runtime a worker offers in its ready frame is handed to
// the next worker of the same command in its config, and not to another command's.
func TestCompiledRuntimeIsShared(t *testing.T) {
	s, d := plainSpec(t)
	s.Command = []string{"shared-runtime-test-" + t.Name()}
	s.Ready = func([]byte) (string, []byte, error) { return "tag-1", []byte("code"), nil }
	assert.NotContains(t, configLines(t, s.configFrame(d)), "code_tag=tag-1")
	compiledRuntimes.LoadOrStore(s.runtimeKey(), compiledRuntime{tag: "tag-1", code: []byte("code")})
	t.Cleanup(func() { compiledRuntimes.Delete(s.runtimeKey()) })
	f := s.configFrame(d)
	assert.Contains(t, configLines(t, f), "code_tag=tag-1")
	assert.True(t, strings.HasSuffix(string(f), "\x04\x00\x00\x00code"), "the code is the last frame")
	other := *s
	other.Command = []string{"another-command"}
	assert.NotContains(t, configLines(t, other.configFrame(d)), "code_tag=tag-1")
}

// TestConfigFrame: what a sandboxed worker and the template are told, and a Command
// worker's own lines.
func TestConfigFrame(t *testing.T) {
	s := &Spec{
		Python: "python3", Sandbox: true, Trees: "/e/work", RootDir: "/e/root", TmpSize: 5,
		Env: []string{"PYTHONPATH=/a", "X=1"}, Mounts: []Mount{{Source: "/src", Target: "/dst"}, {Source: "/rw", Target: "/rw", Writable: true}},
		Packed: true, Rollback: true, Preload: []string{"numpy", "json"}, KickSignal: syscall.SIGUSR1,
		CPULimit: 1500 * time.Millisecond, Beats: DefaultBeats,
	}
	lines := configLines(t, s.configFrame(Dirs{Tree: "3", Home: "work"}))
	for _, want := range []string{
		"root=/e/root", "tmp_size=5", "network=0", "host_workdir=/e/work/3/work", "host_tree=/e/work/3",
		"workdir=" + SandboxWorkdir, "tree=" + SandboxTree, "pythonpath=/a", "mount=ro /src\t/dst",
		"mount=rw /rw\t/rw", "packed=1", "control=1", "rollback=1", "preload=numpy,json", "cpu_seconds=2",
		"kick_signal=" + strconv.Itoa(int(syscall.SIGUSR1)), "sandbox_refused=" + strconv.Itoa(sandboxRefusedExit),
	} {
		assert.Contains(t, lines, want)
	}
	assert.NotContains(t, lines, "template=1")

	tmpl := configLines(t, s.configFrame(Dirs{}))
	assert.Contains(t, tmpl, "template=1")
	assert.Contains(t, tmpl, "host_tree=/e/work", "the template binds every tree")

	c := &Spec{Command: []string{"ssh", "h", "python3"}, Env: []string{"X=1"}, Beats: Beats{Every: time.Second, Silence: 3 * time.Second}}
	lines = configLines(t, c.configFrame(Dirs{Tree: "1", Home: "work"}))
	assert.Contains(t, lines, "env=X=1")
	assert.Contains(t, lines, "silence_ms=3000")
	assert.NotContains(t, lines, "control=1", "a Command worker has no guardian the host controls")
	for _, l := range lines {
		assert.False(t, strings.HasPrefix(l, "root="), "no sandbox for a Command worker: %s", l)
	}
}

// TestFrames: the frames the host writes and reads, in pyrt's layout.
func TestFrames(t *testing.T) {
	r, wr, err := os.Pipe()
	require.NoError(t, err)
	defer r.Close()
	w := &Worker{stdin: wr}
	require.NoError(t, w.Request(9, 250, []uint32{1, 5}, []byte{pyrt.OpRun, 'x'}))
	w.Kick(9, 2)
	w.Reply(4, 1, []byte("ok"))
	wr.Close()
	out := make([]byte, 256)
	n, _ := r.Read(out)
	got := out[:n]
	req := []byte{24, 0, 0, 0, pyrt.FrameRequest, 9, 0, 0, 0, 0, 0, 0, 0, 250, 0, 0, 0, 2, 0, 1, 0, 0, 0, 5, 0, 0, 0, pyrt.OpRun, 'x'}
	req[0] = byte(len(req) - 4)
	kick := []byte{10, 0, 0, 0, pyrt.FrameKick, 9, 0, 0, 0, 0, 0, 0, 0, 2}
	reply := []byte{12, 0, 0, 0, pyrt.FrameReply, 4, 0, 0, 0, 0, 0, 0, 0, 1, 'o', 'k'}
	assert.Equal(t, append(append(req, kick...), reply...), got)

	rid, kicked, resp, ok := Answer([]byte{pyrt.FrameAnswer, 9, 0, 0, 0, 0, 0, 0, 0, 1, 'r'})
	assert.True(t, ok)
	assert.Equal(t, uint64(9), rid)
	assert.True(t, kicked)
	assert.Equal(t, []byte("r"), resp)
	_, _, _, ok = Answer([]byte{pyrt.FrameReady, 1})
	assert.False(t, ok)
}

// TestReadFrame: frames split across reads are reassembled, the guardian's exit frame is
// kept rather than returned, Wake ends a wait, and a stream that is not the protocol is
// refused.
func TestReadFrame(t *testing.T) {
	r, wr, err := os.Pipe()
	require.NoError(t, err)
	defer r.Close()
	defer wr.Close()
	w := Reading(r, DefaultMaxTransfer)
	exit := binary.LittleEndian.AppendUint32([]byte{5, 0, 0, 0, pyrt.FrameExit}, uint32(9<<8))
	go func() {
		wr.Write(exit)                          //nolint:errcheck
		wr.Write([]byte{3, 0, 0})               //nolint:errcheck
		time.Sleep(20 * time.Millisecond)       // a frame cut between reads
		wr.Write([]byte{0, pyrt.FrameReady, 1}) //nolint:errcheck
		wr.Write([]byte{2})                     //nolint:errcheck
	}()
	body, err := w.ReadFrame(time.Now().Add(5 * time.Second))
	require.NoError(t, err)
	assert.Equal(t, []byte{pyrt.FrameReady, 1, 2}, body)
	ws, ok := w.Status()
	assert.True(t, ok)
	assert.Equal(t, 9, ws.ExitStatus(), "the exit frame's status")

	go func() {
		time.Sleep(20 * time.Millisecond)
		w.Wake()
	}()
	_, err = w.ReadFrame(time.Time{})
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)

	wr.Write([]byte{0, 0, 0, 0}) //nolint:errcheck
	// (A Wake whose wait had already returned makes the next one return early.)
	for i := 0; i < 2; i++ {
		if _, err = w.ReadFrame(time.Now().Add(5 * time.Second)); !errors.Is(err, os.ErrDeadlineExceeded) {
			break
		}
	}
	require.ErrorIs(t, err, ErrNotProtocol)
}

// TestReadFrameSpins: a wait for the worker's bytes spins only after a wait that ended
// within spinMax (a frame written during the spin is read by it); after one that took
// longer, or a spin that ended with nothing, it does not spin until a wait ends within
// spinMax again: a worker busy for longer costs one spin a run at most. A host with fewer
// than two CPUs (or Ps) never spins.
func TestReadFrameSpins(t *testing.T) {
	r, wr, err := os.Pipe()
	require.NoError(t, err)
	defer r.Close()
	defer wr.Close()
	w := Reading(r, DefaultMaxTransfer)
	frame := frameOf(pyrt.FrameReady, []byte{1})
	read := func(writeWhen func()) {
		t.Helper()
		done := make(chan struct{})
		go func() {
			defer close(done)
			writeWhen()
			wr.Write(frame) //nolint:errcheck // read below
		}()
		body, err := w.ReadFrame(time.Now().Add(time.Minute))
		require.NoError(t, err)
		assert.Equal(t, frame[4:], body)
		<-done
	}
	later := func() { time.Sleep(50 * time.Millisecond) }
	begun := spinsBegun.Load()
	read(later) // the first wait (a worker's start): no spin
	assert.Equal(t, begun, spinsBegun.Load())
	assert.False(t, w.fast)

	defer func(d time.Duration) { spinMax = d }(spinMax) // (restored)
	spinMax = 10 * time.Second                           // (a wait of 50 ms is fast; however loaded the machine, a write comes during a spin)
	read(later)
	assert.Equal(t, begun, spinsBegun.Load(), "no spin after a slow wait")
	assert.True(t, w.fast, "a wait within spinMax")
	if min(runtime.GOMAXPROCS(0), runtime.NumCPU()) < 2 {
		read(later)
		assert.Equal(t, begun, spinsBegun.Load(), "one CPU or P: no spin")
		return
	}
	read(func() {
		for spinsBegun.Load() == begun { // until the read spins
			runtime.Gosched()
		}
	})
	assert.Equal(t, begun+1, spinsBegun.Load())
	assert.True(t, w.fast, "the frame came during the spin")

	spinMax, w.spun = time.Millisecond, 0 // (w.spun: as a new request leaves it)
	read(later)                           // a spin that ends with nothing, then the wait
	assert.Equal(t, begun+2, spinsBegun.Load())
	assert.False(t, w.fast)
	read(later)
	assert.Equal(t, begun+2, spinsBegun.Load(), "no spin after a slow wait")
	assert.Zero(t, spinners.Load())
}

// TestReadFrameSpinsLittleForDrips: a worker whose code drips its output a byte at a time,
// each within spinMax (keeping every wait "fast"), cannot keep the host spinning: a
// request's spins last spinMax in all, and its next request may spin again.
func TestReadFrameSpinsLittleForDrips(t *testing.T) {
	r, wr, err := os.Pipe()
	require.NoError(t, err)
	defer r.Close()
	defer wr.Close()
	in, inW, err := os.Pipe() // (the requests' pipe: read by no one, kept open)
	require.NoError(t, err)
	defer in.Close()
	defer inW.Close()
	w := Reading(r, DefaultMaxTransfer)
	w.stdin = inW
	frame := frameOf(pyrt.FrameReady, bytes.Repeat([]byte{'x'}, 300))
	drip := func() {
		t.Helper()
		w.fast = true // (as the request's answers so far came fast)
		begun := spinsBegun.Load()
		go func() {
			for _, c := range frame {
				for until := time.Now().Add(50 * time.Microsecond); time.Now().Before(until); {
				} // (a sleep would take longer than spinMax here: a drip each 50 us)
				wr.Write([]byte{c}) //nolint:errcheck // read below
			}
		}()
		body, err := w.ReadFrame(time.Now().Add(time.Minute))
		require.NoError(t, err)
		assert.Equal(t, frame[4:], body)
		// (Each byte waited for was a spin of its own without the bound: ~300.)
		assert.LessOrEqual(t, spinsBegun.Load()-begun, int64(30), "spins for one dripped frame")
	}
	drip()
	require.NoError(t, w.Request(1, 0, nil, []byte{pyrt.OpRun}))
	assert.Zero(t, w.spun, "a request's answer may spin again")
	drip()
}

// TestKillDescendants: every descendant is killed, and a process held for a start time
// that is not its own (its pid reused) is never signalled.
func TestKillDescendants(t *testing.T) {
	cmd := exec.Command("sh", "-c", "sleep 1000 & (sleep 1000 & wait) & wait")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	require.NoError(t, cmd.Start())
	defer func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) //nolint:errcheck
		cmd.Wait()                                      //nolint:errcheck
	}()
	var below []int
	for end := time.Now().Add(5 * time.Second); len(below) < 3 && time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		below = ReadTree().Below(cmd.Process.Pid)
	}
	require.Len(t, below, 3, "two sleeps and a subshell")

	start, ok := procStart(below[0])
	require.True(t, ok)
	_, held := holdProcess(below[0], start+1)
	assert.False(t, held, "a process whose start time is not the scanned one is not held")

	killDescendants(cmd.Process.Pid)
	for _, p := range below {
		assert.NoError(t, waitGone(p), "descendant %d outlived killDescendants", p)
	}
	assert.NoError(t, cmd.Process.Signal(syscall.Signal(0)), "the root itself is left alone")
}

// TestTailBuffer keeps the last bytes only.
func TestTailBuffer(t *testing.T) {
	b := tailBuffer{max: 4}
	b.Write([]byte("abc")) //nolint:errcheck
	b.Write([]byte("def")) //nolint:errcheck
	assert.Equal(t, "cdef", b.String())
}

// frameOf is a frame of kind with payload.
func frameOf(kind byte, payload []byte) []byte {
	f := binary.LittleEndian.AppendUint32(nil, uint32(1+len(payload)))
	return append(append(f, kind), payload...)
}

// TestReadFrameCaps: a frame whose header claims more than its kind may carry, or of a kind
// no worker sends, is refused at its header (a *FrameError that matches ErrNotProtocol),
// whatever follows it.
func TestReadFrameCaps(t *testing.T) {
	const limit = 1 << 20
	cases := []struct {
		name string
		head []byte
		cap  int
	}{
		{"answer", binary.LittleEndian.AppendUint32(nil, frameHead+limit+1), frameHead + limit},
		{"call", binary.LittleEndian.AppendUint32(nil, 1<<30), frameHead + limit},
		{"output", binary.LittleEndian.AppendUint32(nil, 1+8+1+pyrt.OutputChunk+1), 1 + 8 + 1 + pyrt.OutputChunk},
		{"ready", binary.LittleEndian.AppendUint32(nil, readyCap+1), readyCap},
		{"exit", binary.LittleEndian.AppendUint32(nil, 6), 5},
		{"unknown", binary.LittleEndian.AppendUint32(nil, 2), 0},
	}
	kinds := map[string]byte{"answer": pyrt.FrameAnswer, "call": pyrt.FrameCall, "output": pyrt.FrameOutput,
		"ready": pyrt.FrameReady, "exit": pyrt.FrameExit, "unknown": pyrt.FrameRequest}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, wr, err := os.Pipe()
			require.NoError(t, err)
			defer r.Close()
			defer wr.Close()
			w := Reading(r, limit)
			_, err = wr.Write(append(c.head, kinds[c.name], 1, 2, 3))
			require.NoError(t, err)
			_, err = w.ReadFrame(time.Now().Add(5 * time.Second))
			var fe *FrameError
			require.ErrorAs(t, err, &fe)
			assert.ErrorIs(t, err, ErrNotProtocol)
			assert.Equal(t, kinds[c.name], fe.Kind)
			assert.Equal(t, int(binary.LittleEndian.Uint32(c.head)), fe.Size)
			assert.Equal(t, c.cap, fe.Cap)
			assert.LessOrEqual(t, w.BufferCap(), keepBuf, "nothing was allocated by the claimed length")
		})
	}
}

// TestReadFrameBuffer: a large frame within its cap is read whole and taken with its own
// buffer, which then shrinks back to keepBuf; a header that claims a large frame makes the
// buffer grow with what arrives, not with the claim.
func TestReadFrameBuffer(t *testing.T) {
	r, wr, err := os.Pipe()
	require.NoError(t, err)
	defer r.Close()
	defer wr.Close()
	const limit = 2 << 20
	w := Reading(r, limit)
	payload := make([]byte, limit)
	for i := range payload {
		payload[i] = byte(i)
	}
	small := frameOf(pyrt.FrameReady, []byte("after"))
	go func() {
		wr.Write(append(frameOf(pyrt.FrameAnswer, payload), small...)) //nolint:errcheck
	}()
	body, err := w.ReadFrame(time.Now().Add(10 * time.Second))
	require.NoError(t, err)
	require.Equal(t, append([]byte{pyrt.FrameAnswer}, payload...), body)
	assert.LessOrEqual(t, cap(body), 5+limit+1, "the frame's buffer grew to the frame, not past it")
	assert.LessOrEqual(t, w.BufferCap(), keepBuf, "the buffer shrank after the large frame")
	body, err = w.ReadFrame(time.Now().Add(5 * time.Second))
	require.NoError(t, err)
	assert.Equal(t, []byte("Yafter"), body)
	assert.LessOrEqual(t, w.BufferCap(), keepBuf)

	// A header that claims nearly the cap, then 100 KB of it: the buffer holds what came.
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		wr.Write(append(binary.LittleEndian.AppendUint32(nil, limit), pyrt.FrameAnswer)) //nolint:errcheck
		wr.Write(make([]byte, 100<<10))                                                  //nolint:errcheck
	}()
	_, err = w.ReadFrame(time.Now().Add(time.Second))
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	<-sent
	assert.LessOrEqual(t, w.BufferCap(), 8*(100<<10+5), "the buffer grew by what arrived, not by the claim")
}

// TestDeathSnapshotMustFollowTheLastAnswer: the guardian's death report names the
// snapshot's number; one older than the last answer read that changed the state (the
// worker died after it answered and before it forked the next one) is no snapshot to roll
// back to, since waking it would undo a run the host reported done.
func TestDeathSnapshotMustFollowTheLastAnswer(t *testing.T) {
	answer := func(flags byte) []byte {
		f := binary.LittleEndian.AppendUint32(nil, 1+8+1+1)
		f = append(f, pyrt.FrameAnswer)
		f = binary.LittleEndian.AppendUint64(f, 7)
		return append(f, flags, 'x')
	}
	died := func(gen uint32) []byte {
		m := append([]byte{pyrt.ControlDied}, 9, 0, 0, 0, 1) // SIGKILL, a snapshot alive
		return binary.LittleEndian.AppendUint32(m, gen)
	}
	for _, c := range []struct {
		answers  []byte // the flags of the answers read
		snapshot uint32
		current  bool
	}{
		{nil, 0, true},
		{[]byte{pyrt.AnswerChanged}, 1, true},
		{[]byte{pyrt.AnswerChanged}, 0, false},
		{[]byte{pyrt.AnswerChanged, 0, pyrt.AnswerKicked}, 1, true}, // reading requests change nothing
		{[]byte{pyrt.AnswerChanged, pyrt.AnswerChanged | pyrt.AnswerKicked}, 1, false},
	} {
		r, wr, err := os.Pipe()
		require.NoError(t, err)
		w := Reading(r, DefaultMaxTransfer)
		ctl, guardian, err := controlSocket()
		require.NoError(t, err)
		w.ctl = ctl
		newLine(nil).watch(w)
		for _, flags := range c.answers {
			_, err := wr.Write(answer(flags))
			require.NoError(t, err)
			body, err := w.ReadFrame(time.Now().Add(5 * time.Second))
			require.NoError(t, err)
			_, kicked, _, ok := Answer(body)
			assert.True(t, ok)
			assert.Equal(t, flags&pyrt.AnswerKicked != 0, kicked)
		}
		_, err = guardian.Write(died(c.snapshot))
		require.NoError(t, err)
		require.True(t, w.WaitEnd(nil))
		assert.True(t, w.Ended())
		d, ok := w.AwaitDeath(5 * time.Second)
		require.True(t, ok)
		assert.Equal(t, c.current, d.Snapshot, "answers %v, snapshot %d", c.answers, c.snapshot)
		assert.Equal(t, syscall.Signal(9), d.Status.Signal())
		guardian.Close()
		ctl.Close()
		r.Close()
		wr.Close()
	}
}

// numberFree reports whether no process has pid as its pid, process group or session.
func numberFree(pid int) bool {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(stat)
		// pid (comm) state ppid pgrp session ...
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if e.Name() == strconv.Itoa(pid) || len(f) > 3 && (f[2] == strconv.Itoa(pid) || f[3] == strconv.Itoa(pid)) {
			return false
		}
	}
	return true
}

// startAtPid starts cmd (which must set Setpgid) as process pid (free now), through the
// kernel's ns_last_pid (root only), or returns nil when another process of the machine took
// the number first.
func startAtPid(t *testing.T, pid int, cmd func() *exec.Cmd) *exec.Cmd {
	t.Helper()
	for range 20 {
		if !numberFree(pid) {
			return nil
		}
		c := cmd()
		require.NoError(t, os.WriteFile("/proc/sys/kernel/ns_last_pid", []byte(strconv.Itoa(pid-1)), 0))
		require.NoError(t, c.Start())
		if c.Process.Pid == pid {
			return c
		}
		syscall.Kill(-c.Process.Pid, syscall.SIGKILL) //nolint:errcheck // not the pid wanted (cmd sets Setpgid)
		c.Wait()                                      //nolint:errcheck // killed
	}
	return nil
}

// A worker that has ended and been reaped no longer owns its pid: the kernel may give the
// number to any process of the machine (pid_max is 32,768 on many), and Kill, which the
// engine calls on a lost worker to end "whatever is left of its tree", must not signal that
// process, its process group or its children. (Before, it did: a loaded machine running
// several test suites lost a fuzzer's workers, a go command and a make to it.)
func TestKillAfterExitSparesThePidsNextOwner(t *testing.T) {
	require.Zero(t, os.Geteuid(), "ns_last_pid needs root (make test runs as root)")
	// (On a busy machine another process may take the number first: then again, with
	// another worker.)
	for range 10 {
		if killAfterReuse(t) {
			return
		}
	}
	t.Fatal("the machine's other processes took the freed number first, ten times over")
}

// killAfterReuse is one try of TestKillAfterExitSparesThePidsNextOwner: false when it
// could not give the worker's number to a process of its own.
func killAfterReuse(t *testing.T) bool {
	s, d := plainSpec(t)
	w, err := s.Launch(d, 1)
	require.NoError(t, err)
	w, err = s.AwaitReady(w)
	require.NoError(t, err)
	pid := w.Pid()
	// The worker ends with its whole group (the guardian and the python: an OOM kill, a
	// cgroup's kill), and the number is free once init has reaped the orphaned python.
	require.NoError(t, syscall.Kill(-pid, syscall.SIGKILL)) // (alive, not reaped: the test's own)
	w.AwaitExit()
	require.True(t, w.Gone())
	require.Eventually(t, func() bool { return numberFree(pid) }, 10*time.Second, 10*time.Millisecond)
	// Its pid's next owner: a group leader with a child, as a shell's job would be.
	next := startAtPid(t, pid, func() *exec.Cmd {
		c := exec.Command("sh", "-c", "sleep 60 & wait")
		c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		return c
	})
	if next == nil {
		return false
	}
	defer func() {
		syscall.Kill(-pid, syscall.SIGKILL) //nolint:errcheck // the test's own group
		next.Wait()                         //nolint:errcheck // killed
	}()
	var below []int
	for end := time.Now().Add(5 * time.Second); len(below) < 1 && time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		below = ReadTree().Below(pid)
	}
	require.Len(t, below, 1, "the sleep")

	w.Kill()
	time.Sleep(100 * time.Millisecond)
	for _, p := range append(below, pid) {
		assert.Error(t, waitGoneWithin(p, 0), "process %d, the pid's next owner or its child, was killed", p)
	}
	return true
}

// SandboxReserved holds every system directory sandbox.py binds (_SYSTEM_DIRS).
func TestSandboxReservedHoldsTheSystemDirs(t *testing.T) {
	_, rest, ok := strings.Cut(pyrt.WorkerSource, "\n_SYSTEM_DIRS = (")
	require.True(t, ok, "sandbox.py has no _SYSTEM_DIRS")
	dirs, _, _ := strings.Cut(rest, ")")
	n := 0
	for _, d := range strings.Split(dirs, ",") {
		d = strings.Trim(strings.TrimSpace(d), `"`)
		if d != "" {
			assert.Contains(t, SandboxReserved, d)
			n++
		}
	}
	assert.Greater(t, n, 5)
}
