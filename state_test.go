package minipy_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/minipy-go/minipy"
)

// stateCell makes a namespace worth saving: data, a function that reads a global, a class
// with an instance, a closure, a module, and what cannot be saved.
const stateCell = `
import json, threading
rate = 3
def scaled(x):
    return x * rate
class Box:
    def __init__(self, v):
        self.v = v
    def twice(self):
        return Box(scaled(self.v) * 2 // rate)
def counter():
    n = 0
    def inc():
        nonlocal n
        n += 1
        return n
    return inc
tick = counter()
tick()
box = Box(21)
gen = (i for i in range(3))
lock = threading.Lock()
`

// stateEngines runs f on a namespace of each engine.
func stateEngines(t *testing.T) map[string]minipy.Engine {
	return map[string]minipy.Engine{
		"in-process": minipy.InProcess(),
		"isolated":   newIsolated(t, minipy.IsolatedConfig{}),
	}
}

// restoreAcross restores saved, which engine from saved, into target of engine to: a sandbox's
// state goes into the host process only by RestoreTrusted (Restore refuses it first, the
// namespace unchanged), as a caller whose code it was restores it.
func restoreAcross(t *testing.T, from, to string, target *minipy.Namespace, saved []byte) {
	t.Helper()
	if from == "isolated" && to == "in-process" {
		names, err := target.Names()
		require.NoError(t, err)
		require.ErrorIs(t, target.Restore(bytes.NewReader(saved)), minipy.ErrUntrustedState)
		after, err := target.Names()
		require.NoError(t, err)
		require.Equal(t, names, after, "unchanged")
		require.NoError(t, target.RestoreTrusted(bytes.NewReader(saved)), from+" to "+to)
		return
	}
	require.NoError(t, target.Restore(bytes.NewReader(saved)), from+" to "+to)
}

func newNS(t *testing.T, e minipy.Engine) *minipy.Namespace {
	t.Helper()
	var ns *minipy.Namespace
	if iso, ok := e.(*minipy.Isolated); ok {
		ns = iso.NewNamespace()
	} else {
		ns = minipy.NewNamespace()
	}
	t.Cleanup(func() { ns.Close() })
	return ns
}

func runState(t *testing.T, e minipy.Engine, ns *minipy.Namespace, code string) string {
	t.Helper()
	res, err := e.Run(context.Background(), code, &minipy.Options{Globals: ns})
	require.NoError(t, err)
	return res.Repr
}

// TestSaveRestore: a namespace saved in one engine is restored in a fresh namespace of
// each engine, with its functions, classes, closures and arrays working there, and the
// values that cannot be saved named.
func TestSaveRestore(t *testing.T) {
	engines := stateEngines(t)
	for from, src := range engines {
		ns := newNS(t, src)
		runState(t, src, ns, stateCell)
		var saved bytes.Buffer
		info, err := ns.Save(&saved)
		require.NoError(t, err, from)
		assert.ElementsMatch(t, []string{"json", "threading", "rate", "scaled", "Box", "counter", "tick", "box"},
			info.Saved, from)
		assert.Equal(t, []string{"gen", "lock"}, info.Skipped, from)
		assert.Contains(t, info.Reasons["gen"], "generator", from)
		assert.Contains(t, info.Reasons["lock"], "lock", from)

		for to, dst := range engines {
			t.Run(from+" to "+to, func(t *testing.T) {
				target := newNS(t, dst)
				runState(t, dst, target, "old = 1")
				restoreAcross(t, from, to, target, saved.Bytes())
				names, err := target.Names()
				require.NoError(t, err)
				assert.NotContains(t, names, "old", "Restore replaces the variables")
				assert.Equal(t, "(42, 42, 2, True)",
					runState(t, dst, target, "scaled(14), box.twice().v, tick(), json.loads('1') == 1"))
				assert.Equal(t, "30", runState(t, dst, target, "rate = 10\nscaled(3)"), "a restored function sees later cells")
			})
		}
	}
}

