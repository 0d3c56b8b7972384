package minipy_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"image"
	"image/png"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/minipy-go/minipy"
)

// The short path: code in, what the model should read out.
func ExampleMinipy() {
	r, err := minipy.Minipy("import math\nprint('12! is')\nmath.factorial(12)", nil)
	if err != nil {
		panic(err)
	}
	fmt.Print(r.Text())
	// Output:
	// 12! is
	// 479001600
}

// Run takes a context; the run stops at its deadline or Options.Timeout, whichever comes first.
func ExampleRun() {
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	r, err := minipy.Run(ctx, "print('working'); import time; time.sleep(10)", nil)
	fmt.Printf("%q %v %v\n", r.Stdout, errors.Is(err, minipy.ErrTimeout), errors.Is(err, context.DeadlineExceeded))
	// Output: "working\n" true true
}

// A namespace holds a session's variables; Set and Get convert Go values.
func ExampleNamespace_Set() {
	ns := minipy.NewNamespace()
	defer ns.Close()
	if err := ns.Set("prices", map[string]any{"apple": 1.25, "pear": 2}); err != nil {
		panic(err)
	}
	r, _ := minipy.Minipy("total = sum(prices.values())\ntotal", &minipy.Options{Globals: ns})
	fmt.Println(r.Value)
	// Output: 3.25
}

func ExampleNamespace_Get() {
	ns := minipy.NewNamespace()
	defer ns.Close()
	minipy.Minipy("squares = {str(n): n * n for n in range(4)}\nloop = []\nloop.append(loop)", &minipy.Options{Globals: ns})
	v, _ := ns.Get("squares")
	fmt.Println(v.(map[string]any)["3"])
	_, err := ns.Get("loop")
	fmt.Println(errors.Is(err, minipy.ErrUnsupportedValue))
	_, err = ns.Get("nope")
	fmt.Println(errors.Is(err, minipy.ErrNameNotFound))
	// Output:
	// 9
	// true
	// true
}

// Code written against Engine runs in-process or in sandboxed workers alike.
func ExampleEngine() {
	for _, start := range []func() (minipy.Engine, error){
		func() (minipy.Engine, error) { return minipy.InProcess(), nil },
		func() (minipy.Engine, error) { return minipy.NewIsolated(minipy.IsolatedConfig{}) },
	} {
		eng, err := start()
		if err != nil {
			panic(err)
		}
		ns := eng.NewNamespace()
		eng.Run(context.Background(), "x = 20", &minipy.Options{Globals: ns})
		r, _ := eng.Run(context.Background(), "x + 22", &minipy.Options{Globals: ns})
		fmt.Println(r.Value)
		ns.Close()
		eng.Close()
	}
	// Output:
	// 42
	// 42
}

// The isolated engine runs code in sandboxed worker processes: its own file system, no
// network, a hard kill at the deadline, and a crash costs only that worker's variables.
func ExampleNewIsolated() {
	eng, err := minipy.NewIsolated(minipy.IsolatedConfig{})
	if err != nil {
		panic(err)
	}
	defer eng.Close()
	r, _ := eng.Minipy("import os, socket\nsocket.gethostname(), os.getcwd(), os.path.exists('/home')", nil)
	fmt.Println(r.Repr)
	// A crash costs only the run: the worker's snapshot from before it takes over.
	_, err = eng.Minipy("x = 1\nimport os; os._exit(3)", nil)
	fmt.Println(err)
	fmt.Println(errors.Is(err, minipy.ErrStateLost))
	// Output:
	// ('minipy', '/work', False)
	// minipy: the worker exited with status 3; the namespace was rolled back to before this run
	// false
}

// Fork branches a session: the copy starts with the namespace's variables, in a process
// of its own, and the two diverge from there.
func ExampleNamespace_Fork() {
	eng, err := minipy.NewIsolated(minipy.IsolatedConfig{})
	if err != nil {
		panic(err)
	}
	defer eng.Close()
	trunk := eng.NewNamespace()
	eng.Minipy("plan = ['load', 'clean']", &minipy.Options{Globals: trunk})
	branch, err := trunk.Fork()
	if err != nil {
		panic(err)
	}
	eng.Minipy("plan.append('plot')", &minipy.Options{Globals: branch})
	eng.Minipy("plan.append('fit')", &minipy.Options{Globals: trunk})
	for _, ns := range []*minipy.Namespace{trunk, branch} {
		r, _ := eng.Minipy("plan", &minipy.Options{Globals: ns})
		fmt.Println(r.Repr)
	}
	// Output:
	// ['load', 'clean', 'fit']
	// ['load', 'clean', 'plot']
}

