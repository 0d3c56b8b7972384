package e2b

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/session"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// cellOut is what an /execute answered: its stdout and stderr messages, its error
// message, its count.
type cellOut struct {
	code           int
	stdout, stderr []string
	err            map[string]any
	count          float64
}

func (c cellOut) out() string  { return strings.Join(c.stdout, "") }
func (c cellOut) errs() string { return strings.Join(c.stderr, "") }

// bashExecute posts body (JSON) to sandbox sb's /execute, within ctx.
func bashExecute(ctx context.Context, t *testing.T, base string, sb map[string]any, body map[string]any) (cellOut, error) {
	t.Helper()
	js, err := json.Marshal(body)
	require.NoError(t, err)
	req, err := http.NewRequestWithContext(ctx, "POST", base+"/execute", strings.NewReader(string(js)))
	require.NoError(t, err)
	toInterpreter(req, sb)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return cellOut{}, err
	}
	defer resp.Body.Close()
	out := cellOut{code: resp.StatusCode}
	if resp.StatusCode != http.StatusOK {
		return out, nil
	}
	lines := bufio.NewScanner(resp.Body)
	lines.Buffer(nil, 1<<20)
	for lines.Scan() {
		var m map[string]any
		require.NoError(t, json.Unmarshal(lines.Bytes(), &m))
		switch m["type"] {
		case "stdout":
			out.stdout = append(out.stdout, m["text"].(string))
		case "stderr":
			out.stderr = append(out.stderr, m["text"].(string))
		case "error":
			out.err = m
		case "number_of_executions":
			out.count = m["execution_count"].(float64)
		}
	}
	return out, lines.Err()
}

// bash runs code as a bash cell of sb (its default bash context, or the context of id).
func bash(t *testing.T, base string, sb map[string]any, code string, more ...any) cellOut {
	t.Helper()
	body := map[string]any{"code": code, "language": "bash"}
	for i := 0; i+1 < len(more); i += 2 {
		body[more[i].(string)] = more[i+1]
	}
	if _, ok := body["context_id"]; ok {
		delete(body, "language")
	}
	out, err := bashExecute(context.Background(), t, base, sb, body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, out.code, "%s", code)
	return out
}

// bashSandbox creates a sandbox on base with body.
func bashSandbox(t *testing.T, base, body string) map[string]any {
	t.Helper()
	code, sb := call(t, "POST", base+"/v2/sandboxes", body)
	require.Equal(t, http.StatusCreated, code, "%v", sb)
	t.Cleanup(func() { call(t, "DELETE", base+"/sandboxes/"+sb["sandboxID"].(string), "") })
	return sb
}

func bashContexts(t *testing.T, base string, sb map[string]any) []contextBody {
	t.Helper()
	req, err := http.NewRequest("GET", base+"/contexts", nil)
	require.NoError(t, err)
	toInterpreter(req, sb)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var out []contextBody
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
	return out
}

