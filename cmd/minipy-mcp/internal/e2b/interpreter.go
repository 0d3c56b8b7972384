package e2b

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/minipy-go/minipy"
	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/session"
)

// The code interpreter (port 49999): /execute runs code in a context and streams what it
// does as NDJSON, one message a line, as E2B's server does: number_of_executions first,
// then stdout and stderr as the code writes them, then the results (each display, then
// the value), then the error if it raised.

func (s *Server) interpreterRoutes() {
	s.interpreter = http.NewServeMux()
	s.interpreter.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, "OK")
	})
	s.interpreter.HandleFunc("POST /execute", s.execute)
	s.interpreter.HandleFunc("GET /contexts", s.listContexts)
	s.interpreter.HandleFunc("POST /contexts", s.createContext)
	s.interpreter.HandleFunc("DELETE /contexts/{id}", s.removeContext)
	s.interpreter.HandleFunc("POST /contexts/{id}/restart", s.restartContext)
	s.interpreter.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, r.Method+" "+echo(r.URL.Path)+" is not part of the code interpreter")
	})
}

// maxCode caps an execution's request body.
const maxCode = 16 << 20

// languageOf is the language a request names, as E2B's server reads it ("" is Python):
// Python, or bash (bash.go); another is refused (false, 400 written).
func languageOf(w http.ResponseWriter, language string) (string, bool) {
	switch strings.ToLower(strings.TrimSpace(language)) {
	case "", "python", "python3":
		return "python", true
	case langBash:
		return langBash, true
	}
	writeError(w, http.StatusBadRequest, "language "+echo(language)+": minipy runs Python and bash only")
	return "", false
}

func (s *Server) execute(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Code      string            `json:"code"`
		ContextID string            `json:"context_id"`
		Language  string            `json:"language"`
		EnvVars   map[string]string `json:"env_vars"`
	}
	if !readJSON(w, r, maxCode, &req) {
		return
	}
	language, ok := languageOf(w, req.Language)
	if !ok {
		return
	}
	if req.ContextID != "" && req.Language != "" { // (E2B's server refuses both too)
		writeError(w, http.StatusBadRequest, "give a context or a language, not both: a context has its language")
		return
	}
	if why := checkEnvs(req.EnvVars); why != "" {
		writeError(w, http.StatusBadRequest, why)
		return
	}
	sb := sandboxOf(r)
	cc := sb.context(req.ContextID)
	if language == langBash {
		var code int
		var why string
		if cc, code, why = s.defaultBash(sb); cc == nil {
			writeError(w, code, why)
			return
		}
	}
	if cc == nil {
		writeError(w, http.StatusNotFound, "context "+echo(req.ContextID)+" not found")
		return
	}
	ctx, stop := context.WithCancel(r.Context())
	defer stop()
	defer context.AfterFunc(sb.ctx, stop)()
	s.count(&s.stats.Executed)
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if cc.language == langBash {
		s.executeBash(ctx, w, r, sb, cc, req.Code, req.EnvVars)
		return
	}
	cc.count++
	out := &stream{w: w}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	out.send(map[string]any{"type": "number_of_executions", "execution_count": cc.count})
	res, err := s.run(ctx, cc.ns.Load(), req.Code, req.EnvVars, out)
	if idle, lost := session.StateLost(err); lost && s.restoreFromIdle(sb, cc) && idle {
		// Its sandbox's pid 1 died between runs: back as it was at its last save, it runs
		// the code, which did not start. (Died during the run, it is back all the same, and
		// the run's error stands: the code may have run.)
		res, err = s.run(ctx, cc.ns.Load(), req.Code, req.EnvVars, out)
	}
	if ctx.Err() != nil && r.Context().Err() != nil {
		return // the client went away: nobody reads the rest
	}
	if res != nil {
		for _, m := range results(res) {
			out.send(m)
		}
	}
	if err != nil {
		if sb.ctx.Err() != nil {
			// Killed during the run (the API's kill, its timeout): the connection drops, as
			// E2B's does when its sandbox goes, and the SDK raises its TimeoutError ("the
			// sandbox was killed while the request was in progress"), not a run's error.
			panic(http.ErrAbortHandler)
		}
		out.send(errorMessage(err))
	}
}

// run runs code in ns, with envs set for this run only, its output live on out.
func (s *Server) run(ctx context.Context, ns *minipy.Namespace, code string, envs map[string]string, out *stream) (*minipy.Result, error) {
	if len(envs) > 0 {
		restore, err := s.setEnvs(ctx, ns, envs)
		if err != nil {
			return nil, err
		}
		defer restore()
	}
	stdout, stderr := out.writer("stdout"), out.writer("stderr")
	opts := &minipy.Options{Globals: ns, Timeout: s.cfg.Timeout, MaxOutput: s.cfg.MaxOutput, Stdout: stdout, Stderr: stderr}
	start := time.Now()
	res, err := s.cfg.Engine.Run(ctx, code, opts)
	s.cfg.Metrics.ObserveRun(err, time.Since(start))
	stdout.flush()
	stderr.flush()
	return res, err
}

// setEnvs sets an execution's own environment variables; restore puts back what they were.
func (s *Server) setEnvs(ctx context.Context, ns *minipy.Namespace, envs map[string]string) (restore func(), err error) {
	env := make(map[string]any, len(envs))
	for k, v := range envs {
		env[k] = v
	}
	if err := ns.Set("_e2b_env", env); err != nil {
		return nil, err
	}
	quiet := &minipy.Options{Globals: ns, Timeout: 10 * time.Second}
	if _, err := s.cfg.Engine.Run(ctx, setEnvsCode, quiet); err != nil {
		return nil, err
	}
	return func() {
		s.cfg.Engine.Run(context.Background(), restoreEnvsCode, quiet) //nolint:errcheck // the namespace may be gone
	}, nil
}

