package main

import (
	"fmt"
	"regexp"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/minipy-go/minipy"
)

// The memory plan: a budget for all sessions, a share for each, -max-sessions's default
// from the two.
func TestMemoryPlan(t *testing.T) {
	const gib = 1 << 30
	for _, c := range []struct {
		name                 string
		f                    memoryFlags
		none, http           bool
		maxSessions, workers int
		want                 memoryPlan
	}{
		{"the default share", memoryFlags{8 * gib, -1}, false, true, -1, 0, memoryPlan{8 * gib, 512 << 20, 16}},
		{"a session's memory given", memoryFlags{8 * gib, gib}, false, true, -1, 0, memoryPlan{8 * gib, gib, 8}},
		{"sessions given", memoryFlags{8 * gib, -1}, false, true, 4, 0, memoryPlan{8 * gib, 2 * gib, 4}},
		{"no cap on sessions: the budget alone", memoryFlags{8 * gib, -1}, false, true, 0, 0, memoryPlan{8 * gib, 0, 0}},
		{"packed workers share it", memoryFlags{8 * gib, -1}, false, true, -1, 4, memoryPlan{8 * gib, 2 * gib, 16}},
		{"stdio: one client, the budget", memoryFlags{8 * gib, -1}, false, false, -1, 0, memoryPlan{8 * gib, 0, -1}},
		{"no budget", memoryFlags{0, -1}, false, true, 8, 0, memoryPlan{0, 0, 8}},
		{"-limits none", memoryFlags{-1, -1}, true, true, 8, 0, memoryPlan{0, 0, 8}},
		{"-limits none, a budget given", memoryFlags{4 * gib, -1}, true, true, 8, 0, memoryPlan{4 * gib, 0, 8}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := c.f.plan(c.none, c.http, c.maxSessions, c.workers, defaultWorkSize)
			require.NoError(t, err)
			assert.Equal(t, c.want, got)
		})
	}
	def, err := memoryFlags{-1, -1}.plan(false, true, -1, 0, defaultWorkSize)
	require.NoError(t, err)
	assert.Equal(t, minipy.DefaultMemoryBudget(), def.budget)
	assert.Equal(t, defaultMaxSessions(def.budget, sessionMemory+defaultWorkSize), def.maxSessions)
	assert.GreaterOrEqual(t, def.session, int64(sessionMemory+defaultWorkSize), "a share holds what a session may")

	_, err = memoryFlags{4 << 30, -1}.plan(false, true, 100, 0, defaultWorkSize)
	assert.ErrorIs(t, err, errLimits, "a share of 40 MiB")
	assert.ErrorContains(t, err, "would be 40 MiB")
	_, err = memoryFlags{-5, -1}.plan(false, true, -1, 0, defaultWorkSize)
	assert.ErrorIs(t, err, errLimits)
}

var shareLine = regexp.MustCompile(`memory: all sessions (\S+ \S+) \(-memory-budget\), each session (\d+) MiB`)

// The finding (48, 13): with no flags, one session touched 3 GiB, each session's only bound
// an address space of 4.5 GiB, and nothing bounded the sessions together. Now each session
// holds at most its share of the server's budget: a run that touches more ends there, rolled
// back, and another session keeps its variables.
func TestServeSessionMemoryShare(t *testing.T) {
	s := startServer(t, "-backend", "isolated")
	m := shareLine.FindStringSubmatch(s.log.String())
	require.NotNil(t, m, "no memory line in the log:\n%s", s.log)
	require.NotContains(t, s.log.String(), "NOT ENFORCED", "this project's machines run the tests as root, with a cgroup")
	share, err := strconv.Atoi(m[2])
	require.NoError(t, err)
	a, b := s.connect(t, ""), s.connect(t, "")
	text, isError := run(t, b, map[string]any{"code": "y = 2"})
	require.False(t, isError, text)
	text, isError = run(t, a, map[string]any{"code": "x = 1"})
	require.False(t, isError, text)
	text, isError = run(t, a, map[string]any{"code": fmt.Sprintf(`held = []
for _ in range(%d):
    b = bytearray(1 << 20)
    for i in range(0, 1 << 20, 4096):
        b[i] = 1
    held.append(b)`, share+256)})
	assert.True(t, isError, text)
	assert.Contains(t, text, "memory limit", text)
	assert.Contains(t, text, "the namespace was rolled back to before this run", text)
	text, _ = run(t, a, map[string]any{"code": "x"})
	assert.Equal(t, "[value]\n1\n", text, "as before the run")
	text, _ = run(t, b, map[string]any{"code": "y"})
	assert.Equal(t, "[value]\n2\n", text, "the other session is untouched")
}

// The log says what the warm pool keeps.
func TestDescribeSpares(t *testing.T) {
	assert.Contains(t, describeSpares(0, 0), "last 10 s")
	assert.Contains(t, describeSpares(3, 0), "3 sandboxes")
	assert.Contains(t, describeSpares(-1, 0), "none, each new session")
	assert.Contains(t, describeSpares(0, 2), "-workers")
}
