package minipy_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/minipy-go/minipy"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// prettyGoldens is testdata/pretty/goldens.json: IPython's own text/plain of values, one case
// per rule of its pretty printer (scripts/pretty-goldens made it with a real IPython).
type prettyGoldens struct {
	IPython string `json:"ipython"`
	Cases   []struct {
		Name, Setup, Expr, Text string
	} `json:"cases"`
}

var addressRE = regexp.MustCompile(`0x[0-9a-fA-F]+`)

// Result.Repr is the value as IPython shows it, on both engines: each golden case, run as a
// cell (its setup, then the expression), gives IPython's text, addresses aside.
func TestReprAsIPython(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "pretty", "goldens.json"))
	require.NoError(t, err)
	var goldens prettyGoldens
	require.NoError(t, json.Unmarshal(data, &goldens))
	require.Greater(t, len(goldens.Cases), 80)
	for _, e := range engines(t) {
		t.Run(e.name, func(t *testing.T) {
			n := newNbEnv(t, e.eng)
			for _, c := range goldens.Cases {
				res := n.run(t, c.Setup+"\n"+c.Expr)
				assert.Equal(t, c.Text, addressRE.ReplaceAllString(res.Repr, "0xADDR"), "%s (IPython %s)", c.Name, goldens.IPython)
			}
		})
	}
}

// The pretty printer's limits: a value whose text is huge is cut like any other (its
// repr's head and tail, in time), and an error in the code's __repr__ is the code's error.
func TestReprLimits(t *testing.T) {
	for _, e := range engines(t) {
		t.Run(e.name, func(t *testing.T) {
			n := newNbEnv(t, e.eng)
			res := n.run(t, "[list(range(1000)) for _ in range(1000)]")
			assert.Contains(t, res.Repr, "characters of repr omitted")
			assert.True(t, strings.HasPrefix(res.Repr, "[[0, 1, 2,"), res.Repr[:40])
			assert.LessOrEqual(t, len(res.Repr), minipy.DefaultMaxOutput+100)

			res = n.run(t, "list(range(5000))")
			assert.True(t, strings.HasSuffix(res.Repr, " 998,\n 999,\n ...]"), "1,000 items, then ...")

			_, err := e.eng.Run(t.Context(), "class Bad:\n    def __repr__(self):\n        raise ValueError('no repr')\n[Bad()]", n.opts)
			var py *minipy.PythonError
			require.ErrorAs(t, err, &py)
			assert.Equal(t, "ValueError", py.Type)
		})
	}
}