// A bash cell runs in the sandbox's default bash context, a shell whose directory,
// variables, functions and aliases last from cell to cell, in /home/user with the
// sandbox's envs; a cell's envs are its alone; its output streams as E2B's does, whatever
// it prints; a failing cell's error is its status, as E2B's bash kernel says it.
func TestBashCells(t *testing.T) {
	_, base := pauseServer(t, Config{})
	sb := bashSandbox(t, base, `{"envVars": {"TEST_ENV_VAR": "supertest"}}`)

	out := bash(t, base, sb, "pwd")
	assert.Equal(t, []string{"/home/user\n"}, out.stdout, "E2B's cwd bash")
	assert.Nil(t, out.err)
	assert.Empty(t, out.stderr)
	assert.Equal(t, 1.0, out.count)

	out = bash(t, base, sb, "cd /tmp; X=1; f() { echo fn \"$@\"; }; alias hello='echo aliased'")
	assert.Nil(t, out.err)
	out = bash(t, base, sb, "pwd; echo $X; f a; hello")
	assert.Equal(t, "/tmp\n1\nfn a\naliased\n", out.out())
	assert.Equal(t, 3.0, out.count)
	bash(t, base, sb, "cd")

	t.Run("envs", func(t *testing.T) {
		out := bash(t, base, sb, "echo $TEST_ENV_VAR")
		assert.Equal(t, "supertest\n", out.stdout[0], "the sandbox's")
		out = bash(t, base, sb, "echo $FOO; sh -c 'echo child: $FOO'", "env_vars", map[string]string{"FOO": "bar"})
		assert.Equal(t, "bar\nchild: bar\n", out.out(), "the cell's, exported")
		out = bash(t, base, sb, "echo ${FOO:-default}")
		assert.Equal(t, "default\n", out.stdout[0], "the cell's alone")
		out = bash(t, base, sb, "echo $TEST_ENV_VAR", "env_vars", map[string]string{"TEST_ENV_VAR": "overwrite"})
		assert.Equal(t, "overwrite\n", out.stdout[0])
		out = bash(t, base, sb, "echo $TEST_ENV_VAR; sh -c 'echo $TEST_ENV_VAR'")
		assert.Equal(t, "supertest\nsupertest\n", out.out(), "put back, still exported")

		odd := "it's \"$HOME\" !! `id` \\ \n second line"
		out = bash(t, base, sb, `printf '%s|' "$ODD"`, "env_vars", map[string]string{"ODD": odd})
		assert.Equal(t, odd+"|", out.out(), "a value as it is")
		bash(t, base, sb, "LOCAL=mine")
		out = bash(t, base, sb, "echo $LOCAL", "env_vars", map[string]string{"LOCAL": "theirs"})
		assert.Equal(t, "theirs\n", out.out())
		out = bash(t, base, sb, "echo $LOCAL; sh -c 'echo ${LOCAL:-unexported}'")
		assert.Equal(t, "mine\nunexported\n", out.out(), "a shell variable stays one")

		out, err := bashExecute(context.Background(), t, base, sb, map[string]any{"code": "true", "language": "bash",
			"env_vars": map[string]string{"NOT-A-NAME": "x"}})
		require.NoError(t, err)
		assert.Equal(t, http.StatusBadRequest, out.code)
	})

	t.Run("output", func(t *testing.T) {
		out := bash(t, base, sb, "printf abc")
		assert.Equal(t, "abc", out.out(), "a partial line")
		out = bash(t, base, sb, "echo out; echo err >&2; printf tail >&2")
		assert.Equal(t, "out\n", out.out())
		assert.Equal(t, "err\ntail", out.errs())
		out = bash(t, base, sb, "cat; read line; echo \"after [$line]\"")
		assert.Equal(t, "after []\n", out.out(), "a cell's stdin is empty")
		out = bash(t, base, sb, "exec 62>&- 63>&- 0</dev/null; echo still")
		assert.Equal(t, "still\n", out.out(), "the shell's own descriptors are not the cell's")
		out = bash(t, base, sb, "echo next")
		assert.Equal(t, "next\n", out.out())
		big := strings.Repeat("x", 200<<10)
		out = bash(t, base, sb, "s='"+big+"'; echo ${#s}")
		assert.Equal(t, "204800\n", out.out(), "a cell larger than a pipe holds")
		out = bash(t, base, sb, "head -c 300000 /dev/zero | tr '\\0' y; echo")
		assert.Equal(t, strings.Repeat("y", 300000)+"\n", out.out())
	})

	t.Run("status", func(t *testing.T) {
		out := bash(t, base, sb, "false")
		assert.Equal(t, map[string]any{"type": "error", "name": "", "value": "1", "traceback": ""}, out.err,
			"E2B's bash kernel's error: no name, the status")
		out = bash(t, base, sb, "ls /nonexistent")
		assert.Equal(t, "2", out.err["value"])
		assert.Contains(t, out.errs(), "/nonexistent")
		out = bash(t, base, sb, "(exit 3)")
		assert.Equal(t, "3", out.err["value"])
		out = bash(t, base, sb, "if then")
		assert.Equal(t, "2", out.err["value"], "a syntax error")
		assert.Contains(t, out.errs(), "syntax error")
		out = bash(t, base, sb, "true")
		assert.Nil(t, out.err)
	})

	t.Run("options", func(t *testing.T) {
		out := bash(t, base, sb, "set -u -o pipefail; echo on")
		assert.Nil(t, out.err)
		out = bash(t, base, sb, "echo $-; set -o | grep -E '^(nounset|pipefail) ' | tr -s ' \\t' ' '")
		assert.Contains(t, out.out(), "nounset on\npipefail on\n", "a cell's options last")
		bash(t, base, sb, "set +u +o pipefail")
		out = bash(t, base, sb, "set -x; echo traced")
		assert.Equal(t, "traced\n", out.out())
		assert.Contains(t, out.errs(), "+ echo traced")
		out = bash(t, base, sb, "echo still")
		assert.Equal(t, "still\n", out.out())
		assert.Contains(t, out.errs(), "+ echo still", "set -x lasts")
		assert.NotContains(t, out.errs(), "__minipy", "the frame is not traced")
		bash(t, base, sb, "set +x")
		bash(t, base, sb, "set -v")
		out = bash(t, base, sb, "echo verbose")
		assert.Equal(t, "verbose\n", out.out())
		assert.Equal(t, "echo verbose\n", out.errs(), "set -v echoes the cell, not the frame")
		bash(t, base, sb, "set +v; PS1='$ '; PROMPT_COMMAND='echo prompt'")
		out = bash(t, base, sb, "echo no prompt")
		assert.Equal(t, "no prompt\n", out.out())
		assert.Empty(t, out.errs())
		out = bash(t, base, sb, "alias printf=false read=false eval=false set=false; true")
		assert.Nil(t, out.err)
		out = bash(t, base, sb, "echo aliases do not break it; unalias printf read eval set")
		assert.Equal(t, "aliases do not break it\n", out.out())
	})

	// A cell cannot end itself early: it cannot know its marker, which is random.
	t.Run("fake marker", func(t *testing.T) {
		out := bash(t, base, sb, "printf '%s:0\\n' 0123456789abcdef0123456789abcdef; printf 'x:\\n' >&2; sleep 0.3; echo end")
		assert.Equal(t, "0123456789abcdef0123456789abcdef:0\nend\n", out.out())
		assert.Equal(t, "x:\n", out.errs())
		out = bash(t, base, sb, "trap 'echo \"$BASH_COMMAND\"' DEBUG; echo one")
		assert.Contains(t, out.out(), "one\n")
		out = bash(t, base, sb, "trap - DEBUG; echo two")
		assert.Contains(t, out.out(), "two\n", "a trace of the frame does not end the cell")
		out = bash(t, base, sb, "echo three")
		assert.Equal(t, "three\n", out.out())
	})

	t.Run("exit", func(t *testing.T) {
		bash(t, base, sb, "cd /tmp; Y=1")
		out := bash(t, base, sb, "echo bye; exit 4")
		assert.Equal(t, "bye\n", out.out())
		assert.Contains(t, out.errs(), "bash ended (exit status 4)")
		assert.Equal(t, "4", out.err["value"])
		out = bash(t, base, sb, "pwd; echo \"[$Y]\"")
		assert.Equal(t, "/home/user\n[]\n", out.out(), "a new shell")
		assert.Nil(t, out.err)
		out = bash(t, base, sb, "set -e; false; echo not here")
		assert.Contains(t, out.errs(), "bash ended (exit status 1)")
		assert.Equal(t, "1", out.err["value"])
		out = bash(t, base, sb, "echo $-")
		assert.NotContains(t, out.out(), "e")
		out = bash(t, base, sb, "exit")
		assert.Nil(t, out.err)
		out = bash(t, base, sb, "kill -9 $$")
		assert.Equal(t, "137", out.err["value"])
		assert.Contains(t, out.errs(), "killed")
		out = bash(t, base, sb, "echo alive")
		assert.Equal(t, "alive\n", out.out())
	})

	cs := bashContexts(t, base, sb)
	require.Len(t, cs, 2, "the default context and the default bash context")
	assert.Equal(t, "python", cs[0].Language)
	assert.Equal(t, contextBody{ID: cs[1].ID, Language: "bash", Cwd: "/home/user"}, cs[1])
}

