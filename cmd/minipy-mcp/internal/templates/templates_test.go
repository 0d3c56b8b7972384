package templates

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var served = []string{"code-interpreter-v1", "base"}

// A spec's base and steps are checked before anything runs: the base image or a template,
// never another image, and each step's arguments.
func TestSpecBase(t *testing.T) {
	for _, tc := range []struct {
		spec Spec
		base string
	}{
		{Spec{}, "base"},
		{Spec{FromImage: BaseImage}, "base"},
		{Spec{FromTemplate: "code-interpreter-v1"}, "code-interpreter-v1"},
		{Spec{FromTemplate: "mine"}, "mine"},
	} {
		base, err := tc.spec.Base("base", served)
		require.NoError(t, err)
		assert.Equal(t, tc.base, base)
	}
	_, err := (&Spec{FromImage: "ubuntu:22.04"}).Base("base", served)
	assert.ErrorIs(t, err, ErrRefused)
	assert.Contains(t, err.Error(), "fromBaseImage() (e2bdev/base)")
	_, err = (&Spec{FromImageRegistry: []byte(`{"type":"registry"}`)}).Base("base", served)
	assert.ErrorIs(t, err, ErrRefused)
	for _, bad := range []Spec{
		{FromImage: BaseImage, FromTemplate: "base"},
		{ReadyCmd: "true"},
		{Steps: []Step{{Type: "RUN"}}},
		{Steps: []Step{{Type: "RUN", Args: []string{"a", "b", "c"}}}},
		{Steps: []Step{{Type: "RUN", Args: []string{"a\x00"}}}},
		{Steps: []Step{{Type: "COPY", Args: []string{"a", "b"}}}},
		{Steps: []Step{{Type: "COPY", Args: []string{"a", "b"}, FilesHash: "../../etc"}}},
		{Steps: []Step{{Type: "COPY", Args: []string{"a", "b", "", "rwx"}, FilesHash: strings.Repeat("a", 64)}}},
		{Steps: []Step{{Type: "ENV", Args: []string{"A"}}}},
		{Steps: []Step{{Type: "ENV", Args: []string{"A=B", "c"}}}},
		{Steps: []Step{{Type: "WORKDIR"}}},
		{Steps: []Step{{Type: "ADD", Args: []string{"x"}}}},
	} {
		_, err := bad.Base("base", served)
		assert.Error(t, err, "%+v", bad)
	}
}

// machine is a Machine that records what a build does, each command's exit code given
// by fail (0 when it has none).
type machine struct {
	runs, started []string
	put           map[string][]byte
	fail          map[string]int
	envs          [][]string
	root          bool // it has a root user
}

// prompt is the command's prompt: dir and "$ ", or "# " as root.
func prompt(c Cmd) string {
	if c.Root {
		return c.Dir + "# "
	}
	return c.Dir + "$ "
}

func (m *machine) Run(ctx context.Context, c Cmd, out func(string)) (int, error) {
	m.runs = append(m.runs, prompt(c)+c.Line)
	m.envs = append(m.envs, c.Env)
	out("output of " + c.Line)
	return m.fail[c.Line], nil
}

func (m *machine) Start(c Cmd) error {
	m.started = append(m.started, prompt(c)+c.Line)
	return nil
}

func (m *machine) RootUser() bool { return m.root }

func (m *machine) Put(name string, data []byte) error {
	m.put[name] = data
	return nil
}

// A build runs its steps in order in the machine: ENV, USER and WORKDIR change what the
// steps after them get, a COPY puts its upload there first; its log says each step; the
// result is what sandboxes of the template start with.
func TestBuildRun(t *testing.T) {
	hash := strings.Repeat("ab", 32)
	spec := &Spec{Steps: []Step{
		{Type: "ENV", Args: []string{"A", "1"}},
		{Type: "COPY", Args: []string{"src/*", "dest/", "user", "0755"}, FilesHash: hash},
		{Type: "WORKDIR", Args: []string{"app"}},
		{Type: "USER", Args: []string{"user"}},
		{Type: "RUN", Args: []string{"make", "user"}},
	}, StartCmd: "serve", ReadyCmd: "check"}
	m := &machine{put: map[string][]byte{}}
	b := NewBuild("t1", "b1")
	require.True(t, b.Begin())
	assert.False(t, b.Begin(), "once")
	res, err := b.Run(context.Background(), spec, Result{Envs: map[string]string{"BASE": "x"}}, m,
		func(h string) ([]byte, bool) { return []byte("tar"), h == hash })
	require.NoError(t, err)
	assert.Empty(t, m.started, "the steps alone: Finalize starts the start command")
	require.NoError(t, b.Finalize(context.Background(), m, res))
	assert.Equal(t, Result{Envs: map[string]string{"A": "1", "BASE": "x"}, Workdir: "/home/user/app", User: "user",
		StartCmd: "serve", ReadyCmd: "check"}, res)
	assert.Equal(t, []byte("tar"), m.put["/tmp/.minipy-upload-"+hash])
	require.Len(t, m.runs, 4)
	assert.Equal(t, "/home/user$ "+copyScript, m.runs[0])
	assert.Contains(t, m.envs[0], "MINIPY_DEST=/home/user/dest")
	assert.Contains(t, m.envs[0], "MINIPY_INTO=1", "a destination ending in / takes the files into it")
	assert.Contains(t, m.envs[0], "MINIPY_MODE=0755")
	assert.Contains(t, m.envs[0], "A=1")
	assert.Equal(t, "/home/user/app$ make", m.runs[2])
	assert.Equal(t, "/home/user/app$ check", m.runs[3])
	assert.Equal(t, []string{"/home/user/app$ serve"}, m.started)
	b.End("", nil)
	info := b.Info(0)
	assert.Equal(t, Ready, info.Status)
	assert.Nil(t, info.Reason)
	assert.Contains(t, info.LogEntries[0].Message, "[1/5] ENV A 1")
	assert.Equal(t, "1", info.LogEntries[0].Step)
	assert.Equal(t, "Template is ready", info.LogEntries[len(info.LogEntries)-1].Message)
	assert.Len(t, b.Info(len(info.LogEntries)).LogEntries, 0, "an offset past the log gives none")
	assert.Len(t, b.Info(-1).LogEntries, 0)
	b.End("1", errors.New("too late"))
	assert.Equal(t, Ready, b.Status(), "a build ends once")
}

