package minipy

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/minipy-go/minipy/internal/pyrt"
)

// ToolName is the name the tool is offered to a model under, as toolslm's get_schema(minipy).
const ToolName = "minipy"

// DefaultToolTimeout bounds a tool call whose caller's Options.Timeout is 0 and whose model
// passed no timeout. It is shorter than DefaultTimeout because a model waits on every call.
const DefaultToolTimeout = time.Minute

// MaxToolTimeout is the most a model may ask for with the tool's "timeout" argument when
// the caller's Options.Timeout is not positive; a positive Options.Timeout is the maximum
// instead, so a caller's bound always holds.
const MaxToolTimeout = 10 * time.Minute

// DefaultToolOutput is the character budget of the text a tool call returns (and of each of
// its stdout, stderr and value) when the caller's Options.MaxOutput is 0: about 4k tokens.
const DefaultToolOutput = 16 << 10

// Tool describes the minipy tool for a model. Its JSON is toolslm's get_schema shape, the
// one Anthropic's Messages API takes: {"name", "description", "input_schema"}.
type Tool struct {
	Name        string      `json:"name"`
	Description string      `json:"description"`
	InputSchema InputSchema `json:"input_schema"`
}

// InputSchema is the JSON Schema of the tool's arguments: an object with "code" (string,
// required) and "timeout" (number of seconds, optional).
type InputSchema struct {
	Type       string         `json:"type"`
	Properties map[string]any `json:"properties"`
	Required   []string       `json:"required"`
}

// Map returns the schema as a plain JSON object, the form most SDKs take (openai-go's
// FunctionDefinitionParam.Parameters, mcp.Tool.InputSchema).
func (s InputSchema) Map() map[string]any {
	props := make(map[string]any, len(s.Properties))
	for k, v := range s.Properties {
		props[k] = v
	}
	return map[string]any{
		"type":       s.Type,
		"properties": props,
		"required":   append([]string(nil), s.Required...),
	}
}

// OpenAI returns the tool in the shape of OpenAI's Chat Completions "tools" entries:
// {"type": "function", "function": {"name", "description", "parameters"}}.
func (t *Tool) OpenAI() map[string]any {
	return map[string]any{
		"type": "function",
		"function": map[string]any{
			"name":        t.Name,
			"description": t.Description,
			"parameters":  t.InputSchema.Map(),
		},
	}
}

// ToolSchema describes the tool served by CallTool with default options: what a model
// needs to call it well, including the Python version and which common libraries are
// importable (detected once, starting the in-process interpreter if needed).
func ToolSchema() *Tool {
	return ToolSchemaFor(nil)
}

// ToolSchemaFor describes the tool served by CallTool with opts, whose timeout and output
// budget the description states.
func ToolSchemaFor(opts *Options) *Tool {
	info, _ := inProcessInfo() // without an interpreter the description just omits it
	return toolSchema(info, opts)
}

// pythonInfo is what the description says about the interpreter.
type pythonInfo struct {
	Version   string   // "3.11.7"; empty when unknown
	Libraries []string // the importable ones of runtime.py's _COMMON_LIBRARIES
}

var inProcessInfoOnce = sync.OnceValues(func() (pythonInfo, error) {
	e, err := inProcess()
	if err != nil {
		return pythonInfo{}, err
	}
	return engineInfo(e, nil)
})

// inProcessInfo is engineInfo for the in-process interpreter, asked once per process.
func inProcessInfo() (pythonInfo, error) { return inProcessInfoOnce() }

// engineInfo asks e's interpreter for its version and importable libraries (through ns's
// worker for the isolated engine; the in-process one takes nil).
func engineInfo(e engine, ns *Namespace) (pythonInfo, error) {
	v, err := e.do(ns, pyrt.OpInfo)
	if err != nil {
		return pythonInfo{}, err
	}
	parts, _ := v.([]any)
	if len(parts) != 3 {
		return pythonInfo{}, errTruncated
	}
	var info pythonInfo
	info.Version, _ = parts[0].(string)
	libs, _ := parts[2].([]any)
	for _, l := range libs {
		if s, ok := l.(string); ok {
			info.Libraries = append(info.Libraries, s)
		}
	}
	return info, nil
}

// toolSchema builds the Tool for an interpreter described by info and the caller's opts.
func toolSchema(info pythonInfo, opts *Options) *Tool {
	limits := toolLimitsOf(opts)
	timeoutDoc := fmt.Sprintf("Seconds after which the run is stopped; default %s, at most %s.",
		seconds(limits.timeout), seconds(limits.maxTimeout))
	if limits.timeout < 0 {
		timeoutDoc = fmt.Sprintf("Seconds after which the run is stopped; default none, at most %s.",
			seconds(limits.maxTimeout))
	}
	desc := toolDescription(info, limits)
	if opts != nil {
		locals := opts.Locals
		if locals == opts.Globals {
			locals = nil
		}
		desc += functionsDescription(opts.Globals, locals)
	}
	return &Tool{
		Name:        ToolName,
		Description: desc,
		InputSchema: InputSchema{
			Type: "object",
			Properties: map[string]any{
				"code": map[string]any{
					"type":        "string",
					"description": "Python source to run, like a notebook cell: the value of its last expression is shown.",
				},
				"timeout": map[string]any{
					"type":        "number",
					"description": timeoutDoc,
				},
			},
			Required: []string{"code"},
		},
	}
}

