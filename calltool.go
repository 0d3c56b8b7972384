package minipy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/minipy-go/minipy/internal/pyrt"
)

// CallTool serves one call of the minipy tool (see ToolSchema) in the in-process
// interpreter: it parses the model's arguments, runs the code with opts as the base (its
// Globals are the session's namespace; see ToolSchemaFor for the timeout and output
// budget), and renders what the model should read back. isError is set for a Python
// error, a timeout, a cancelled run and arguments that could not be used; the text then
// says what happened (for bad arguments, how to call the tool correctly).
//
// The text is a sequence of labelled sections, each label on a line of its own, in this
// order and only when non-empty: [stdout], [stderr], [value], then one of [error],
// [timeout] or [cancelled]; a run with none of them gives "[no output]". When the
// sections exceed the budget, the longest are cut in the middle to a fair share of it,
// with a marker "[... N characters omitted ...]"; labels and short sections are kept.
// docs/tool.md shows examples; the format is pinned by the golden files in testdata/tool.
func CallTool(ctx context.Context, input json.RawMessage, opts *Options) (text string, isError bool) {
	e, err := inProcess()
	if err != nil {
		return renderError(err), true
	}
	r := callTool(ctx, e, input, opts)
	return r.Text, r.IsError
}

// ToolResult is what one call of the minipy tool gives the model: CallTool's text, and the
// images the code showed (display(), matplotlib figures, an image value), which the text
// names in place: the Nth image is the one it calls "[image N: PNG 640x480, 23 KB]". Send
// the images as images (Anthropic: image blocks in the tool_result; MCP: ImageContent;
// OpenAI chat: a user message with image_url parts after the tool message), never as text.
type ToolResult struct {
	Text    string
	Images  []Image
	IsError bool
	// Err is the run's error, for the host's logs and metrics (the model has the text): nil
	// when the code ran to its end, else what Run returns (match it with errors.Is and
	// errors.As), or an error matching ErrBadArguments when the model's arguments were not
	// a valid call and nothing ran.
	Err error
	// Duration is how long the run took (Result.Duration); 0 when nothing ran.
	Duration time.Duration
	// Files and MoreFiles are Result's: the files the run created or changed, for a host
	// that hands them to the model's client (minipy-mcp links them after the text), and
	// how many more there are (MoreFilesUnknown: some may be, how many is not known). The
	// text does not list them.
	Files     []FileInfo
	MoreFiles int
}

// CallToolResult is CallTool that also returns the images of the run.
func CallToolResult(ctx context.Context, input json.RawMessage, opts *Options) ToolResult {
	e, err := inProcess()
	if err != nil {
		return ToolResult{Text: renderError(err), IsError: true, Err: err}
	}
	return callTool(ctx, e, input, opts)
}

// callTool is CallToolResult on any engine.
func callTool(ctx context.Context, e engine, input json.RawMessage, opts *Options) ToolResult {
	limits := toolLimitsOf(opts)
	args, err := parseToolArguments(input)
	if err != nil {
		return ToolResult{Text: badArguments(err, limits), IsError: true, Err: fmt.Errorf("%w: %w", ErrBadArguments, err)}
	}
	run := Options{}
	if opts != nil {
		run = *opts
	}
	run.Timeout = limits.timeout
	capped := false
	if args.timeout > 0 {
		run.Timeout = args.timeout
		if args.timeout > limits.maxTimeout {
			run.Timeout, capped = limits.maxTimeout, true
		}
	}
	run.MaxOutput = limits.output
	res, err := e.run(ctx, args.code, &run)
	how := toolRun{timeout: run.Timeout, asked: args.timeout, capped: capped}
	r := ToolResult{Text: renderRun(res, err, how, limits.output), Images: res.Images(), IsError: err != nil, Err: err}
	if res != nil {
		r.Duration = res.Duration
		r.Files, r.MoreFiles = res.Files, res.MoreFiles
	}
	return r
}

