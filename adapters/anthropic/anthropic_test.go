package anthropic_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"image/png"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/minipy-go/minipy"
	minipyanthropic "github.com/minipy-go/minipy/adapters/anthropic"
	"github.com/minipy-go/minipy/adapters/internal/scripted"
)

// plotCode draws a figure; the tool's text names it "[image 1: PNG WxH, N KB]".
const plotCode = "import matplotlib.pyplot as plt\nimport numpy as np\nx = np.linspace(0, 6, 50)\nplt.plot(x, np.sin(x))\nplt.title('sin')\nprint('plotted')"

var imageMarker = regexp.MustCompile(`\[image 1: PNG (\d+)x(\d+), \d+ KB\]`)

// checkPlot checks that text is the plot cell's output naming one PNG image and that
// encoded is that PNG, in base64.
func checkPlot(t *testing.T, text, encoded string) {
	t.Helper()
	marker := imageMarker.FindStringSubmatch(text)
	if !assert.NotNil(t, marker, "the text names the plot: %q", text) {
		return
	}
	assert.Equal(t, "[stdout]\nplotted\n"+marker[0]+"\n", text)
	data, err := base64.StdEncoding.DecodeString(encoded)
	assert.NoError(t, err)
	cfg, err := png.DecodeConfig(bytes.NewReader(data))
	if assert.NoError(t, err, "the image is a PNG") {
		assert.Equal(t, marker[1], strconv.Itoa(cfg.Width))
		assert.Equal(t, marker[2], strconv.Itoa(cfg.Height))
	}
}

// toolUse is a Messages API reply that calls minipy with input.
func toolUse(msgID, id string, input map[string]any) any {
	return scripted.AnthropicMessage(msgID, "tool_use",
		map[string]any{"type": "text", "text": "Let me run that."},
		map[string]any{"type": "tool_use", "id": id, "name": minipy.ToolName, "input": input})
}

// toolResult returns the tool_result block of the request's last message, checking that
// it answers id. Like every check in a step, which runs on the server's goroutine, it
// asserts and goes on.
func toolResult(t *testing.T, req map[string]any, id string) map[string]any {
	t.Helper()
	assert.Equal(t, "user", scripted.Get(req, "messages", -1, "role"))
	block, _ := scripted.Get(req, "messages", -1, "content", 0).(map[string]any)
	assert.NotNil(t, block, "the last message has a content block")
	assert.Equal(t, "tool_result", block["type"])
	assert.Equal(t, id, block["tool_use_id"])
	return block
}

// The SDK's BetaToolRunner, against a scripted Messages API, runs the model's code in the
// tool and sends back the text, the plot as an image block, and a Python error as an
// error result; in-process and in the isolated engine's sandboxed workers alike.
func TestBetaToolRunnerRunsTheModelsCode(t *testing.T) {
	t.Run("in-process", func(t *testing.T) { runnerLoop(t, minipy.InProcess()) })
	t.Run("isolated", func(t *testing.T) {
		eng, err := minipy.NewIsolated(minipy.IsolatedConfig{})
		require.NoError(t, err)
		defer eng.Close()
		runnerLoop(t, eng)
	})
}