// Files go in before a run and come out after it: Result.Files names what the run made.
func ExampleNamespace_WriteFile() {
	eng, err := minipy.NewIsolated(minipy.IsolatedConfig{})
	if err != nil {
		panic(err)
	}
	defer eng.Close()
	ns := eng.NewNamespace()
	defer ns.Close()
	if err := ns.WriteFile("data/sales.csv", []byte("region,amount\nnorth,120\nsouth,80\nnorth,30\n")); err != nil {
		panic(err)
	}
	r, err := eng.Minipy(`import csv, collections, os
totals = collections.Counter()
for row in csv.DictReader(open("data/sales.csv")):
    totals[row["region"]] += int(row["amount"])
os.makedirs("out", exist_ok=True)
with open("out/totals.csv", "w") as f:
    f.writelines(f"{k},{v}\n" for k, v in sorted(totals.items()))
dict(totals)`, &minipy.Options{Globals: ns})
	if err != nil {
		panic(err)
	}
	fmt.Println(r.Repr)
	for _, f := range r.Files {
		fmt.Println(f.Name, f.Size)
	}
	out, _ := ns.ReadFile("out/totals.csv")
	fmt.Print(string(out))
	_, err = ns.ReadFile("../etc/passwd")
	fmt.Println(errors.Is(err, minipy.ErrBadPath))
	// Output:
	// {'north': 150, 'south': 80}
	// out/totals.csv 19
	// north,150
	// south,80
	// true
}

// DialPort reaches a server that the code started in its sandbox, whose network is its
// own; an absolute name reaches the files it wrote anywhere in its sandbox.
func ExampleNamespace_DialPort() {
	eng, err := minipy.NewIsolated(minipy.IsolatedConfig{})
	if err != nil {
		panic(err)
	}
	defer eng.Close()
	ns := eng.NewNamespace()
	defer ns.Close()
	_, err = eng.Minipy(`import http.server, os, threading
os.makedirs("/srv/site", exist_ok=True)
open("/srv/site/index.html", "w").write("<h1>built in the sandbox</h1>")
h = lambda *a: http.server.SimpleHTTPRequestHandler(*a, directory="/srv/site")
srv = http.server.ThreadingHTTPServer(("127.0.0.1", 8000), h)
threading.Thread(target=srv.serve_forever, daemon=True).start()`, &minipy.Options{Globals: ns})
	if err != nil {
		panic(err)
	}
	client := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return ns.DialPort(ctx, 8000) },
	}}
	resp, err := client.Get("http://sandbox/index.html")
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Println(resp.StatusCode, string(body))
	page, _ := ns.ReadFile("/srv/site/index.html")
	fmt.Println(len(page))
	// Output:
	// 200 <h1>built in the sandbox</h1>
	// 29
}

// CallTool serves a model's tool call: JSON arguments in, the text to send back out.
func ExampleCallTool() {
	ns := minipy.NewNamespace()
	defer ns.Close()
	opts := &minipy.Options{Globals: ns}
	cell := regexp.MustCompile(`<cell-\d+>`) // runs are numbered per process
	for _, args := range []string{
		`{"code": "import math\nr = 2\nprint('area:')\nmath.pi * r ** 2"}`,
		`{"code": "r / 0"}`,
	} {
		text, isError := minipy.CallTool(context.Background(), json.RawMessage(args), opts)
		fmt.Printf("isError=%v\n%s", isError, cell.ReplaceAllString(text, "<cell-N>"))
	}
	// Output:
	// isError=false
	// [stdout]
	// area:
	// [value]
	// 12.566370614359172
	// isError=true
	// [error]
	// Traceback (most recent call last):
	//   File "<cell-N>", line 1, in <module>
	//     r / 0
	//     ~~^~~
	// ZeroDivisionError: division by zero
}

// ToolSchema is what a model client registers: Anthropic's shape as is, OpenAI's through OpenAI().
func ExampleToolSchema() {
	tool := minipy.ToolSchema()
	fmt.Println(tool.Name, tool.InputSchema.Required)
	fmt.Println(tool.OpenAI()["type"])
	// Output:
	// minipy [code]
	// function
}

// Options.Stdout and Stderr get the output while the code runs; the Result still has it.
func ExampleOptions_live() {
	opts := &minipy.Options{Stdout: os.Stdout}
	r, _ := minipy.Minipy("import time\nfor step in range(3):\n    print('step', step)\n    time.sleep(0.01)\n'done'", opts)
	fmt.Println(r.Repr, len(r.Stdout))
	// Output:
	// step 0
	// step 1
	// step 2
	// 'done' 21
}