// A cell past its timeout, or whose request ends, is interrupted and its shell goes on;
// one that does not stop on SIGINT has its shell killed, and the next cell a new one.
func TestBashInterrupt(t *testing.T) {
	_, base := pauseServer(t, Config{Timeout: time.Second})
	sb := bashSandbox(t, base, `{}`)
	bash(t, base, sb, "X=kept")
	started := time.Now()
	out := bash(t, base, sb, "echo before; sleep 100; echo after")
	assert.Less(t, time.Since(started), 10*time.Second)
	assert.Equal(t, "before\n", out.out())
	require.NotNil(t, out.err)
	assert.Equal(t, "TimeoutError", out.err["name"])
	assert.NotContains(t, out.err["value"], "killed")
	out = bash(t, base, sb, "echo $X")
	assert.Equal(t, "kept\n", out.out(), "the shell goes on")

	out = bash(t, base, sb, "while :; do :; done")
	assert.Equal(t, "TimeoutError", out.err["name"], "a loop of the shell's own")
	assert.Equal(t, "kept\n", bash(t, base, sb, "echo $X").out())

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := bashExecute(ctx, t, base, sb, map[string]any{"code": "sleep 100", "language": "bash"})
	assert.Error(t, err, "the client went away")
	out = bash(t, base, sb, "echo $X")
	assert.Equal(t, "kept\n", out.out(), "its cell was interrupted, after it")

	out = bash(t, base, sb, "trap '' INT; sleep 100")
	require.NotNil(t, out.err)
	assert.Equal(t, "TimeoutError", out.err["name"])
	assert.Contains(t, out.err["value"], "its shell was killed")
	out = bash(t, base, sb, "echo \"[$X]\"; pwd")
	assert.Equal(t, "[]\n/home/user\n", out.out(), "a new shell")
	assert.Nil(t, out.err)
}

