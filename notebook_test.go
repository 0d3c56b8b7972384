package minipy_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/minipy-go/minipy"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// nbEnv is one engine with a fresh namespace, for notebook cells.
type nbEnv struct {
	eng  minipy.Engine
	ns   *minipy.Namespace
	opts *minipy.Options
}

func newNbEnv(t *testing.T, eng minipy.Engine) *nbEnv {
	t.Helper()
	ns := eng.NewNamespace()
	t.Cleanup(func() { ns.Close() })
	return &nbEnv{eng: eng, ns: ns, opts: &minipy.Options{Globals: ns, Timeout: 30 * time.Second}}
}

func (n *nbEnv) run(t *testing.T, code string) *minipy.Result {
	t.Helper()
	res, err := n.eng.Run(context.Background(), code, n.opts)
	require.NoError(t, err, "%s", code)
	return res
}

func (n *nbEnv) tool(t *testing.T, code string) string {
	t.Helper()
	input, err := json.Marshal(map[string]any{"code": code})
	require.NoError(t, err)
	text, _ := n.eng.CallTool(context.Background(), input, n.opts)
	return text
}

// The model's text for cells of IPython syntax is the same on both engines, and is pinned
// by golden files (testdata/notebook/NAME.txt: the cell, then what the model reads).
func TestNotebookSyntaxGolden(t *testing.T) {
	cells := []struct{ name, code string }{
		{"shell", "x = 5\n!echo hello {x} $x '$x' $$x\nfiles = !printf 'a\\nb\\n'\nprint(files, files.s)\n!!echo {x * 2}"},
		{"shell_stderr_merged", "!echo out; echo err >&2; exit 3\nprint('exit code', _exit_code)"},
		{"shell_in_block", "for i in range(2):\n    !echo loop {i}\n    print('after', i)"},
		{"help", "len?"},
		{"help_source", "def add(a, b=1):\n    \"Add b to a.\"\n    return a + b\nadd??"},
		{"help_missing", "nothing_here?"},
		{"who", "a = 1\nb = 'two'\nimport math\n%who\n%whos\n%who int"},
		{"env", "%env MINIPY_NB_TEST=one two\n%env MINIPY_NB_TEST"},
		{"unknown_magic", "x = 1\n%nosuch arg"},
		{"unknown_cell_magic", "%%nosuch\nprint(1)"},
		{"misplaced_cell_magic", "x = 1\n%%time\nprint(x)"},
		{"line_numbers", "a = 1\n!true\nb = 1/0"},
		{"bash", "%%bash\necho one\necho two >&2\nexit 3"},
		{"capture", "%%capture cap\nprint('hidden')\n!echo also hidden"},
		{"accepted", "%matplotlib inline\n%load_ext autoreload\n%autoreload 2\n'ok'"},
	}
	for _, e := range engines(t) {
		t.Run(e.name, func(t *testing.T) {
			for _, c := range cells {
				t.Run(c.name, func(t *testing.T) {
					n := newNbEnv(t, e.eng)
					got := "[cell]\n" + c.code + "\n" + n.tool(t, c.code)
					minipy.CheckGolden(t, filepath.Join("notebook", c.name+".txt"), minipy.CellNumber.ReplaceAllString(got, "<cell-N>"))
				})
			}
		})
	}
}

// Valid Python is never transformed, even where it looks like IPython syntax; and a cell
// with IPython syntax leaves its strings alone.
func TestNotebookLeavesPythonAlone(t *testing.T) {
	for _, e := range engines(t) {
		t.Run(e.name, func(t *testing.T) {
			n := newNbEnv(t, e.eng)
			res := n.run(t, "a = 7 % 3\nb = 1 != 2\ns = '!ls %time x?'\nc = (7\n% 2)\n(a, b, s, c)")
			assert.Equal(t, []any{int64(1), true, "!ls %time x?", int64(1)}, res.Value)
			res = n.run(t, "s = \"\"\"\n%not_magic\n!not_shell\nx?\n\"\"\"\n%pwd\nt = (1,\n  2) # what?\ns")
			assert.Equal(t, "\n%not_magic\n!not_shell\nx?\n", res.Value)
			_, err := n.eng.Run(context.Background(), "x = (1,\n!ls", n.opts)
			var py *minipy.PythonError
			require.ErrorAs(t, err, &py)
			assert.Equal(t, "SyntaxError", py.Type)
		})
	}
}

