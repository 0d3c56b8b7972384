// Package scripted plays a model's HTTP API from a script, so that the adapters' tests run
// the frameworks' own agent loops offline: each request is answered by the next step,
// which sees the request.
package scripted

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
)

// Step answers one request: it gets the request's JSON body, decoded, and returns the
// reply's body, which is encoded as JSON. It checks the request with assert, not require:
// it runs on the server's goroutine, where t.FailNow must not be called.
type Step func(t *testing.T, request map[string]any) any

// Serve starts a local server that answers POST requests to path with steps, in order,
// and returns its URL. The server is closed when the test ends; the test fails if another
// request comes, a step is left unplayed, or a request is not JSON.
func Serve(t *testing.T, path string, steps ...Step) string {
	t.Helper()
	var mu sync.Mutex
	next := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if !assert.Equal(t, http.MethodPost, r.Method) || !assert.Equal(t, path, r.URL.Path) ||
			!assert.Less(t, next, len(steps), "a request after the last step") {
			http.Error(w, "not in the script", http.StatusNotFound)
			return
		}
		var request map[string]any
		if !assert.NoError(t, json.NewDecoder(r.Body).Decode(&request)) {
			http.Error(w, "not JSON", http.StatusBadRequest)
			return
		}
		step := steps[next]
		next++
		w.Header().Set("Content-Type", "application/json")
		assert.NoError(t, json.NewEncoder(w).Encode(step(t, request)))
	}))
	t.Cleanup(func() {
		srv.Close()
		mu.Lock()
		defer mu.Unlock()
		assert.Equal(t, len(steps), next, "steps of the script that were not played")
	})
	return srv.URL
}

// Get walks a decoded JSON document by object keys (string) and array indexes (int;
// negative ones count from the end), returning nil when the path does not exist.
func Get(doc any, path ...any) any {
	for _, p := range path {
		switch key := p.(type) {
		case string:
			m, ok := doc.(map[string]any)
			if !ok {
				return nil
			}
			doc = m[key]
		case int:
			a, ok := doc.([]any)
			if !ok {
				return nil
			}
			if key < 0 {
				key += len(a)
			}
			if key < 0 || key >= len(a) {
				return nil
			}
			doc = a[key]
		default:
			return nil
		}
	}
	return doc
}

// Completion is a Chat Completions reply with one choice holding message (the role is
// added).
func Completion(id, finishReason string, message map[string]any) any {
	message["role"] = "assistant"
	return map[string]any{
		"id": id, "object": "chat.completion", "created": 0, "model": "gpt-test",
		"choices": []any{map[string]any{"index": 0, "finish_reason": finishReason, "message": message, "logprobs": nil}},
		"usage":   map[string]any{"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20},
	}
}

// FunctionCall is a Chat Completions tool call of the function name with arguments, a
// JSON document in a string as models write it.
func FunctionCall(id, name, arguments string) any {
	return map[string]any{"id": id, "type": "function", "function": map[string]any{"name": name, "arguments": arguments}}
}

// AnthropicMessage is a Messages API reply with the given content blocks.
func AnthropicMessage(id, stopReason string, content ...any) any {
	return map[string]any{
		"id": id, "type": "message", "role": "assistant", "model": "claude-test",
		"content": content, "stop_reason": stopReason, "stop_sequence": nil,
		"usage": map[string]any{"input_tokens": 10, "output_tokens": 10},
	}
}
