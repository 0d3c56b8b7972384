package e2b

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/minipy-go/minipy"
)

// startupServer serves sandboxes whose workers run Startup, as minipy-mcp -e2b's do.
func startupServer(t *testing.T) string {
	eng, err := minipy.NewIsolated(minipy.IsolatedConfig{WorkDirPath: Home, Spares: -1, Startup: Startup})
	require.NoError(t, err)
	t.Cleanup(func() { eng.Close() })
	s := New(Config{Engine: eng})
	srv := httptest.NewServer(s)
	t.Cleanup(func() { srv.Close(); s.Close() })
	return srv.URL
}

// execute runs code in sandbox sb through the interpreter's /execute (port 49999): its
// NDJSON messages.
func execute(t *testing.T, base string, sb map[string]any, code string) []map[string]any {
	t.Helper()
	js, err := json.Marshal(map[string]string{"code": code})
	require.NoError(t, err)
	req, err := http.NewRequest("POST", base+"/execute", bytes.NewReader(js))
	require.NoError(t, err)
	toInterpreter(req, sb)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var msgs []map[string]any
	lines := bufio.NewScanner(resp.Body)
	lines.Buffer(nil, 16<<20)
	for lines.Scan() {
		var m map[string]any
		require.NoError(t, json.Unmarshal(lines.Bytes(), &m))
		msgs = append(msgs, m)
	}
	require.NoError(t, lines.Err())
	return msgs
}

// ofType is msgs' messages of type typ.
func ofType(msgs []map[string]any, typ string) []map[string]any {
	var out []map[string]any
	for _, m := range msgs {
		if m["type"] == typ {
			out = append(out, m)
		}
	}
	return out
}

// A figure shown (plt.show) is a result with its PNG and its chart (charts.py, run by
// Startup); a figure whose chart cannot be read still gives its PNG, its chart {} as
// E2B's, and no error or note; a figure left open at the end is shown too, with its chart.
func TestChartResults(t *testing.T) {
	base := startupServer(t)
	code, sb := call(t, "POST", base+"/v2/sandboxes", `{}`)
	require.Equal(t, http.StatusCreated, code, "%v", sb)
	png := func(r map[string]any) []byte {
		t.Helper()
		s, ok := r["png"].(string)
		require.True(t, ok, "a png: %v", brief([]map[string]any{r}))
		b, err := base64.StdEncoding.DecodeString(s)
		require.NoError(t, err)
		require.True(t, bytes.HasPrefix(b, []byte("\x89PNG")), "a PNG")
		return b
	}

	msgs := execute(t, base, sb, `
import matplotlib.pyplot as plt
plt.plot([1, 2, 3], [4, 1, 9], label='a')
plt.xlabel('Time (s)')
plt.title('T')
plt.show()
`)
	require.Empty(t, ofType(msgs, "error"), "%v", brief(msgs))
	results := ofType(msgs, "result")
	require.Equal(t, 1, len(results), "%v", brief(msgs))
	png(results[0])
	chart, ok := results[0]["chart"].(map[string]any)
	require.True(t, ok, "a chart object: %v", results[0]["chart"])
	assert.Equal(t, "line", chart["type"])
	assert.Equal(t, "T", chart["title"])
	assert.Equal(t, "s", chart["x_unit"])
	assert.Equal(t, "linear", chart["x_scale"])
	assert.Equal(t, []any{map[string]any{"label": "a", "points": []any{
		[]any{1.0, 4.0}, []any{2.0, 1.0}, []any{3.0, 9.0}}}}, chart["elements"])

	msgs = execute(t, base, sb, `
fig = plt.figure()
plt.bar(['x', 'y'], [3, 4])
def broken():
    raise RuntimeError("unreadable")
fig.get_axes = broken
plt.show()
fig, ax = plt.subplots()
_ = ax.pie([1, 3])
`)
	require.Empty(t, ofType(msgs, "error"), "%v", brief(msgs))
	for _, m := range ofType(msgs, "stderr") {
		assert.NotContains(t, m["text"], "e2b/chart", "the formatter failed on nothing")
	}
	results = ofType(msgs, "result")
	require.Equal(t, 2, len(results), "%v", brief(msgs))
	png(results[0])
	assert.Equal(t, map[string]any{}, results[0]["chart"], "a figure that could not be read")
	png(results[1])
	chart, ok = results[1]["chart"].(map[string]any)
	require.True(t, ok, "%v", brief(results[1:]))
	assert.Equal(t, "pie", chart["type"])
	assert.Equal(t, []any{90.0, 270.0}, column(chart["elements"], "angle"))

	msgs = execute(t, base, sb, `print("no figure")`)
	assert.Empty(t, ofType(msgs, "result"), "no figure, no result")
	require.Len(t, ofType(msgs, "stdout"), 1)
	assert.Equal(t, "no figure\n", ofType(msgs, "stdout")[0]["text"])
}

// brief is msgs as a failure shows them: images by their size.
func brief(msgs []map[string]any) []map[string]any {
	out := make([]map[string]any, len(msgs))
	for i, m := range msgs {
		out[i] = map[string]any{}
		for k, v := range m {
			if s, ok := v.(string); ok && k == "png" {
				v = fmt.Sprintf("(%d base64 bytes)", len(s))
			}
			out[i][k] = v
		}
	}
	return out
}

// column is key of each object in list.
func column(list any, key string) []any {
	items, _ := list.([]any)
	out := make([]any, len(items))
	for i, item := range items {
		m, _ := item.(map[string]any)
		out[i] = m[key]
	}
	return out
}
