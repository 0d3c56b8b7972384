package minipy

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/minipy-go/minipy/internal/cpython"
)

// The flag is named for this file's golden files so that it cannot clash with another
// test file's -update in the same test binary.
var updateToolGolden = flag.Bool("update-tool", false, "rewrite the tool golden files in testdata/")

// goldenVersion is the Python version the golden files in testdata/ are written for. Where
// another version's text differs (3.13 puts carets under calls in tracebacks), its own file
// in testdata/<version>/ takes precedence, and a version without one takes the nearest older
// version's (3.14 reads 3.13's), so that every tested version is compared exactly.
const goldenVersion = "3.11"

// checkGolden compares got with testdata/name (or the linked version's own copy), or
// rewrites it with -update-tool: the base file on goldenVersion, elsewhere a version's own
// copy only where its text differs from the base.
func checkGolden(t *testing.T, name, got string) {
	t.Helper()
	base := filepath.Join("testdata", name)
	path := base
	version := cpython.LinkedVersion()
	if version != goldenVersion {
		// This version's own file, else the nearest older version's that has one (a
		// version's text holds until one changes it), else the base's.
		var major, minor, baseMinor int
		fmt.Sscanf(version, "%d.%d", &major, &minor)  //nolint:errcheck // "3.14"
		fmt.Sscanf(goldenVersion, "3.%d", &baseMinor) //nolint:errcheck
		for m := minor; m > baseMinor; m-- {
			own := filepath.Join("testdata", fmt.Sprintf("%d.%d", major, m), name)
			if _, err := os.Stat(own); err == nil || *updateToolGolden && m == minor {
				path = own
				break
			}
		}
	}
	if *updateToolGolden {
		if want, err := os.ReadFile(base); path != base && err == nil && string(want) == got {
			os.Remove(path) //nolint:errcheck // absent already, mostly
			path = base
		} else {
			require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
			require.NoError(t, os.WriteFile(path, []byte(got), 0o644))
		}
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "missing golden file; run go test -run %s -update-tool", t.Name())
	assert.Equal(t, string(want), got, "golden file %s (go test -update-tool rewrites it)", path)
}

// cellNumber matches the file name of a run in tracebacks, "<cell-12>": the number counts
// every run of the process, so it depends on which tests ran before.
var cellNumber = regexp.MustCompile(`<cell-\d+>`)

func TestCallToolGolden(t *testing.T) {
	cases := []struct {
		name    string
		input   string
		opts    *Options
		isError bool
	}{
		{name: "value", input: `{"code": "6 * 7"}`},
		{name: "stdout_and_value", input: `{"code": "for i in range(3):\n    print('line', i)\n{'answer': 42}"}`},
		{name: "stderr", input: `{"code": "import sys\nprint('result')\nprint('careful', file=sys.stderr)"}`},
		{name: "silenced_value", input: `{"code": "x = 1\nx;"}`},
		{name: "python_error", input: `{"code": "print('before')\n1 / 0"}`, isError: true},
		{name: "syntax_error", input: `{"code": "def f(:\n    pass"}`, isError: true},
		{name: "timeout", input: `{"code": "import time\nprint('started')\ntime.sleep(30)", "timeout": "0.3"}`, isError: true},
		{name: "timeout_capped", input: `{"code": "while True:\n    pass", "timeout": 3600}`,
			opts: &Options{Timeout: 300 * time.Millisecond}, isError: true},
		{name: "truncated", input: `{"code": "print('x' * 1000)\nprint('the end')\nlist(range(100))"}`,
			opts: &Options{MaxOutput: 300}},
		{name: "double_encoded", input: `"{\"code\": \"print('hi')\", \"glb\": {}}"`},
		{name: "code_double_encoded", input: `{"code": "\"import math\\nmath.sqrt(16)\"", "timeout": "30s"}`},
		{name: "bad_missing_code", input: `{"source": "print(1)"}`, isError: true},
		{name: "bad_code_type", input: `{"code": ["print(1)"]}`, isError: true},
		{name: "bad_not_object", input: `print(1)`, isError: true},
		{name: "bad_timeout", input: `{"code": "1", "timeout": "soon"}`, isError: true},
		{name: "bad_empty_code", input: `{"code": "  "}`, isError: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			text, isError := CallTool(context.Background(), json.RawMessage(tc.input), tc.opts)
			assert.Equal(t, tc.isError, isError)
			checkGolden(t, filepath.Join("tool", tc.name+".txt"), cellNumber.ReplaceAllString(text, "<cell-N>"))
		})
	}
}

