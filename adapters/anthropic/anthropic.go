// Package anthropic offers minipy as a tool of github.com/anthropics/anthropic-sdk-go/v2:
// an anthropic.BetaTool, the interface the SDK's BetaToolRunner
// (client.Beta.Messages.NewToolRunner, NewToolRunnerStreaming, a thread's NewToolRunner)
// runs.
//
// Its name, description and input schema are minipy's tool schema for the engine and
// options. Execute runs the model's arguments and returns the text minipy's CallTool
// renders (labelled sections: [stdout], [stderr], [value], ...) as a text block, then one
// base64 image block per image the code showed (matplotlib figures, display() of a
// picture), in order; the text names the Nth as "[image N: PNG 640x480, 23 KB]".
//
// When the call failed (a Python error, a timeout, arguments the tool cannot use),
// Execute returns a *ToolError instead, whose message is that same text: the runner sends
// it as the tool_result with is_error set (after its "Error: " prefix), so the model
// reads the traceback and can recover. The runner sends no images with an error result.
//
// This package's name is the SDK's: import one of the two under another name, such as
// minipyanthropic.
package anthropic

import (
	"context"
	"encoding/base64"
	"encoding/json"

	"github.com/anthropics/anthropic-sdk-go/v2"

	"github.com/minipy-go/minipy"
)

// Tool is minipy as an anthropic.BetaTool. Its methods are safe for concurrent use; runs
// in one namespace take turns.
type Tool struct {
	eng  minipy.Engine
	opts *minipy.Options
}

var _ anthropic.BetaTool = (*Tool)(nil)

// New returns the tool running code on eng with opts: opts.Globals is the conversation's
// namespace (nil: the engine's default one), and its Timeout and MaxOutput bound each
// call as they bound minipy's CallTool (see minipy.ToolSchemaFor).
func New(eng minipy.Engine, opts *minipy.Options) *Tool {
	return &Tool{eng: eng, opts: opts}
}

// Name is minipy's tool name, "minipy".
func (t *Tool) Name() string { return minipy.ToolName }

// Description is the description of minipy's tool schema for t's engine and options: the
// Python version, the importable libraries, the limits, and the host functions of the
// namespace at the time of the call.
func (t *Tool) Description() string { return t.eng.ToolSchemaFor(t.opts).Description }

// InputSchema is the JSON Schema of the tool's arguments: {"code": string, "timeout":
// number of seconds}, code required.
func (t *Tool) InputSchema() anthropic.BetaToolInputSchemaParam {
	s := t.eng.ToolSchemaFor(t.opts).InputSchema
	return anthropic.BetaToolInputSchemaParam{Properties: s.Properties, Required: s.Required}
}

// Execute runs the model's arguments, a JSON object as InputSchema defines it. It returns
// the text the model reads, then the images the code showed; or, when the call failed, a
// *ToolError with that text.
func (t *Tool) Execute(ctx context.Context, input json.RawMessage) ([]anthropic.BetaToolResultBlockParamContentUnion, error) {
	r := t.eng.CallToolResult(ctx, input, t.opts)
	if r.IsError {
		return nil, &ToolError{Result: r}
	}
	return Content(r), nil
}

// Content is a tool result's content as the Messages API takes it: a text block, then an
// image block per image, in order. It is what Execute returns, for hosts that answer
// tool_use blocks in a loop of their own.
func Content(r minipy.ToolResult) []anthropic.BetaToolResultBlockParamContentUnion {
	content := make([]anthropic.BetaToolResultBlockParamContentUnion, 0, 1+len(r.Images))
	content = append(content, anthropic.BetaToolResultBlockParamContentUnion{OfText: &anthropic.BetaTextBlockParam{Text: r.Text}})
	for _, img := range r.Images {
		content = append(content, anthropic.BetaToolResultBlockParamContentUnion{OfImage: &anthropic.BetaImageBlockParam{
			Source: anthropic.BetaImageBlockParamSourceUnion{OfBase64: &anthropic.BetaBase64ImageSourceParam{
				Data:      base64.StdEncoding.EncodeToString(img.Data),
				MediaType: anthropic.BetaBase64ImageSourceMediaType(img.MIMEType),
			}},
		}})
	}
	return content
}

// ToolError is Execute's error for a call that failed: Result is the whole tool result,
// and its message is the text the model reads. It unwraps to the run's error, so
// errors.Is(err, minipy.ErrTimeout), errors.As(err, &pythonError) and
// errors.Is(err, minipy.ErrBadArguments) tell what happened.
type ToolError struct {
	Result minipy.ToolResult
}

func (e *ToolError) Error() string { return e.Result.Text }

func (e *ToolError) Unwrap() error { return e.Result.Err }
