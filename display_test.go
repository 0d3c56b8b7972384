package minipy_test

import (
	"bytes"
	"context"
	"encoding/json"
	"image"
	"image/color"
	"image/png"
	"path/filepath"
	"strings"
	"testing"

	"github.com/minipy-go/minipy"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// pngOf is a w x h PNG, made in Go.
func pngOf(t *testing.T, w, h int) []byte {
	t.Helper()
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	seed := uint32(w*h + 1)
	for i := range img.Pix { // noise: it does not compress, so the size is about w*h*4
		seed = seed*1664525 + 1013904223
		img.Pix[i] = byte(seed >> 24)
	}
	img.Set(0, 0, color.White)
	var b bytes.Buffer
	require.NoError(t, png.Encode(&b, img))
	return b.Bytes()
}

// Objects are shown by IPython's display protocol, every MIME type with its raw data and
// text/plain beside it; display()'s text goes to stdout where it was called.
func TestDisplayProtocol(t *testing.T) {
	for _, e := range engines(t) {
		t.Run(e.name, func(t *testing.T) {
			n := newNbEnv(t, e.eng)
			pic := pngOf(t, 3, 2)
			require.NoError(t, n.ns.Set("pic", pic))
			n.run(t, `
import base64
class Rich:
    def __init__(self, **reprs): self.reprs = reprs
    def __repr__(self): return "Rich()"
    def __getattribute__(self, name):
        reprs = object.__getattribute__(self, "reprs")
        if name.startswith("_repr_") and name[6:-1] in reprs:
            return lambda: reprs[name[6:-1]]
        return object.__getattribute__(self, name)
class Bundle:
    def _repr_mimebundle_(self, include=None, exclude=None):
        return {"text/plain": "bundle!", "text/html": "<i>b</i>", "image/png": base64.b64encode(pic).decode()}
    def _repr_html_(self): return "<b>ignored: the bundle has text/html</b>"
    def _repr_markdown_(self): return "*md*"
class Fails:
    def _repr_html_(self): raise ValueError("no html today")
    def __repr__(self): return "Fails()"
`)
			cases := []struct {
				code, mime string
				want       []byte
			}{
				{"display(Rich(png=pic))", "image/png", pic},
				{"display(Rich(jpeg=b'\\xff\\xd8\\xff fake'))", "image/jpeg", []byte("\xff\xd8\xff fake")},
				{"display(Rich(svg='<svg/>'))", "image/svg+xml", []byte("<svg/>")},
				{"display(Rich(html='<p>hi</p>'))", "text/html", []byte("<p>hi</p>")},
				{"display(Rich(markdown='# T'))", "text/markdown", []byte("# T")},
				{"display(Rich(latex='$x^2$'))", "text/latex", []byte("$x^2$")},
				{"display(Rich(json={'a': [1, 2]}))", "application/json", []byte(`{"a": [1, 2]}`)},
			}
			for _, c := range cases {
				res := n.run(t, c.code)
				require.Len(t, res.Displays, 1, c.code)
				d := res.Displays[0]
				assert.Equal(t, c.want, d.Data[c.mime], c.code)
				assert.Equal(t, "Rich()", d.Text(), c.code)
				assert.False(t, d.Value)
			}
			res := n.run(t, "print('before')\ndisplay(Bundle())\nprint('after')")
			require.Len(t, res.Displays, 1)
			d := res.Displays[0]
			assert.Equal(t, pic, d.Data["image/png"], "base64 text of a binary type is decoded")
			assert.Equal(t, "<i>b</i>", string(d.Data["text/html"]))
			assert.Equal(t, "*md*", string(d.Data["text/markdown"]), "methods fill in what the bundle lacks")
			assert.Equal(t, "before\n[image 1: PNG 3x2, 1 KB]\nafter\n", res.Output())
			assert.Equal(t, "before\nafter\n", res.Stdout, "Stdout holds what was printed, alone")
			assert.Equal(t, len("before\n"), d.Offset)
			assert.Equal(t, "[image 1: PNG 3x2, 1 KB]", d.Caption)
			img, ok := d.Image()
			require.True(t, ok)
			assert.Equal(t, minipy.Image{MIMEType: "image/png", Data: pic, Width: 3, Height: 2}, img)

			res = n.run(t, "display(Fails())")
			require.Len(t, res.Displays, 1)
			assert.Equal(t, map[string][]byte{"text/plain": []byte("Fails()")}, res.Displays[0].Data)
			assert.Equal(t, "Fails()\n", res.Output())
			assert.Empty(t, res.Stdout)
			assert.Contains(t, res.Stderr, "Fails._repr_html_ failed: ValueError: no html today")

			// raw bundles, several objects, plain values.
			res = n.run(t, "display({'text/plain': 'raw', 'text/html': '<b>raw</b>'}, raw=True)\ndisplay(1, 'two')")
			require.Len(t, res.Displays, 3)
			assert.Equal(t, "<b>raw</b>", string(res.Displays[0].Data["text/html"]))
			assert.Equal(t, "raw\n1\n'two'\n", res.Output())

			// IPython.display's names work with or without IPython.
			res = n.run(t, "from IPython.display import display as d2, HTML, Markdown, Image, SVG, JSON, Latex\n"+
				"d2(HTML('<b>x</b>'), Markdown('# hi'), JSON({'a': 1}), Image(data=pic), SVG('<svg/>'), Latex('$y$'))")
			require.Len(t, res.Displays, 6)
			assert.Equal(t, "<b>x</b>", string(res.Displays[0].Data["text/html"]))
			assert.Equal(t, "# hi", string(res.Displays[1].Data["text/markdown"]))
			assert.Equal(t, pic, res.Displays[3].Data["image/png"])
			assert.Equal(t, "<b>x</b>\n# hi\n{\"a\": 1}\n[image 1: PNG 3x2, 1 KB]\n<svg/>\n$y$\n", res.Output(),
				"what has only a default repr as text shows its readable form")

			// %%capture keeps displays too, and shows them again on demand.
			res = n.run(t, "%%capture cap\ndisplay(Rich(png=pic))\nprint('quiet')")
			assert.Empty(t, res.Displays)
			assert.Empty(t, res.Stdout)
			res = n.run(t, "len(cap.outputs)")
			assert.Equal(t, int64(1), res.Value)
			res = n.run(t, "cap.show()")
			require.Len(t, res.Displays, 1)
			assert.Equal(t, "quiet\n[image 1: PNG 3x2, 1 KB]\n", res.Output())
			assert.Equal(t, "quiet\n", res.Stdout)

			// Plain values as the last value make no display; nothing leaks into the next run.
			res = n.run(t, "[1, 2, 3]")
			assert.Empty(t, res.Displays)
		})
	}
}

// matplotlib renders with Agg; plt.show() and the figures left open become PNG displays,
// and are closed, as with Jupyter's inline backend.
// Formatters registered as in IPython (__minipy__.display_formatter.formatters: a MIME type
// to a callable) give every display and value the forms its own methods did not: a plain
// value with one becomes a display; one that raises is noted on stderr and left out.
func TestDisplayRegisteredFormatters(t *testing.T) {
	inEachEngine(t, func(t *testing.T, eng minipy.Engine, opts *minipy.Options) {
		run := func(code string) *minipy.Result {
			t.Helper()
			r, err := eng.Run(context.Background(), code, opts)
			require.NoError(t, err)
			return r
		}
		run(`class Point(tuple): pass
fmts = __minipy__.display_formatter.formatters
fmts["application/json"] = lambda o: {"x": o[0], "y": o[1]} if isinstance(o, Point) else None
fmts["text/x-broken"] = lambda o: 1 / 0 if isinstance(o, Point) else None`)
		defer run("for m in ('application/json', 'text/x-broken'): fmts.pop(m)") // (in-process: one interpreter for all)
		r := run("Point((1, 2))")
		require.Len(t, r.Displays, 1)
		assert.True(t, r.Displays[0].Value)
		assert.JSONEq(t, `{"x": 1, "y": 2}`, string(r.Displays[0].Data["application/json"]))
		assert.NotContains(t, r.Displays[0].Data, "text/x-broken")
		assert.Contains(t, r.Stderr, "the text/x-broken formatter failed on Point: ZeroDivisionError")
		r = run("display(Point((3, 4)))\n7")
		require.Len(t, r.Displays, 1, "7 has no form but its text")
		assert.JSONEq(t, `{"x": 3, "y": 4}`, string(r.Displays[0].Data["application/json"]))
	})
}

func TestDisplayFigures(t *testing.T) {
	for _, e := range engines(t) {
		t.Run(e.name, func(t *testing.T) {
			n := newNbEnv(t, e.eng)
			needModuleIn(t, n, "matplotlib")
			res := n.run(t, "import matplotlib\nimport matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nprint('before')\nplt.show()\nprint('after')\nmatplotlib.get_backend()")
			assert.Equal(t, "'module://minipy_inline'", res.Repr)
			require.Len(t, res.Displays, 1)
			img, ok := res.Displays[0].Image()
			require.True(t, ok)
			cfg, err := png.DecodeConfig(bytes.NewReader(img.Data))
			require.NoError(t, err)
			assert.Greater(t, cfg.Width, 300)
			assert.Equal(t, "before\n[image 1: PNG "+img.String()[4:]+"]\nafter\n", res.Output())
			assert.Equal(t, "before\nafter\n", res.Stdout)
			assert.Regexp(t, `^<Figure size 640x480 with 1 Axes>$`, res.Displays[0].Text())

			// One left open is shown at the end, after what was printed; then closed.
			res = n.run(t, "fig = plt.figure()\nplt.plot([3, 1])\nprint('drawn')")
			require.Len(t, res.Displays, 1)
			assert.Regexp(t, `^drawn\n\[image 1: PNG \d+x\d+, \d+ KB\]\n$`, res.Output())
			assert.Equal(t, "drawn\n", res.Stdout)
			assert.Equal(t, len(res.Stdout), res.Displays[0].Offset)
			assert.Equal(t, []any{}, n.run(t, "plt.get_fignums()").Value)

			// A closed figure gives nothing; an empty one only its text.
			res = n.run(t, "f = plt.figure()\nplt.plot([1])\nplt.close(f)")
			assert.Empty(t, res.Displays)
			assert.Empty(t, res.Stdout)

			// A figure as the value is shown once, as the value, its marker under the repr.
			res = n.run(t, "fig, ax = plt.subplots()\nax.plot([1, 2])\nfig")
			require.Len(t, res.Displays, 1)
			assert.True(t, res.Displays[0].Value)
			assert.Regexp(t, `^<Figure size 640x480 with 1 Axes>\n\[image 1: PNG \d+x\d+, \d+ KB\]$`, res.ValueText())
			assert.Equal(t, "<Figure size 640x480 with 1 Axes>", res.Repr, "Repr is the text alone")
			assert.Empty(t, res.Stdout)
			assert.Empty(t, res.Output(), "the value's marker is under its repr, not in the output")
			assert.Regexp(t, `^<Figure size 640x480 with 1 Axes>\n\[image 1: PNG \d+x\d+, \d+ KB\]$`, res.Text())

			// A cell that raises still shows its figure.
			_, err = e.eng.Run(context.Background(), "plt.plot([5, 6])\n1/0", n.opts)
			require.Error(t, err)
			assert.Equal(t, []any{}, n.run(t, "plt.get_fignums()").Value)

			// GUI backends are refused: no window can open.
			res = n.run(t, "matplotlib.use('TkAgg')\nmatplotlib.get_backend()")
			assert.Equal(t, "'module://minipy_inline'", res.Repr)
			assert.Contains(t, res.Stderr, "matplotlib.use('TkAgg') ignored")
			n.run(t, "%matplotlib inline")
		})
	}
}

// needModuleIn skips t when n's Python cannot import module (see needModule).
func needModuleIn(t *testing.T, n *nbEnv, module string) {
	t.Helper()
	r := n.run(t, "import importlib.util\nimportlib.util.find_spec('"+module+"') is not None")
	if r.Value != true {
		t.Skipf("%s is not installed for this Python (Debian's python3-%s is for the distribution's python3)", module, module)
	}
}

func TestDisplayPILAndPandas(t *testing.T) {
	for _, e := range engines(t) {
		t.Run(e.name, func(t *testing.T) {
			n := newNbEnv(t, e.eng)
			needModuleIn(t, n, "PIL")
			needModuleIn(t, n, "pandas")
			res := n.run(t, "from PIL import Image\nimg = Image.new('RGB', (64, 32), 'red')\nimg")
			require.Len(t, res.Displays, 1)
			img, ok := res.Displays[0].Image()
			require.True(t, ok)
			assert.Equal(t, 64, img.Width)
			assert.Equal(t, 32, img.Height)
			assert.Regexp(t, `^<PIL.Image.Image image mode=RGB size=64x32( at 0x[0-9A-F]+)?>\n\[image 1: PNG 64x32, 1 KB\]$`, res.ValueText())
			assert.Regexp(t, `^<PIL.Image.Image image mode=RGB size=64x32( at 0x[0-9A-F]+)?>$`, res.Repr,
				"PIL 10's _repr_pretty_ leaves the address out")
			res = n.run(t, "display(img.convert('CMYK'))")
			require.Len(t, res.Displays, 1)
			_, ok = res.Displays[0].Image()
			assert.True(t, ok, "modes PNG lacks are converted")

			res = n.run(t, "import pandas as pd\ndf = pd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})\ndf")
			assert.Equal(t, "   a  b\n0  1  x\n1  2  y", res.Repr)
			require.Len(t, res.Displays, 1)
			assert.Contains(t, string(res.Displays[0].Data["text/html"]), "<table")
			assert.Equal(t, res.Repr, res.Displays[0].Text())
			res = n.run(t, "display(df)")
			assert.Equal(t, "   a  b\n0  1  x\n1  2  y\n", res.Output(), "the model reads the text form")
			assert.Empty(t, res.Stdout)
			assert.Equal(t, "   a  b\n0  1  x\n1  2  y", res.Displays[0].Caption)
		})
	}
}

// The caps on images per run and bytes per image: a figure or PIL image too large is
// rendered again smaller, anything else is left out, and the text says so in place.
func TestDisplayLimits(t *testing.T) {
	for _, e := range engines(t) {
		t.Run(e.name, func(t *testing.T) {
			n := newNbEnv(t, e.eng)
			needModuleIn(t, n, "matplotlib")
			require.NoError(t, n.ns.Set("big", pngOf(t, 200, 200)))
			opts := *n.opts
			opts.MaxImages = 2
			res, err := e.eng.Run(context.Background(), "import matplotlib.pyplot as plt\nfor i in range(3):\n    plt.plot([i, 1])\n    plt.show()", &opts)
			require.NoError(t, err)
			assert.Len(t, res.Images(), 2)
			assert.Len(t, res.Displays, 3)
			assert.Regexp(t, `^\[image 1: .*\]\n\[image 2: .*\]\n\[image not shown: a run shows at most 2 images\]\n$`, res.Output())

			opts = *n.opts
			opts.MaxImageBytes = 12000
			res, err = e.eng.Run(context.Background(), "plt.figure(figsize=(12, 9))\nplt.plot(range(100), [i * i % 17 for i in range(100)])\nplt.show()\n"+
				"from IPython.display import Image\ndisplay(Image(data=big))", &opts)
			require.NoError(t, err)
			images := res.Images()
			require.Len(t, images, 1)
			assert.LessOrEqual(t, len(images[0].Data), 12000)
			assert.Less(t, images[0].Width, 1100, "rendered again at a lower dpi")
			lines := strings.Split(res.Output(), "\n")
			assert.Regexp(t, `^\[image 1: PNG \d+x\d+, \d+ KB\]$`, lines[0])
			assert.Regexp(t, `^\[image not shown: its PNG of \d+ KB is over the limit of 12 KB per image\]$`, lines[1])
		})
	}
}

// CallToolResult gives the text with each image named in place and the images themselves;
// the text is pinned by a golden file, the same on both engines.
func TestCallToolResultImages(t *testing.T) {
	for _, e := range engines(t) {
		t.Run(e.name, func(t *testing.T) {
			n := newNbEnv(t, e.eng)
			pic := pngOf(t, 4, 4)
			require.NoError(t, n.ns.Set("pic", pic))
			code := "from IPython.display import Image, Markdown\nprint('first')\ndisplay(Image(data=pic))\n" +
				"display(Markdown('**done**'))\nImage(data=pic)"
			input, err := json.Marshal(map[string]any{"code": code})
			require.NoError(t, err)
			r := e.eng.CallToolResult(context.Background(), input, n.opts)
			assert.False(t, r.IsError)
			require.Len(t, r.Images, 2)
			for _, img := range r.Images {
				assert.Equal(t, minipy.Image{MIMEType: "image/png", Data: pic, Width: 4, Height: 4}, img)
			}
			minipy.CheckGolden(t, filepath.Join("notebook", "tool_images.txt"), "[cell]\n"+code+"\n"+r.Text)
			text, isError := e.eng.CallTool(context.Background(), input, n.opts)
			assert.Equal(t, r.Text, text)
			assert.False(t, isError)
		})
	}
}

// A cell that draws a 640x480 line plot and shows it (matplotlib imported before).
func BenchmarkPlotCell(b *testing.B) {
	for _, e := range benchEngines(b) {
		b.Run(e.name, func(b *testing.B) {
			ns := e.eng.NewNamespace()
			defer ns.Close()
			opts := &minipy.Options{Globals: ns}
			if _, err := e.eng.Run(context.Background(), "import matplotlib.pyplot as plt", opts); err != nil {
				b.Skipf("matplotlib: %v", err)
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				res, err := e.eng.Run(context.Background(), "plt.plot(range(100))\nplt.show()", opts)
				if err != nil || len(res.Images()) != 1 {
					b.Fatal(err, res.Stdout)
				}
			}
		})
	}
}

// A host function's result can show displays (WithDisplays): shown where the call was made,
// numbered with the run's other images and within its caps.
func TestHostFunctionDisplays(t *testing.T) {
	pic := pngOf(t, 5, 4)
	chart := minipy.Function{
		Name: "chart",
		Call: func(context.Context, map[string]any) (any, error) {
			return minipy.WithDisplays(map[string]any{"points": 3},
				minipy.Display{Data: map[string][]byte{"image/png": pic, "text/plain": []byte("<chart>")}},
				minipy.Display{Data: map[string][]byte{"text/markdown": []byte("**summary**")}}), nil
		},
	}
	for _, e := range engines(t) {
		t.Run(e.name, func(t *testing.T) {
			h := newHostEnv(t, e.eng, chart)
			res, err := h.run(t, "print('before')\nr = chart()\nprint(r)")
			require.NoError(t, err)
			assert.Equal(t, "before\n[image 1: PNG 5x4, 1 KB]\n**summary**\n{'points': 3}\n", res.Output())
			assert.Equal(t, "before\n{'points': 3}\n", res.Stdout)
			require.Len(t, res.Displays, 2)
			assert.Equal(t, pic, res.Displays[0].Data["image/png"])
			assert.Equal(t, "<chart>", res.Displays[0].Text())
			assert.Equal(t, "**summary**", res.Displays[1].Text(), "text/plain is always there")
			assert.Equal(t, []minipy.Image{{MIMEType: "image/png", Data: pic, Width: 5, Height: 4}}, res.Images())

			opts := *h.opts
			opts.MaxImages = 1
			res, err = h.eng.Run(context.Background(), "chart(); chart()", &opts)
			require.NoError(t, err)
			assert.Len(t, res.Images(), 1)
			assert.Contains(t, res.Output(), "[image not shown: a run shows at most 1 image]")
		})
	}
}