func runnerLoop(t *testing.T, eng minipy.Engine) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ns := eng.NewNamespace()
	defer ns.Close()
	opts := &minipy.Options{Globals: ns, Timeout: 20 * time.Second}

	const answer = "12!/7 is 68428800, and the plot shows one period of sin."
	want := eng.ToolSchemaFor(opts)
	wantSchema, err := json.Marshal(want.InputSchema)
	require.NoError(t, err)
	url := scripted.Serve(t, "/v1/messages",
		func(t *testing.T, req map[string]any) any {
			assert.Equal(t, want.Name, scripted.Get(req, "tools", 0, "name"))
			assert.Equal(t, want.Description, scripted.Get(req, "tools", 0, "description"))
			gotSchema, err := json.Marshal(scripted.Get(req, "tools", 0, "input_schema"))
			assert.NoError(t, err)
			assert.JSONEq(t, string(wantSchema), string(gotSchema))
			return toolUse("msg_1", "toolu_1", map[string]any{"code": "import math\nn = math.factorial(12)\nprint('12! =', n)\nn / 7"})
		},
		func(t *testing.T, req map[string]any) any {
			result := toolResult(t, req, "toolu_1")
			assert.Nil(t, result["is_error"])
			assert.Equal(t, []any{map[string]any{"type": "text", "text": "[stdout]\n12! = 479001600\n[value]\n68428800.0\n"}}, result["content"])
			return toolUse("msg_2", "toolu_2", map[string]any{"code": plotCode, "timeout": 30})
		},
		func(t *testing.T, req map[string]any) any {
			result := toolResult(t, req, "toolu_2")
			assert.Nil(t, result["is_error"])
			text, _ := scripted.Get(result, "content", 0, "text").(string)
			content, _ := result["content"].([]any)
			assert.Len(t, content, 2, "the text, then the plot")
			assert.Equal(t, "image", scripted.Get(content, 1, "type"))
			assert.Equal(t, "base64", scripted.Get(content, 1, "source", "type"))
			assert.Equal(t, "image/png", scripted.Get(content, 1, "source", "media_type"))
			encoded, _ := scripted.Get(content, 1, "source", "data").(string)
			checkPlot(t, text, encoded)
			return toolUse("msg_3", "toolu_3", map[string]any{"code": "n / 0"})
		},
		func(t *testing.T, req map[string]any) any {
			result := toolResult(t, req, "toolu_3")
			assert.Equal(t, true, result["is_error"])
			text, _ := scripted.Get(result, "content", 0, "text").(string)
			assert.Contains(t, text, "[error]\nTraceback (most recent call last):\n")
			assert.Contains(t, text, "ZeroDivisionError: division by zero\n")
			return scripted.AnthropicMessage("msg_4", "end_turn", map[string]any{"type": "text", "text": answer})
		},
	)
	client := anthropic.NewClient(option.WithBaseURL(url), option.WithAPIKey("test-key"), option.WithMaxRetries(0))
	runner := client.Beta.Messages.NewToolRunner([]anthropic.BetaTool{minipyanthropic.New(eng, opts)}, anthropic.BetaToolRunnerParams{
		BetaMessageNewParams: anthropic.BetaMessageNewParams{
			Model:     "claude-test",
			MaxTokens: 1024,
			Messages:  []anthropic.BetaMessageParam{anthropic.NewBetaUserMessage(anthropic.NewBetaTextBlock("What is 12!/7? Then plot sin."))},
		},
		MaxIterations: 6,
	})
	msg, err := runner.RunToCompletion(ctx)
	require.NoError(t, err)
	require.NotEmpty(t, msg.Content)
	assert.Equal(t, answer, msg.Content[0].Text)
	assert.Equal(t, 4, runner.IterationCount())
}

func TestExecuteErrors(t *testing.T) {
	ctx := context.Background()
	eng := minipy.InProcess()
	ns := eng.NewNamespace()
	defer ns.Close()
	tool := minipyanthropic.New(eng, &minipy.Options{Globals: ns})

	t.Run("bad arguments", func(t *testing.T) {
		content, err := tool.Execute(ctx, json.RawMessage(`{"source": "1"}`))
		assert.Nil(t, content)
		var toolErr *minipyanthropic.ToolError
		require.ErrorAs(t, err, &toolErr)
		assert.True(t, toolErr.Result.IsError)
		assert.Contains(t, err.Error(), "[bad arguments]\n")
		assert.ErrorIs(t, err, minipy.ErrBadArguments)
	})
	t.Run("timeout", func(t *testing.T) {
		_, err := tool.Execute(ctx, json.RawMessage(`{"code": "print('started')\nimport time\ntime.sleep(30)", "timeout": 0.2}`))
		assert.ErrorIs(t, err, minipy.ErrTimeout)
		var toolErr *minipyanthropic.ToolError
		require.ErrorAs(t, err, &toolErr)
		assert.Equal(t, toolErr.Result.Text, err.Error())
		assert.Contains(t, err.Error(), "[stdout]\nstarted\n")
		assert.Contains(t, err.Error(), "[timeout]\n")
	})
	t.Run("python error", func(t *testing.T) {
		_, err := tool.Execute(ctx, json.RawMessage(`{"code": "raise KeyError('k')"}`))
		var pyErr *minipy.PythonError
		require.ErrorAs(t, err, &pyErr)
		assert.Equal(t, "KeyError", pyErr.Type)
	})
}

// Content is Execute's blocks for a host's own loop: the text, then each image.
func TestContent(t *testing.T) {
	r := minipy.ToolResult{Text: "[stdout]\n[image 1: PNG 1x1, 1 KB]\n", Images: []minipy.Image{{MIMEType: "image/png", Data: []byte("png")}}}
	content := minipyanthropic.Content(r)
	require.Len(t, content, 2)
	assert.Equal(t, r.Text, content[0].OfText.Text)
	require.NotNil(t, content[1].OfImage)
	assert.Equal(t, base64.StdEncoding.EncodeToString([]byte("png")), content[1].OfImage.Source.OfBase64.Data)
	assert.Equal(t, anthropic.BetaBase64ImageSourceMediaTypeImagePNG, content[1].OfImage.Source.OfBase64.MediaType)
}
