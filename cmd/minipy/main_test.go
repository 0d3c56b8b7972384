package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"image"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/minipy-go/minipy"
)

func cli(t *testing.T, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(args, strings.NewReader(stdin), &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestCLIPrintsOutputThenValue(t *testing.T) {
	code, out, errOut := cli(t, "", "-c", "import math; print('12! is', math.factorial(12)); math.factorial(12) // 7")
	assert.Equal(t, 0, code, errOut)
	assert.Equal(t, "12! is 479001600\n68428800\n", out)
}

func TestCLIReadsCodeFromStdin(t *testing.T) {
	code, out, _ := cli(t, "x = 2\nx ** 10\n")
	assert.Equal(t, 0, code)
	assert.Equal(t, "1024\n", out)
}

func TestCLIErrorExitsNonZeroWithTraceback(t *testing.T) {
	code, out, errOut := cli(t, "", "-c", "print('before')\n{}['missing']")
	assert.Equal(t, 1, code)
	assert.Equal(t, "before\n", out)
	assert.Contains(t, errOut, "Traceback (most recent call last):")
	assert.Contains(t, errOut, "KeyError: 'missing'")
}

func TestCLIJSON(t *testing.T) {
	code, out, _ := cli(t, "", "--json", "-c", "print('hi')\n{'a': [1, 2**70], 'nan': float('nan')}")
	assert.Equal(t, 0, code)
	var doc map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &doc))
	assert.Equal(t, true, doc["has_value"])
	assert.Nil(t, doc["value"], "NaN has no JSON form: value is null, repr has it")
	assert.Equal(t, "{'a': [1, 1180591620717411303424], 'nan': nan}", doc["repr"])
	assert.Equal(t, "hi\n", doc["stdout"])
	assert.Nil(t, doc["error"])

	code, out, _ = cli(t, "", "--json", "-c", "1/0")
	assert.Equal(t, 1, code)
	require.NoError(t, json.Unmarshal([]byte(out), &doc))
	pyErr := doc["error"].(map[string]any)
	assert.Equal(t, "ZeroDivisionError", pyErr["type"])
	assert.Equal(t, "division by zero", pyErr["message"])
	assert.Contains(t, pyErr["traceback"], "1/0")
}

func TestCLITimeout(t *testing.T) {
	code, out, errOut := cli(t, "", "--json", "--timeout", "200ms", "-c", "print('started', flush=True)\nwhile True: pass")
	assert.Equal(t, 1, code, errOut)
	var doc map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &doc))
	assert.Equal(t, true, doc["timed_out"])
	assert.Equal(t, "started\n", doc["stdout"])
	assert.Equal(t, "minipy.TimeoutInterrupt", doc["error"].(map[string]any)["type"])
}

func TestCLIBadUsage(t *testing.T) {
	code, _, errOut := cli(t, "", "-c", "1", "extra")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "unexpected arguments")
	code, _, _ = cli(t, "", "--no-such-flag")
	assert.Equal(t, 2, code)
}

// Without cgo the module still builds, and a run says clearly what is missing.
func TestCLIWithoutCgoExplainsItself(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "minipy-nocgo")
	build := exec.Command("go", "build", "-o", bin, ".")
	// (Without GOFLAGS' -linkmode=external, which needs cgo: scripts/compat's sid builds set it.)
	var goflags []string
	for _, f := range strings.Fields(os.Getenv("GOFLAGS")) {
		if !strings.Contains(f, "linkmode=external") {
			goflags = append(goflags, f)
		}
	}
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS="+strings.Join(goflags, " "))
	out, err := build.CombinedOutput()
	require.NoError(t, err, "%s", out)
	cmd := exec.Command(bin, "-c", "1+1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err = cmd.Run()
	var exitErr *exec.ExitError
	require.ErrorAs(t, err, &exitErr)
	assert.Contains(t, stderr.String(), "CGO_ENABLED=1")
	assert.Contains(t, stderr.String(), "python3-dev")
}

// imageCode displays a w x h PNG made in Go: the CLI's tests need no matplotlib or PIL,
// which a Python built for `make compat` lacks (the core's tests cover those).
func imageCode(t *testing.T, w, h int, display bool) string {
	t.Helper()
	var b bytes.Buffer
	require.NoError(t, png.Encode(&b, image.NewRGBA(image.Rect(0, 0, w, h))))
	code := fmt.Sprintf("Image(data=base64.b64decode('%s'))", base64.StdEncoding.EncodeToString(b.Bytes()))
	if display {
		code = "display(" + code + ")"
	}
	return "from IPython.display import Image; import base64; " + code
}

// htmlValue is a value with an HTML form, as a DataFrame has.
const htmlValue = "class Table:\n    def _repr_html_(self): return '<table><tr><td>1</td></tr></table>'\nTable()"