// TestSaveRestoreNumpy: numpy arrays and the module come along, both ways.
func TestSaveRestoreNumpy(t *testing.T) {
	needModule(t, "numpy")
	engines := stateEngines(t)
	for from, src := range engines {
		ns := newNS(t, src)
		runState(t, src, ns, "import numpy as np\narr = np.arange(6).reshape(2, 3)")
		var saved bytes.Buffer
		_, err := ns.Save(&saved)
		require.NoError(t, err)
		for to, dst := range engines {
			target := newNS(t, dst)
			restoreAcross(t, from, to, target, saved.Bytes())
			assert.Equal(t, "(15, (2, 3), 'int64')", runState(t, dst, target, "int(arr.sum()), arr.shape, np.asarray(arr).dtype.name"),
				from+" to "+to)
		}
	}
}

// TestSaveRestoreLarge: a namespace whose pickle is megabytes in many pieces (the
// isolated worker writes its reply from them, runtime.Chunks, with writev) round trips
// between the engines byte for byte.
func TestSaveRestoreLarge(t *testing.T) {
	needModule(t, "numpy")
	engines := stateEngines(t)
	const cell = "import numpy as np, hashlib\n" +
		"blob = bytes(range(256)) * 12289\n" + // 3 MB and a bit
		"buf = bytearray(blob[:700001])\n" +
		"arr = np.arange(600000, dtype=np.int32)[::2]\n" + // not contiguous: pickled through a copy
		"words = ['w%d' % i for i in range(50000)]\n"
	const check = "hashlib.sha256(blob + bytes(buf) + arr.tobytes() + ','.join(words).encode()).hexdigest()"
	for from, src := range engines {
		ns := newNS(t, src)
		runState(t, src, ns, cell)
		want := runState(t, src, ns, check)
		var saved bytes.Buffer
		_, err := ns.Save(&saved)
		require.NoError(t, err, from)
		require.Greater(t, saved.Len(), 4<<20, from)
		for to, dst := range engines {
			target := newNS(t, dst)
			restoreAcross(t, from, to, target, saved.Bytes())
			assert.Equal(t, want, runState(t, dst, target, check), from+" to "+to)
		}
	}
}

// TestSaveRestoreFiles: an isolated namespace's working directory comes along (files,
// directories, links, modes); the in-process engine, which has none, refuses such a
// namespace and stays unchanged.
func TestSaveRestoreFiles(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{})
	ns := newNS(t, e)
	runState(t, e, ns, "import os\nos.makedirs('data/sub')\nopen('data/sub/a.txt', 'w').write('hello')\n"+
		"os.chmod('data/sub/a.txt', 0o600)\nos.symlink('sub/a.txt', 'data/link')\nx = 1")
	var saved bytes.Buffer
	info, err := ns.Save(&saved)
	require.NoError(t, err)
	assert.Equal(t, 4, info.Files, "data, data/sub, data/sub/a.txt, data/link")

	target := newNS(t, e)
	require.NoError(t, target.WriteFile("data/sub/a.txt", []byte("to be replaced")))
	require.NoError(t, target.WriteFile("mine.txt", []byte("stays")))
	require.NoError(t, target.Restore(bytes.NewReader(saved.Bytes())))
	got, err := target.ReadFile("data/sub/a.txt")
	require.NoError(t, err)
	assert.Equal(t, "hello", string(got))
	assert.Equal(t, "('hello', 'sub/a.txt', '0o600', 'stays', 1)", runState(t, e, target,
		"open('data/link').read(), os.readlink('data/link'), oct(os.stat('data/sub/a.txt').st_mode & 0o777), "+
			"open('mine.txt').read(), x"))

	in := minipy.NewNamespace()
	defer in.Close()
	require.NoError(t, in.Set("kept", 1))
	err = in.RestoreTrusted(bytes.NewReader(saved.Bytes()))
	require.ErrorIs(t, err, minipy.ErrNoFiles)
	names, err := in.Names()
	require.NoError(t, err)
	assert.Equal(t, []string{"kept"}, names, "the namespace is unchanged")
}

