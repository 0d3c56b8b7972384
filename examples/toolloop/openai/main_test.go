package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/minipy-go/minipy"
	"github.com/minipy-go/minipy/examples/internal/scripted"
)

// completion is a Chat Completions reply with one choice.
func completion(id, finishReason string, message map[string]any) any {
	message["role"] = "assistant"
	return map[string]any{
		"id": id, "object": "chat.completion", "created": 0, "model": "gpt-4o",
		"choices": []any{map[string]any{"index": 0, "finish_reason": finishReason, "message": message, "logprobs": nil}},
	}
}

// toolCall is a function call of minipy with the arguments as a model writes them: a
// JSON document in a string.
func toolCall(id, arguments string) any {
	return map[string]any{"id": id, "type": "function", "function": map[string]any{"name": minipy.ToolName, "arguments": arguments}}
}

// toolMessage returns the content of the request's message at index i from the end,
// checking that it is the tool message answering callID.
func toolMessage(t *testing.T, req map[string]any, fromEnd int, callID string) string {
	msgs, _ := req["messages"].([]any)
	require.GreaterOrEqual(t, len(msgs), fromEnd)
	msg := msgs[len(msgs)-fromEnd]
	assert.Equal(t, "tool", scripted.Get(msg, "role"))
	assert.Equal(t, callID, scripted.Get(msg, "tool_call_id"))
	switch content := scripted.Get(msg, "content").(type) {
	case string:
		return content
	case []any:
		s, _ := scripted.Get(content, 0, "text").(string)
		return s
	}
	t.Errorf("tool message content is %T", scripted.Get(msg, "content"))
	return ""
}

func TestToolLoop(t *testing.T) {
	var first, second string
	url := scripted.Serve(t, "/v1/chat/completions",
		func(t *testing.T, req map[string]any) any {
			want, err := json.Marshal(minipy.ToolSchema().OpenAI())
			require.NoError(t, err)
			got, err := json.Marshal(scripted.Get(req, "tools", 0))
			require.NoError(t, err)
			assert.JSONEq(t, string(want), string(got), "the tool as the Chat Completions API receives it")
			return completion("chatcmpl-1", "tool_calls", map[string]any{"content": nil, "tool_calls": []any{
				toolCall("call_1", `{"code": "import math\nr = 3\nmath.pi * r ** 2"}`),
			}})
		},
		func(t *testing.T, req map[string]any) any {
			first = toolMessage(t, req, 1, "call_1")
			// What models really send: a timeout as a string, a field the schema lacks, and the
			// code encoded twice; then code that fails.
			return completion("chatcmpl-2", "tool_calls", map[string]any{"content": nil, "tool_calls": []any{
				toolCall("call_2", `{"code": "\"print(round(math.pi * r ** 2, 2))\"", "timeout": "5", "glb": {}}`),
				toolCall("call_3", `{"code": "r.upper()"}`),
			}})
		},
		func(t *testing.T, req map[string]any) any {
			second = toolMessage(t, req, 2, "call_2")
			failed := toolMessage(t, req, 1, "call_3")
			assert.Contains(t, failed, "[error]\n")
			assert.Contains(t, failed, "AttributeError: 'int' object has no attribute 'upper'")
			return completion("chatcmpl-3", "stop", map[string]any{"content": "The area is " + second})
		},
	)
	client := openai.NewClient(option.WithBaseURL(url+"/v1/"), option.WithAPIKey("test-key"), option.WithMaxRetries(0))
	answer, err := ask(context.Background(), client, openai.ChatModelGPT4o, "Area of a circle of radius 3?")
	require.NoError(t, err)
	assert.Equal(t, "[value]\n28.274333882308138\n", first)
	assert.Equal(t, "[stdout]\n28.27\n", second)
	assert.Equal(t, "The area is [stdout]\n28.27\n", answer)
}