func TestNotebookMagics(t *testing.T) {
	for _, e := range engines(t) {
		t.Run(e.name, func(t *testing.T) {
			n := newNbEnv(t, e.eng)
			res := n.run(t, "%time sum(range(1000))")
			assert.Equal(t, int64(499500), res.Value)
			assert.Regexp(t, `^CPU times: user .+, sys: .+, total: .+\nWall time: .+\n$`, res.Stdout)

			res = n.run(t, "%%time\nx = 2\nx * 21")
			assert.Equal(t, int64(42), res.Value)
			assert.Contains(t, res.Stdout, "Wall time: ")

			res = n.run(t, "%timeit -n 10 -r 2 sum(range(10))")
			assert.Regexp(t, `^\S+ .?s ± \S+ .?s per loop \(mean ± std\. dev\. of 2 runs, 10 loops each\)\n$`, res.Stdout)
			res = n.run(t, "r = %timeit -o -q -n 5 -r 3 pass\n(r.loops, r.repeat, len(r.all_runs), r.best <= r.worst)")
			assert.Equal(t, []any{int64(5), int64(3), int64(3), true}, res.Value)
			assert.Empty(t, res.Stdout)
			res = n.run(t, "%%timeit -n 3 -r 1 y = 2\ny * 2")
			assert.Contains(t, res.Stdout, "(mean ± std. dev. of 1 run, 3 loops each)")

			// The statement of %time runs in the cell's namespace and its errors name the line.
			_, err := n.eng.Run(context.Background(), "z = 1\n%time z / 0", n.opts)
			var py *minipy.PythonError
			require.ErrorAs(t, err, &py)
			assert.Equal(t, "ZeroDivisionError", py.Type)
			assert.Contains(t, py.Traceback, "line 2")
			assert.Contains(t, py.Traceback, "%time z / 0")

			// The worker has a /tmp of its own; in-process a test directory of the host's.
			dir := n.run(t, "import tempfile\nd = tempfile.mkdtemp()\nd").Value.(string)
			res = n.run(t, "%%writefile {d}/f.py\nprint('from file')\n")
			assert.Equal(t, "Writing "+dir+"/f.py\n", res.Stdout)
			res = n.run(t, "%%writefile -a $d/f.py\nprint('more')\n")
			assert.Equal(t, "Appending to "+dir+"/f.py\n", res.Stdout)
			assert.Equal(t, "print('from file')\nprint('more')\n", n.run(t, "open(d + '/f.py').read()").Value)
			res = n.run(t, "%%writefile {d}/f.py\nx = 1\n")
			assert.Equal(t, "Overwriting "+dir+"/f.py\n", res.Stdout)

			res = n.run(t, "%%capture cap --no-stderr\nprint('kept')\n")
			assert.Empty(t, res.Stdout)
			assert.Equal(t, "kept\n", n.run(t, "cap.stdout").Value)
			assert.Equal(t, "kept\n", n.run(t, "cap()").Stdout)

			res = n.run(t, "%ls $d")
			assert.Equal(t, "f.py\n", res.Stdout)
			n.run(t, "import shutil\nshutil.rmtree(d)")
		})
	}
}

// %cd changes the process's directory (in-process, the host's): the test goes back.
func TestNotebookCd(t *testing.T) {
	for _, e := range engines(t) {
		t.Run(e.name, func(t *testing.T) {
			n := newNbEnv(t, e.eng)
			dir, err := filepath.EvalSymlinks(t.TempDir())
			require.NoError(t, err)
			if e.name == "isolated" {
				dir = "/tmp"
			}
			require.NoError(t, n.ns.Set("d", dir))
			res := n.run(t, "before = %pwd\n%cd $d\nafter = %pwd\n%cd -q -\n(before, after, __import__('os').getcwd() == before)")
			assert.Equal(t, dir+"\n", res.Stdout)
			v := res.Value.([]any)
			assert.Equal(t, dir, v[1])
			assert.Equal(t, true, v[2])
		})
	}
}

func TestNotebookPip(t *testing.T) {
	havePip := exec.Command(minipy.LinkedPython(), "-c", "import pip").Run() == nil
	for _, e := range engines(t) {
		t.Run(e.name, func(t *testing.T) {
			n := newNbEnv(t, e.eng)
			res := n.run(t, "%pip --version")
			if havePip && e.name == "inprocess" {
				assert.Regexp(t, `^pip \S+ from `, res.Stdout)
			} else if !havePip {
				assert.Contains(t, res.Stdout, "minipy: pip is not installed for ")
			}
			// No network here: the sandbox has none, and CI machines may have none either.
			if e.name == "isolated" && havePip {
				res = n.run(t, "%pip download --no-deps -d /tmp/dl --index-url http://127.0.0.1:9/simple minipy-no-such-package")
				assert.Contains(t, res.Stdout, "minipy: pip could not reach the package index")
			}
		})
	}
}

