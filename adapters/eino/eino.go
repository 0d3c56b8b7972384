// Package eino offers minipy as a tool of github.com/cloudwego/eino, for its ToolsNode
// and the agents that run one, such as its react agent.
//
// New returns a tool.InvokableTool: its Info is minipy's tool schema (the name "minipy",
// the description for the engine and options, the JSON Schema of {"code", "timeout"}),
// and InvokableRun runs the model's arguments and returns the text minipy's CallTool
// renders: labelled sections ([stdout], [stderr], [value], [error], [timeout]) within the
// output budget of the options. A Python error, a timeout or unusable arguments are part
// of that text, not a Go error, so that the agent's loop carries on and the model reads
// them; an error from InvokableRun would end the graph's run.
//
// NewEnhanced returns a tool.EnhancedInvokableTool instead: its result is the same text
// followed by one image part per image the code showed (matplotlib figures, display() of a
// picture), in order, base64 with its MIME type; the text names the Nth as
// "[image N: PNG 640x480, 23 KB]". ToolsNode puts them in the tool message's
// UserInputMultiContent. Offer it only with a ChatModel that sends such tool messages to
// its API: eino-ext's OpenAI model (v0.1.7) refuses a tool message with multimodal
// content, so use New with it.
//
// Options go to the engine as minipy.Options; WithOptions replaces them for one call (a
// shared agent serving many conversations passes each one's namespace with
// react.WithToolOptions, or compose.WithToolOption to a ToolsNode).
package eino

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/cloudwego/eino/components/tool"
	"github.com/cloudwego/eino/schema"
	"github.com/eino-contrib/jsonschema"

	"github.com/minipy-go/minipy"
)

// ErrSchema is the error of Info when minipy's input schema could not be converted to
// eino's JSON Schema type.
var ErrSchema = errors.New("minipy/eino: the tool's input schema could not be converted")

// Tool is minipy as an eino tool.InvokableTool. Its methods are safe for concurrent use;
// runs in one namespace take turns.
type Tool struct{ base }

// EnhancedTool is minipy as an eino tool.EnhancedInvokableTool, whose results carry the
// images the code showed.
type EnhancedTool struct{ base }

var (
	_ tool.InvokableTool         = (*Tool)(nil)
	_ tool.EnhancedInvokableTool = (*EnhancedTool)(nil)
)

// New returns the tool running code on eng with opts: opts.Globals is the conversation's
// namespace (nil: the engine's default one), and its Timeout and MaxOutput bound each
// call as they bound minipy's CallTool (see minipy.ToolSchemaFor).
func New(eng minipy.Engine, opts *minipy.Options) *Tool {
	return &Tool{base{eng: eng, opts: opts}}
}

// NewEnhanced is New for a tool whose results carry the images the code showed.
func NewEnhanced(eng minipy.Engine, opts *minipy.Options) *EnhancedTool {
	return &EnhancedTool{base{eng: eng, opts: opts}}
}

// InvokableRun runs the model's arguments, a JSON object as the schema defines it, and
// returns the text the model reads. Its error is always nil (see the package doc); the
// images the code showed are named in the text but not sent (see NewEnhanced).
func (t *Tool) InvokableRun(ctx context.Context, argumentsInJSON string, opts ...tool.Option) (string, error) {
	return t.call(ctx, argumentsInJSON, opts).Text, nil
}

// InvokableRun runs the model's arguments, a JSON object as the schema defines it, and
// returns the text the model reads, then the images the code showed. Its error is always
// nil (see the package doc).
func (t *EnhancedTool) InvokableRun(ctx context.Context, arg *schema.ToolArgument, opts ...tool.Option) (*schema.ToolResult, error) {
	var args string
	if arg != nil {
		args = arg.Text
	}
	r := t.call(ctx, args, opts)
	parts := make([]schema.ToolOutputPart, 0, 1+len(r.Images))
	parts = append(parts, schema.ToolOutputPart{Type: schema.ToolPartTypeText, Text: r.Text})
	for _, img := range r.Images {
		data := base64.StdEncoding.EncodeToString(img.Data)
		parts = append(parts, schema.ToolOutputPart{Type: schema.ToolPartTypeImage, Image: &schema.ToolOutputImage{
			MessagePartCommon: schema.MessagePartCommon{Base64Data: &data, MIMEType: img.MIMEType},
		}})
	}
	return &schema.ToolResult{Parts: parts}, nil
}

// WithOptions makes one call run with opts instead of the options the tool was made with
// (its namespace, timeout and output budget; nil: minipy's defaults). The tool's Info
// still describes the tool's own options.
func WithOptions(opts *minipy.Options) tool.Option {
	return tool.WrapImplSpecificOptFn(func(o *callOptions) { o.opts = opts })
}

// callOptions are the implementation-specific options of a call.
type callOptions struct{ opts *minipy.Options }

// base is what both tools share: the engine and the options.
type base struct {
	eng  minipy.Engine
	opts *minipy.Options
}

// Info describes the tool to the model: minipy's tool schema for the engine and options
// (the Python version, the importable libraries, the limits, the host functions of the
// namespace at the time of the call).
func (b *base) Info(context.Context) (*schema.ToolInfo, error) {
	t := b.eng.ToolSchemaFor(b.opts)
	raw, err := json.Marshal(t.InputSchema.Map())
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSchema, err)
	}
	params := new(jsonschema.Schema)
	if err := json.Unmarshal(raw, params); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSchema, err)
	}
	return &schema.ToolInfo{Name: t.Name, Desc: t.Description, ParamsOneOf: schema.NewParamsOneOfByJSONSchema(params)}, nil
}

// call runs the model's arguments with the call's options.
func (b *base) call(ctx context.Context, args string, opts []tool.Option) minipy.ToolResult {
	o := tool.GetImplSpecificOptions(&callOptions{opts: b.opts}, opts...)
	return b.eng.CallToolResult(ctx, json.RawMessage(args), o.opts)
}