// TestRestoreRefusesBadInput: empty, foreign, cut, altered and foreign-key input is
// refused before anything of it is loaded, with the namespace unchanged.
func TestRestoreRefusesBadInput(t *testing.T) {
	for name, e := range stateEngines(t) {
		t.Run(name, func(t *testing.T) {
			src := newNS(t, e)
			runState(t, e, src, "y = [1, 2]")
			var saved bytes.Buffer
			_, err := src.Save(&saved)
			require.NoError(t, err)
			good := saved.Bytes()
			altered := bytes.Clone(good)
			altered[len(altered)/2] ^= 1

			ns := newNS(t, e)
			runState(t, e, ns, "x = 1")
			for what, c := range map[string]struct {
				input []byte
				want  error
			}{
				"empty":   {nil, minipy.ErrBadState},
				"foreign": {[]byte("PK\x03\x04 a zip file, say, long enough to hold a tag: 0123456789"), minipy.ErrBadState},
				"cut":     {good[:len(good)-10], minipy.ErrBadState},
				"added":   {append(bytes.Clone(good), "more"...), minipy.ErrBadState},
				"altered": {altered, minipy.ErrStateTag},
			} {
				err := ns.Restore(bytes.NewReader(c.input))
				assert.ErrorIs(t, err, c.want, what)
				if what != "altered" {
					assert.NotErrorIs(t, err, minipy.ErrStateTag, what)
				}
			}
			assert.Equal(t, "(1, False)", runState(t, e, ns, "x, 'y' in globals()"), "unchanged")
		})
	}
}

// TestStateKey: a namespace sealed under one key is refused under another, and restored
// once the key is set back; short keys are refused.
func TestStateKey(t *testing.T) {
	require.Error(t, minipy.SetStateKey([]byte("short")))
	key1 := bytes.Repeat([]byte{1}, 32)
	key2 := bytes.Repeat([]byte{2}, 32)
	require.NoError(t, minipy.SetStateKey(key1))
	t.Cleanup(func() { minipy.SetStateKey(bytes.Repeat([]byte{7}, 32)) }) //nolint:errcheck
	ns := minipy.NewNamespace()
	defer ns.Close()
	require.NoError(t, ns.Set("v", "secret"))
	var saved bytes.Buffer
	_, err := ns.Save(&saved)
	require.NoError(t, err)

	require.NoError(t, minipy.SetStateKey(key2))
	target := minipy.NewNamespace()
	defer target.Close()
	require.ErrorIs(t, target.Restore(bytes.NewReader(saved.Bytes())), minipy.ErrStateTag)
	require.NoError(t, minipy.SetStateKey(key1))
	require.NoError(t, target.Restore(bytes.NewReader(saved.Bytes())))
	v, err := target.Get("v")
	require.NoError(t, err)
	assert.Equal(t, "secret", v)
}

// TestRestoreHostFunctions: host functions are not saved; a restored namespace keeps the
// ones registered on it and names the missing ones when they are called.
func TestRestoreHostFunctions(t *testing.T) {
	for name, e := range stateEngines(t) {
		t.Run(name, func(t *testing.T) {
			double := minipy.Func("double", "Doubles n.", func(_ context.Context, in struct {
				N int `json:"n"`
			}) (int, error) {
				return 2 * in.N, nil
			})
			src := newNS(t, e)
			require.NoError(t, src.Register(double))
			runState(t, e, src, "def quad(n):\n    return double(n=double(n=n))")
			var saved bytes.Buffer
			info, err := src.Save(&saved)
			require.NoError(t, err)
			assert.Equal(t, []string{"double"}, info.HostFunctions)

			bare := newNS(t, e)
			require.NoError(t, bare.Restore(bytes.NewReader(saved.Bytes())))
			_, err = e.Run(context.Background(), "quad(1)", &minipy.Options{Globals: bare})
			var pyErr *minipy.PythonError
			require.ErrorAs(t, err, &pyErr)
			assert.Contains(t, pyErr.Error(), "host function double is not registered")

			require.NoError(t, bare.Register(double))
			assert.Equal(t, "12", runState(t, e, bare, "quad(3)"), "registered after the restore")

			ready := newNS(t, e)
			require.NoError(t, ready.Register(double))
			require.NoError(t, ready.Restore(bytes.NewReader(saved.Bytes())))
			assert.Equal(t, "20", runState(t, e, ready, "quad(5)"), "registered before the restore")
		})
	}
}