// createCodeContext makes bash contexts of their own, in the cwd asked for; other
// languages are refused; a restart gives a context a new shell; a pause keeps a bash
// context (not its shell's memory), and a resume gives it a new shell.
func TestBashContexts(t *testing.T) {
	_, base := pauseServer(t, Config{})
	sb := bashSandbox(t, base, `{}`)
	id, token := sb["sandboxID"].(string), sb["envdAccessToken"].(string)
	code, made := onPort(t, base, id, token, "49999", "POST", "/contexts", `{"language": "bash", "cwd": "/tmp"}`)
	require.Equal(t, http.StatusOK, code, "%v", made)
	assert.Equal(t, "bash", made["language"])
	assert.Equal(t, "/tmp", made["cwd"])
	ctxID := made["id"].(string)
	out := bash(t, base, sb, "pwd; Z=1", "context_id", ctxID)
	assert.Equal(t, "/tmp\n", out.out())
	assert.Equal(t, "/home/user\n[]\n", bash(t, base, sb, "pwd; echo \"[$Z]\"").out(), "the default bash context is another")

	code, other := onPort(t, base, id, token, "49999", "POST", "/contexts", `{"language": "bash", "cwd": "/nonexistent"}`)
	require.Equal(t, http.StatusOK, code, "%v", other)
	assert.Equal(t, "/home/user", other["cwd"], "a cwd it cannot enter: it stays in /home/user, as a Python context does")

	for _, lang := range []string{"javascript", "js", "r", "java", "ts"} {
		code, body := onPort(t, base, id, token, "49999", "POST", "/contexts", `{"language": "`+lang+`"}`)
		assert.Equal(t, http.StatusBadRequest, code, "%s: %v", lang, body)
		code, body = onPort(t, base, id, token, "49999", "POST", "/execute", `{"code": "1", "language": "`+lang+`"}`)
		assert.Equal(t, http.StatusBadRequest, code, "%s: %v", lang, body)
	}
	code, _ = onPort(t, base, id, token, "49999", "POST", "/execute",
		`{"code": "1", "language": "bash", "context_id": "`+ctxID+`"}`)
	assert.Equal(t, http.StatusBadRequest, code, "a context and a language")

	code, _ = onPort(t, base, id, token, "49999", "POST", "/contexts/"+ctxID+"/restart", "")
	require.Equal(t, http.StatusNoContent, code)
	out = bash(t, base, sb, "echo \"[$Z]\"; pwd", "context_id", ctxID)
	assert.Equal(t, "[]\n/tmp\n", out.out(), "restarted: a new shell, in its cwd")
	assert.Equal(t, 1.0, out.count)

	// The default context's restart ends the commands of the sandbox, and the shells.
	code, _ = onPort(t, base, id, token, "49999", "POST", "/contexts/"+bashContexts(t, base, sb)[0].ID+"/restart", "")
	require.Equal(t, http.StatusNoContent, code)
	out = bash(t, base, sb, "pwd", "context_id", ctxID)
	assert.Equal(t, "/tmp\n", out.out())
	assert.Contains(t, out.errs(), "had ended", "the cell says its shell is new")

	code, _ = onPort(t, base, id, token, "49999", "DELETE", "/contexts/"+other["id"].(string), "")
	require.Equal(t, http.StatusNoContent, code)
	out, err := bashExecute(context.Background(), t, base, sb, map[string]any{"code": "pwd", "context_id": other["id"]})
	require.NoError(t, err)
	assert.Equal(t, http.StatusNotFound, out.code, "removed")
	assert.Len(t, bashContexts(t, base, sb), 3)
}

