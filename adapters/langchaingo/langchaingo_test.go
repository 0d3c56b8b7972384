package langchaingo_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/tmc/langchaingo/agents"
	"github.com/tmc/langchaingo/chains"
	"github.com/tmc/langchaingo/llms/openai"
	"github.com/tmc/langchaingo/tools"

	"github.com/minipy-go/minipy"
	"github.com/minipy-go/minipy/adapters/internal/scripted"
	"github.com/minipy-go/minipy/adapters/langchaingo"
)

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

// call is a reply that calls minipy with arguments.
func call(id, arguments string) any {
	return scripted.Completion("chatcmpl-"+id, "tool_calls", map[string]any{"content": nil, "tool_calls": []any{
		scripted.FunctionCall(id, minipy.ToolName, arguments),
	}})
}

// langchaingo's OpenAI functions agent, on its own OpenAI client and executor, runs the
// model's code in the tool and sends back what minipy renders: the code as the agent's
// "__arg1", then minipy's JSON arguments, then code that fails.
func TestExecutorRunsTheModelsCode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	eng := minipy.InProcess()
	ns := eng.NewNamespace()
	defer ns.Close()
	tool := langchaingo.New(eng, &minipy.Options{Globals: ns, Timeout: 20 * time.Second})

	const answer = "12!/7 is 68428800, and the 10th prime is 29."
	url := scripted.Serve(t, "/chat/completions",
		func(t *testing.T, req map[string]any) any {
			assert.Equal(t, minipy.ToolName, scripted.Get(req, "tools", 0, "function", "name"))
			assert.Equal(t, tool.Description(), scripted.Get(req, "tools", 0, "function", "description"))
			return call("call_1", `{"__arg1": "import math\nn = math.factorial(12)\nprint('12! =', n)\nn / 7"}`)
		},
		func(t *testing.T, req map[string]any) any {
			assert.Equal(t, "[stdout]\n12! = 479001600\n[value]\n68428800.0\n", toolMessage(t, req, "call_1"))
			return call("call_2", `{"code": "primes = [p for p in range(2, 100) if all(p % d for d in range(2, p))]\nprimes[9], n // 7", "timeout": 5}`)
		},
		func(t *testing.T, req map[string]any) any {
			assert.Equal(t, "[value]\n(29, 68428800)\n", toolMessage(t, req, "call_2"))
			return call("call_3", `{"__arg1": "primes[100]"}`)
		},
		func(t *testing.T, req map[string]any) any {
			text := toolMessage(t, req, "call_3")
			assert.Contains(t, text, "[error]\nTraceback (most recent call last):\n")
			assert.Contains(t, text, "primes[100]\n")
			assert.Contains(t, text, "IndexError: list index out of range\n")
			return scripted.Completion("chatcmpl-4", "stop", map[string]any{"content": answer})
		},
	)
	llm, err := openai.New(openai.WithBaseURL(url), openai.WithToken("test-key"), openai.WithModel("gpt-test"))
	require.NoError(t, err)
	agent := agents.NewOpenAIFunctionsAgent(llm, []tools.Tool{tool})
	out, err := chains.Run(ctx, agents.NewExecutor(agent, agents.WithMaxIterations(5)), "What is 12!/7, and the 10th prime?")
	require.NoError(t, err)
	assert.Equal(t, answer, out)
}

// langchaingo's text-based ReAct agent (MRKL) passes what follows "Action Input:", here
// code in a Markdown fence, and puts the tool's text in the prompt as the observation.
func TestOneShotAgentRunsFencedCode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	eng := minipy.InProcess()
	ns := eng.NewNamespace()
	defer ns.Close()
	tool := langchaingo.New(eng, &minipy.Options{Globals: ns})

	prompt := func(req map[string]any) string {
		s, _ := scripted.Get(req, "messages", -1, "content").(string)
		return s
	}
	url := scripted.Serve(t, "/chat/completions",
		func(t *testing.T, req map[string]any) any {
			assert.Contains(t, prompt(req), "minipy: "+tool.Description())
			return scripted.Completion("chatcmpl-1", "stop", map[string]any{"content": "Thought: I should compute it.\n" +
				"Action: minipy\nAction Input: ```python\nimport math\nprint('computing')\nmath.factorial(10)\n```"})
		},
		func(t *testing.T, req map[string]any) any {
			assert.Contains(t, prompt(req), "\nObservation: [stdout]\ncomputing\n[value]\n3628800\n")
			return scripted.Completion("chatcmpl-2", "stop", map[string]any{"content": "Thought: I now know the final answer\nFinal Answer: 10! is 3628800."})
		},
	)
	llm, err := openai.New(openai.WithBaseURL(url), openai.WithToken("test-key"), openai.WithModel("gpt-test"))
	require.NoError(t, err)
	agent := agents.NewOneShotAgent(llm, []tools.Tool{tool})
	out, err := chains.Run(ctx, agents.NewExecutor(agent, agents.WithMaxIterations(3)), "What is 10!?")
	require.NoError(t, err)
	assert.Equal(t, "10! is 3628800.", out)
}