// TestSaveClosedNamespace: a closed namespace cannot be saved or restored.
func TestSaveClosedNamespace(t *testing.T) {
	ns := minipy.NewNamespace()
	require.NoError(t, ns.Close())
	_, err := ns.Save(&bytes.Buffer{})
	require.ErrorIs(t, err, minipy.ErrNamespaceClosed)
	require.ErrorIs(t, ns.Restore(strings.NewReader("x")), minipy.ErrNamespaceClosed)
	require.False(t, errors.Is(err, minipy.ErrBadState))
}

// TestRestoreModuleFromItsFiles: a value of a module the code wrote in its working
// directory loads once the saved files are there.
func TestRestoreModuleFromItsFiles(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{})
	ns := newNS(t, e)
	runState(t, e, ns, "open('shapes.py', 'w').write('class Square:\\n    def __init__(self, n): self.n = n\\n')\n"+
		"import shapes\nsq = shapes.Square(3)")
	var saved bytes.Buffer
	_, err := ns.Save(&saved)
	require.NoError(t, err)
	target := newNS(t, e)
	require.NoError(t, target.Restore(bytes.NewReader(saved.Bytes())))
	assert.Equal(t, "3", runState(t, e, target, "sq.n"))
}

// TestRestoreDataclassRepr: a dataclass's __repr__ is reprlib's wrapper (3.12+; dataclasses'
// own in 3.11), whose globals are that module's: restored with the namespace as its globals,
// repr() raised NameError (_thread, get_ident).
func TestRestoreDataclassRepr(t *testing.T) {
	for name, e := range stateEngines(t) {
		ns := newNS(t, e)
		runState(t, e, ns, "from dataclasses import dataclass, field\n@dataclass\nclass P:\n    x: int\n"+
			"    tags: list = field(default_factory=list)\np = P(1)")
		var saved bytes.Buffer
		_, err := ns.Save(&saved)
		require.NoError(t, err, name)
		target := newNS(t, e)
		require.NoError(t, target.Restore(bytes.NewReader(saved.Bytes())), name)
		assert.Equal(t, "(P(x=1, tags=[]), P(x=2, tags=[]), True)", runState(t, e, target, "p, P(2), p == P(1)"), name)
	}
}

// TestSaveAnnotatedClass: a class with annotations (every dataclass) is saved and restored
// with them. From 3.14 (PEP 649) they are a function closing over the class's dict, which
// Save could not pickle: it skipped every annotated class.
func TestSaveAnnotatedClass(t *testing.T) {
	for name, e := range stateEngines(t) {
		ns := newNS(t, e)
		runState(t, e, ns, "from dataclasses import dataclass\n@dataclass\nclass P:\n    x: int\n    y: 'Later' = None\n"+
			"class Plain:\n    n: float\nclass Later: pass\np = P(1)")
		var saved bytes.Buffer
		info, err := ns.Save(&saved)
		require.NoError(t, err, name)
		assert.Empty(t, info.Skipped, "%s: %v", name, info.Reasons)
		target := newNS(t, e)
		require.NoError(t, target.Restore(bytes.NewReader(saved.Bytes())), name)
		assert.Equal(t, "True", runState(t, e, target, "P.__annotations__ == {'x': int, 'y': 'Later'} and "+
			"Plain.__annotations__ == {'n': float} and repr(p) == 'P(x=1, y=None)'"), name)
	}
}