// fakeEngine returns a fixed result and records the options of the run it was asked for.
type fakeEngine struct {
	res  *Result
	err  error
	code string
	opts Options
}

func (f *fakeEngine) run(_ context.Context, code string, opts *Options) (*Result, error) {
	f.code, f.opts = code, *opts
	return f.res, f.err
}

func (f *fakeEngine) do(*Namespace, byte, ...any) (any, error) { return nil, errors.New("unused") }
func (f *fakeEngine) name() string                             { return "a fake engine" }
func (f *fakeEngine) hosts() *hostRegistry                     { return &hostRegistry{} }

// The stops a real interpreter cannot produce on cue: a cancelled context, code that
// ignores the interrupt, and an error that is not Python's.
func TestCallToolGoldenStops(t *testing.T) {
	printed := &Result{Stdout: "working\n"}
	cases := []struct {
		name string
		res  *Result
		err  error
	}{
		{name: "cancelled", res: printed, err: &InterruptedError{Cause: context.Canceled, After: 1500 * time.Millisecond,
			Python: &PythonError{Type: "minipy.TimeoutInterrupt", Message: "stopped",
				Traceback: "Traceback (most recent call last):\n  File \"<cell-N>\", line 2, in <module>\nminipy.TimeoutInterrupt: stopped\n"}}},
		{name: "abandoned", res: printed, err: &InterruptedError{Cause: ErrTimeout, After: 2 * time.Second, Abandoned: true}},
		{name: "host_deadline", res: printed, err: &InterruptedError{Cause: context.DeadlineExceeded, deadline: true, After: 250 * time.Millisecond,
			Python: &PythonError{Type: "minipy.TimeoutInterrupt", Message: "stopped",
				Traceback: "Traceback (most recent call last):\n  File \"<cell-N>\", line 2, in <module>\nminipy.TimeoutInterrupt: stopped\n"}}},
		{name: "never_started", err: &InterruptedError{Cause: ErrTimeout, After: 2 * time.Second}},
		{name: "engine_error", err: fmt.Errorf("minipy: run: %w", ErrNamespaceClosed)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := &fakeEngine{res: tc.res, err: tc.err}
			r := callTool(context.Background(), e, json.RawMessage(`{"code": "work()", "timeout": 2}`), nil)
			assert.True(t, r.IsError)
			checkGolden(t, filepath.Join("tool", tc.name+".txt"), r.Text)
		})
	}
}

// The host's own deadline and cancellation reach a real run and are told apart from the
// tool's timeout.
func TestCallToolHostContext(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	text, isError := CallTool(ctx, json.RawMessage(`{"code": "import time\ntime.sleep(30)"}`), nil)
	assert.True(t, isError)
	assert.Contains(t, text, "[timeout]\nThe run was stopped after 0.3s: the host's deadline for this call passed.\n")
	assert.Contains(t, text, "time.sleep(30)")

	ctx, cancel = context.WithCancel(context.Background())
	cancel()
	text, isError = CallTool(ctx, json.RawMessage(`{"code": "print('never')"}`), nil)
	assert.True(t, isError)
	assert.True(t, strings.HasPrefix(text, "[cancelled]\nThe run was cancelled by the host after "), text)
	assert.NotContains(t, text, "never")
}

