package minipy_test

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/minipy-go/minipy"
)

// The house rules that a reader of the code relies on, checked so that they do not drift
// again: the README fits in 250 lines (its first screen is the two commands), and no
// function of the tree's code (every module; tests aside) is longer than 80 lines, so
// that each step of a long job is a function with a name: in Go, and in the Python that
// the workers run (each def and method from its first decorator to its last line).
func TestHouseRules(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	assert.LessOrEqual(t, bytes.Count(readme, []byte("\n")), 250, "README.md's lines")

	fset := token.NewFileSet()
	var pyFiles []string
	err = filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "node_modules" || d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) && path != "." {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, ".py") && !strings.HasPrefix(d.Name(), "test_") {
			pyFiles = append(pyFiles, path)
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution|parser.ParseComments)
		if err != nil {
			return err
		}
		if ast.IsGenerated(f) { // ("Code generated ... DO NOT EDIT.": protoc's, not ours to shape)
			return nil
		}
		for _, decl := range f.Decls {
			if fn, ok := decl.(*ast.FuncDecl); ok {
				lines := fset.Position(fn.End()).Line - fset.Position(fn.Pos()).Line + 1
				assert.LessOrEqual(t, lines, 80, "%s: func %s's lines", path, fn.Name.Name)
			}
		}
		return nil
	})
	require.NoError(t, err)
	pythonFunctionsFit(t, pyFiles)
}

// pythonFunctionsFit holds the Python files' functions to the 80 lines, read by the linked
// Python's own parser (ast: a def's first decorator to its end_lineno).
func pythonFunctionsFit(t *testing.T, files []string) {
	require.NotEmpty(t, files, "the tree's Python (internal/pyrt)")
	const src = `import ast, sys
n = 0
for path in sys.argv[1:]:
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n += 1
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            print("%s\t%s\t%d" % (path, node.name, node.end_lineno - first + 1))
print("functions\t%d" % n)
`
	out, err := exec.Command(minipy.LinkedPython(), append([]string{"-c", src}, files...)...).CombinedOutput()
	require.NoError(t, err, "%s", out)
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	require.Equal(t, fmt.Sprintf("functions\t%d", len(lines)-1), lines[len(lines)-1], "every function read")
	for _, line := range lines[:len(lines)-1] {
		f := strings.Split(line, "\t")
		require.Len(t, f, 3, line)
		n, err := strconv.Atoi(f[2])
		require.NoError(t, err, line)
		assert.LessOrEqual(t, n, 80, "%s: def %s's lines", f[0], f[1])
	}
}
