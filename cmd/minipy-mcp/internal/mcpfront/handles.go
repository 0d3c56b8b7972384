package mcpfront

// Sessions as handles, for clients of MCP 2026-07-28 over HTTP, which has no protocol
// sessions (SEP-2567): the HTTP server's tools take an optional "session" argument. A call
// without one on a request of that revision starts a namespace and returns its handle (in
// the text and in structuredContent); the model passes it back on later calls, which then
// run there. (Over stdio the connection is the session, whatever the revision.) A
// handle belongs to the user who made it (-tokens), lives until it is idle for
// -session-timeout, and, with -state-dir, is saved and brought back as sessions are,
// across replicas. Its schema marks it "x-mcp-header": clients mirror it in the
// Mcp-Param-Session header, on which a load balancer can route (docs/deploy.md). A client
// of an earlier revision may pass a handle too; without one it keeps its session's
// namespace.

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/minipy-go/minipy"
	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/session"
)

const (
	// HandleArg is the tool argument that carries a handle, and HandleHeader the
	// x-mcp-header name clients mirror it in (Mcp-Param-Session).
	HandleArg    = "session"
	HandleHeader = "Session"
	// HandlePrefix starts every handle, so that a model and a log can tell one.
	HandlePrefix = "mpy_"
)

// handleSession is a namespace reached by its handle.
type handleSession struct {
	ns       *minipy.Namespace
	kept     *keptSession
	lastUsed time.Time
	inUse    int
}

// handleProperty is the "session" property of the tools' input schemas.
func handleProperty(idle time.Duration) map[string]any {
	life := "until it is idle for " + idle.String()
	if idle <= 0 {
		life = "until the server restarts"
	}
	return map[string]any{
		"type": "string",
		"description": "The session handle (" + HandlePrefix + "...) that an earlier call returned, if one did: the call " +
			"runs in that session, with its variables, imports and files; pass it back on every later call. A call " +
			"that got no handle keeps its variables without one. A session lives " + life + ".",
		"x-mcp-header": HandleHeader,
	}
}

// withHandleProperty adds the "session" property to a tool's input schema.
func withHandleProperty(schema map[string]any, idle time.Duration) map[string]any {
	props, _ := schema["properties"].(map[string]any)
	if props == nil {
		props = map[string]any{}
		schema["properties"] = props
	}
	props[HandleArg] = handleProperty(idle)
	return schema
}

// handleOf reads the "session" argument of a call ("" if none).
func handleOf(arguments json.RawMessage) (string, error) {
	var args map[string]json.RawMessage
	if json.Unmarshal(arguments, &args) != nil {
		return "", nil // (the tool itself says what is wrong with them)
	}
	raw, ok := args[HandleArg]
	if !ok || bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
		return "", nil
	}
	var h string
	if err := json.Unmarshal(raw, &h); err != nil {
		return "", errors.New(`"session" must be a string: the handle an earlier call returned`)
	}
	return strings.TrimSpace(h), nil
}

// newHandle is a fresh handle: 128 random bits.
func newHandle() string {
	var b [16]byte
	rand.Read(b[:]) //nolint:errcheck // crypto/rand.Read does not fail
	return HandlePrefix + base64.RawURLEncoding.EncodeToString(b[:])
}

func userOf(ctx context.Context, req *mcp.CallToolRequest) string {
	if extra := req.Extra; extra != nil && extra.TokenInfo != nil {
		return extra.TokenInfo.UserID
	}
	if info := auth.TokenInfoFromContext(ctx); info != nil {
		return info.UserID
	}
	return ""
}

// errUnknownHandle: no session has the handle (for this user), here or saved.
var errUnknownHandle = errors.New("unknown session")