func TestCallToolKeepsStateInTheCallersNamespace(t *testing.T) {
	ns := NewNamespace()
	defer ns.Close()
	opts := &Options{Globals: ns}
	text, isError := CallTool(context.Background(), json.RawMessage(`{"code": "x = 41"}`), opts)
	require.False(t, isError, text)
	text, isError = CallTool(context.Background(), json.RawMessage(`{"code": "x + 1"}`), opts)
	require.False(t, isError, text)
	assert.Equal(t, "[value]\n42\n", text)
	v, err := ns.Get("x")
	require.NoError(t, err)
	assert.Equal(t, int64(41), v)

	other := NewNamespace()
	defer other.Close()
	text, isError = CallTool(context.Background(), json.RawMessage(`{"code": "x"}`), &Options{Globals: other})
	assert.True(t, isError)
	assert.Contains(t, text, "NameError: name 'x' is not defined")
}

func TestCallToolRunOptions(t *testing.T) {
	ns := &Namespace{}
	cases := []struct {
		name        string
		input       string
		opts        *Options
		wantTimeout time.Duration
		wantOutput  int
	}{
		{"defaults", `{"code": "1"}`, nil, DefaultToolTimeout, DefaultToolOutput},
		{"model timeout", `{"code": "1", "timeout": 2.5}`, nil, 2500 * time.Millisecond, DefaultToolOutput},
		{"model timeout string", `{"code": "1", "timeout": " 12 "}`, nil, 12 * time.Second, DefaultToolOutput},
		{"model timeout duration", `{"code": "1", "timeout": "2m"}`, nil, 2 * time.Minute, DefaultToolOutput},
		{"model timeout capped", `{"code": "1", "timeout": 1e12}`, nil, MaxToolTimeout, DefaultToolOutput},
		{"zero timeout is the default", `{"code": "1", "timeout": 0}`, nil, DefaultToolTimeout, DefaultToolOutput},
		{"null timeout is the default", `{"code": "1", "timeout": null}`, nil, DefaultToolTimeout, DefaultToolOutput},
		{"caller timeout", `{"code": "1"}`, &Options{Timeout: 5 * time.Second}, 5 * time.Second, DefaultToolOutput},
		{"caller timeout caps the model", `{"code": "1", "timeout": 60}`, &Options{Timeout: 5 * time.Second}, 5 * time.Second, DefaultToolOutput},
		{"model may shorten", `{"code": "1", "timeout": 1}`, &Options{Timeout: 5 * time.Second}, time.Second, DefaultToolOutput},
		{"caller no timeout", `{"code": "1"}`, &Options{Timeout: -1}, -1, DefaultToolOutput},
		{"caller output", `{"code": "1"}`, &Options{MaxOutput: 100}, DefaultToolTimeout, 100},
		{"caller no output cap", `{"code": "1"}`, &Options{MaxOutput: -1}, DefaultToolTimeout, -1},
		{"caller namespace", `{"code": "1"}`, &Options{Globals: ns}, DefaultToolTimeout, DefaultToolOutput},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := &fakeEngine{res: &Result{}}
			r := callTool(context.Background(), e, json.RawMessage(tc.input), tc.opts)
			require.False(t, r.IsError)
			assert.Equal(t, "1", e.code)
			assert.Equal(t, tc.wantTimeout, e.opts.Timeout)
			assert.Equal(t, tc.wantOutput, e.opts.MaxOutput)
			if tc.opts != nil {
				assert.Same(t, tc.opts.Globals, e.opts.Globals)
			}
		})
	}
}

