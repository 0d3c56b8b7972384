package main

import (
	"context"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	"github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/minipy-go/minipy"
	"github.com/minipy-go/minipy/examples/internal/scripted"
)

// The model reads the functions in the tool's description, writes one code block that
// calls both in a loop, and gets back only the line the code printed.
func TestCodeMode(t *testing.T) {
	var result string
	url := scripted.Serve(t, "/v1/messages",
		func(t *testing.T, req map[string]any) any {
			desc, _ := scripted.Get(req, "tools", 0, "description").(string)
			assert.Contains(t, desc, "\n  find_orders(customer: str | None = None, status: str | None = None) -> list[dict] — Orders of the shop")
			assert.Contains(t, desc, "\n  convert(amount: float, from_currency: str, to_currency: str) -> float — Convert an amount")
			return scripted.AnthropicMessage("msg_1", "tool_use", map[string]any{"type": "tool_use", "id": "toolu_1", "name": minipy.ToolName,
				"input": map[string]any{"code": `
shipped = find_orders(status="shipped")
total = sum(convert(o["amount"], o["currency"], "EUR") for o in shipped)
print(f"{len(shipped)} shipped orders, {total:.2f} EUR")
`}})
		},
		func(t *testing.T, req map[string]any) any {
			msgs, _ := req["messages"].([]any)
			block := scripted.Get(msgs[len(msgs)-1], "content", 0)
			assert.Equal(t, "toolu_1", scripted.Get(block, "tool_use_id"))
			switch c := scripted.Get(block, "content").(type) {
			case string:
				result = c
			case []any:
				result, _ = scripted.Get(c, 0, "text").(string)
			}
			return scripted.AnthropicMessage("msg_2", "end_turn", map[string]any{"type": "text", "text": "About 215 EUR."})
		},
	)
	s := newShop()
	client := anthropic.NewClient(option.WithBaseURL(url), option.WithAPIKey("test-key"), option.WithMaxRetries(0))
	answer, err := ask(context.Background(), client, anthropic.ModelClaudeSonnet4_5, s, "What did our shipped orders bring in, in EUR?")
	require.NoError(t, err)
	assert.Equal(t, "About 215 EUR.", answer)
	// 120 USD + 9800 JPY + 42 GBP, in EUR.
	assert.Equal(t, "[stdout]\n3 shipped orders, 219.32 EUR\n", result, "only the printed summary reaches the model")
	assert.Equal(t, map[string]int{"find_orders": 1, "convert": 3}, s.calls, "the code called the Go functions")
}