// acquireHandle returns the namespace of handle h for user, bringing it back from
// -state-dir if this process does not hold it; the caller releases it (releaseHandle).
// An empty h makes a new one.
func (s *sessions) acquireHandle(ctx context.Context, h, user string) (string, *handleSession, error) {
	if h == "" {
		if s.gate != nil {
			if refusal := s.gate.Hold(user); refusal != "" {
				return "", nil, errors.New(refusal)
			}
		}
		h = newHandle()
		hs := &handleSession{ns: s.newNamespace(), kept: &keptSession{user: user}, lastUsed: time.Now(), inUse: 1}
		s.mu.Lock()
		s.handles[h] = hs
		s.mu.Unlock()
		if s.state != nil {
			s.state.TryLease(session.KindSession, h, user)
		}
		return h, hs, nil
	}
	s.mu.Lock()
	hs := s.handles[h]
	if hs != nil && hs.kept.user == user {
		hs.inUse++
		hs.lastUsed = time.Now()
		s.mu.Unlock()
		return h, hs, nil
	}
	s.mu.Unlock()
	if hs != nil || s.state == nil {
		return h, nil, errUnknownHandle
	}
	_, blob, err := s.state.ClaimOpen(ctx, session.KindSession, h, user)
	if errors.Is(err, fs.ErrNotExist) {
		return h, nil, errUnknownHandle
	}
	if err != nil {
		return h, nil, err
	}
	defer blob.Close()
	ns := s.newNamespace()
	if err := ns.Restore(blob); err != nil {
		ns.Close() //nolint:errcheck // freeing is best effort
		s.state.ReleaseLease(session.KindSession, h)
		return h, nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if other := s.handles[h]; other != nil { // brought back by a call that came at the same time
		ns.Close() //nolint:errcheck // freeing is best effort
		other.inUse++
		return h, other, nil
	}
	hs = &handleSession{ns: ns, kept: &keptSession{user: user}, lastUsed: time.Now(), inUse: 1}
	s.handles[h] = hs
	return h, hs, nil
}

// releaseHandle ends a call's use of handle h; changed notes that it ran code.
func (s *sessions) releaseHandle(h string, hs *handleSession, changed bool) {
	s.mu.Lock()
	hs.inUse--
	hs.lastUsed = time.Now()
	s.mu.Unlock()
	if changed && s.state != nil {
		k := hs.kept
		k.mu.Lock()
		k.dirty = true
		if k.timer == nil {
			k.timer = time.AfterFunc(s.stateIdle, func() { s.saveHandle(h, hs) })
		} else {
			k.timer.Reset(s.stateIdle)
		}
		k.mu.Unlock()
	}
}

// saveHandle saves handle h's namespace if it ran code since its last save.
func (s *sessions) saveHandle(h string, hs *handleSession) {
	k := hs.kept
	k.mu.Lock()
	defer k.mu.Unlock()
	if !k.dirty {
		return
	}
	k.dirty = false
	_, err := saveNamespace(s.state.Store, h, session.Meta{User: k.user}, hs.ns)
	k.saved(err, "a session handle")
}

// closeHandles ends the handles idle for longer than idle (all of them: idle < 0), after
// saving them (-state-dir).
func (s *sessions) closeHandles(idle time.Duration) {
	s.mu.Lock()
	var ending []string
	for h, hs := range s.handles {
		if idle < 0 || hs.inUse == 0 && time.Since(hs.lastUsed) > idle {
			ending = append(ending, h)
		}
	}
	s.mu.Unlock()
	for _, h := range ending {
		s.closeHandle(h)
	}
}

// closeHandle ends handle h here: saved (-state-dir), its lease given up, its namespace freed.
func (s *sessions) closeHandle(h string) {
	s.mu.Lock()
	hs := s.handles[h]
	delete(s.handles, h)
	s.mu.Unlock()
	if hs == nil {
		return
	}
	if s.state != nil {
		hs.kept.mu.Lock()
		if hs.kept.timer != nil {
			hs.kept.timer.Stop()
		}
		hs.kept.closed = true // (its last save is tried once)
		hs.kept.mu.Unlock()
		s.saveHandle(h, hs)
		s.state.ReleaseLease(session.KindSession, h)
	}
	hs.ns.Close() //nolint:errcheck // freeing is best effort
	if s.gate != nil {
		s.gate.Release(hs.kept.user)
	}
}

// expireHandles closes the handles idle for idle, every idle/4 (at least every second),
// until ctx ends.
func (s *sessions) expireHandles(ctx context.Context, idle time.Duration) {
	if idle <= 0 {
		return
	}
	t := time.NewTicker(max(idle/4, time.Second))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.closeHandles(idle)
		}
	}
}

// handleText is what a call that made a session adds to its reply.
func handleText(h string) string {
	return fmt.Sprintf("[session]\n%s: pass it as \"session\" in your next calls to keep these variables.\n", h)
}

// handleResult is a run's result in a handle's session: the text (with the handle, if the
// call made it) and images; the files it changed are named, not linked (resources/read
// reads a protocol session's files), and structuredContent carries the handle.
func handleResult(res minipy.ToolResult, h string, made bool) *mcp.CallToolResult {
	out := toolResult(res)
	kept := out.Content[:0]
	var files []string
	for _, c := range out.Content {
		if link, ok := c.(*mcp.ResourceLink); ok {
			files = append(files, link.Name)
			continue
		}
		kept = append(kept, c)
	}
	out.Content = kept
	text := out.Content[0].(*mcp.TextContent)
	if len(files) > 0 {
		text.Text = joinLines(text.Text, "[files]\n"+strings.Join(files, "\n")+"\n")
	}
	if made {
		text.Text = joinLines(text.Text, handleText(h))
	}
	out.StructuredContent = map[string]any{HandleArg: h}
	return out
}

// handleError is the reply to a call whose handle cannot be used.
func handleError(h string, err error) *mcp.CallToolResult {
	if errors.Is(err, errUnknownHandle) {
		return errorResult(fmt.Sprintf("The session %q is unknown: it expired, or was never made here. Nothing "+
			"ran. Call again without \"session\" to start a new session (its variables start empty).", h))
	}
	return errorResult("Nothing ran: " + err.Error())
}

// errorResult is a tool error with text.
func errorResult(text string) *mcp.CallToolResult {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "[error]\n" + text + "\n"}}, IsError: true}
}

// resetHandle empties handle h's namespace.
func (s *sessions) resetHandle(ctx context.Context, req *mcp.CallToolRequest, h string) *mcp.CallToolResult {
	h, hs, err := s.acquireHandle(ctx, h, userOf(ctx, req))
	if err != nil {
		return handleError(h, err)
	}
	fresh := s.newNamespace()
	s.mu.Lock()
	old := hs.ns
	hs.ns = fresh
	s.mu.Unlock()
	old.Close() //nolint:errcheck // freeing is best effort
	s.releaseHandle(h, hs, true)
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{
		Text: "[reset]\nThe namespace is empty: every variable, function, import and file of this session is gone.\n"}},
		StructuredContent: map[string]any{HandleArg: h}}
}

// liveHandle reports whether session handle h is in this replica's memory.
func (s *sessions) liveHandle(h string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.handles[h] != nil
}