// A failing step ends the build there, saying which and why in E2B's words; root and a
// user the sandbox has not are refused; files not uploaded are an error, not an empty copy.
func TestBuildFails(t *testing.T) {
	hash := strings.Repeat("cd", 32)
	for _, tc := range []struct {
		step Step
		fail map[string]int
		want string
	}{
		{Step{Type: "RUN", Args: []string{"false"}}, map[string]int{"false": 1},
			"failed to run command 'false': command failed: exit status 1"},
		{Step{Type: "RUN", Args: []string{"whoami", "root"}}, nil, "root: this server's sandboxes have one user"},
		{Step{Type: "RUN", Args: []string{"whoami", "root123"}}, nil,
			"failed to run command 'whoami': command failed: unauthenticated: invalid username: 'root123'"},
		{Step{Type: "USER", Args: []string{"root"}}, nil, "failed to set the user: root"},
		{Step{Type: "COPY", Args: []string{"a", "b"}, FilesHash: hash}, nil, "were not uploaded"},
	} {
		m := &machine{put: map[string][]byte{}, fail: tc.fail}
		b := NewBuild("t", "b")
		b.Begin()
		_, err := b.Run(context.Background(), &Spec{Steps: []Step{{Type: "ENV", Args: []string{"A", "1"}}, tc.step}},
			Result{}, m, func(string) ([]byte, bool) { return nil, false })
		var se *StepError
		require.ErrorAs(t, err, &se, tc.want)
		assert.Equal(t, "2", se.Step)
		assert.Contains(t, err.Error(), tc.want)
		b.End(se.Step, err)
		info := b.Info(0)
		assert.Equal(t, Failed, info.Status)
		require.NotNil(t, info.Reason)
		assert.Equal(t, "2", info.Reason.Step)
		assert.Contains(t, info.Reason.Message, tc.want)
	}
}

// Where the sandbox has a root user, steps run as root when they say so, and after USER
// root; so do the start and ready commands.
func TestBuildAsRoot(t *testing.T) {
	hash := strings.Repeat("ef", 32)
	spec := &Spec{Steps: []Step{
		{Type: "RUN", Args: []string{"apt-get install -y x", "root"}},
		{Type: "RUN", Args: []string{"whoami"}},
		{Type: "COPY", Args: []string{"a", "/etc2/a", "root"}, FilesHash: hash},
		{Type: "USER", Args: []string{"root"}},
		{Type: "RUN", Args: []string{"id -u"}},
		{Type: "RUN", Args: []string{"id -un", "user"}},
	}, StartCmd: "serve", ReadyCmd: "check"}
	m := &machine{put: map[string][]byte{}, root: true}
	b := NewBuild("t", "b")
	b.Begin()
	res, err := b.Run(context.Background(), spec, Result{}, m, func(string) ([]byte, bool) { return []byte("tar"), true })
	require.NoError(t, err)
	require.NoError(t, b.Finalize(context.Background(), m, res))
	assert.Equal(t, RootUser, res.User)
	assert.Equal(t, []string{"/home/user# apt-get install -y x", "/home/user$ whoami", "/home/user# " + copyScript,
		"/home/user# id -u", "/home/user$ id -un", "/home/user# check"}, m.runs)
	assert.Equal(t, []string{"/home/user# serve"}, m.started)
	assert.Equal(t, Cmd{Line: "serve", Dir: "/home/user", Root: true}, res.Start())
}

