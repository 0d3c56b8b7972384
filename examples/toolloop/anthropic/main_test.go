package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/minipy-go/minipy"
	"github.com/minipy-go/minipy/examples/agent"
	"github.com/minipy-go/minipy/examples/internal/scripted"
)

func message(id, stopReason string, content ...any) any {
	return scripted.AnthropicMessage(id, stopReason, content...)
}

func text(s string) any { return map[string]any{"type": "text", "text": s} }

func toolUse(id string, input any) any {
	return map[string]any{"type": "tool_use", "id": id, "name": minipy.ToolName, "input": input}
}

// toolResult returns the text and is_error of the tool_result block at index i of the
// request's last message, checking that it answers toolUseID.
func toolResult(t *testing.T, req map[string]any, i int, toolUseID string) (string, bool) {
	msgs, _ := req["messages"].([]any)
	require.NotEmpty(t, msgs)
	last := msgs[len(msgs)-1]
	assert.Equal(t, "user", scripted.Get(last, "role"))
	block := scripted.Get(last, "content", i)
	assert.Equal(t, "tool_result", scripted.Get(block, "type"))
	assert.Equal(t, toolUseID, scripted.Get(block, "tool_use_id"))
	isError, _ := scripted.Get(block, "is_error").(bool)
	switch content := scripted.Get(block, "content").(type) {
	case string:
		return content, isError
	case []any:
		assert.Len(t, content, 1)
		assert.Equal(t, "text", scripted.Get(content, 0, "type"))
		s, _ := scripted.Get(content, 0, "text").(string)
		return s, isError
	}
	t.Errorf("tool_result content is %T", scripted.Get(block, "content"))
	return "", isError
}

// The model defines a function, calls it again in a second turn (the namespace persists)
// together with code that fails, and answers with what the tool results said.
func TestToolLoop(t *testing.T) {
	var first, second string
	url := scripted.Serve(t, "/v1/messages",
		func(t *testing.T, req map[string]any) any {
			tool := scripted.Get(req, "tools", 0)
			want, err := json.Marshal(minipy.ToolSchema())
			require.NoError(t, err)
			got, err := json.Marshal(tool)
			require.NoError(t, err)
			assert.JSONEq(t, string(want), string(got), "the tool as the Messages API receives it")
			assert.Equal(t, "What is the 100th prime?", scripted.Get(req, "messages", 0, "content", 0, "text"))
			return message("msg_1", "tool_use", text("Let me compute it."), toolUse("toolu_1", map[string]any{
				"code": "def nth_prime(n):\n    found = []\n    k = 2\n    while len(found) < n:\n" +
					"        if all(k % p for p in found if p * p <= k):\n            found.append(k)\n        k += 1\n" +
					"    return found[-1]\n\nnth_prime(100)",
			}))
		},
		func(t *testing.T, req map[string]any) any {
			var isError bool
			first, isError = toolResult(t, req, 0, "toolu_1")
			assert.False(t, isError)
			// Parallel tool use: the second fails, and says so.
			return message("msg_2", "tool_use",
				toolUse("toolu_2", map[string]any{"code": "print(nth_prime(1000))", "timeout": "10"}),
				toolUse("toolu_3", map[string]any{"code": "nth_prime(5) / 0"}))
		},
		func(t *testing.T, req map[string]any) any {
			var isError bool
			second, isError = toolResult(t, req, 0, "toolu_2")
			assert.False(t, isError)
			failed, isError := toolResult(t, req, 1, "toolu_3")
			assert.True(t, isError)
			assert.Contains(t, failed, "[error]\n")
			assert.Contains(t, failed, "ZeroDivisionError: division by zero")
			return message("msg_3", "end_turn", text("From the tool: "+first+" and "+second))
		},
	)
	client := anthropic.NewClient(option.WithBaseURL(url), option.WithAPIKey("test-key"), option.WithMaxRetries(0))
	answer, err := ask(context.Background(), client, anthropic.ModelClaudeSonnet4_5, "What is the 100th prime?")
	require.NoError(t, err)
	assert.Equal(t, "[value]\n541\n", first)
	assert.Equal(t, "[stdout]\n7919\n", second)
	assert.Equal(t, "From the tool: [value]\n541\n and [stdout]\n7919\n", answer)
}

func TestToolLoopGivesUp(t *testing.T) {
	steps := make([]scripted.Step, agent.MaxTurns)
	for i := range steps {
		steps[i] = func(t *testing.T, req map[string]any) any {
			return message("msg", "tool_use", toolUse("toolu", map[string]any{"code": "1"}))
		}
	}
	url := scripted.Serve(t, "/v1/messages", steps...)
	client := anthropic.NewClient(option.WithBaseURL(url), option.WithAPIKey("test-key"), option.WithMaxRetries(0))
	_, err := ask(context.Background(), client, anthropic.ModelClaudeSonnet4_5, "loop")
	assert.ErrorIs(t, err, agent.ErrTooManyTurns)
}

// plotCode makes a matplotlib plot, which the tool result carries as an image.
const plotCode = "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()"

// The model plots; the tool_result carries the text, which names the image, and the image
// as a base64 PNG block after it.
func TestToolLoopImages(t *testing.T) {
	url := scripted.Serve(t, "/v1/messages",
		func(t *testing.T, req map[string]any) any {
			return message("msg_1", "tool_use", toolUse("toolu_1", map[string]any{"code": plotCode}))
		},
		func(t *testing.T, req map[string]any) any {
			msgs, _ := req["messages"].([]any)
			require.NotEmpty(t, msgs)
			block := scripted.Get(msgs[len(msgs)-1], "content", 0)
			assert.Equal(t, "tool_result", scripted.Get(block, "type"))
			assert.Equal(t, "toolu_1", scripted.Get(block, "tool_use_id"))
			assert.Equal(t, false, scripted.Get(block, "is_error"))
			content, _ := scripted.Get(block, "content").([]any)
			require.Len(t, content, 2, "the text block and one image block")
			assert.Equal(t, "text", scripted.Get(content, 0, "type"))
			assert.Contains(t, scripted.Get(content, 0, "text"), "[image 1: PNG")
			assert.Equal(t, "image", scripted.Get(content, 1, "type"))
			assert.Equal(t, "base64", scripted.Get(content, 1, "source", "type"))
			assert.Equal(t, "image/png", scripted.Get(content, 1, "source", "media_type"))
			data, _ := scripted.Get(content, 1, "source", "data").(string)
			png, err := base64.StdEncoding.DecodeString(data)
			require.NoError(t, err)
			assert.True(t, bytes.HasPrefix(png, []byte("\x89PNG\r\n\x1a\n")), "the image is a PNG file")
			return message("msg_2", "end_turn", text("A rising line."))
		},
	)
	client := anthropic.NewClient(option.WithBaseURL(url), option.WithAPIKey("test-key"), option.WithMaxRetries(0))
	answer, err := ask(context.Background(), client, anthropic.ModelClaudeSonnet4_5, "Plot 1, 2, 3.")
	require.NoError(t, err)
	assert.Equal(t, "A rising line.", answer)
}