func toolDescription(info pythonInfo, limits toolLimits) string {
	var b strings.Builder
	python := "Python"
	if info.Version != "" {
		python = "Python " + info.Version
	}
	fmt.Fprintf(&b, "Run Python code in a persistent %s interpreter and read what it printed and returned.\n", python)
	b.WriteString("- State persists between calls: variables, functions and imports from one call are there in the next.\n")
	b.WriteString("- The value of the last expression is shown, as in a notebook cell (end it with ';' to hide it); print() anything else.\n")
	b.WriteString("- IPython syntax works too: !shell commands (x = !cmd gives the lines), %pip install, %time, %timeit, %%bash, %%writefile, obj? for help.\n")
	b.WriteString("- display(obj) shows rich objects; matplotlib figures (plt.show(), or still open when the run ends) and PIL images come back as images, named in the text as [image N: ...].\n")
	b.WriteString("- The reply has labelled sections: [stdout], [stderr], [value], and [error] with the traceback or [timeout] when the run failed.\n")
	if limits.output > 0 {
		fmt.Fprintf(&b, "- Output beyond %d characters is truncated: the middle is cut and a marker says how much.\n", limits.output)
	}
	switch {
	case limits.timeout > 0:
		fmt.Fprintf(&b, "- A run is stopped after %s unless you pass \"timeout\" (seconds, at most %s).\n",
			seconds(limits.timeout), seconds(limits.maxTimeout))
	default:
		fmt.Fprintf(&b, "- A run has no time limit unless you pass \"timeout\" (seconds, at most %s).\n", seconds(limits.maxTimeout))
	}
	if len(info.Libraries) > 0 {
		fmt.Fprintf(&b, "- Importable besides the standard library: %s.", strings.Join(info.Libraries, ", "))
	} else {
		b.WriteString("- Only the standard library is known to be importable.")
	}
	return b.String()
}

// The tool description lists at most maxListedFunctions host functions, in at most
// maxFunctionsText bytes; the rest are counted.
const (
	maxListedFunctions = 60
	maxFunctionsText   = 6000
	maxFunctionDoc     = 160
)

// functionsDescription lists the host functions of the run's namespaces for the model, as
// Python signatures with their one-line docs, or returns "" when there are none.
func functionsDescription(spaces ...*Namespace) string {
	var fns []*hostFunc
	for _, ns := range spaces {
		if ns == nil || ns.engine == nil || !ns.isOpen() {
			continue
		}
		fns = append(fns, ns.engine.hosts().functions(ns.id)...)
	}
	if len(fns) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("\n- Functions of the host are defined in the code's namespace; call them from Python (help(name) shows one). " +
		"Their results are Python values, their errors raise minipy.HostError, and loops over them stay in the code: print only what you need.")
	shown := 0
	for _, hf := range fns {
		line := "\n  " + hf.signature()
		if doc := oneLine(hf.fn.Description, maxFunctionDoc); doc != "" {
			line += " — " + doc
		}
		if shown == maxListedFunctions || b.Len()+len(line) > maxFunctionsText {
			break
		}
		b.WriteString(line)
		shown++
	}
	if left := len(fns) - shown; left > 0 {
		fmt.Fprintf(&b, "\n  ... and %d more (dir() lists them, help(name) describes one).", left)
	}
	return b.String()
}

// oneLine is the first line of doc, cut to max bytes at a word.
func oneLine(doc string, max int) string {
	doc = strings.TrimSpace(doc)
	if i := strings.IndexByte(doc, '\n'); i >= 0 {
		doc = strings.TrimSpace(doc[:i])
	}
	if len(doc) <= max {
		return doc
	}
	cut := strings.LastIndexByte(doc[:max], ' ')
	if cut < max/2 {
		cut = max
		for cut > 0 && !utf8.RuneStart(doc[cut]) {
			cut--
		}
	}
	return strings.TrimRight(doc[:cut], " ,;:") + "..."
}

// seconds renders d for the model: "60 seconds", "1.5 seconds".
func seconds(d time.Duration) string {
	return strconv.FormatFloat(d.Seconds(), 'f', -1, 64) + " seconds"
}

// toolLimits are the timeout and output budget of tool calls made with some Options.
type toolLimits struct {
	timeout    time.Duration // default; negative: none
	maxTimeout time.Duration // most a model may ask for
	output     int           // character budget; negative: none
}

func toolLimitsOf(opts *Options) toolLimits {
	l := toolLimits{timeout: DefaultToolTimeout, maxTimeout: MaxToolTimeout, output: DefaultToolOutput}
	if opts == nil {
		return l
	}
	switch {
	case opts.Timeout > 0:
		l.timeout, l.maxTimeout = opts.Timeout, opts.Timeout
	case opts.Timeout < 0:
		l.timeout = -1
	}
	if opts.MaxOutput != 0 {
		l.output = opts.MaxOutput
	}
	return l
}
