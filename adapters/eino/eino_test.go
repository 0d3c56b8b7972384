package eino_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"image/png"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	einoopenai "github.com/cloudwego/eino-ext/components/model/openai"
	"github.com/cloudwego/eino/components/model"
	"github.com/cloudwego/eino/components/tool"
	"github.com/cloudwego/eino/compose"
	"github.com/cloudwego/eino/flow/agent/react"
	"github.com/cloudwego/eino/schema"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/minipy-go/minipy"
	"github.com/minipy-go/minipy/adapters/eino"
	"github.com/minipy-go/minipy/adapters/internal/scripted"
)

// plotCode draws a figure; the tool's text names it "[image 1: PNG WxH, N KB]".
const plotCode = "import matplotlib.pyplot as plt\nimport numpy as np\nx = np.linspace(0, 6, 50)\nplt.plot(x, np.sin(x))\nplt.title('sin')\nprint('plotted')"

var imageMarker = regexp.MustCompile(`\[image 1: PNG (\d+)x(\d+), \d+ KB\]`)

// toolMessage returns the content of the request's last message, checking that it is the
// tool message answering callID. Like every check in a step, which runs on the server's
// goroutine, it asserts and goes on.
func toolMessage(t *testing.T, req map[string]any, callID string) string {
	t.Helper()
	assert.Equal(t, "tool", scripted.Get(req, "messages", -1, "role"))
	assert.Equal(t, callID, scripted.Get(req, "messages", -1, "tool_call_id"))
	content, ok := scripted.Get(req, "messages", -1, "content").(string)
	assert.True(t, ok, "the tool message's content is text")
	return content
}

// call is a Chat Completions reply that calls minipy with arguments.
func call(id, arguments string) any {
	return scripted.Completion("chatcmpl-"+id, "tool_calls", map[string]any{"content": "", "tool_calls": []any{
		scripted.FunctionCall(id, minipy.ToolName, arguments),
	}})
}

// eino's react agent, with eino-ext's OpenAI ChatModel, runs the model's code through
// its ToolsNode and sends the text back in the tool message.
func TestReactAgentRunsTheModelsCode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	eng := minipy.InProcess()
	ns := eng.NewNamespace()
	defer ns.Close()
	opts := &minipy.Options{Globals: ns, Timeout: 20 * time.Second}

	const answer = "12!/7 is 68428800; the plot is drawn."
	wantParams, err := json.Marshal(eng.ToolSchemaFor(opts).InputSchema.Map())
	require.NoError(t, err)
	plotArgs, err := json.Marshal(map[string]any{"code": plotCode, "timeout": 30})
	require.NoError(t, err)
	url := scripted.Serve(t, "/chat/completions",
		func(t *testing.T, req map[string]any) any {
			want := eng.ToolSchemaFor(opts)
			assert.Equal(t, want.Name, scripted.Get(req, "tools", 0, "function", "name"))
			assert.Equal(t, want.Description, scripted.Get(req, "tools", 0, "function", "description"))
			gotParams, err := json.Marshal(scripted.Get(req, "tools", 0, "function", "parameters"))
			assert.NoError(t, err)
			assert.JSONEq(t, string(wantParams), string(gotParams))
			return call("call_1", `{"code": "import math\nn = math.factorial(12)\nprint('12! =', n)\nn / 7"}`)
		},
		func(t *testing.T, req map[string]any) any {
			assert.Equal(t, "[stdout]\n12! = 479001600\n[value]\n68428800.0\n", toolMessage(t, req, "call_1"))
			return call("call_2", string(plotArgs))
		},
		func(t *testing.T, req map[string]any) any {
			text := toolMessage(t, req, "call_2")
			assert.Regexp(t, `^\[stdout\]\nplotted\n\[image 1: PNG \d+x\d+, \d+ KB\]\n$`, text, "the text names the plot")
			return call("call_3", `{"code": "n / 0"}`)
		},
		func(t *testing.T, req map[string]any) any {
			text := toolMessage(t, req, "call_3")
			assert.Contains(t, text, "[error]\nTraceback (most recent call last):\n")
			assert.Contains(t, text, "ZeroDivisionError: division by zero\n")
			return scripted.Completion("chatcmpl-4", "stop", map[string]any{"content": answer})
		},
	)
	cm, err := einoopenai.NewChatModel(ctx, &einoopenai.ChatModelConfig{BaseURL: url, APIKey: "test-key", Model: "gpt-test"})
	require.NoError(t, err)
	agent, err := react.NewAgent(ctx, &react.AgentConfig{
		ToolCallingModel: cm,
		ToolsConfig:      compose.ToolsNodeConfig{Tools: []tool.BaseTool{eino.New(eng, opts)}},
		MaxStep:          12,
	})
	require.NoError(t, err)
	msg, err := agent.Generate(ctx, []*schema.Message{schema.UserMessage("What is 12!/7? Then plot sin.")})
	require.NoError(t, err)
	assert.Equal(t, answer, msg.Content)
}

