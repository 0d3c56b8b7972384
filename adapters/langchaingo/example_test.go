package langchaingo_test

import (
	"context"
	"fmt"

	"github.com/minipy-go/minipy"
	"github.com/minipy-go/minipy/adapters/langchaingo"
)

// The tool takes the code itself, as langchaingo's agents pass it, or minipy's JSON
// arguments; variables persist in the namespace between calls.
func Example() {
	ctx := context.Background()
	eng := minipy.InProcess()
	ns := eng.NewNamespace() // one per conversation
	defer ns.Close()
	tool := langchaingo.New(eng, &minipy.Options{Globals: ns})

	fmt.Println(tool.Name())
	out, _ := tool.Call(ctx, "import math\nn = math.factorial(12)\nprint('12! is', n)\nn / 7")
	fmt.Print(out)
	out, _ = tool.Call(ctx, `{"code": "n % 1000", "timeout": 5}`)
	fmt.Print(out)
	// Output:
	// minipy
	// [stdout]
	// 12! is 479001600
	// [value]
	// 68428800.0
	// [value]
	// 600
}