// toolArguments are the model's arguments, decoded.
type toolArguments struct {
	code    string
	timeout time.Duration // 0: not given
}

// argumentError says what is wrong with the model's arguments.
type argumentError struct{ problem string }

func (e *argumentError) Error() string { return e.problem }

func badArgument(format string, args ...any) error {
	return &argumentError{problem: fmt.Sprintf(format, args...)}
}

// parseToolArguments decodes input, tolerating what models send besides the schema:
// arguments or code encoded twice as a JSON string, a timeout as a string ("30", "30s"),
// and fields the schema does not have (ignored).
func parseToolArguments(input json.RawMessage) (toolArguments, error) {
	var args toolArguments
	raw := bytes.TrimSpace(input)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return args, badArgument("no arguments were given")
	}
	if raw[0] == '"' {
		var inner string
		if err := json.Unmarshal(raw, &inner); err == nil {
			raw = bytes.TrimSpace([]byte(inner))
		}
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil || fields == nil {
		return args, badArgument("the arguments are not a JSON object")
	}
	rawCode, ok := fields["code"]
	if !ok || bytes.Equal(bytes.TrimSpace(rawCode), []byte("null")) {
		return args, badArgument(`"code" is missing`)
	}
	if err := json.Unmarshal(rawCode, &args.code); err != nil {
		return args, badArgument(`"code" must be a string of Python source`)
	}
	args.code = undoubleCode(args.code)
	if strings.TrimSpace(args.code) == "" {
		return args, badArgument(`"code" is empty`)
	}
	timeout, err := parseTimeout(fields["timeout"])
	if err != nil {
		return args, err
	}
	args.timeout = timeout
	return args, nil
}

// undoubleCode decodes code that is, as a whole, one JSON string literal: a model that
// encoded its code twice. A cell whose only statement is a double-quoted string would be
// pointless, so nothing real is lost.
func undoubleCode(code string) string {
	t := strings.TrimSpace(code)
	if len(t) < 2 || t[0] != '"' || t[len(t)-1] != '"' {
		return code
	}
	var inner string
	if err := json.Unmarshal([]byte(t), &inner); err != nil {
		return code
	}
	return inner
}

// parseTimeout reads the "timeout" argument: seconds as a number or a string, or a Go
// duration string; absent, null, empty, zero or negative mean "the default".
func parseTimeout(raw json.RawMessage) (time.Duration, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return 0, nil
	}
	bad := badArgument(`"timeout" must be a number of seconds, such as 30`)
	var secs float64
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return 0, bad
		}
		s = strings.TrimSpace(s)
		if s == "" {
			return 0, nil
		}
		if f, err := strconv.ParseFloat(s, 64); err == nil {
			secs = f
		} else if d, err := time.ParseDuration(s); err == nil {
			secs = d.Seconds()
		} else {
			return 0, bad
		}
	default:
		if err := json.Unmarshal(raw, &secs); err != nil {
			return 0, bad
		}
	}
	switch {
	case math.IsNaN(secs) || math.IsInf(secs, -1):
		return 0, bad
	case secs <= 0:
		return 0, nil
	case secs >= math.MaxInt64/float64(time.Second):
		return math.MaxInt64, nil
	}
	return time.Duration(secs * float64(time.Second)), nil
}

// badArguments is the text for arguments that could not be used: what is wrong and how
// to call the tool.
func badArguments(err error, limits toolLimits) string {
	var b strings.Builder
	fmt.Fprintf(&b, "[bad arguments]\n%s. Call %s with a JSON object such as "+
		`{"code": "import math\nmath.sqrt(2)", "timeout": 30}`+
		`: "code" (string, required) is the Python source; "timeout" (number, optional) is in seconds, at most %s.`+"\n",
		strings.TrimSuffix(err.Error(), "."), ToolName, seconds(limits.maxTimeout))
	return b.String()
}