func TestCallInputs(t *testing.T) {
	ctx := context.Background()
	eng := minipy.InProcess()
	ns := eng.NewNamespace()
	defer ns.Close()
	tool := langchaingo.New(eng, &minipy.Options{Globals: ns})

	for _, tc := range []struct{ name, input, want string }{
		{"code", "6 * 7", "[value]\n42\n"},
		{"code that is a JSON object without code", `{"a": 1}`, "[value]\n{'a': 1}\n"},
		{"arguments", `{"code": "print('hi')"}`, "[stdout]\nhi\n"},
		{"arguments with spaces and a timeout", " {\"code\": \"1 + 1\", \"timeout\": \"2\"}\n", "[value]\n2\n"},
		{"code that is not JSON", "{1, 2} | {3}", "[value]\n{1, 2, 3}\n"},
		{"nothing to show", "x = 1", "[no output]\n"},
		{"code in a fence", "```python\nprint('fenced')\n6 * 7\n```", "[stdout]\nfenced\n[value]\n42\n"},
		{"code in a bare fence", "\n```\n2 ** 10\n```\n", "[value]\n1024\n"},
		{"backticks inside the code", "s = \"```\"\nlen(s)", "[value]\n3\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := tool.Call(ctx, tc.input)
			require.NoError(t, err)
			assert.Equal(t, tc.want, out)
		})
	}

	t.Run("bad arguments", func(t *testing.T) {
		out, err := tool.Call(ctx, `{"code": 5}`)
		require.NoError(t, err, "the model reads what is wrong")
		assert.Contains(t, out, "[bad arguments]\n")
		r := tool.CallResult(ctx, `{"code": 5}`)
		assert.True(t, r.IsError)
		assert.ErrorIs(t, r.Err, minipy.ErrBadArguments)
	})
	t.Run("python error", func(t *testing.T) {
		r := tool.CallResult(ctx, "1/0")
		assert.True(t, r.IsError)
		var pyErr *minipy.PythonError
		require.ErrorAs(t, r.Err, &pyErr)
		assert.Equal(t, "ZeroDivisionError", pyErr.Type)
		out, err := tool.Call(ctx, "1/0")
		require.NoError(t, err)
		assert.Contains(t, out, "ZeroDivisionError: division by zero\n")
	})
	t.Run("timeout", func(t *testing.T) {
		r := tool.CallResult(ctx, `{"code": "import time\ntime.sleep(30)", "timeout": 0.2}`)
		assert.True(t, r.IsError)
		assert.ErrorIs(t, r.Err, minipy.ErrTimeout)
		assert.Contains(t, r.Text, "[timeout]\n")
	})
}

func TestDescription(t *testing.T) {
	eng := minipy.InProcess()
	opts := &minipy.Options{Timeout: 7 * time.Second}
	tool := langchaingo.New(eng, opts)
	schema := eng.ToolSchemaFor(opts)
	assert.Equal(t, schema.Name, tool.Name())
	assert.Contains(t, tool.Description(), schema.Description)
	assert.Contains(t, tool.Description(), "7 seconds")
	// The description names the host functions registered after New.
	ns := eng.NewNamespace()
	defer ns.Close()
	tool = langchaingo.New(eng, &minipy.Options{Globals: ns})
	require.NoError(t, ns.Register(minipy.Function{Name: "lookup_price", Description: "The price of an item.",
		Call: func(context.Context, map[string]any) (any, error) { return 1.5, nil }}))
	assert.Contains(t, tool.Description(), "lookup_price")
}
