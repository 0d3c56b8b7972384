package minipy_test

// The last-expression rule (IPython's, which toolslm's minipy approximates with an ast
// rewrite to _result) lives in the Python half, internal/pyrt/runtime.py: exec_cell and
// ends_with_semicolon. Both engines use it; these tests pin it.

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/minipy-go/minipy"
)

func TestLastExpressionRules(t *testing.T) {
	cases := []struct {
		code     string
		hasValue bool
		repr     string
	}{
		{"1+1", true, "2"},
		{"x = 3\nx * 2", true, "6"},
		{"x = 3\nx * 2  # the answer", true, "6"},
		{"x = 3\nx * 2;", false, ""},
		{"x = 3\nx * 2;  # silenced, comment ignored", false, ""},
		{"x = 3\nx * 2 ;\n\n", false, ""},
		{"s = 'a;'\ns", true, "'a;'"},
		{"x = 3; x", true, "3"},
		{"None", false, ""},
		{"print('hi')", false, ""}, // print returns None
		{"x = 1", false, ""},
		{"for i in range(3):\n    i", false, ""},
		{"if True:\n    5", false, ""},
		{"def f():\n    return 1", false, ""},
		{"", false, ""},
		{"# only a comment\n", false, ""},
		{"   \n\n", false, ""},
		{"[i * i for i in range(4)]", true, "[0, 1, 4, 9]"},
		{"import os\n(lambda: 7)()", true, "7"},
	}
	for _, c := range cases {
		t.Run(c.code, func(t *testing.T) {
			r := run(t, c.code, fresh(t))
			assert.Equal(t, c.hasValue, r.HasValue)
			assert.Equal(t, c.repr, r.Repr)
			if !c.hasValue {
				assert.Nil(t, r.Value)
			}
		})
	}
}

func TestNoStaleValueAndNoResultVariable(t *testing.T) {
	opts := fresh(t)
	r := run(t, "41 + 1", opts)
	require.True(t, r.HasValue)
	r = run(t, "y = 5", opts)
	assert.False(t, r.HasValue, "a statement after an expression must not show the old value")
	assert.Empty(t, r.Repr)
	assert.Equal(t, []string{"y"}, names(t, opts.Globals), "no _result or other helper is left in the namespace")
	_, err := minipy.Minipy("1/0", opts)
	require.Error(t, err)
	r = run(t, "y", opts)
	assert.Equal(t, int64(5), r.Value)
}

func TestTopLevelAwait(t *testing.T) {
	opts := &minipy.Options{Globals: minipy.NewNamespace()}
	defer opts.Globals.Close()
	r, err := minipy.Minipy("import asyncio\nasync def twice(x):\n    await asyncio.sleep(0.01)\n    return 2 * x\nawait twice(21)", opts)
	require.NoError(t, err)
	assert.Equal(t, int64(42), r.Value)
	// A task started in one run is still there in the next: the event loop persists.
	_, err = minipy.Minipy("task = asyncio.ensure_future(twice(5))", opts)
	require.NoError(t, err)
	r, err = minipy.Minipy("await task", opts)
	require.NoError(t, err)
	assert.Equal(t, int64(10), r.Value)
	// Plain asyncio.run still works (no loop is running between runs).
	r, err = minipy.Minipy("asyncio.run(twice(1))", opts)
	require.NoError(t, err)
	assert.Equal(t, int64(2), r.Value)
}