// toolRun is what the renderer needs to know about how the run was bounded.
type toolRun struct {
	timeout time.Duration // the run's timeout; negative: none
	asked   time.Duration // the model's timeout; 0: none
	capped  bool          // asked was more than allowed
}

// textSection is one labelled part of the text a model reads.
type textSection struct {
	label string // "[stdout]"
	what  string // what a truncation marker calls the body: "stdout"
	body  string
}

// renderRun renders a run's result and error as the model reads them, within budget
// characters of section bodies (negative: no limit).
func renderRun(res *Result, err error, how toolRun, budget int) string {
	var sections []textSection
	add := func(label, body string) {
		if body != "" {
			sections = append(sections, textSection{label: label, what: strings.Trim(label, "[]"), body: body})
		}
	}
	if res != nil {
		add("[stdout]", res.Output())
		add("[stderr]", res.Stderr)
		if res.HasValue {
			add("[value]", res.ValueText())
		}
	}
	var interrupted *InterruptedError
	var py *PythonError
	switch {
	case err == nil:
		if len(sections) == 0 {
			return "[no output]\n"
		}
	case errors.As(err, &interrupted):
		add(interruptedSection(interrupted, how))
	case errors.As(err, &py):
		add("[error]", pythonErrorText(py))
	default:
		add("[error]", err.Error())
	}
	fitSections(sections, budget, budget)
	var b strings.Builder
	for _, s := range sections {
		b.WriteString(s.label)
		b.WriteByte('\n')
		b.WriteString(ensureNewline(s.body))
	}
	return b.String()
}

// fitSections truncates the bodies so that together they are at most budget characters,
// sharing it fairly: a section shorter than its share is kept whole and leaves the rest
// to the others, so a short error is never cut because the output was long. A body the
// runtime already cut at runtimeCap characters is cut again around its marker, so the
// count of what is left out stays true.
func fitSections(sections []textSection, budget, runtimeCap int) {
	if budget < 0 {
		return
	}
	sizes := make([]int, len(sections))
	total := 0
	for i, s := range sections {
		sizes[i] = utf8.RuneCountInString(s.body)
		total += sizes[i]
	}
	if total <= budget {
		return
	}
	whole := make([]bool, len(sections))
	left, open := budget, len(sections)
	for changed := true; changed && open > 0; {
		changed = false
		share := left / open
		for i, size := range sizes {
			if !whole[i] && size <= share {
				whole[i], changed = true, true
				left -= size
				open--
			}
		}
	}
	if open == 0 {
		return
	}
	share, extra := left/open, left%open
	for i := range sections {
		if whole[i] {
			continue
		}
		n := share
		if extra > 0 { // the first cut sections get the remainder
			n++
			extra--
		}
		body := sections[i].body
		if head, tail, omitted, what, ok := splitRuntimeCut(body, runtimeCap); ok {
			sections[i].body = cutMiddle(head, tail, omitted, n, what)
		} else {
			sections[i].body = truncateText(body, n, sections[i].what)
		}
	}
}

func interruptedSection(e *InterruptedError, how toolRun) (label, body string) {
	var b strings.Builder
	after := strconv.FormatFloat(e.After.Seconds(), 'f', 1, 64) + "s"
	switch {
	case errors.Is(e, context.DeadlineExceeded):
		label = "[timeout]"
		fmt.Fprintf(&b, "The run was stopped after %s: the host's deadline for this call passed.\n", after)
	case errors.Is(e, ErrTimeout):
		label = "[timeout]"
		fmt.Fprintf(&b, "The run was stopped after %s", after)
		switch {
		case how.capped:
			fmt.Fprintf(&b, ", the most it may take (%s; you asked for %s). Make the work fit in that time.\n",
				seconds(how.timeout), seconds(how.asked))
		case how.timeout > 0:
			fmt.Fprintf(&b, ", its timeout of %s. Pass a larger \"timeout\" if the work needs it, or make it faster.\n",
				seconds(how.timeout))
		default:
			b.WriteString(".\n")
		}
	default:
		label = "[cancelled]"
		fmt.Fprintf(&b, "The run was cancelled by the host after %s.\n", after)
	}
	switch {
	case e.Abandoned:
		b.WriteString("The code did not respond to the interrupt (a long call inside C code) and is still running; the next call waits for it to finish.\n")
	case e.Python != nil:
		// Without a Python error the code never started (the interpreter was busy).
		b.WriteString("Variables assigned before the stop are kept.\n")
		if e.Python.Traceback != "" {
			b.WriteString("Where it was stopped:\n")
			b.WriteString(e.Python.Traceback)
		}
	}
	return label, b.String()
}

