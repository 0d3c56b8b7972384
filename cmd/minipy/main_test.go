package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
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