const setEnvsCode = `import os as _e2b_os
_e2b_saved = {k: _e2b_os.environ.get(k) for k in _e2b_env}
_e2b_os.environ.update(_e2b_env)
del _e2b_env, _e2b_os`

const restoreEnvsCode = `import os as _e2b_os
for _e2b_k, _e2b_v in _e2b_saved.items():
    if _e2b_v is None:
        _e2b_os.environ.pop(_e2b_k, None)
    else:
        _e2b_os.environ[_e2b_k] = _e2b_v
del _e2b_saved, _e2b_os
try:
    del _e2b_k, _e2b_v
except NameError:
    pass`

// stream writes an execution's NDJSON messages, one at a time, each flushed.
type stream struct {
	mu sync.Mutex
	w  http.ResponseWriter
}

func (o *stream) send(msg map[string]any) {
	line, err := json.Marshal(msg)
	if err != nil {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.w.Write(append(line, '\n')) //nolint:errcheck // the client went away: the run goes on to its end
	if f, ok := o.w.(http.Flusher); ok {
		f.Flush()
	}
}

// writer is a live output stream as messages of type kind (stdout or stderr), a line or
// more each (ipykernel's stream sends what a flush gives it, and print writes a line in
// pieces): what follows the last line end waits for the next one, or for the run's end
// (flush), or goes at maxPending.
func (o *stream) writer(kind string) *streamWriter { return &streamWriter{o: o, kind: kind} }

const maxPending = 64 << 10

type streamWriter struct {
	o    *stream
	kind string

	mu      sync.Mutex
	pending []byte
}

func (sw *streamWriter) Write(p []byte) (int, error) {
	sw.mu.Lock()
	defer sw.mu.Unlock()
	sw.pending = append(sw.pending, p...)
	cut := bytes.LastIndexAny(sw.pending, "\n\r") + 1
	if len(sw.pending) >= maxPending {
		cut = len(sw.pending)
		start := cut - 1 // the last character's first byte
		for start > 0 && cut-start < utf8.UTFMax && !utf8.RuneStart(sw.pending[start]) {
			start--
		}
		if !utf8.FullRune(sw.pending[start:]) {
			cut = start // a character in pieces waits for the rest of it
		}
	}
	sw.send(cut)
	return len(p), nil
}

// flush sends what waits for a line end.
func (sw *streamWriter) flush() {
	sw.mu.Lock()
	defer sw.mu.Unlock()
	sw.send(len(sw.pending))
}

func (sw *streamWriter) send(n int) {
	if n <= 0 {
		return
	}
	sw.o.send(map[string]any{"type": sw.kind, "text": string(sw.pending[:n]),
		"timestamp": time.Now().UTC().Format(time.RFC3339Nano)})
	sw.pending = append(sw.pending[:0], sw.pending[n:]...)
}

// results are a run's result messages: its displays in order, then its value, the main
// result, when no display is it.
func results(res *minipy.Result) []map[string]any {
	var out []map[string]any
	main := false
	for _, d := range res.Displays {
		out = append(out, resultMessage(d.Data, d.Value))
		main = main || d.Value
	}
	if res.HasValue && !main {
		out = append(out, resultMessage(map[string][]byte{"text/plain": []byte(res.Repr)}, true))
	}
	return out
}

// mimeKeys are the result fields of E2B's MIME types; others go under their MIME type.
var mimeKeys = map[string]string{
	"text/plain": "text", "text/html": "html", "text/markdown": "markdown", "image/svg+xml": "svg",
	"image/png": "png", "image/jpeg": "jpeg", "application/pdf": "pdf", "text/latex": "latex",
	"application/json": "json", "application/javascript": "javascript", "e2b/data": "data",
	"e2b/chart": "chart",
}

// resultMessage is a display's data as E2B's result: text forms as text, binary ones
// (images, PDF) base64, JSON as JSON. Like E2B's server, it takes the quotes off a text
// form that is a quoted string ('hello' is hello).
func resultMessage(data map[string][]byte, main bool) map[string]any {
	msg := map[string]any{"type": "result", "is_main_result": main}
	for mime, b := range data {
		key, ok := mimeKeys[mime]
		if !ok {
			key = mime
		}
		switch {
		case (mime == "application/json" || mime == "e2b/data" || mime == "e2b/chart") && json.Valid(b):
			msg[key] = json.RawMessage(b)
		case strings.HasPrefix(mime, "text/") || mime == "image/svg+xml" || strings.HasSuffix(mime, "javascript"):
			msg[key] = string(b)
		default:
			msg[key] = base64.StdEncoding.EncodeToString(b)
		}
	}
	if t, ok := msg["text"].(string); ok && len(t) >= 2 && strings.HasPrefix(t, "'") && strings.HasSuffix(t, "'") {
		msg["text"] = t[1 : len(t)-1]
	}
	return msg
}

// errorMessage is a run's error as E2B's: the exception's name, value and traceback.
func errorMessage(err error) map[string]any {
	msg := map[string]any{"type": "error"}
	var pe *minipy.PythonError
	var ie *minipy.InterruptedError
	switch {
	case errors.As(err, &ie):
		msg["name"], msg["value"], msg["traceback"] = "TimeoutError", ie.Error(), ""
		if ie.Python != nil {
			msg["traceback"] = ie.Python.Traceback
		}
	case errors.As(err, &pe):
		msg["name"], msg["value"], msg["traceback"] = pe.Type, pe.Message, pe.Traceback
	default:
		msg["name"], msg["value"], msg["traceback"] = "SandboxError", err.Error(), ""
	}
	return msg
}
