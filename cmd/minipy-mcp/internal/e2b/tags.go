package e2b

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/minipy-go/minipy/cmd/minipy-mcp/internal/session"
)

// E2B's template tags (the SDK's Template.assignTags, removeTags, getTags). A template's
// builds are named by the template's name and name:tag for each of their tags
// (keepTemplate); POST /templates/tags gives the build a name:tag names more tags (each
// moves to it), DELETE /templates/tags takes tags off, GET /templates/{id}/tags lists
// them. A build that holds no name after a change is dropped, as one that a new build
// took every name from is. In the state store a snapshot's names are in its sealed meta
// and the newest that took a name holds it (snapstore.go): a build whose names change is
// stored again, its save copied under a new id with its new names, and the old one removed.

// tagName says why tag is not a tag's name ("" when it is one).
func tagName(tag string) string {
	if !nameOf(tag, "") {
		return fmt.Sprintf("tag %q: 1 to 128 letters, digits and . _ -", echo(tag))
	}
	return ""
}

// tagsRequest is the body of POST and DELETE /templates/tags (E2B's
// AssignTemplateTagsRequest, DeleteTemplateTagsRequest).
type tagsRequest struct {
	Target string   `json:"target"` // name:tag (name alone: name:default)
	Name   string   `json:"name"`
	Tags   []string `json:"tags"`
}

// readTags reads a tags request, checking its tags; false when it answered an error.
func readTags(w http.ResponseWriter, r *http.Request, req *tagsRequest) bool {
	if !readJSON(w, r, 1<<16, req) {
		return false
	}
	if len(req.Tags) == 0 || len(req.Tags) > 100 {
		writeError(w, http.StatusBadRequest, "tags: 1 to 100")
		return false
	}
	for _, tag := range req.Tags {
		if why := tagName(tag); why != "" {
			writeError(w, http.StatusBadRequest, why)
			return false
		}
	}
	return true
}

// templateBuild is user's build that name (a template's name:tag, or name alone) names.
func (s *Server) templateBuild(user, name string) *snapshot {
	for _, sn := range s.userSnapshots(user) {
		if sn.templateID != "" && slices.Contains(sn.names, name) {
			return sn
		}
	}
	return nil
}

// assignTags is POST /templates/tags: target's build takes the tags (201: them, its id).
func (s *Server) assignTags(w http.ResponseWriter, r *http.Request) {
	var req tagsRequest
	if !readTags(w, r, &req) {
		return
	}
	name, tag, _ := strings.Cut(req.Target, ":")
	if tag == "" {
		tag = "default"
	}
	user := userOf(r)
	sn := s.templateBuild(user, name+":"+tag)
	if sn == nil {
		writeError(w, http.StatusNotFound, "template "+echo(name+":"+tag)+" not found: tags name your templates' builds")
		return
	}
	var add []string
	for _, t := range req.Tags {
		add = append(add, name+":"+t)
	}
	if err := s.renameBuilds(user, sn.templateID, map[string][]string{sn.id: add}, nil); err != nil {
		writeError(w, http.StatusInternalServerError, "the tags could not be assigned: "+err.Error())
		return
	}
	writeJSON(w, http.StatusCreated, map[string]any{"tags": req.Tags, "buildID": sn.buildID})
}