// scriptedModel is a model.ToolCallingChatModel that answers from a script and records
// what it was sent and the tools it was given. eino-ext's chat models do not send a tool
// message's images to their APIs, so the enhanced tool's test puts the model in-process;
// eino's react agent and ToolsNode still drive the tool.
type scriptedModel struct {
	mu      sync.Mutex
	replies []*schema.Message
	inputs  [][]*schema.Message
	tools   []*schema.ToolInfo
}

// errScriptEnded is the error of a request after the last reply.
var errScriptEnded = errors.New("a request after the last step of the script")

func (m *scriptedModel) Generate(_ context.Context, input []*schema.Message, _ ...model.Option) (*schema.Message, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.inputs) == len(m.replies) {
		return nil, errScriptEnded
	}
	m.inputs = append(m.inputs, input)
	return m.replies[len(m.inputs)-1], nil
}

func (m *scriptedModel) Stream(ctx context.Context, input []*schema.Message, opts ...model.Option) (*schema.StreamReader[*schema.Message], error) {
	msg, err := m.Generate(ctx, input, opts...)
	if err != nil {
		return nil, err
	}
	return schema.StreamReaderFromArray([]*schema.Message{msg}), nil
}

func (m *scriptedModel) WithTools(tools []*schema.ToolInfo) (model.ToolCallingChatModel, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.tools = tools
	return m, nil
}

// The enhanced tool sends the plot as an image part of the tool message, after the text
// that names it, in eino's react agent loop.
func TestReactAgentGetsThePlot(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	eng := minipy.InProcess()
	ns := eng.NewNamespace()
	defer ns.Close()

	args, err := json.Marshal(map[string]any{"code": plotCode})
	require.NoError(t, err)
	const answer = "The plot shows one period of sin."
	m := &scriptedModel{replies: []*schema.Message{
		schema.AssistantMessage("", []schema.ToolCall{{ID: "call_1", Type: "function",
			Function: schema.FunctionCall{Name: minipy.ToolName, Arguments: string(args)}}}),
		schema.AssistantMessage(answer, nil),
	}}
	agent, err := react.NewAgent(ctx, &react.AgentConfig{
		ToolCallingModel: m,
		ToolsConfig:      compose.ToolsNodeConfig{Tools: []tool.BaseTool{eino.NewEnhanced(eng, &minipy.Options{Globals: ns})}},
		MaxStep:          6,
	})
	require.NoError(t, err)
	msg, err := agent.Generate(ctx, []*schema.Message{schema.UserMessage("Plot sin.")})
	require.NoError(t, err)
	assert.Equal(t, answer, msg.Content)

	require.Len(t, m.tools, 1)
	assert.Equal(t, minipy.ToolName, m.tools[0].Name)
	require.Len(t, m.inputs, 2)
	last := m.inputs[1][len(m.inputs[1])-1]
	assert.Equal(t, schema.Tool, last.Role)
	assert.Equal(t, "call_1", last.ToolCallID)
	parts := last.UserInputMultiContent
	require.Len(t, parts, 2, "the text, then the plot")
	assert.Equal(t, schema.ChatMessagePartTypeText, parts[0].Type)
	marker := imageMarker.FindStringSubmatch(parts[0].Text)
	require.NotNil(t, marker, "the text names the plot: %q", parts[0].Text)
	assert.Equal(t, "[stdout]\nplotted\n"+marker[0]+"\n", parts[0].Text)

	assert.Equal(t, schema.ChatMessagePartTypeImageURL, parts[1].Type)
	require.NotNil(t, parts[1].Image)
	assert.Equal(t, "image/png", parts[1].Image.MIMEType)
	require.NotNil(t, parts[1].Image.Base64Data)
	data, err := base64.StdEncoding.DecodeString(*parts[1].Image.Base64Data)
	require.NoError(t, err)
	cfg, err := png.DecodeConfig(bytes.NewReader(data))
	require.NoError(t, err, "the image part is a PNG")
	assert.Equal(t, marker[1], strconv.Itoa(cfg.Width))
	assert.Equal(t, marker[2], strconv.Itoa(cfg.Height))
}

