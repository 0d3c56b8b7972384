package anthropic_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/minipy-go/minipy"
	minipyanthropic "github.com/minipy-go/minipy/adapters/anthropic"
)

// Execute answers a tool_use block's input: a text block (then the images), or a
// *ToolError that the runner sends as an error result. Pass the tool to
// client.Beta.Messages.NewToolRunner to let the SDK run the loop.
func Example() {
	ctx := context.Background()
	eng := minipy.InProcess()
	ns := eng.NewNamespace() // one per conversation
	defer ns.Close()
	tool := minipyanthropic.New(eng, &minipy.Options{Globals: ns})

	fmt.Println(tool.Name(), tool.InputSchema().Required)
	content, err := tool.Execute(ctx, json.RawMessage(`{"code": "import math\nn = math.factorial(12)\nprint('12! is', n)\nn / 7"}`))
	if err != nil {
		panic(err)
	}
	fmt.Print(content[0].OfText.Text)

	_, err = tool.Execute(ctx, json.RawMessage(`{"code": "n / 0"}`))
	var pyErr *minipy.PythonError
	fmt.Println(errors.As(err, &pyErr), pyErr.Type)
	// Output:
	// minipy [code]
	// [stdout]
	// 12! is 479001600
	// [value]
	// 68428800.0
	// true ZeroDivisionError
}
