// Package notebook_test holds toolslm's minipy notebook examples, run through the Go API.
package notebook_test

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/minipy-go/minipy"
)

// The last expression is the result, as in a notebook cell.
func Example_lastExpression() {
	r, _ := minipy.Minipy("import math\nmath.factorial(12)", nil)
	fmt.Println(r.Value, r.Repr)
	// Output: 479001600 479001600
}

// Printed output and the value are both kept (toolslm's minipy returned only one).
func Example_printAndValue() {
	r, _ := minipy.Minipy("print('computing...')\nsum(range(10))", nil)
	fmt.Print(r.Text())
	// Output:
	// computing...
	// 45
}

// A trailing semicolon hides the value, as in IPython.
func Example_semicolon() {
	r, _ := minipy.Minipy("x = 10\nx * 2;", nil)
	fmt.Println(r.HasValue)
	// Output: false
}

// Caller-owned globals persist between runs, and functions see the cell's imports.
func Example_persistentGlobals() {
	ns := minipy.NewNamespace()
	defer ns.Close()
	opts := &minipy.Options{Globals: ns}
	minipy.Minipy("import statistics\ndef mean(xs):\n    return statistics.fmean(xs)", opts)
	minipy.Minipy("data = [1, 2, 3, 4]", opts)
	r, _ := minipy.Minipy("mean(data)", opts)
	names, _ := ns.Names()
	fmt.Println(r.Value, names)
	// Output: 2.5 [statistics mean data]
}

// Go values in, Go values out.
func Example_goValues() {
	ns := minipy.NewNamespace()
	defer ns.Close()
	ns.Set("prices", map[string]float64{"apple": 1.25, "pear": 2})
	r, _ := minipy.Minipy("{k: v * 2 for k, v in sorted(prices.items())}", &minipy.Options{Globals: ns})
	fmt.Println(r.Value.(map[string]any)["pear"])
	// Output: 4
}

// Errors come back as a *PythonError with a traceback of the user's own lines.
func Example_traceback() {
	_, err := minipy.Minipy("def inverse(x):\n    return 1 / x\ninverse(0)", nil)
	var pyErr *minipy.PythonError
	if errors.As(err, &pyErr) {
		// Each run is a file "<cell-N>" (N counts runs in the process); show the end.
		lines := strings.Split(strings.TrimSpace(pyErr.Traceback), "\n")
		fmt.Println(pyErr.Type)
		fmt.Println(strings.Join(lines[len(lines)-3:], "\n"))
	}
	// Output:
	// ZeroDivisionError
	//     return 1 / x
	//            ~~^~~
	// ZeroDivisionError: division by zero
}

// A timeout stops code that would run forever, even code that catches Exception.
func Example_timeout() {
	code := "n = 0\nwhile True:\n    try:\n        n += 1\n    except Exception:\n        pass"
	_, err := minipy.Minipy(code, &minipy.Options{Timeout: 100 * time.Millisecond})
	fmt.Println(errors.Is(err, minipy.ErrTimeout))
	// Output: true
}
