// Package langchaingo offers minipy as a tool of github.com/tmc/langchaingo: a
// tools.Tool that an agent (agents.NewOpenAIFunctionsAgent, agents.NewOneShotAgent, ...)
// and its agents.Executor call with Python code.
//
// A langchaingo tool takes one string and returns one string. The input may be the
// code itself, which is what langchaingo's agents pass (the OpenAI functions agent
// offers every tool a single "__arg1" string and hands over its value; the ReAct agent
// passes what follows "Action Input:", taken out of its Markdown code fence if it is in
// one), or a JSON object with the arguments of minipy's schema, {"code": "...",
// "timeout": 30}, which a model that was shown that schema sends. The output is the text minipy's CallTool
// renders: labelled sections ([stdout], [stderr], [value], [error], [timeout]) within the
// output budget of the options. A Python error, a timeout or unusable arguments are
// part of that text, not a Go error, so that the agent reads them and carries on.
//
// langchaingo's tools return text only: an image the code showed (a matplotlib plot,
// display() of a picture) is named in the text as "[image N: PNG 640x480, 23 KB]" but
// not sent. Use CallResult, or another adapter, where the model should see it.
package langchaingo

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"

	"github.com/tmc/langchaingo/tools"

	"github.com/minipy-go/minipy"
)

// Tool is minipy as a langchaingo tools.Tool. Its methods are safe for concurrent use;
// runs in one namespace take turns.
type Tool struct {
	eng  minipy.Engine
	opts *minipy.Options
}

var _ tools.Tool = (*Tool)(nil)

// New returns the tool running code on eng with opts: opts.Globals is the conversation's
// namespace (nil: the engine's default one), and its Timeout and MaxOutput bound each
// call as they bound minipy's CallTool (see minipy.ToolSchemaFor).
func New(eng minipy.Engine, opts *minipy.Options) *Tool {
	return &Tool{eng: eng, opts: opts}
}

// Name is minipy's tool name, "minipy".
func (t *Tool) Name() string { return minipy.ToolName }

// Description is the description of minipy's tool schema for t's engine and options
// (the Python version, the importable libraries, the limits, the host functions of the
// namespace), followed by what to pass as the input.
func (t *Tool) Description() string {
	return t.eng.ToolSchemaFor(t.opts).Description +
		"\n- The input is the Python code to run (or a JSON object {\"code\": \"...\", \"timeout\": seconds})."
}

// Call runs input, the code or a JSON object of the tool's arguments, and returns the text
// the model reads. Its error is always nil: failures are in the text (see the package
// doc); CallResult has the run's error and images.
func (t *Tool) Call(ctx context.Context, input string) (string, error) {
	return t.CallResult(ctx, input).Text, nil
}

// CallResult is Call that returns the whole minipy.ToolResult: the text, the images the
// code showed, whether it failed and the run's error.
func (t *Tool) CallResult(ctx context.Context, input string) minipy.ToolResult {
	return t.eng.CallToolResult(ctx, arguments(input), t.opts)
}

// arguments turns a langchaingo tool input into minipy's tool arguments: a JSON object
// with a "code" member (the arguments as minipy's schema has them) is passed as it is;
// anything else is the code itself, out of its Markdown code fence if it is in one (as
// models write code after a ReAct agent's "Action Input:"). Python source that happens to
// be such an object, a dict literal with a "code" key and nothing else to run, is taken
// as arguments.
func arguments(input string) json.RawMessage {
	if isArguments(input) {
		return json.RawMessage(input)
	}
	args, _ := json.Marshal(map[string]string{"code": unfence(input)}) // a string map always marshals
	return args
}

// unfence returns the code inside a Markdown code fence that is the whole of input
// ("```python\n...\n```"), or input when it is not one.
func unfence(input string) string {
	t := strings.TrimSpace(input)
	if !strings.HasPrefix(t, "```") || !strings.HasSuffix(t, "```") {
		return input
	}
	first := strings.IndexByte(t, '\n')
	last := strings.LastIndex(t, "```")
	if first < 0 || last <= first || strings.Contains(t[3:first], "`") { // an info string has no backtick
		return input
	}
	return t[first+1 : last]
}

// isArguments reports whether input is a JSON object with a "code" member.
func isArguments(input string) bool {
	raw := bytes.TrimSpace([]byte(input))
	if len(raw) == 0 || raw[0] != '{' || !strings.HasSuffix(string(raw), "}") {
		return false
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return false
	}
	_, ok := fields["code"]
	return ok
}