func TestToolLoopGivesUp(t *testing.T) {
	steps := make([]scripted.Step, maxTurns)
	for i := range steps {
		steps[i] = func(t *testing.T, req map[string]any) any {
			return completion("chatcmpl", "tool_calls", map[string]any{"tool_calls": []any{toolCall("call", `{"code": "1"}`)}})
		}
	}
	url := scripted.Serve(t, "/v1/chat/completions", steps...)
	client := openai.NewClient(option.WithBaseURL(url+"/v1/"), option.WithAPIKey("test-key"), option.WithMaxRetries(0))
	_, err := ask(context.Background(), client, openai.ChatModelGPT4o, "loop")
	assert.ErrorIs(t, err, errTooManyTurns)
}

// plotCode makes a matplotlib plot, which the tool result names and shows as an image.
const plotCode = "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()"

// shownMessage checks that the request's last message is the user message showing the
// turn's images and returns its text part and image URLs.
func shownMessage(t *testing.T, req map[string]any) (string, []string) {
	msgs, _ := req["messages"].([]any)
	require.NotEmpty(t, msgs)
	msg := msgs[len(msgs)-1]
	assert.Equal(t, "user", scripted.Get(msg, "role"))
	parts, _ := scripted.Get(msg, "content").([]any)
	require.NotEmpty(t, parts)
	assert.Equal(t, "text", scripted.Get(parts, 0, "type"))
	text, _ := scripted.Get(parts, 0, "text").(string)
	var urls []string
	for i := 1; i < len(parts); i++ {
		assert.Equal(t, "image_url", scripted.Get(parts, i, "type"))
		url, _ := scripted.Get(parts, i, "image_url", "url").(string)
		urls = append(urls, url)
	}
	return text, urls
}

// isPNG checks that url is a data URL of a PNG file.
func isPNG(t *testing.T, url string) {
	data, ok := strings.CutPrefix(url, "data:image/png;base64,")
	require.True(t, ok, "a PNG data URL: %.40s", url)
	png, err := base64.StdEncoding.DecodeString(data)
	require.NoError(t, err)
	assert.True(t, bytes.HasPrefix(png, []byte("\x89PNG\r\n\x1a\n")), "the image is a PNG file")
}

// The model plots; the tool message names the image, and a user message after it shows it.
// Then two calls in one turn, one of them plotting: the tool messages come first, then
// one user message whose text says which call each image is from.
func TestToolLoopImages(t *testing.T) {
	url := scripted.Serve(t, "/v1/chat/completions",
		func(t *testing.T, req map[string]any) any {
			return completion("chatcmpl-1", "tool_calls", map[string]any{"content": nil, "tool_calls": []any{
				toolCall("call_1", `{"code": `+strconv.Quote(plotCode)+`}`),
			}})
		},
		func(t *testing.T, req map[string]any) any {
			assert.Contains(t, toolMessage(t, req, 2, "call_1"), "[image 1: PNG")
			text, urls := shownMessage(t, req)
			assert.Equal(t, "Images shown by the minipy tool call above, in order: image 1.", text)
			require.Len(t, urls, 1)
			isPNG(t, urls[0])
			return completion("chatcmpl-2", "tool_calls", map[string]any{"content": nil, "tool_calls": []any{
				toolCall("call_2", `{"code": "print('no plot')"}`),
				toolCall("call_3", `{"code": "plt.plot([3, 2, 1])\nplt.show()\nplt.plot([1, 1, 1])\nplt.show()"}`),
			}})
		},
		func(t *testing.T, req map[string]any) any {
			assert.Equal(t, "[stdout]\nno plot\n", toolMessage(t, req, 3, "call_2"))
			third := toolMessage(t, req, 2, "call_3")
			assert.Contains(t, third, "[image 1: PNG")
			assert.Contains(t, third, "[image 2: PNG")
			text, urls := shownMessage(t, req)
			assert.Equal(t, "Images shown by the minipy tool calls above, in order: image 1 of call_3, image 2 of call_3.", text)
			require.Len(t, urls, 2)
			isPNG(t, urls[0])
			isPNG(t, urls[1])
			return completion("chatcmpl-3", "stop", map[string]any{"content": "Three lines."})
		},
	)
	client := openai.NewClient(option.WithBaseURL(url+"/v1/"), option.WithAPIKey("test-key"), option.WithMaxRetries(0))
	answer, err := ask(context.Background(), client, openai.ChatModelGPT4o, "Plot some lines.")
	require.NoError(t, err)
	assert.Equal(t, "Three lines.", answer)
}
