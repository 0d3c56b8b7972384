package e2b

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/e2b/envd/proto/process"
	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/e2b/envd/proto/process/processconnect"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// toSandbox routes a client's requests to a sandbox's envd, as the SDKs do.
type toSandbox struct{ id, token string }

func (s toSandbox) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("E2b-Sandbox-Id", s.id)
	r.Header.Set("E2b-Sandbox-Port", "49983")
	r.Header.Set("X-Access-Token", s.token)
	return http.DefaultTransport.RoundTrip(r)
}

// output reads a command's stream to its end: its stdout and its exit code.
func output[T interface{ GetEvent() *process.ProcessEvent }](t *testing.T, next func() bool, msg func() T) (string, int32) {
	t.Helper()
	out, code := "", int32(-2)
	for next() {
		ev := msg().GetEvent()
		if d := ev.GetData(); d != nil {
			out += string(d.GetStdout())
		}
		if e := ev.GetEnd(); e != nil {
			code = e.GetExitCode()
		}
	}
	return out, code
}

// commands.connect follows a running command: its pid, its output from then on, its end;
// its stream's end leaves the command running; an unknown or ended command is NotFound.
func TestCommandConnect(t *testing.T) {
	_, base := pauseServer(t, Config{})
	code, sb := call(t, "POST", base+"/v2/sandboxes", `{}`)
	require.Equal(t, http.StatusCreated, code)
	client := processconnect.NewProcessClient(&http.Client{Transport: toSandbox{sb["sandboxID"].(string),
		sb["envdAccessToken"].(string)}}, base)
	ctx := context.Background()
	stdin := true
	started, err := client.Start(ctx, connect.NewRequest(&process.StartRequest{Stdin: &stdin, Process: &process.ProcessConfig{
		Cmd: "sh", Args: []string{"-c", "read x; echo one; echo two"}}}))
	require.NoError(t, err)
	require.True(t, started.Receive())
	pid := started.Msg().GetEvent().GetStart().GetPid()
	require.NotZero(t, pid)

	sel := &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: pid}}
	early, cancel := context.WithCancel(ctx)
	left, err := client.Connect(early, connect.NewRequest(&process.ConnectRequest{Process: sel}))
	require.NoError(t, err)
	require.True(t, left.Receive())
	assert.Equal(t, pid, left.Msg().GetEvent().GetStart().GetPid())
	cancel() // (this one leaves; the command goes on)

	follow, err := client.Connect(ctx, connect.NewRequest(&process.ConnectRequest{Process: sel}))
	require.NoError(t, err)
	require.True(t, follow.Receive())
	assert.Equal(t, pid, follow.Msg().GetEvent().GetStart().GetPid())
	_, err = client.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{Process: sel,
		Input: &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: []byte("go\n")}}}))
	require.NoError(t, err)
	out, exit := output(t, follow.Receive, follow.Msg)
	assert.Equal(t, "one\ntwo\n", out, "what it wrote after the connect")
	assert.Equal(t, int32(0), exit)
	out, exit = output(t, started.Receive, started.Msg)
	assert.Equal(t, "one\ntwo\n", out, "its own stream has it all")
	assert.Equal(t, int32(0), exit)

	require.Eventually(t, func() bool {
		gone, err := client.Connect(ctx, connect.NewRequest(&process.ConnectRequest{Process: sel}))
		if err == nil && !gone.Receive() {
			err = gone.Err()
		}
		return connect.CodeOf(err) == connect.CodeNotFound
	}, 5*time.Second, 20*time.Millisecond, "an ended command is NotFound")
	missing, err := client.Connect(ctx, connect.NewRequest(&process.ConnectRequest{Process: &process.ProcessSelector{
		Selector: &process.ProcessSelector_Pid{Pid: 999999}}}))
	if err == nil {
		assert.False(t, missing.Receive())
		err = missing.Err()
	}
	assert.Equal(t, connect.CodeNotFound, connect.CodeOf(err))
	assert.True(t, strings.Contains(err.Error(), "999999"))
}
