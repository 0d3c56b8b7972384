package e2b

import (
	"encoding/json"
	"io"
	"slices"
	"time"

	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/session"
)

// Snapshots in the state store (Config.Store): each is sealed there as a paused sandbox
// is (its head, then each context's save, streamed: the server holds a chunk at a time),
// under session.KindSnapshot, so that it outlives the server and every replica sharing the
// store serves it. Its bytes count with the paused sandboxes' in the store (MaxPausedBytes,
// a quarter per user); it lives until it is deleted or the store's TTL (-state-ttl) ends
// it, as every save there. A name is kept with the snapshot that took it: the newest
// snapshot that took a name holds it (the name moves, as E2B's does, without rewriting
// the older one's save).

// storedSnapshot is what a stored snapshot's meta holds (session.Meta.Init).
type storedSnapshot struct {
	ID         string    `json:"id"`
	SandboxID  string    `json:"sandboxID"`
	Template   string    `json:"template"`
	Name       string    `json:"name,omitempty"`
	Names      []string  `json:"names,omitempty"` // (more than one: a template's, with its tags)
	Created    time.Time `json:"created"`
	TemplateID string    `json:"templateID,omitempty"` // snapshot.templateID
	BuildID    string    `json:"buildID,omitempty"`    // snapshot.buildID
}

// storedSnapshots is user's snapshots in the store, newest first, each name held by the
// newest that took it.
func (s *Server) storedSnapshots(user string) []*snapshot {
	var out []*snapshot
	for _, one := range s.cfg.Store.List(session.KindSnapshot) {
		var ss storedSnapshot
		if one.User != user || json.Unmarshal(one.Init, &ss) != nil || ss.ID != one.ID {
			continue
		}
		sn := &snapshot{id: ss.ID, user: user, sandboxID: ss.SandboxID, template: ss.Template, created: ss.Created,
			size: one.Size, stored: true, templateID: ss.TemplateID, buildID: ss.BuildID, names: ss.Names}
		if ss.Name != "" && len(ss.Names) == 0 {
			sn.names = []string{ss.Name}
		}
		out = append(out, sn)
	}
	slices.SortFunc(out, func(a, b *snapshot) int {
		return -listPlace{a.created, a.id}.compare(listPlace{b.created, b.id})
	})
	taken := map[string]bool{}
	for _, sn := range out {
		sn.names = slices.DeleteFunc(sn.names, func(n string) bool { return taken[n] })
		for _, n := range sn.names {
			taken[n] = true
		}
	}
	return out
}

// storedSnapshot is user's snapshot of id in the store, or nil (its names are not read:
// storedSnapshots says which it holds).
func (s *Server) storedSnapshot(user, id string) *snapshot {
	meta, err := s.cfg.Store.Stat(session.KindSnapshot, id)
	var ss storedSnapshot
	if err != nil || meta.User != user || json.Unmarshal(meta.Init, &ss) != nil || ss.ID != id {
		return nil
	}
	return &snapshot{id: ss.ID, user: user, sandboxID: ss.SandboxID, template: ss.Template, created: ss.Created, stored: true,
		templateID: ss.TemplateID, buildID: ss.BuildID}
}

// storeSnapshot seals sn, sb's contexts saved now, into the store; sn.size is set.
func (s *Server) storeSnapshot(sb *sandbox, sn *snapshot, contexts []*codeContext) error {
	ss := storedSnapshot{ID: sn.id, SandboxID: sn.sandboxID, Template: sn.template, Created: sn.created,
		TemplateID: sn.templateID, BuildID: sn.buildID}
	ss.setNames(sn.names)
	info, err := json.Marshal(ss)
	if err != nil {
		return err
	}
	head := storedHead{Envs: sn.envs, Template: sn.start, Streamed: true}
	sn.size, err = s.storeContexts(session.KindSnapshot, sn.id, session.Meta{User: sb.user, Init: info}, head, contexts, false)
	return err
}

// setNames sets ss's names: one in Name (as saves before templates had it), several in
// Names.
func (ss *storedSnapshot) setNames(names []string) {
	ss.Name, ss.Names = "", nil
	switch {
	case len(names) == 1:
		ss.Name = names[0]
	case len(names) > 1:
		ss.Names = names
	}
}

// openSnapshot opens a stored snapshot's contexts, each streaming its save from the store
// in turn, and its head (its environment, a template's start); close the closer once they
// are restored.
func (s *Server) openSnapshot(sn *snapshot) (storedHead, []pausedContext, io.Closer, error) {
	_, blob, err := s.cfg.Store.Open(session.KindSnapshot, sn.id)
	if err != nil {
		return storedHead{}, nil, nil, err
	}
	head, paused, err := readStored(blob)
	if err != nil {
		blob.Close()
		return storedHead{}, nil, nil, err
	}
	return head, paused, blob, nil
}