// Register gives the model's code Go functions to call: it loops and filters in Python, and
// only what it prints comes back into the model's context.
func ExampleNamespace_Register() {
	type query struct {
		Customer string  `json:"customer" jsonschema:"the customer's name"`
		MinTotal float64 `json:"min_total,omitempty"`
	}
	type order struct {
		ID    int     `json:"id"`
		Total float64 `json:"total"`
	}
	orders := map[string][]order{"ann": {{1, 30}, {2, 120}, {3, 75}}}
	find := minipy.Func("find_orders", "A customer's orders.", func(ctx context.Context, q query) ([]order, error) {
		var out []order
		for _, o := range orders[q.Customer] {
			if o.Total >= q.MinTotal {
				out = append(out, o)
			}
		}
		if out == nil {
			return nil, fmt.Errorf("no orders for %q", q.Customer)
		}
		return out, nil
	})
	ns := minipy.NewNamespace()
	defer ns.Close()
	if err := ns.Register(find); err != nil {
		panic(err)
	}
	opts := &minipy.Options{Globals: ns}
	r, _ := minipy.Run(context.Background(), `
import minipy
big = find_orders("ann", min_total=50)
print(len(big), "orders,", sum(o["total"] for o in big), "in all")
try:
    find_orders("bob")
except minipy.HostError as e:
    print("error:", e)
`, opts)
	fmt.Print(r.Stdout)
	// The tool description shows the model what it can call.
	desc := minipy.ToolSchemaFor(opts).Description
	fmt.Println(desc[strings.LastIndex(desc, "\n")+1:])
	// Output:
	// 2 orders, 195.0 in all
	// error: no orders for "bob"
	//   find_orders(customer: str, min_total: float | None = None) -> list[dict] — A customer's orders.
}

// CallToolResult returns the images a run showed beside the text, which names each one in
// place; send them to the model as images (see ToolResult). Here the image is a PNG made in
// Go; matplotlib figures and PIL images come back the same way.
func ExampleCallToolResult() {
	ns := minipy.NewNamespace()
	defer ns.Close()
	img := image.NewGray(image.Rect(0, 0, 40, 30))
	var pic bytes.Buffer
	if err := png.Encode(&pic, img); err != nil {
		panic(err)
	}
	if err := ns.Set("pic", pic.Bytes()); err != nil {
		panic(err)
	}
	code := "from IPython.display import Image\nprint('the picture:')\ndisplay(Image(data=pic))\nprint('done')"
	input, _ := json.Marshal(map[string]string{"code": code})
	r := minipy.CallToolResult(context.Background(), input, &minipy.Options{Globals: ns})
	fmt.Print(r.Text)
	for _, img := range r.Images {
		fmt.Println(img.MIMEType, img.Width, img.Height)
	}
	// Output:
	// [stdout]
	// the picture:
	// [image 1: PNG 40x30, 1 KB]
	// done
	// image/png 40 30
}

// A namespace saved and restored into another one, as a server does when a session moves
// to another process (which then needs the same minipy.SetStateKey).
func ExampleNamespace_Save() {
	ns := minipy.NewNamespace()
	defer ns.Close()
	minipy.Minipy("rate = 3\ndef scaled(x):\n    return x * rate\nlines = (l for l in [])", &minipy.Options{Globals: ns})
	var saved bytes.Buffer
	info, err := ns.Save(&saved)
	if err != nil {
		panic(err)
	}
	fmt.Println("saved:", info.Saved, "skipped:", info.Skipped)

	later := minipy.NewNamespace()
	defer later.Close()
	if err := later.Restore(&saved); err != nil {
		panic(err)
	}
	r, _ := minipy.Minipy("rate = 10\nscaled(4)", &minipy.Options{Globals: later})
	fmt.Println(r.Repr)
	// Output:
	// saved: [rate scaled] skipped: [lines]
	// 40
}

// Stdout holds what the code printed; each display's place in it is its Offset, and Output
// (what Text and CallTool give the model) puts its caption there. Repr is IPython's text.
func ExampleResult_Output() {
	r, err := minipy.Minipy("print('before')\ndisplay({'rows': 3})\nprint('after')\n[type(1), len]", nil)
	if err != nil {
		panic(err)
	}
	fmt.Printf("%q\n", r.Stdout)
	fmt.Println(r.Displays[0].Offset, r.Displays[0].Caption)
	fmt.Print(r.Output())
	fmt.Println(r.Repr)
	// Output:
	// "before\nafter\n"
	// 7 {'rows': 3}
	// before
	// {'rows': 3}
	// after
	// [int, <function len(obj, /)>]
}