// A failed ready check is tried again soon, then less often: 10 ms doubling to 500 ms.
func TestReadyDelay(t *testing.T) {
	var got []time.Duration
	for n := 1; n <= 8; n++ {
		got = append(got, readyDelay(n))
	}
	ms := time.Millisecond
	assert.Equal(t, []time.Duration{10 * ms, 20 * ms, 40 * ms, 80 * ms, 160 * ms, 320 * ms, 500 * ms, 500 * ms}, got)
	assert.Equal(t, readyEvery, readyDelay(1000), "no overflow")
}

// A start command whose ready check never succeeds fails the build's finalize step.
func TestFinalizeNotReady(t *testing.T) {
	m := &machine{put: map[string][]byte{}, fail: map[string]int{"check": 1}}
	b := NewBuild("t", "b")
	b.Begin()
	ctx, cancel := context.WithTimeout(context.Background(), 3*readyFirst)
	defer cancel()
	err := b.Finalize(ctx, m, Result{StartCmd: "serve", ReadyCmd: "check", Workdir: "/w"})
	var se *StepError
	require.ErrorAs(t, err, &se)
	assert.Equal(t, "finalize", se.Step)
	assert.ErrorIs(t, err, ErrNotReady)
	assert.Equal(t, []string{"/w$ serve"}, m.started)
	assert.NoError(t, b.Finalize(ctx, m, Result{}), "no start command: nothing to wait for")
}

// A ready command is run again until it succeeds, within ReadyTimeout or the context.
func TestWaitReady(t *testing.T) {
	m := &machine{put: map[string][]byte{}, fail: map[string]int{"check": 1}}
	ctx, cancel := context.WithTimeout(context.Background(), 3*readyEvery)
	defer cancel()
	err := WaitReady(ctx, m, Result{ReadyCmd: "check"}, func(string) {})
	assert.ErrorIs(t, err, ErrNotReady)
	assert.GreaterOrEqual(t, len(m.runs), 2, "checked again")
	assert.NoError(t, WaitReady(context.Background(), m, Result{}, func(string) {}), "no ready command: ready")
}

// A build's log is bounded, and so is each line.
func TestBuildLogBounded(t *testing.T) {
	b := NewBuild("t", "b")
	for range maxLogEntries + 10 {
		b.Log("info", "1", strings.Repeat("x", maxLogLine+100))
	}
	info := b.Info(0)
	assert.Len(t, info.LogEntries, maxLogEntries)
	assert.Len(t, info.LogEntries[0].Message, maxLogLine+3)
}

// Uploads are each user's own, bounded (the user's oldest go first; past the total, a new
// one is refused), and their URLs' signatures name the template and hash and expire.
func TestUploads(t *testing.T) {
	u := NewUploads(10, 20, 30)
	require.NoError(t, u.Put("alice", "h1", bytes.NewReader([]byte("0123456789"))))
	assert.ErrorIs(t, u.Put("alice", "big", bytes.NewReader(make([]byte, 11))), ErrUploadTooLarge)
	assert.True(t, u.Has("alice", "h1"))
	assert.False(t, u.Has("bob", "h1"), "another user's")
	time.Sleep(time.Millisecond)
	require.NoError(t, u.Put("alice", "h2", bytes.NewReader(make([]byte, 10))))
	require.NoError(t, u.Put("alice", "h3", bytes.NewReader(make([]byte, 10))))
	assert.False(t, u.Has("alice", "h1"), "the oldest went")
	assert.True(t, u.Has("alice", "h3"))
	require.NoError(t, u.Put("bob", "h1", bytes.NewReader(make([]byte, 10))))
	assert.ErrorIs(t, u.Put("carol", "h1", bytes.NewReader(make([]byte, 1))), ErrUploadsFull)
	u.Forget("alice")
	assert.False(t, u.Has("alice", "h2"))
	require.NoError(t, u.Put("carol", "h1", bytes.NewReader(make([]byte, 10))))

	q := u.Sign("t1", "h1")
	var expires, sig string
	for _, kv := range strings.Split(q, "&") {
		k, v, _ := strings.Cut(kv, "=")
		if k == "expires" {
			expires = v
		} else {
			sig = v
		}
	}
	assert.True(t, u.Check("t1", "h1", expires, sig))
	assert.False(t, u.Check("t2", "h1", expires, sig), "another template")
	assert.False(t, u.Check("t1", "h2", expires, sig), "other files")
	assert.False(t, u.Check("t1", "h1", "99999999999", sig), "a later expiry")
	assert.False(t, u.Check("t1", "h1", "1", u.signature("t1", "h1", "1")), "expired")
	assert.False(t, NewUploads(1, 1, 1).Check("t1", "h1", expires, sig), "another server's key")
	assert.ErrorIs(t, NewUploads(10, 5, 30).Put("alice", "h", bytes.NewReader(make([]byte, 6))), ErrUploadTooLarge,
		"larger than a user's share")
}
