package e2b

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/e2b/envd/proto/process"
	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/e2b/envd/proto/process/processconnect"
)

// A pty (E2B's sandbox.pty): an interactive login shell on a terminal of the size asked,
// its output streamed as pty data, what is typed sent as pty input; a resize reaches it
// (tput cols); a reconnected stream follows it; a kill ends it; a command on pipes has
// no terminal to type into or resize.
func TestPty(t *testing.T) {
	_, base := pauseServer(t, Config{})
	code, sb := call(t, "POST", base+"/v2/sandboxes", `{}`)
	require.Equal(t, http.StatusCreated, code)
	client := processconnect.NewProcessClient(&http.Client{Transport: toSandbox{sb["sandboxID"].(string),
		sb["envdAccessToken"].(string)}}, base)
	ctx := context.Background()
	start := func(envs map[string]string) (*connect.ServerStreamForClient[process.StartResponse], uint32) {
		envs["TERM"] = "xterm-256color"
		stream, err := client.Start(ctx, connect.NewRequest(&process.StartRequest{
			Process: &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-i", "-l"}, Envs: envs},
			Pty:     &process.PTY{Size: &process.PTY_Size{Cols: 80, Rows: 24}}}))
		require.NoError(t, err)
		require.True(t, stream.Receive(), "%v", stream.Err())
		pid := stream.Msg().GetEvent().GetStart().GetPid()
		require.NotZero(t, pid)
		return stream, pid
	}
	typeIn := func(pid uint32, text string) {
		_, err := client.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{
			Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: pid}},
			Input:   &process.ProcessInput{Input: &process.ProcessInput_Pty{Pty: []byte(text)}}}))
		require.NoError(t, err)
	}
	// shows reads a stream to its end: what the terminal showed and the exit code.
	shows := func(next func() bool, ev func() *process.ProcessEvent) (string, int32) {
		out, code := "", int32(-2)
		for next() {
			if d := ev().GetData(); d != nil {
				assert.Empty(t, d.GetStdout(), "a terminal's output is pty data")
				out += string(d.GetPty())
			}
			if e := ev().GetEnd(); e != nil {
				code = e.GetExitCode()
			}
		}
		return out, code
	}

	stream, pid := start(map[string]string{"ABC": "123"})
	typeIn(pid, "echo $ABC; tput cols\nexit\n")
	out, exit := shows(stream.Receive, func() *process.ProcessEvent { return stream.Msg().GetEvent() })
	assert.Equal(t, int32(0), exit)
	assert.Contains(t, out, "123")
	assert.Contains(t, out, "80")

	stream, pid = start(map[string]string{})
	_, err := client.Update(ctx, connect.NewRequest(&process.UpdateRequest{
		Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: pid}},
		Pty:     &process.PTY{Size: &process.PTY_Size{Cols: 100, Rows: 24}}}))
	require.NoError(t, err)
	typeIn(pid, "tput cols\n")
	// Its stream goes; another follows it (pty.connect) and sees it to its end.
	cctx, cancel := context.WithCancel(ctx)
	go func() {
		for stream.Receive() {
			if strings.Contains(string(stream.Msg().GetEvent().GetData().GetPty()), "100") {
				cancel()
			}
		}
	}()
	<-cctx.Done()
	stream.Close()
	again, err := client.Connect(ctx, connect.NewRequest(&process.ConnectRequest{
		Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: pid}}}))
	require.NoError(t, err)
	require.True(t, again.Receive())
	typeIn(pid, "echo re''connected\nexit\n")
	out, exit = shows(again.Receive, func() *process.ProcessEvent { return again.Msg().GetEvent() })
	assert.Contains(t, out, "reconnected")
	assert.Equal(t, int32(0), exit)

	_, pid = start(map[string]string{})
	_, err = client.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{
		Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: pid}}, Signal: process.Signal_SIGNAL_SIGKILL}))
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		list, err := client.List(ctx, connect.NewRequest(&process.ListRequest{}))
		require.NoError(t, err)
		return len(list.Msg.GetProcesses()) == 0
	}, 10*time.Second, 10*time.Millisecond, "killed")

	stdin := true
	piped, err := client.Start(ctx, connect.NewRequest(&process.StartRequest{Stdin: &stdin,
		Process: &process.ProcessConfig{Cmd: "cat"}}))
	require.NoError(t, err)
	require.True(t, piped.Receive())
	catPid := piped.Msg().GetEvent().GetStart().GetPid()
	sel := &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: catPid}}
	_, err = client.Update(ctx, connect.NewRequest(&process.UpdateRequest{Process: sel,
		Pty: &process.PTY{Size: &process.PTY_Size{Cols: 100, Rows: 24}}}))
	assert.Equal(t, connect.CodeFailedPrecondition, connect.CodeOf(err))
	_, err = client.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{Process: sel,
		Input: &process.ProcessInput{Input: &process.ProcessInput_Pty{Pty: []byte("x")}}}))
	assert.Equal(t, connect.CodeFailedPrecondition, connect.CodeOf(err))
	_, err = client.CloseStdin(ctx, connect.NewRequest(&process.CloseStdinRequest{Process: sel}))
	require.NoError(t, err)
	for piped.Receive() {
	}
}

// A command outlives the stream that started it, as envd's does (its client may follow it
// again), but not its timeout (the request's Connect-Timeout-Ms): past it, it is killed.
func TestCommandOutlivesItsClient(t *testing.T) {
	_, base := pauseServer(t, Config{})
	code, sb := call(t, "POST", base+"/v2/sandboxes", `{}`)
	require.Equal(t, http.StatusCreated, code)
	client := processconnect.NewProcessClient(&http.Client{Transport: toSandbox{sb["sandboxID"].(string),
		sb["envdAccessToken"].(string)}}, base)
	running := func() int {
		list, err := client.List(context.Background(), connect.NewRequest(&process.ListRequest{}))
		require.NoError(t, err)
		return len(list.Msg.GetProcesses())
	}
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := client.Start(ctx, connect.NewRequest(&process.StartRequest{Process: &process.ProcessConfig{
		Cmd: "sleep", Args: []string{"60"}}}))
	require.NoError(t, err)
	require.True(t, stream.Receive())
	cancel()
	stream.Close()
	time.Sleep(200 * time.Millisecond) // (the server has seen the client go: it would have killed it then)
	assert.Equal(t, 1, running(), "still running")

	tctx, tcancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer tcancel()
	timed, err := client.Start(tctx, connect.NewRequest(&process.StartRequest{Process: &process.ProcessConfig{
		Cmd: "sleep", Args: []string{"60"}}}))
	require.NoError(t, err)
	require.True(t, timed.Receive())
	for timed.Receive() {
	}
	require.Eventually(t, func() bool { return running() == 1 }, 20*time.Second, 10*time.Millisecond,
		"the one with a timeout is killed at it")
}