// removeTags is DELETE /templates/tags: the tags come off the template's builds (204;
// 404 when none of them names one).
func (s *Server) removeTags(w http.ResponseWriter, r *http.Request) {
	var req tagsRequest
	if !readTags(w, r, &req) {
		return
	}
	user := userOf(r)
	var gone []string
	templateID := ""
	for _, t := range req.Tags {
		if sn := s.templateBuild(user, req.Name+":"+t); sn != nil {
			gone, templateID = append(gone, req.Name+":"+t), sn.templateID
		}
	}
	if len(gone) == 0 {
		writeError(w, http.StatusNotFound, "template "+echo(req.Name)+" has none of those tags")
		return
	}
	if err := s.renameBuilds(user, templateID, nil, gone); err != nil {
		writeError(w, http.StatusInternalServerError, "the tags could not be removed: "+err.Error())
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// templateTag is one of a template's tags (E2B's TemplateTag).
type templateTag struct {
	Tag       string    `json:"tag"`
	BuildID   string    `json:"buildID"`
	CreatedAt time.Time `json:"createdAt"`
}

// listTags is GET /templates/{id}/tags: the tags of the template of that id or name.
func (s *Server) listTags(w http.ResponseWriter, r *http.Request) {
	if r.PathValue("what") != "tags" {
		writeError(w, http.StatusNotFound, r.Method+" "+echo(r.URL.Path)+" is not part of what minipy serves of E2B's "+
			"API (docs/e2b.md lists what is)")
		return
	}
	builds := s.templateSnapshots(userOf(r), r.PathValue("id"))
	if len(builds) == 0 {
		writeError(w, http.StatusNotFound, "template "+echo(r.PathValue("id"))+" not found")
		return
	}
	out := []templateTag{}
	for _, sn := range builds {
		for _, n := range sn.names {
			if _, tag, ok := strings.Cut(n, ":"); ok {
				out = append(out, templateTag{Tag: tag, BuildID: sn.buildID, CreatedAt: sn.created})
			}
		}
	}
	slices.SortFunc(out, func(a, b templateTag) int { return strings.Compare(a.Tag, b.Tag) })
	writeJSON(w, http.StatusOK, out)
}

// renameBuilds changes the names of user's builds of the template of templateID: each
// build of add's ids takes its names (from whichever held them), and the names of remove
// come off whichever holds them; a build left holding none is dropped.
func (s *Server) renameBuilds(user, templateID string, add map[string][]string, remove []string) error {
	builds := s.templateSnapshots(user, templateID)
	taken := remove
	for _, names := range add {
		taken = append(taken, names...)
	}
	raw := s.storedNames(user) // (a stored build's names as sealed, those newer ones hold too)
	var changes []*snapshot    // (with their new names)
	for _, sn := range builds {
		names := slices.DeleteFunc(slices.Clone(sn.names), func(n string) bool { return slices.Contains(taken, n) })
		for _, n := range add[sn.id] {
			if !slices.Contains(names, n) {
				names = append(names, n)
			}
		}
		// A removed name must leave the builds that hold it beneath the one that held it
		// too, or it would fall back to them.
		shadowed := slices.ContainsFunc(raw[sn.id], func(n string) bool { return slices.Contains(remove, n) })
		if !slices.Equal(names, sn.names) || shadowed {
			c := *sn
			c.names = names
			changes = append(changes, &c)
		}
	}
	if s.cfg.Store == nil {
		s.mu.Lock()
		for _, c := range changes {
			if sn := s.snapshots[c.id]; sn != nil {
				sn.names = c.names
			}
		}
		s.mu.Unlock()
	}
	var errs []error
	for _, c := range changes {
		switch {
		case len(c.names) == 0:
			s.dropSnapshot(c)
		case c.stored:
			errs = append(errs, s.storeNames(c))
		}
	}
	return errors.Join(errs...)
}

// storedNames is user's stored snapshots' names as their metas hold them, by id (none
// without a store).
func (s *Server) storedNames(user string) map[string][]string {
	out := map[string][]string{}
	if s.cfg.Store == nil {
		return out
	}
	for _, one := range s.cfg.Store.List(session.KindSnapshot) {
		var ss storedSnapshot
		if one.User == user && json.Unmarshal(one.Init, &ss) == nil && ss.ID == one.ID {
			out[ss.ID] = append(ss.Names, ss.Name)
		}
	}
	return out
}

// storeNames stores the stored build sn again with its names (sn.names), as the newest
// snapshot: its save copied under a new id, the old one removed.
func (s *Server) storeNames(sn *snapshot) error {
	meta, blob, err := s.cfg.Store.Open(session.KindSnapshot, sn.id)
	if err != nil {
		return err
	}
	defer blob.Close()
	var ss storedSnapshot
	if err := json.Unmarshal(meta.Init, &ss); err != nil {
		return err
	}
	ss.ID, ss.Created = randomID(), time.Now()
	ss.setNames(sn.names)
	info, err := json.Marshal(ss)
	if err != nil {
		return err
	}
	if err := s.cfg.Store.SaveFrom(session.KindSnapshot, ss.ID, session.Meta{User: meta.User, Init: info},
		func(w io.Writer) error { _, err := io.Copy(w, blob); return err }); err != nil {
		return err
	}
	s.dropSnapshot(sn)
	return nil
}
