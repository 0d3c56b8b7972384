package e2b

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The template API's powers, probed as another user and as someone holding a URL: a
// template, its builds and its uploads are their user's; an upload URL takes the files of
// its template and hash alone, unaltered, bounded; a build's request is checked before a
// sandbox starts; a served template's name is no one's to take.
func TestTemplatesRefused(t *testing.T) {
	s, _ := newTestServer()
	s.cfg.MaxUpload = 100
	call := func(key, method, target, body string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(method, target, strings.NewReader(body))
		if key != "" {
			r.Header.Set("X-API-KEY", key)
		}
		w := httptest.NewRecorder()
		s.ServeHTTP(w, r)
		return w
	}
	assert.Equal(t, http.StatusBadRequest, call("ka", "POST", "/v3/templates", `{"name": "base"}`).Code, "a served name")
	assert.Equal(t, http.StatusBadRequest, call("ka", "POST", "/v3/templates", `{"name": "a b"}`).Code)
	assert.Equal(t, http.StatusBadRequest, call("ka", "POST", "/v3/templates", `{"name": "x", "tags": ["a b"]}`).Code)
	assert.Equal(t, http.StatusBadRequest, call("ka", "POST", "/templates/tags", `{"target": "x:v1", "tags": ["a/b"]}`).Code)
	assert.Equal(t, http.StatusBadRequest, call("ka", "POST", "/templates/tags", `{"target": "x:v1", "tags": []}`).Code)
	assert.Equal(t, http.StatusNotFound, call("ka", "POST", "/templates/tags", `{"target": "x:v1", "tags": ["p"]}`).Code)
	assert.Equal(t, http.StatusNotFound, call("ka", "DELETE", "/templates/tags", `{"name": "x", "tags": ["p"]}`).Code)
	assert.Equal(t, http.StatusNotFound, call("ka", "GET", "/templates/x/tags", "").Code)
	assert.Equal(t, http.StatusNotFound, call("ka", "GET", "/templates/x/other", "").Code)
	assert.Equal(t, http.StatusUnauthorized, call("", "POST", "/templates/tags", `{"target": "x", "tags": ["p"]}`).Code)
	assert.Equal(t, http.StatusUnauthorized, call("", "POST", "/v3/templates", `{"name": "x"}`).Code)
	w := call("ka", "POST", "/v3/templates", `{"name": "mine:v1"}`)
	require.Equal(t, http.StatusAccepted, w.Code)
	var made struct {
		TemplateID, BuildID string
		Names, Tags         []string
	}
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &made))
	assert.Equal(t, []string{"mine"}, made.Names)
	assert.Equal(t, []string{"v1"}, made.Tags)

	hash := strings.Repeat("ab", 32)
	files := "/templates/" + made.TemplateID + "/files/" + hash
	build := "/templates/" + made.TemplateID + "/builds/" + made.BuildID
	assert.Equal(t, http.StatusNotFound, call("kb", "GET", files, "").Code, "another user's template")
	assert.Equal(t, http.StatusNotFound, call("kb", "GET", build+"/status", "").Code)
	assert.Equal(t, http.StatusNotFound, call("kb", "POST", "/v2"+build, `{}`).Code)
	assert.Equal(t, http.StatusBadRequest, call("ka", "GET", "/templates/"+made.TemplateID+"/files/..%2f..", "").Code)

	w = call("ka", "GET", files, "")
	require.Equal(t, http.StatusCreated, w.Code)
	var link struct {
		Present bool
		URL     string
	}
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &link))
	assert.False(t, link.Present)
	u, err := url.Parse(link.URL)
	require.NoError(t, err)
	assert.Equal(t, files, u.Path)
	signed := u.RequestURI()
	q := u.Query()
	q.Set("signature", q.Get("signature")[1:]+"A")
	assert.Equal(t, http.StatusForbidden, call("", "PUT", files+"?"+q.Encode(), "tar").Code, "an altered signature")
	assert.Equal(t, http.StatusForbidden, call("", "PUT", strings.Replace(signed, hash, strings.Repeat("cd", 32), 1),
		"tar").Code, "other files")
	assert.Equal(t, http.StatusRequestEntityTooLarge, call("", "PUT", signed, strings.Repeat("x", 101)).Code)
	assert.Equal(t, http.StatusOK, call("", "PUT", signed, "tar").Code)
	require.NoError(t, json.Unmarshal(call("ka", "GET", files, "").Body.Bytes(), &link))
	assert.True(t, link.Present)

	w = call("kb", "POST", "/v3/templates", `{"name": "bobs"}`)
	require.Equal(t, http.StatusAccepted, w.Code)
	var bobs struct{ TemplateID string }
	require.NoError(t, json.Unmarshal(w.Body.Bytes(), &bobs))
	require.NoError(t, json.Unmarshal(call("kb", "GET", "/templates/"+bobs.TemplateID+"/files/"+hash, "").Body.Bytes(), &link))
	assert.False(t, link.Present, "alice's upload is hers")

	for _, body := range []string{`{"fromImage": "ubuntu:22.04"}`, `{"fromTemplate": "bobs"}`,
		`{"steps": [{"type": "ADD", "args": ["x"]}]}`, `{"steps": [{"type": "RUN"}]}`, `{"fromImage": 1}`} {
		w := call("ka", "POST", "/v2"+build, body)
		assert.Equal(t, http.StatusBadRequest, w.Code, body)
	}
	var status struct{ Status string }
	require.NoError(t, json.Unmarshal(call("ka", "GET", build+"/status?logsOffset=0", "").Body.Bytes(), &status))
	assert.Equal(t, "waiting", status.Status, "nothing started")
	assert.Equal(t, http.StatusBadRequest, call("ka", "GET", build+"/status?logsOffset=-1", "").Code)
	assert.Equal(t, http.StatusBadRequest, call("ka", "GET", build+"/status?logsOffset=12abc", "").Code)

	delete(s.sandboxes, "sb1") // (the test server's, which runs nothing to end)
	s.EndUser("alice")         // (a revoked key: the user's uploads go with it)
	require.NoError(t, json.Unmarshal(call("ka", "GET", files, "").Body.Bytes(), &link))
	assert.False(t, link.Present, "a revoked user's uploads are forgotten")
	assert.Equal(t, http.StatusNotFound, call("kb", "DELETE", "/templates/"+made.TemplateID, "").Code)
	assert.Equal(t, http.StatusNoContent, call("ka", "DELETE", "/templates/mine", "").Code)
	assert.Equal(t, http.StatusNotFound, call("ka", "GET", build+"/status", "").Code, "deleted")
	assert.Equal(t, http.StatusForbidden, call("", "PUT", signed, "tar").Code, "the template is gone")
}
