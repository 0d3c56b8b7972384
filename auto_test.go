package minipy_test

import (
	"archive/zip"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/minipy-go/minipy"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeVenv makes the two files that make dir a virtualenv for FindVirtualenv.
func fakeVenv(t *testing.T, dir string) {
	t.Helper()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "bin"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "pyvenv.cfg"), []byte("home = /usr/bin\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "bin", "python"), nil, 0o755))
}

func write(t *testing.T, path, content string) {
	t.Helper()
	require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
	require.NoError(t, os.WriteFile(path, []byte(content), 0o644))
}

func TestFindVirtualenv(t *testing.T) {
	t.Setenv("VIRTUAL_ENV", "")
	t.Setenv("UV_PROJECT_ENVIRONMENT", "")
	root := t.TempDir()
	require.NoError(t, os.Mkdir(filepath.Join(root, ".git"), 0o755)) // the search stops here

	// A .venv in the project, found from a subdirectory.
	proj := filepath.Join(root, "proj")
	fakeVenv(t, filepath.Join(proj, ".venv"))
	sub := filepath.Join(proj, "src", "pkg")
	require.NoError(t, os.MkdirAll(sub, 0o755))
	venv, project, err := minipy.FindVirtualenv(sub)
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(proj, ".venv"), venv)
	assert.Equal(t, proj, project)

	// A uv project: uv.lock, or [tool.uv] in pyproject.toml; its environment must exist.
	uv := filepath.Join(root, "uvproj")
	write(t, filepath.Join(uv, "uv.lock"), "version = 1\n")
	_, _, err = minipy.FindVirtualenv(uv)
	assert.ErrorIs(t, err, minipy.ErrNoVirtualenv)
	t.Setenv("UV_PROJECT_ENVIRONMENT", "env")
	fakeVenv(t, filepath.Join(uv, "env"))
	venv, _, err = minipy.FindVirtualenv(uv)
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(uv, "env"), venv)
	t.Setenv("UV_PROJECT_ENVIRONMENT", "")

	tooluv := filepath.Join(root, "tooluv")
	write(t, filepath.Join(tooluv, "pyproject.toml"), "[project]\nname = \"x\"\n\n[tool.uv]\ndev-dependencies = []\n")
	_, _, err = minipy.FindVirtualenv(tooluv)
	assert.ErrorIs(t, err, minipy.ErrNoVirtualenv)
	fakeVenv(t, filepath.Join(tooluv, ".venv"))
	venv, _, err = minipy.FindVirtualenv(tooluv)
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(tooluv, ".venv"), venv)

	// No markers up to .git: no virtualenv (the in-process engine).
	plain := filepath.Join(root, "plain", "deeper")
	require.NoError(t, os.MkdirAll(plain, 0o755))
	venv, _, err = minipy.FindVirtualenv(plain)
	require.NoError(t, err)
	assert.Empty(t, venv)
	eng, err := minipy.Auto(plain)
	require.NoError(t, err)
	assert.Equal(t, minipy.InProcess(), eng)

	// An active virtualenv wins; a bad one is an error.
	t.Setenv("VIRTUAL_ENV", filepath.Join(tooluv, ".venv"))
	venv, _, err = minipy.FindVirtualenv(plain)
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(tooluv, ".venv"), venv)
	t.Setenv("VIRTUAL_ENV", plain)
	_, _, err = minipy.FindVirtualenv(plain)
	assert.Error(t, err)
}

// helloWheel writes a wheel of a one-module package "hello" into dir: pip installs it
// without the network or a build backend.
func helloWheel(t *testing.T, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "hello-1.0-py3-none-any.whl")
	f, err := os.Create(path)
	require.NoError(t, err)
	z := zip.NewWriter(f)
	for name, content := range map[string]string{
		"hello/__init__.py":            "GREETING = 'hello from the venv'\n",
		"hello-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: hello\nVersion: 1.0\n",
		"hello-1.0.dist-info/WHEEL":    "Wheel-Version: 1.0\nGenerator: minipy-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
		"hello-1.0.dist-info/RECORD":   "hello/__init__.py,,\nhello-1.0.dist-info/METADATA,,\nhello-1.0.dist-info/WHEEL,,\nhello-1.0.dist-info/RECORD,,\n",
	} {
		w, err := z.Create(name)
		require.NoError(t, err)
		_, err = w.Write([]byte(content))
		require.NoError(t, err)
	}
	require.NoError(t, z.Close())
	require.NoError(t, f.Close())
	return path
}