// Issue 48, finding 9: a namespace saved by an isolated engine holds a pickle that the
// sandboxed code made, and unpickling runs code: restored in-process, it ran in the host. It
// is refused there (ErrUntrustedState), nothing of it run and the namespace unchanged,
// unless the caller restores it by name (RestoreTrusted).
func TestRestoreSandboxStateInTheHost(t *testing.T) {
	marker := filepath.Join(t.TempDir(), "pwned")
	e := newIsolated(t, minipy.IsolatedConfig{})
	ns := newNS(t, e)
	runState(t, e, ns, fmt.Sprintf("class Payload:\n    def __reduce__(self):\n"+
		"        return (eval, (\"__import__('os').path.isdir(%%r) and __import__('pathlib').Path(%%r).write_text('ran in the host')\" %% (%q, %q),))\n"+
		"p = Payload()", filepath.Dir(marker), marker))
	var saved bytes.Buffer
	_, err := ns.Save(&saved)
	require.NoError(t, err)

	host := minipy.NewNamespace()
	defer host.Close()
	_, err = minipy.Run(t.Context(), "kept = 1", &minipy.Options{Globals: host})
	require.NoError(t, err)
	err = host.Restore(bytes.NewReader(saved.Bytes()))
	require.ErrorIs(t, err, minipy.ErrUntrustedState)
	assert.NoFileExists(t, marker, "nothing of the pickle ran")
	v, err := host.Get("kept")
	require.NoError(t, err)
	assert.Equal(t, int64(1), v, "the namespace unchanged")

	other := newNS(t, e)
	require.NoError(t, other.Restore(bytes.NewReader(saved.Bytes())), "into a sandbox it goes")
	assert.NoFileExists(t, marker, "(the sandbox does not reach the host's directory)")

	require.NoError(t, host.RestoreTrusted(bytes.NewReader(saved.Bytes())))
	assert.FileExists(t, marker, "trusted by name: the pickle's code ran here, as said")
}

// Issue 48, finding 7: a chain of 1,000 directories cost Restore 11.8 s of the host's CPU
// (each directory's path resolved from the root for every prefix). The host walks and
// writes trees from their directories' fds: the chain saves and restores in well under a
// second of CPU (5 s is the bound here, for a loaded machine under -race: 1.3 s).
func TestRestoreDeepTree(t *testing.T) {
	e := newIsolated(t, minipy.IsolatedConfig{})
	ns := newNS(t, e)
	runState(t, e, ns, "import os\nfor i in range(1, 1001):\n    os.mkdir('/'.join(['d'] * i))\n"+
		"open('/'.join(['d'] * 1000 + ['bottom.txt']), 'w').write('deep')")
	cpu := func() time.Duration {
		var ru syscall.Rusage
		require.NoError(t, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	before := cpu()
	var saved bytes.Buffer
	info, err := ns.Save(&saved)
	require.NoError(t, err)
	assert.Equal(t, 1001, info.Files)
	target := newNS(t, e)
	require.NoError(t, target.Restore(bytes.NewReader(saved.Bytes())))
	used := cpu() - before
	t.Logf("Save and Restore of 1,000 nested directories: %v of the host's CPU", used)
	assert.Less(t, used, 5*time.Second)
	got, err := target.ReadFile(strings.Repeat("d/", 1000) + "bottom.txt")
	require.NoError(t, err)
	assert.Equal(t, "deep", string(got))
}

// Saving runs the values' own code (__reduce__): a value whose code never returns is
// stopped as a run past its timeout is (defaultOpTimeout; shortened here), whether it
// yields to the kick or swallows it: Save returns an error matching ErrTimeout instead of
// hanging its caller, and the namespace goes on (its worker rolled back).
func TestSaveOfHostileValueIsStopped(t *testing.T) {
	for name, loop := range map[string]string{
		"kicked":   "while True: time.sleep(1)",
		"swallows": "while True:\n            try:\n                time.sleep(1)\n            except BaseException:\n                pass",
	} {
		t.Run(name, func(t *testing.T) {
			e := newIsolated(t, minipy.IsolatedConfig{})
			minipy.SetOpTimeout(e, 300*time.Millisecond)
			ns := e.NewNamespace()
			_, err := e.Run(context.Background(), "import time\nclass Evil:\n    def __reduce__(self):\n        "+loop+
				"\nevil = Evil()\nx = 41", &minipy.Options{Globals: ns})
			require.NoError(t, err)
			done := make(chan error, 1)
			go func() { _, err := ns.Save(io.Discard); done <- err }()
			select {
			case err = <-done:
			case <-time.After(time.Minute):
				t.Fatal("Save still waits on the value's code")
			}
			require.ErrorIs(t, err, minipy.ErrTimeout)
			r, err := e.Run(context.Background(), "x + 1", &minipy.Options{Globals: ns})
			require.NoError(t, err)
			assert.Equal(t, int64(42), r.Value)
		})
	}
}