func TestBashPause(t *testing.T) {
	t.Run("memory", func(t *testing.T) {
		_, base := pauseServer(t, Config{})
		bashPause(t, base)
	})
	t.Run("store", func(t *testing.T) {
		_, base := storeServer(t, t.TempDir(), Config{})
		bashPause(t, base)
	})
}

func bashPause(t *testing.T, base string) {
	code, sb := callAs(t, "ann", "POST", base+"/v2/sandboxes", `{}`)
	require.Equal(t, http.StatusCreated, code, "%v", sb)
	id, token := sb["sandboxID"].(string), sb["envdAccessToken"].(string)
	t.Cleanup(func() { callAs(t, "ann", "DELETE", base+"/sandboxes/"+id, "") })
	code, made := onPort(t, base, id, token, "49999", "POST", "/contexts", `{"language": "bash", "cwd": "/tmp"}`)
	require.Equal(t, http.StatusOK, code, "%v", made)
	bash(t, base, sb, "W=1; echo kept > file.txt; cd /")
	bash(t, base, sb, "V=1", "context_id", made["id"])
	require.Equal(t, "", run(t, base, sb, "x = 1"))
	before := bashContexts(t, base, sb)
	require.Len(t, before, 3)

	code, body := callAs(t, "ann", "POST", base+"/sandboxes/"+id+"/pause", "")
	require.Equal(t, http.StatusNoContent, code, "%v", body)
	code, _ = callAs(t, "ann", "POST", base+"/v2/sandboxes/"+id+"/connect", `{"timeout": 60}`)
	require.Equal(t, http.StatusCreated, code)
	assert.Equal(t, before, bashContexts(t, base, sb), "its contexts: ids, languages, cwds")
	assert.Equal(t, "1", run(t, base, sb, "x"))
	out := bash(t, base, sb, "pwd; echo \"[$W]\"; cat file.txt")
	assert.Equal(t, "/home/user\n[]\nkept\n", out.out(), "a new shell, in its cwd; the files kept")
	assert.Equal(t, 2.0, out.count)
	out = bash(t, base, sb, "pwd; echo \"[$V]\"", "context_id", made["id"])
	assert.Equal(t, "/tmp\n[]\n", out.out())
	assert.Len(t, bashContexts(t, base, sb), 3, "the default bash context is still the default")
}

// A frame is read by bash as the wire says: the heredoc holds the code as it is.
func TestCellFrame(t *testing.T) {
	f := cellFrame("echo 'a'\nEOF\n", map[string]string{"B": "x'y", "A": "1"}, "MINIPY_d", "0123456789abcdef0123456789abcdef")
	assert.Contains(t, f, "<<'MINIPY_d' || \\builtin true; \\builtin unset -v __minipy_s\necho 'a'\nEOF\n\nMINIPY_d\n")
	assert.Less(t, strings.Index(f, "export A="), strings.Index(f, "export B='x'\\''y'"), "in order")
	assert.NotContains(t, f, "0123456789abcdef0123456789abcdef", "the marker is never whole")
	assert.NotContains(t, f, "!", "no history expansion")
	assert.True(t, shellName("_a1"))
	assert.False(t, shellName("1a"))
	assert.False(t, shellName("a-b"))
	assert.False(t, shellName(""))
}