func TestParseToolArguments(t *testing.T) {
	ok := []struct {
		input   string
		code    string
		timeout time.Duration
	}{
		{`{"code": "print(1)"}`, "print(1)", 0},
		{` {"code": "print(1)", "timeout": "7", "glb": {"a": 1}, "loc": null} `, "print(1)", 7 * time.Second},
		{`"{\"code\": \"print(1)\", \"timeout\": 3}"`, "print(1)", 3 * time.Second},
		{`{"code": "\"print(1)\\nprint(2)\""}`, "print(1)\nprint(2)", 0},
		{`{"code": "'single quotes stay'"}`, "'single quotes stay'", 0},
		{`{"code": "\"a\" + \"b\""}`, `"a" + "b"`, 0},
		{`{"code": "1", "timeout": -5}`, "1", 0},
		{`{"code": "1", "timeout": ""}`, "1", 0},
		{`{"code": "1", "timeout": 0.25}`, "1", 250 * time.Millisecond},
	}
	for _, tc := range ok {
		args, err := parseToolArguments(json.RawMessage(tc.input))
		if assert.NoError(t, err, tc.input) {
			assert.Equal(t, tc.code, args.code, tc.input)
			assert.Equal(t, tc.timeout, args.timeout, tc.input)
		}
	}
	for _, input := range []string{``, `null`, `[]`, `42`, `"just code"`, `{}`, `{"code": null}`,
		`{"code": 1}`, `{"code": ""}`, `{"code": "1", "timeout": true}`, `{"code": "1", "timeout": "NaN"}`,
		`{"code": "1", "timeout": {"seconds": 1}}`, `{"code": "1"`} {
		_, err := parseToolArguments(json.RawMessage(input))
		var argErr *argumentError
		assert.ErrorAs(t, err, &argErr, "input %q", input)
	}
}

func TestTruncateText(t *testing.T) {
	assert.Equal(t, "short", truncateText("short", 5, "stdout"))
	assert.Equal(t, "short", truncateText("short", -1, "stdout"))
	got := truncateText(strings.Repeat("é", 50)+strings.Repeat("ü", 50), 10, "stdout")
	assert.Equal(t, "ééééé\n[... 90 characters of stdout omitted ...]\nüüüüü", got)
	assert.True(t, utf8.ValidString(got))

	// A short error keeps its whole traceback however long the output was.
	text := renderRun(&Result{Stdout: strings.Repeat("o", 1000)}, &PythonError{Traceback: strings.Repeat("e", 50)}, toolRun{}, 200)
	assert.Equal(t, "[stdout]\n"+strings.Repeat("o", 75)+"\n[... 850 characters of stdout omitted ...]\n"+strings.Repeat("o", 75)+
		"\n[error]\n"+strings.Repeat("e", 50)+"\n", text)

	text, isError := CallTool(context.Background(), json.RawMessage(`{"code": "print('y' * 10**6)"}`), nil)
	assert.False(t, isError)
	assert.LessOrEqual(t, utf8.RuneCountInString(text), DefaultToolOutput+100)
	assert.Contains(t, text, fmt.Sprintf("[... %d characters of stdout omitted ...]", 1_000_001-DefaultToolOutput))
}

// ToolResult.Err and Duration tell the host what happened, for its logs and metrics, on
// both engines.
func TestToolResultErr(t *testing.T) {
	iso, err := NewIsolated(IsolatedConfig{})
	require.NoError(t, err)
	defer iso.Close()
	for _, eng := range []Engine{InProcess(), iso} {
		ok := eng.CallToolResult(context.Background(), json.RawMessage(`{"code": "1 + 1"}`), nil)
		assert.NoError(t, ok.Err)
		assert.Positive(t, ok.Duration)

		bad := eng.CallToolResult(context.Background(), json.RawMessage(`{"cod": "1"}`), nil)
		assert.True(t, bad.IsError)
		assert.ErrorIs(t, bad.Err, ErrBadArguments)
		assert.Zero(t, bad.Duration, "nothing ran")

		raised := eng.CallToolResult(context.Background(), json.RawMessage(`{"code": "1/0"}`), nil)
		var py *PythonError
		require.ErrorAs(t, raised.Err, &py)
		assert.Equal(t, "ZeroDivisionError", py.Type)

		slow := eng.CallToolResult(context.Background(), json.RawMessage(`{"code": "import time; time.sleep(5)", "timeout": 0.2}`), nil)
		assert.ErrorIs(t, slow.Err, ErrTimeout)
	}
}