func TestCLIJSONDisplays(t *testing.T) {
	code, out, errOut := cli(t, "", "--json", "-c", imageCode(t, 40, 30, true))
	require.Equal(t, 0, code, errOut)
	var doc struct {
		Stdout   string
		Displays []struct {
			Data    map[string]any
			Value   bool
			Offset  int
			Caption string
			Path    *string
		}
	}
	require.NoError(t, json.Unmarshal([]byte(out), &doc))
	assert.NotContains(t, doc.Stdout, "[image", "stdout holds what was printed")
	require.Len(t, doc.Displays, 1)
	d := doc.Displays[0]
	assert.False(t, d.Value)
	assert.Regexp(t, `^\[image 1: PNG 40x30, 1 KB\]$`, d.Caption)
	assert.Equal(t, len(doc.Stdout), d.Offset)
	assert.Nil(t, d.Path, "no --save-images, no path")
	require.IsType(t, "", d.Data["image/png"])
	png, err := base64.StdEncoding.DecodeString(d.Data["image/png"].(string))
	require.NoError(t, err, "binary data is standard base64")
	assert.True(t, bytes.HasPrefix(png, []byte("\x89PNG")))
	require.IsType(t, "", d.Data["text/plain"])
	assert.Contains(t, d.Data["text/plain"], "Image object")

	// A value with an HTML form (a DataFrame's, say): text/html is text, given as is.
	code, out, errOut = cli(t, "", "--json", "-c", htmlValue)
	require.Equal(t, 0, code, errOut)
	require.NoError(t, json.Unmarshal([]byte(out), &doc))
	require.Len(t, doc.Displays, 1)
	assert.True(t, doc.Displays[0].Value)
	require.IsType(t, "", doc.Displays[0].Data["text/html"])
	assert.Contains(t, doc.Displays[0].Data["text/html"], "<table")
	assert.Contains(t, out, "<table", "HTML is not escaped to \\u003c")

	// No displays: no key.
	code, out, _ = cli(t, "", "--json", "-c", "1")
	require.Equal(t, 0, code)
	assert.NotContains(t, out, "displays")
}

func TestIsTextMIME(t *testing.T) {
	for _, mime := range []string{"text/plain", "text/html", "text/markdown", "image/svg+xml", "application/json",
		"application/javascript", "application/vnd.vegalite.v5+json", "application/xhtml+xml", "text/plain; charset=utf-8"} {
		assert.True(t, isTextMIME(mime), mime)
	}
	for _, mime := range []string{"image/png", "image/jpeg", "application/pdf", "application/octet-stream"} {
		assert.False(t, isTextMIME(mime), mime)
	}
}

func TestCLISaveImages(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "plots") // created by the CLI
	code, out, errOut := cli(t, "", "--save-images", dir, "-c", imageCode(t, 40, 30, true))
	require.Equal(t, 0, code, errOut)
	assert.Regexp(t, `^\[image 1: PNG 40x30, \d+ KB\]\n$`, out, "the marker is in the streamed output")
	first := filepath.Join(dir, "image-1.png")
	assert.Regexp(t, `^minipy: saved image 1 \(PNG \d+x\d+, \d+ KB\) to `+regexp.QuoteMeta(first)+"\n$", errOut)
	data, err := os.ReadFile(first)
	require.NoError(t, err)
	assert.True(t, bytes.HasPrefix(data, []byte("\x89PNG\r\n\x1a\n")))
	cfg, format, err := image.DecodeConfig(bytes.NewReader(data))
	require.NoError(t, err)
	assert.Equal(t, "png", format)
	assert.Positive(t, cfg.Width)
	info, err := os.Stat(dir)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o755), info.Mode().Perm())

	// A second run (as from another process: the count starts again) skips the taken name.
	code, _, errOut = cli(t, "", "--save-images", dir, "-c", imageCode(t, 30, 20, false))
	require.Equal(t, 0, code, errOut)
	second := filepath.Join(dir, "image-2.png")
	assert.Equal(t, "minipy: saved image 1 (PNG 30x20, 1 KB) to "+second+"\n", errOut)
	again, err := os.ReadFile(first)
	require.NoError(t, err)
	assert.Equal(t, data, again, "the first image is not overwritten")
	data, err = os.ReadFile(second)
	require.NoError(t, err)
	cfg, _, err = image.DecodeConfig(bytes.NewReader(data))
	require.NoError(t, err)
	assert.Equal(t, [2]int{30, 20}, [2]int{cfg.Width, cfg.Height})

	// With --json the path is in the display, not on stderr; a figure then the value.
	code, out, errOut = cli(t, "", "--json", "--save-images", dir, "-c",
		imageCode(t, 40, 30, true)+"\n"+imageCode(t, 8, 8, false))
	require.Equal(t, 0, code, errOut)
	assert.Empty(t, errOut)
	var doc struct {
		Repr     string
		Displays []struct {
			Value   bool
			Caption string
			Path    string
		}
	}
	require.NoError(t, json.Unmarshal([]byte(out), &doc))
	assert.Equal(t, "<IPython.core.display.Image object>", doc.Repr, "the value's text alone")
	assert.Equal(t, "[image 2: PNG 8x8, 1 KB]", doc.Displays[1].Caption)
	require.Len(t, doc.Displays, 2)
	assert.Equal(t, filepath.Join(dir, "image-3.png"), doc.Displays[0].Path)
	assert.Equal(t, filepath.Join(dir, "image-4.png"), doc.Displays[1].Path)
	assert.True(t, doc.Displays[1].Value)
	assert.FileExists(t, doc.Displays[1].Path)

	// The count goes on across runs of one process (the REPL's cells).
	saver := &imageSaver{dir: dir}
	img := minipy.Display{Data: map[string][]byte{"image/jpeg": []byte("\xff\xd8jpeg"), "text/plain": []byte("x")}}
	for _, want := range []string{"image-1.jpg", "image-2.jpg"} {
		saved, err := saver.save(&minipy.Result{Displays: []minipy.Display{img}})
		require.NoError(t, err)
		require.Len(t, saved, 1)
		assert.Equal(t, filepath.Join(dir, want), saved[0].path)
	}
}

func TestCLISaveImagesError(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(file, nil, 0o644))
	code, out, errOut := cli(t, "", "--save-images", file, "-c", imageCode(t, 40, 30, true))
	assert.Equal(t, 1, code)
	assert.Contains(t, out, "[image 1: PNG ")
	assert.Contains(t, errOut, "minipy: saving images: ")
}
