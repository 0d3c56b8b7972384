package e2b

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"time"
)

// E2B's fork (POST /sandboxes/{id}/fork, the SDK's sandbox.fork and Sandbox.fork): count
// new sandboxes of the same user, each with a copy of every code context as it is between
// runs (its variables and its files: what a pause keeps), its own id and access token, the
// sandbox's template, metadata and environment; the sandbox itself goes on. Each fork is a
// sandbox like any other, under the same caps, and apart from the sandbox and from the other
// forks: in processes and working directories of its own.

// maxForks caps the forks of one request (E2B's count is at most 100).
const maxForks = 100

// forkRequest is the body of a fork (E2B's SandboxForkRequest).
type forkRequest struct {
	Timeout *int `json:"timeout"` // seconds
	Count   *int `json:"count"`
}

// forkResult is one fork's outcome (E2B's SandboxForkResult): its sandbox, or why it was
// not started.
type forkResult struct {
	Sandbox *sandboxBody `json:"sandbox,omitempty"`
	Error   *apiError    `json:"error,omitempty"`
}

// fork checks the request before its key and before it looks the sandbox up, as E2B's API
// validates a body against its schema first: a count of 0 is a 400 for any id and key, not
// a 401 or a 404. The body read is bounded (64 KiB) for a caller without a key as well.
func (s *Server) fork(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<16))
	if err != nil {
		writeError(w, http.StatusBadRequest, "the request's body: "+err.Error())
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body)) // (again, for a forward to the replica that runs it)
	var req forkRequest
	if len(bytes.TrimSpace(body)) > 0 {
		if err := json.Unmarshal(body, &req); err != nil {
			writeError(w, http.StatusBadRequest, "the request's body is not the JSON expected: "+err.Error())
			return
		}
	}
	count := 1
	if req.Count != nil {
		count = *req.Count
	}
	if count < 1 || count > maxForks {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("count %d: from 1 to %d forks", count, maxForks))
		return
	}
	life, why := s.life(req.Timeout)
	if why != "" {
		writeError(w, http.StatusBadRequest, why)
		return
	}
	s.authed(s.owned(s.awake(func(w http.ResponseWriter, r *http.Request, sb *sandbox) {
		s.forkAs(w, sb, count, life)
	})))(w, r)
}

// forkAs answers a checked fork of sb: count forks, each to live life.
func (s *Server) forkAs(w http.ResponseWriter, sb *sandbox, count int, life time.Duration) {
	if !sb.running() {
		writeError(w, http.StatusConflict, "sandbox "+sb.id+" is paused, or being paused or resumed: resume it first")
		return
	}
	sb.mu.Lock()
	contexts := slices.Clone(sb.contexts)
	sb.mu.Unlock()
	saved, _, err := saveContexts(contexts, false) // (once for all the forks, after the runs in progress)
	if err != nil {
		if sb.ctx.Err() != nil {
			writeError(w, http.StatusNotFound, "sandbox "+sb.id+" was killed")
			return
		}
		writeError(w, http.StatusInternalServerError, "the sandbox could not be forked: "+err.Error())
		return
	}
	out := make([]forkResult, count)
	for i := range out {
		if f, code, why := s.forkOf(sb, saved, life); f != nil {
			body := f.body()
			out[i].Sandbox = &body
		} else {
			out[i].Error = &apiError{Code: code, Message: why}
		}
	}
	writeJSON(w, http.StatusCreated, out)
}

// copyOf is a copy of sb whose contexts are saved, to live life, not yet registered nor
// started: a fork's, or the one a template's build checks its start command in.
func (s *Server) copyOf(sb *sandbox, saved []pausedContext, life time.Duration) (*sandbox, int, string) {
	f := s.sandboxFor(sb.user, sb.template, maps.Clone(sb.metadata), maps.Clone(sb.envs), sb.autoPause, life)
	f.autoCold, f.ports, f.egress, f.tmpl = sb.autoCold, sb.ports, sb.egress, sb.tmpl
	contexts, code, why := s.restoreContexts(f, saved)
	if code != 0 {
		f.cancel()
		return nil, code, why
	}
	f.contexts = contexts
	return f, 0, ""
}

// forkOf starts a fork of sb whose contexts are saved, to live life.
func (s *Server) forkOf(sb *sandbox, saved []pausedContext, life time.Duration) (*sandbox, int, string) {
	f, code, why := s.copyOf(sb, saved, life)
	if f == nil {
		return nil, code, why
	}
	contexts := f.contexts
	if code, why := s.startTemplate(f); code != 0 { // (a boot: the processes are not copied)
		f.cancel()
		for _, cc := range contexts {
			cc.close()
		}
		return nil, code, why
	}
	if code, why := s.register(f, life); code != 0 {
		return nil, code, why
	}
	s.logf("minipy-mcp: E2B sandbox %s of user %q forked from %s (%v)", f.id, f.user, sb.id, life)
	return f, 0, ""
}
