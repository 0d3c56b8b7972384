package minipy_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Result.Stdout holds what the code printed, exactly; each display's place in it is its
// Offset (bytes), and Output puts the captions back there, on lines of their own.
func TestDisplayPlacesInStdout(t *testing.T) {
	for _, e := range engines(t) {
		t.Run(e.name, func(t *testing.T) {
			n := newNbEnv(t, e.eng)

			// Offsets count bytes, after text of several bytes a character.
			res := n.run(t, "print('héllo ✓')\ndisplay(1)\nprint('x')")
			assert.Equal(t, "héllo ✓\nx\n", res.Stdout)
			require.Len(t, res.Displays, 1)
			assert.Equal(t, len("héllo ✓\n"), res.Displays[0].Offset)
			assert.Equal(t, "1", res.Displays[0].Caption)
			assert.Equal(t, "héllo ✓\n1\nx\n", res.Output())

			// A display after a line left open starts a line of its own in Output.
			res = n.run(t, "print('a', end='')\ndisplay('two')\nprint('b')")
			assert.Equal(t, "ab\n", res.Stdout)
			assert.Equal(t, 1, res.Displays[0].Offset)
			assert.Equal(t, "a\n'two'\nb\n", res.Output())

			// At the very start, several in one place, and at the end.
			res = n.run(t, "display(1, 2)\nprint('mid')\ndisplay(3)")
			assert.Equal(t, "mid\n", res.Stdout)
			offsets := []int{}
			for _, d := range res.Displays {
				offsets = append(offsets, d.Offset)
			}
			assert.Equal(t, []int{0, 0, 4}, offsets)
			assert.Equal(t, "1\n2\nmid\n3\n", res.Output())

			// What child processes wrote before the display comes before it.
			res = n.run(t, "import os, sys\nsys.stdout.flush()\nos.system('echo child')\ndisplay(4)\nprint('after')")
			assert.Equal(t, "child\nafter\n", res.Stdout)
			assert.Equal(t, "child\n4\nafter\n", res.Output())

			// The value: its place is the end, its text Repr; nothing in Output.
			res = n.run(t, "class R:\n    def _repr_html_(self): return '<b>r</b>'\n    def __repr__(self): return 'R!'\nprint('p')\nR()")
			require.Len(t, res.Displays, 1)
			assert.True(t, res.Displays[0].Value)
			assert.Equal(t, len(res.Stdout), res.Displays[0].Offset)
			assert.Empty(t, res.Displays[0].Caption, "a value without an image has Repr for text")
			assert.Equal(t, "R!", res.ValueText())
			assert.Equal(t, "p\n", res.Output())
			assert.Equal(t, "p\nR!", res.Text())
		})
	}
}

// A display in output cut to MaxOutput keeps its place: in the head, in the tail, or just
// after the omission marker when its place was cut. Both of the isolated engine's ways of
// reading its output (whole, and head and tail alone for one far past the cap) agree.
func TestDisplayPlacesInCutOutput(t *testing.T) {
	for _, e := range engines(t) {
		t.Run(e.name, func(t *testing.T) {
			n := newNbEnv(t, e.eng)
			for _, size := range []int{1_000, 200_000} {
				opts := *n.opts
				opts.MaxOutput = 100
				code := fmt.Sprintf("print('h' * 10)\ndisplay('head')\nprint('m' * %d)\ndisplay('middle')\nprint('m' * %d)\n"+
					"display('tail')\nprint('t' * 10)", size/2, size/2)
				res, err := e.eng.Run(context.Background(), code, &opts)
				require.NoError(t, err)
				require.Len(t, res.Displays, 3)
				marker := strings.Index(res.Stdout, "characters of stdout omitted")
				require.Greater(t, marker, 0, res.Stdout)
				afterMarker := marker + strings.Index(res.Stdout[marker:], "]") + 1
				for afterMarker < len(res.Stdout) && res.Stdout[afterMarker] == '\n' {
					afterMarker++
				}
				assert.Equal(t, len("hhhhhhhhhh\n"), res.Displays[0].Offset, "in the head: %d", size)
				mid := res.Displays[1].Offset
				assert.True(t, mid >= afterMarker-1 && mid <= afterMarker, "just after the marker: %d, marker ends at %d (%d)", mid, afterMarker, size)
				assert.Equal(t, len(res.Stdout)-len("tttttttttt\n"), res.Displays[2].Offset, "in the tail: %d", size)
				out := res.Output()
				assert.True(t, strings.HasPrefix(out, "hhhhhhhhhh\n'head'\nmmm"), out)
				assert.True(t, strings.HasSuffix(out, "mmm\n'tail'\ntttttttttt\n"), out)
				assert.Contains(t, out, "omitted ...]\n'middle'\n")
				assert.Contains(t, out, "'middle'\n")
			}
		})
	}
}

// Live output shows each display's text where it happened, as a terminal would, though
// Stdout does not hold it.
func TestDisplayLiveOutput(t *testing.T) {
	for _, e := range engines(t) {
		t.Run(e.name, func(t *testing.T) {
			opts, log := liveOpts(newNbEnv(t, e.eng).ns)
			res, err := e.eng.Run(context.Background(), "print('before')\ndisplay({'a': 1})\nprint('after')", opts)
			require.NoError(t, err)
			assert.Equal(t, "before\nafter\n", res.Stdout)
			assert.Equal(t, "before\n{'a': 1}\nafter\n", log.text("out"))
			assert.Equal(t, res.Output(), log.text("out"))
		})
	}
}