// cellStream passes on what comes before its marker, whatever the reads' boundaries.
func TestCellStream(t *testing.T) {
	const marker = "0123456789abcdef0123456789abcdef"
	text := "out 0123 partial" + marker + ":7\nafter"
	for cut := 1; cut < len(text); cut++ {
		var got strings.Builder
		c := newCellStream(&got, marker)
		c.take([]byte(text[:cut]), true)
		rest := text[cut:]
		if !c.done {
			c.take([]byte(rest), true)
			rest = ""
		}
		require.True(t, c.done, "cut %d", cut)
		assert.Equal(t, "out 0123 partial", got.String(), "cut %d", cut)
		assert.Equal(t, "7", c.field)
		assert.Equal(t, "after", string(c.rest)+rest, "cut %d", cut)
	}
}

// A context's cells run one at a time; a sandbox killed during a cell drops its
// connection, as a Python run's; the default bash context counts under MaxContexts.
func TestBashSandbox(t *testing.T) {
	_, base := pauseServer(t, Config{MaxContexts: 2})
	sb := bashSandbox(t, base, `{}`)
	id, token := sb["sandboxID"].(string), sb["envdAccessToken"].(string)
	first := make(chan cellOut)
	go func() {
		out, _ := bashExecute(context.Background(), t, base, sb, map[string]any{
			"code": "touch started; sleep 0.5; N=1; echo first", "language": "bash"})
		first <- out
	}()
	require.Eventually(t, func() bool {
		code, _ := onPort(t, base, id, token, "49983", "GET", "/files?path=started", "")
		return code == http.StatusOK
	}, 10*time.Second, 10*time.Millisecond)
	second := bash(t, base, sb, "echo \"second $N\"")
	assert.Equal(t, "second 1\n", second.out(), "after the first")
	assert.Equal(t, "first\n", (<-first).out())

	code, body := onPort(t, base, id, token, "49999", "POST", "/contexts", `{"language": "bash"}`)
	assert.Equal(t, http.StatusTooManyRequests, code, "%v", body)

	done := make(chan error)
	go func() {
		_, err := bashExecute(context.Background(), t, base, sb, map[string]any{"code": "touch running; sleep 100",
			"language": "bash"})
		done <- err
	}()
	require.Eventually(t, func() bool {
		code, _ := onPort(t, base, id, token, "49983", "GET", "/files?path=running", "")
		return code == http.StatusOK
	}, 10*time.Second, 10*time.Millisecond)
	code, _ = call(t, "DELETE", base+"/sandboxes/"+id, "")
	require.Equal(t, http.StatusNoContent, code)
	select {
	case err := <-done:
		assert.Error(t, err, "the connection dropped")
	case <-time.After(10 * time.Second):
		t.Fatal("the cell outlived its sandbox")
	}
}

// A bash context takes a place under its user's cap, as a Python context does, and gives
// it back as it goes.
func TestBashPlaces(t *testing.T) {
	g := session.NewGate(0, 2)
	_, base := gateServer(t, g, Config{})
	code, sb := callAs(t, "ann", "POST", base+"/v2/sandboxes", `{}`)
	require.Equal(t, http.StatusCreated, code, "%v", sb)
	id, token := sb["sandboxID"].(string), sb["envdAccessToken"].(string)
	assert.Equal(t, "/home/user\n", bash(t, base, sb, "pwd").out())
	code, body := onPort(t, base, id, token, "49999", "POST", "/contexts", `{"language": "bash"}`)
	assert.Equal(t, http.StatusTooManyRequests, code, "%v", body)
	code, _ = onPort(t, base, id, token, "49999", "DELETE", "/contexts/"+bashContexts(t, base, sb)[1].ID, "")
	require.Equal(t, http.StatusNoContent, code)
	code, body = onPort(t, base, id, token, "49999", "POST", "/contexts", `{"language": "bash", "cwd": "/tmp"}`)
	assert.Equal(t, http.StatusOK, code, "%v", body)
	code, _ = callAs(t, "ann", "DELETE", base+"/sandboxes/"+id, "")
	require.Equal(t, http.StatusNoContent, code)
	code, sb = callAs(t, "ann", "POST", base+"/v2/sandboxes", `{}`)
	assert.Equal(t, http.StatusCreated, code, "the kill gave every place back: %v", sb)
}