// Auto on a project with a real virtualenv: the code runs on the venv's python in a worker,
// sees the project's files, and what it installs with pip lands in the venv.
func TestAutoUsesProjectVirtualenv(t *testing.T) {
	t.Setenv("VIRTUAL_ENV", "")
	r, err := minipy.Minipy("import sys; sys.executable", nil)
	require.NoError(t, err)
	python := r.Value.(string) // the linked libpython's python: venvs of it run our workers
	proj := t.TempDir()
	out, err := exec.Command(python, "-m", "venv", filepath.Join(proj, ".venv")).CombinedOutput()
	require.NoError(t, err, "%s", out)
	write(t, filepath.Join(proj, "data.txt"), "project data\n")
	wheel := helloWheel(t, proj)
	if os.Geteuid() == 0 {
		// A root host's sandboxed workers run as nobody (see IsolatedConfig): let nobody
		// reach the project and write to the venv, as a user's own would be to a worker
		// running as that user.
		for _, d := range []string{proj, filepath.Dir(proj)} { // t.TempDir's two levels
			require.NoError(t, os.Chmod(d, 0o755))
		}
		require.NoError(t, exec.Command("chmod", "-R", "a+rwX", filepath.Join(proj, ".venv")).Run())
	}

	eng, err := minipy.Auto(proj)
	require.NoError(t, err)
	defer eng.Close()
	_, isolated := eng.(*minipy.Isolated)
	require.True(t, isolated, "a project with a virtualenv gets the isolated engine")
	ns := eng.NewNamespace()
	opts := &minipy.Options{Globals: ns, Timeout: 2 * 60e9}
	r, err = eng.Run(context.Background(), "import sys, os\nsys.prefix, os.environ['VIRTUAL_ENV'], open("+pyQuote(filepath.Join(proj, "data.txt"))+").read()", opts)
	require.NoError(t, err)
	venv := filepath.Join(proj, ".venv")
	assert.Equal(t, []any{venv, venv, "project data\n"}, r.Value)

	r, err = eng.Run(context.Background(), "import subprocess, sys\np = subprocess.run([sys.executable, '-m', 'pip', 'install', '--no-index', '-q', "+
		pyQuote(wheel)+"], capture_output=True, text=True)\np.returncode, p.stderr", opts)
	require.NoError(t, err)
	assert.Equal(t, int64(0), r.Value.([]any)[0], "pip failed: %v", r.Value)
	r, err = eng.Run(context.Background(), "import hello; hello.GREETING", opts)
	require.NoError(t, err)
	assert.Equal(t, "hello from the venv", r.Value)
	matches, _ := filepath.Glob(filepath.Join(venv, "lib", "python3*", "site-packages", "hello", "__init__.py"))
	assert.Len(t, matches, 1, "the package is installed in the host's virtualenv")

	// The project is read-only to the code; the venv is not.
	_, err = eng.Run(context.Background(), "open("+pyQuote(filepath.Join(proj, "new.txt"))+", 'w')", opts)
	var pyErr *minipy.PythonError
	require.ErrorAs(t, err, &pyErr)
	assert.Equal(t, "OSError", pyErr.Type)
}

// pyQuote is s as a Python string literal.
func pyQuote(s string) string {
	q := "'"
	for _, r := range s {
		switch r {
		case '\'', '\\':
			q += "\\" + string(r)
		default:
			q += string(r)
		}
	}
	return q + "'"
}

func TestNewBackend(t *testing.T) {
	t.Setenv("VIRTUAL_ENV", "")
	eng, err := minipy.NewBackend(minipy.BackendInProcess, t.TempDir(), minipy.IsolatedConfig{})
	require.NoError(t, err)
	assert.Equal(t, minipy.InProcess(), eng)
	eng, err = minipy.NewBackend(minipy.BackendIsolated, t.TempDir(), minipy.IsolatedConfig{Workers: 1})
	require.NoError(t, err)
	_, isolated := eng.(*minipy.Isolated)
	assert.True(t, isolated)
	require.NoError(t, eng.Close())
	_, err = minipy.NewBackend("kernel", t.TempDir(), minipy.IsolatedConfig{})
	assert.ErrorIs(t, err, minipy.ErrBackend)
}