// A shell command is stopped with its run, and its process with it.
func TestNotebookShellStops(t *testing.T) {
	for _, e := range engines(t) {
		t.Run(e.name, func(t *testing.T) {
			n := newNbEnv(t, e.eng)
			n.run(t, "pass") // the worker is up: the timeout is the shell command's
			marker := fmt.Sprintf("%d.%d", 30, time.Now().UnixNano()%1e6)
			opts := *n.opts
			opts.Timeout = time.Second
			start := time.Now()
			_, err := n.eng.Run(context.Background(), "print('start')\n!sleep "+marker, &opts)
			assert.Less(t, time.Since(start), 10*time.Second)
			require.ErrorIs(t, err, minipy.ErrTimeout)
			var ie *minipy.InterruptedError
			require.True(t, errors.As(err, &ie))
			assert.Contains(t, ie.Python.Traceback, "!sleep")
			if e.name == "inprocess" {
				assert.Eventually(t, func() bool { return !processWithArg("sleep", marker) }, 5*time.Second, 20*time.Millisecond)
			}
			assert.Equal(t, int64(2), n.run(t, "1 + 1").Value, "the namespace works on")
		})
	}
}

// processWithArg reports whether a process named name with arg among its arguments lives.
func processWithArg(name, arg string) bool {
	entries, _ := os.ReadDir("/proc")
	for _, ent := range entries {
		cmdline, err := os.ReadFile(filepath.Join("/proc", ent.Name(), "cmdline"))
		if err != nil {
			continue
		}
		parts := strings.Split(string(cmdline), "\x00")
		if len(parts) > 1 && filepath.Base(parts[0]) == name && parts[1] == arg {
			return true
		}
	}
	return false
}

// Child processes that inherit stdout and stderr write into the run's output, in order with
// print, on both engines alike.
func TestChildProcessOutput(t *testing.T) {
	code := strings.Join([]string{
		"import subprocess, os, sys",
		"print('a')",
		"subprocess.run(['echo', 'b'])",
		"print('c')",
		"os.system('echo d; echo e >&2')",
		"r = subprocess.run('echo f', shell=True, stdout=sys.stdout)",
		"print(os.popen('echo g; echo h >&2').read().strip())",
		"subprocess.run(['sh', '-c', 'echo i >&2'], stderr=subprocess.STDOUT)",
		"os.write(sys.stdout.fileno(), b'j\\n')",
		"print('k')",
		"subprocess.run(['sh', '-c', 'head -c 200000 /dev/zero | tr \"\\\\0\" x; echo'])",
		"print('l')",
	}, "\n")
	want := "a\nb\nc\nd\nf\ng\ni\nj\nk\n" + strings.Repeat("x", 200000) + "\nl\n"
	for _, e := range engines(t) {
		t.Run(e.name, func(t *testing.T) {
			n := newNbEnv(t, e.eng)
			n.opts.MaxOutput = -1
			res := n.run(t, code)
			assert.Equal(t, want, res.Stdout)
			assert.Equal(t, "e\nh\n", res.Stderr)
			// What a background child writes after its run ends is not the next run's. (It
			// writes 0.2 s after the run; the next run starts 2 s after it, a margin that a
			// loaded machine's slow start of sh does not use up: written later, it would be
			// written during the next run, whose output it then is.)
			n.run(t, "import subprocess\np = subprocess.Popen(['sh', '-c', 'sleep 0.2; echo late'])")
			time.Sleep(2 * time.Second)
			res = n.run(t, "p.wait(); print('next')")
			assert.Equal(t, "next\n", res.Stdout)
		})
	}
}

// In-process, child processes never write to the host's own fds 1 and 2: the helper
// process runs such code and prints only its marker.
func TestChildProcessesSpareHostFds(t *testing.T) {
	if os.Getenv("MINIPY_FD_HELPER") == "1" {
		res, err := minipy.Run(context.Background(),
			"import subprocess, os\nsubprocess.run(['echo', 'LEAK-out'])\nsubprocess.run('echo LEAK-err >&2', shell=True)\n"+
				"os.system('echo LEAK-system')\n!echo LEAK-bang", nil)
		if err != nil {
			fmt.Println("error:", err)
			return
		}
		fmt.Printf("MARKER %q\n", res.Stdout+res.Stderr)
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestChildProcessesSpareHostFds$", "-test.count=1")
	cmd.Env = append(os.Environ(), "MINIPY_FD_HELPER=1")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Contains(t, string(out), `MARKER "LEAK-out\nLEAK-system\nLEAK-bang\nLEAK-err\n"`)
	assert.Equal(t, 4, strings.Count(string(out), "LEAK-"), "only in the marker: %s", out)
}