// WithOptions runs one call in another namespace, as a shared agent serving many
// conversations does, through the ToolsNode's options.
func TestWithOptions(t *testing.T) {
	ctx := context.Background()
	eng := minipy.InProcess()
	a, b := eng.NewNamespace(), eng.NewNamespace()
	defer a.Close()
	defer b.Close()
	require.NoError(t, b.Set("who", "b"))
	node, err := compose.NewToolNode(ctx, &compose.ToolsNodeConfig{Tools: []tool.BaseTool{eino.New(eng, &minipy.Options{Globals: a})}})
	require.NoError(t, err)
	callWho := schema.AssistantMessage("", []schema.ToolCall{{ID: "call_1", Type: "function",
		Function: schema.FunctionCall{Name: minipy.ToolName, Arguments: `{"code": "globals().get('who', 'nobody')"}`}}})

	out, err := node.Invoke(ctx, callWho)
	require.NoError(t, err)
	require.Len(t, out, 1)
	assert.Equal(t, "[value]\n'nobody'\n", out[0].Content)
	out, err = node.Invoke(ctx, callWho, compose.WithToolOption(eino.WithOptions(&minipy.Options{Globals: b})))
	require.NoError(t, err)
	require.Len(t, out, 1)
	assert.Equal(t, "[value]\n'b'\n", out[0].Content)
}

// Failures are text for the model, never an error that would end the graph's run.
func TestFailuresAreText(t *testing.T) {
	ctx := context.Background()
	eng := minipy.InProcess()
	ns := eng.NewNamespace()
	defer ns.Close()
	plain := eino.New(eng, &minipy.Options{Globals: ns})
	enhanced := eino.NewEnhanced(eng, &minipy.Options{Globals: ns})
	for _, tc := range []struct{ name, args, want string }{
		{"bad arguments", `{"source": "1"}`, "[bad arguments]\n"},
		{"not JSON", `print(1)`, "[bad arguments]\n"},
		{"python error", `{"code": "raise ValueError('no')"}`, "ValueError: no\n"},
		{"timeout", `{"code": "import time\ntime.sleep(30)", "timeout": 0.2}`, "[timeout]\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := plain.InvokableRun(ctx, tc.args)
			require.NoError(t, err)
			assert.Contains(t, out, tc.want)
			res, err := enhanced.InvokableRun(ctx, &schema.ToolArgument{Text: tc.args})
			require.NoError(t, err)
			require.Len(t, res.Parts, 1)
			assert.Contains(t, res.Parts[0].Text, tc.want)
		})
	}
	res, err := enhanced.InvokableRun(ctx, nil)
	require.NoError(t, err)
	require.Len(t, res.Parts, 1)
	assert.Contains(t, res.Parts[0].Text, "[bad arguments]\n")
}
