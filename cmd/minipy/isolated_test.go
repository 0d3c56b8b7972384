package main

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCLIIsolatedRunsInAWorker(t *testing.T) {
	// os._exit would end an in-process run's host; in a worker it is a reported crash.
	code, out, errOut := cli(t, "", "--isolated", "-c", "import os; os.write(1, b'raw\\n'); os.getpid() != "+
		"__import__('os').getppid()")
	assert.Equal(t, 0, code, errOut)
	assert.Equal(t, "raw\nTrue\n", out)

	code, _, errOut = cli(t, "", "--isolated", "-c", "import os; os._exit(3)")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "exited with status 3")

	// (A second, not 100 ms: under load a first run's kick could land before the C loop
	// began, and stop it as Python.)
	code, _, errOut = cli(t, "", "--isolated", "--timeout", "1s", "-c", "sum(range(10**12))")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "worker process tree was killed")
}

func TestCLIIsolatedMountAndEnv(t *testing.T) {
	dir, err := os.MkdirTemp("", "minipy-cli-")
	require.NoError(t, err)
	defer os.RemoveAll(dir)
	require.NoError(t, os.Chmod(dir, 0o755)) // the sandbox's user must be able to enter it
	require.NoError(t, os.WriteFile(filepath.Join(dir, "in.txt"), []byte("from the host"), 0o644))
	t.Setenv("MINIPY_CLI_SECRET", "s3cret")
	code, out, errOut := cli(t, "", "--isolated", "--mount", dir+":/data", "--env", "GREETING=hi", "-c",
		"import os; open('/data/in.txt').read(), os.environ.get('GREETING'), os.environ.get('MINIPY_CLI_SECRET')")
	assert.Equal(t, 0, code, errOut)
	assert.Equal(t, "('from the host', 'hi', None)\n", out)

	code, _, errOut = cli(t, "", "--isolated", "--mount", ":/x", "-c", "1")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "SOURCE[:TARGET][:rw]")
}

// --egress-allow: the sandbox's proxy lets through the hosts listed and says why it refuses
// the others, in one line (the refused name never reaches a resolver or a dial); it makes the
// backend isolated and cannot go with --network.
func TestCLIEgressAllow(t *testing.T) {
	code, out, errOut := cli(t, "", "--egress-allow", "pypi,example.test:8443", "-c", `import urllib.request, urllib.error
try:
    urllib.request.urlopen("http://unlisted.test/", timeout=10)
except urllib.error.HTTPError as e:
    print(e.code, e.read().decode().strip())`)
	assert.Equal(t, 0, code, errOut)
	assert.Equal(t, "403 minipy: egress to unlisted.test:80 is not allowed (allowed: pypi.org, files.pythonhosted.org, "+
		"example.test:8443)\n", out)

	code, _, errOut = cli(t, "", "--egress-allow", "pypi", "--network", "-c", "1")
	assert.NotEqual(t, 0, code)
	assert.Contains(t, errOut, "IsolatedConfig.Egress is the way out of a sandbox without a network")
}

// --root-user gives the sandbox a root user (a root host's), which its code becomes with
// sudo; without it there is no sudo.
func TestCLIRootUser(t *testing.T) {
	script := "import subprocess; subprocess.run('sudo id -u', shell=True, capture_output=True, text=True).stdout.strip()"
	code, out, errOut := cli(t, "", "--isolated", "-c", script)
	assert.Equal(t, 0, code, errOut)
	assert.Equal(t, "''\n", out, "no root user, no sudo")
	code, out, errOut = cli(t, "", "--root-user", "-c", script)
	if os.Geteuid() != 0 {
		assert.Equal(t, 1, code)
		assert.Contains(t, errOut, "root")
		return
	}
	assert.Equal(t, 0, code, errOut)
	assert.Equal(t, "'0'\n", out)
}

// SIGTERM (timeout(1)'s) and SIGHUP end the CLI with 128 + the signal once its engine is
// closed: no sandbox outlives it (testproc checks), and its private directory is gone.
func TestCLITerminateClosesTheEngine(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGHUP} {
		tmp := t.TempDir()
		// (The workers' user passes through it, as through /tmp.)
		require.NoError(t, os.Chmod(filepath.Dir(tmp), 0o711))
		require.NoError(t, os.Chmod(tmp, 0o711))
		cmd := command(t, "--isolated", "--timeout", "60s", "-c", "print('ready', flush=True)\nimport time\ntime.sleep(60)")
		cmd.Env = append(cmd.Env, "TMPDIR="+tmp)
		var errOut bytes.Buffer
		cmd.Stderr = &errOut
		out, err := cmd.StdoutPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		line, err := bufio.NewReader(out).ReadString('\n')
		if err != nil {
			cmd.Wait() //nolint:errcheck // (its stderr says why)
			t.Fatalf("%v: %s", err, errOut.String())
		}
		require.Equal(t, "ready\n", line)
		dirs, _ := filepath.Glob(filepath.Join(tmp, "minipy-isolated-*"))
		require.Len(t, dirs, 1, "the engine's private directory, while it runs")
		require.NoError(t, cmd.Process.Signal(sig))
		err = cmd.Wait()
		var exit *exec.ExitError
		require.ErrorAs(t, err, &exit, sig.String())
		assert.Equal(t, 128+int(sig), exit.ExitCode(), sig.String())
		dirs, _ = filepath.Glob(filepath.Join(tmp, "minipy-isolated-*"))
		assert.Empty(t, dirs, "%s: the engine's private directory is removed", sig)
	}
}
