package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
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

	code, _, errOut = cli(t, "", "--isolated", "--timeout", "100ms", "-c", "sum(range(10**12))")
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "worker process tree was killed")
}
