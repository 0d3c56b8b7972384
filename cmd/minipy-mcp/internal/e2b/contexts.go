package e2b

import (
	"fmt"
	"net/http"
	"slices"
)

// contextBody is a code context as the code interpreter describes it.
type contextBody struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
}

func (cc *codeContext) body() contextBody {
	return contextBody{ID: cc.id, Language: cc.language, Cwd: cc.cwd}
}

func (s *Server) listContexts(w http.ResponseWriter, r *http.Request) {
	sb := sandboxOf(r)
	sb.mu.Lock()
	out := make([]contextBody, 0, len(sb.contexts))
	for _, cc := range sb.contexts {
		out = append(out, cc.body())
	}
	sb.mu.Unlock()
	writeJSON(w, http.StatusOK, out)
}

// createContext makes a code context: a namespace of its own, with fresh variables, or a
// shell of its own (bash.go), in the cwd asked for (the sandbox's working directory by
// default).
func (s *Server) createContext(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Language string `json:"language"`
		Cwd      string `json:"cwd"`
	}
	if !readJSON(w, r, 1<<16, &req) {
		return
	}
	language, ok := languageOf(w, req.Language)
	if !ok {
		return
	}
	sb := sandboxOf(r)
	sb.mu.Lock()
	full := len(sb.contexts) >= s.cfg.MaxContexts
	sb.mu.Unlock()
	if full {
		writeError(w, http.StatusTooManyRequests, fmt.Sprintf("a sandbox holds at most %d code contexts; remove one first",
			s.cfg.MaxContexts))
		return
	}
	cc, code, why := s.newContext(sb, language, req.Cwd)
	if cc == nil {
		writeError(w, code, why)
		return
	}
	sb.mu.Lock()
	if sb.dead || sb.state != stateRunning { // (its place would outlive it: places.go)
		sb.mu.Unlock()
		cc.close()
		writeError(w, http.StatusBadGateway, "the sandbox "+sb.id+" was killed or paused meanwhile")
		return
	}
	sb.contexts = append(sb.contexts, cc)
	sb.mu.Unlock()
	writeJSON(w, http.StatusOK, cc.body())
}

// removeContext closes a code context; the default one stays (E2B's cannot be removed
// either).
func (s *Server) removeContext(w http.ResponseWriter, r *http.Request) {
	sb, id := sandboxOf(r), r.PathValue("id")
	sb.mu.Lock()
	i := slices.IndexFunc(sb.contexts, func(cc *codeContext) bool { return cc.id == id })
	var cc *codeContext
	if i > 0 {
		cc = sb.contexts[i]
		sb.contexts = slices.Delete(sb.contexts, i, i+1)
	}
	sb.mu.Unlock()
	switch {
	case i == 0:
		writeError(w, http.StatusBadRequest, "the sandbox's default context cannot be removed (restart it instead)")
	case cc == nil:
		writeError(w, http.StatusNotFound, "context "+echo(id)+" not found")
	default:
		cc.close()
		w.WriteHeader(http.StatusNoContent)
	}
}

// restartContext gives a code context fresh variables: a new namespace in its place (a new
// shell at its next cell, for bash), after the run in progress, if any.
func (s *Server) restartContext(w http.ResponseWriter, r *http.Request) {
	sb := sandboxOf(r)
	cc := sb.context(r.PathValue("id"))
	if cc == nil || r.PathValue("id") == "" {
		writeError(w, http.StatusNotFound, "context "+echo(r.PathValue("id"))+" not found")
		return
	}
	if cc.language == langBash {
		cc.restartShell()
		w.WriteHeader(http.StatusNoContent)
		return
	}
	fresh := s.cfg.Engine.NewNamespace()
	if _, err := s.setUpFor(sb, fresh, cc.cwd); err != nil {
		fresh.Close() //nolint:errcheck // closing a namespace does not fail
		writeError(w, http.StatusInternalServerError, "the context did not restart: "+err.Error())
		return
	}
	cc.mu.Lock()
	old := cc.ns.Swap(fresh)
	cc.count = 0
	sb.mu.Lock()
	gone := !sb.holds(cc) // killed, paused, or removed meanwhile: its close may have closed either namespace
	sb.mu.Unlock()
	cc.mu.Unlock()
	old.Close() //nolint:errcheck // closing a namespace does not fail
	if gone {
		fresh.Close() //nolint:errcheck // closing a namespace does not fail
	}
	w.WriteHeader(http.StatusNoContent)
}