// pythonErrorText is the traceback, or "Type: message" when there is none.
func pythonErrorText(e *PythonError) string {
	if e.Traceback != "" {
		return e.Traceback
	}
	return e.Error()
}

// renderError is the text for an error that is not the code's (the interpreter could not
// start).
func renderError(err error) string {
	return "[error]\n" + ensureNewline(err.Error())
}

func ensureNewline(s string) string {
	if strings.HasSuffix(s, "\n") {
		return s
	}
	return s + "\n"
}

// truncateText keeps the first and last halves of budget characters of text around a
// marker that says how many of what were left out; a negative budget keeps everything.
func truncateText(text string, budget int, what string) string {
	n := utf8.RuneCountInString(text)
	if budget < 0 || n <= budget {
		return text
	}
	return cutMiddle(text, text, 0, budget, what)
}

// cutMiddle joins the first half of budget characters of head and the last half of tail
// with a marker counting what is left out: the rest of both plus omitted.
func cutMiddle(head, tail string, omitted, budget int, what string) string {
	keepHead := budget / 2
	keepTail := budget - keepHead
	h := prefixRunes(head, keepHead)
	t := suffixRunes(tail, keepTail)
	if head == tail { // one text: what is left out is between the two kept parts
		omitted += utf8.RuneCountInString(head) - keepHead - keepTail
	} else {
		omitted += utf8.RuneCountInString(head) - utf8.RuneCountInString(h) +
			utf8.RuneCountInString(tail) - utf8.RuneCountInString(t)
	}
	return h + fmt.Sprintf(pyrt.Omitted, omitted, what) + t
}

// runtimeMarker is the marker runtime.py's output capture puts where it cut a stream.
var runtimeMarker = regexp.MustCompile("^" + strings.NewReplacer("%d", `(\d+)`, "%s", `(\w+)`).Replace(regexp.QuoteMeta(pyrt.Omitted)))

// splitRuntimeCut undoes the cut runtime.py made in body, capped at limit characters: the
// kept head and tail, and how many characters it left out. ok is false when body was not
// cut (a marker is only trusted at the exact place the capture puts it).
func splitRuntimeCut(body string, limit int) (head, tail string, omitted int, what string, ok bool) {
	if limit < 0 {
		return "", "", 0, "", false
	}
	head = prefixRunes(body, limit/2)
	m := runtimeMarker.FindStringSubmatchIndex(body[len(head):])
	if m == nil {
		return "", "", 0, "", false
	}
	rest := body[len(head):]
	tail = rest[m[1]:]
	if utf8.RuneCountInString(tail) != limit-limit/2 {
		return "", "", 0, "", false
	}
	omitted, err := strconv.Atoi(rest[m[2]:m[3]])
	if err != nil {
		return "", "", 0, "", false
	}
	return head, tail, omitted, rest[m[4]:m[5]], true
}

func prefixRunes(s string, n int) string {
	i := 0
	for ; n > 0 && i < len(s); n-- {
		_, size := utf8.DecodeRuneInString(s[i:])
		i += size
	}
	return s[:i]
}

func suffixRunes(s string, n int) string {
	i := len(s)
	for ; n > 0 && i > 0; n-- {
		_, size := utf8.DecodeLastRuneInString(s[:i])
		i -= size
	}
	return s[i:]
}
