package minipy

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The schema's JSON, for a known interpreter, is the expected document in testdata.
func TestToolSchemaJSON(t *testing.T) {
	tool := toolSchema(pythonInfo{Version: "3.12.1", Libraries: []string{"numpy", "pandas"}}, nil)
	got, err := json.MarshalIndent(tool, "", "  ")
	require.NoError(t, err)
	checkGolden(t, "schema.json", string(got)+"\n")

	// The shape get_schema produces and Anthropic takes, whatever the golden file says.
	var doc map[string]any
	require.NoError(t, json.Unmarshal(got, &doc))
	assert.Equal(t, "minipy", doc["name"])
	schema := doc["input_schema"].(map[string]any)
	assert.Equal(t, "object", schema["type"])
	assert.Equal(t, []any{"code"}, schema["required"])
	props := schema["properties"].(map[string]any)
	assert.Len(t, props, 2)
	assert.Equal(t, "string", props["code"].(map[string]any)["type"])
	assert.Equal(t, "number", props["timeout"].(map[string]any)["type"])
}

func TestToolSchemaOpenAIShape(t *testing.T) {
	tool := toolSchema(pythonInfo{Version: "3.12.1"}, nil)
	got, err := json.Marshal(tool.OpenAI())
	require.NoError(t, err)
	params, err := json.Marshal(tool.InputSchema)
	require.NoError(t, err)
	desc, err := json.Marshal(tool.Description)
	require.NoError(t, err)
	assert.JSONEq(t, fmt.Sprintf(`{"type": "function", "function": {"name": "minipy", "description": %s, "parameters": %s}}`,
		desc, params), string(got))
}

func TestInputSchemaMapIsACopy(t *testing.T) {
	tool := toolSchema(pythonInfo{}, nil)
	m := tool.InputSchema.Map()
	want, err := json.Marshal(tool.InputSchema)
	require.NoError(t, err)
	got, err := json.Marshal(m)
	require.NoError(t, err)
	assert.JSONEq(t, string(want), string(got))

	m["properties"].(map[string]any)["glb"] = map[string]any{"type": "object"}
	m["required"].([]string)[0] = "changed"
	assert.NotContains(t, tool.InputSchema.Properties, "glb")
	assert.Equal(t, []string{"code"}, tool.InputSchema.Required)
}

func TestToolSchemaStatesTheLimits(t *testing.T) {
	d := toolSchema(pythonInfo{}, nil).Description
	assert.Contains(t, d, "beyond 16384 characters")
	assert.Contains(t, d, "stopped after 60 seconds")
	assert.Contains(t, d, "at most 600 seconds")
	assert.Contains(t, d, "Only the standard library")

	tool := toolSchema(pythonInfo{}, &Options{Timeout: 1500 * time.Millisecond, MaxOutput: 1000})
	assert.Contains(t, tool.Description, "beyond 1000 characters")
	assert.Contains(t, tool.Description, "stopped after 1.5 seconds")
	assert.Contains(t, tool.Description, "at most 1.5 seconds")
	assert.Equal(t, "Seconds after which the run is stopped; default 1.5 seconds, at most 1.5 seconds.",
		tool.InputSchema.Properties["timeout"].(map[string]any)["description"])

	unbounded := toolSchema(pythonInfo{}, &Options{Timeout: -1, MaxOutput: -1}).Description
	assert.Contains(t, unbounded, "no time limit unless you pass")
	assert.NotContains(t, unbounded, "truncated")
}

// ToolSchema describes the interpreter that runs the code: its version, and libraries that
// really import.
func TestToolSchemaDescribesThisInterpreter(t *testing.T) {
	info, err := inProcessInfo()
	require.NoError(t, err)
	r, err := Minipy("import platform; platform.python_version()", nil)
	require.NoError(t, err)
	assert.Equal(t, r.Value, info.Version)

	d := ToolSchema().Description
	assert.Contains(t, d, "persistent Python "+info.Version+" interpreter")
	if len(info.Libraries) == 0 {
		assert.Contains(t, d, "Only the standard library")
		return
	}
	assert.Contains(t, d, "Importable besides the standard library: "+strings.Join(info.Libraries, ", ")+".")
	quoted := make([]string, len(info.Libraries))
	for i, l := range info.Libraries {
		quoted[i] = fmt.Sprintf("%q", l)
	}
	r, err = Minipy("import importlib.util\n[m for m in ["+strings.Join(quoted, ", ")+"] if importlib.util.find_spec(m) is None]", nil)
	require.NoError(t, err)
	assert.Equal(t, []any{}, r.Value, "listed but not importable")
}
