package eino_test

import (
	"context"
	"fmt"

	"github.com/minipy-go/minipy"
	"github.com/minipy-go/minipy/adapters/eino"
)

// The tool's Info is minipy's schema; InvokableRun takes the model's JSON arguments and
// returns what the model reads. Variables persist in the namespace between calls.
func Example() {
	ctx := context.Background()
	eng := minipy.InProcess()
	ns := eng.NewNamespace() // one per conversation
	defer ns.Close()
	tool := eino.New(eng, &minipy.Options{Globals: ns})

	info, err := tool.Info(ctx)
	if err != nil {
		panic(err)
	}
	params, _ := info.ParamsOneOf.ToJSONSchema()
	fmt.Println(info.Name, params.Required)
	out, _ := tool.InvokableRun(ctx, `{"code": "import math\nn = math.factorial(12)\nprint('12! is', n)\nn / 7"}`)
	fmt.Print(out)
	out, _ = tool.InvokableRun(ctx, `{"code": "n.bit_length()", "timeout": 5}`)
	fmt.Print(out)
	// Output:
	// minipy [code]
	// [stdout]
	// 12! is 479001600
	// [value]
	// 68428800.0
	// [value]
	// 29
}
