//go:build cgo

package cpython

import (
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/minipy-go/minipy/internal/pyrt"
)

// worker.py's _FT_* are mp_snap_fork's table slots (MP_FT_*), name for name.
func TestSnapForkTableMatchesTheWorker(t *testing.T) {
	py := map[string]int{}
	assign := regexp.MustCompile(`(?m)^(_FT_\w+(?:, _FT_\w+)*) = ([0-9, ]+)$`)
	for _, m := range assign.FindAllStringSubmatch(pyrt.WorkerSource, -1) {
		names, values := strings.Split(m[1], ", "), strings.Split(m[2], ", ")
		require.Len(t, values, len(names), m[0])
		for i, name := range names {
			v, err := strconv.Atoi(values[i])
			require.NoError(t, err)
			py[strings.TrimPrefix(name, "_FT_")] = v
		}
	}
	assert.Equal(t, snapTable(), py)
}

// The code is its section's bytes, whole, read once.
func TestSnapForkCode(t *testing.T) {
	code := SnapForkCode()
	require.NotEmpty(t, code, "section %s in this binary", snapSection)
	assert.Less(t, len(code), 4096, "one page")
	assert.Equal(t, readSnapForkCode(), code)
}

// The compiler kept mp_snap_fork to itself: in this binary's copy of its section, no
// instruction reaches outside it but through a register (the table's pointers): no direct
// call, no branch out, no address relative to where the code lies (globals, literals, jump
// tables: they would be wrong in the worker's copy), no thread-local storage (the stack
// protector's canary). objdump is binutils', which cgo's gcc needs.
func TestSnapForkReachesNothingOutside(t *testing.T) {
	self, err := os.Executable()
	require.NoError(t, err)
	out, err := exec.Command("objdump", "-d", "--section=minipy_snap_fork", self).CombinedOutput()
	require.NoError(t, err, "%s", out)
	forbidden := map[string]*regexp.Regexp{
		"amd64": regexp.MustCompile(`%rip|%fs:|%gs:|\bcall\s+[0-9a-f]+\b`),
		"arm64": regexp.MustCompile(`\badrp?\b|\bbl\s+[0-9a-f]+\b|\bldr\s+\w+, [0-9a-f]+\b|tpidr_el0`),
	}[runtime.GOARCH]
	if forbidden == nil {
		t.Fatalf("no patterns for %s: add this architecture's", runtime.GOARCH)
	}
	insn := regexp.MustCompile(`^\s*([0-9a-f]+):\t[0-9a-f ]+\t(\S+)\s*(.*)$`)
	target := regexp.MustCompile(`^([0-9a-f]+)(?: <|$)`)
	var addrs []uint64
	var branches [][2]string
	for _, line := range strings.Split(string(out), "\n") {
		m := insn.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		addr, err := strconv.ParseUint(m[1], 16, 64)
		require.NoError(t, err)
		addrs = append(addrs, addr)
		assert.False(t, forbidden.MatchString(line), "reaches outside: %s", line)
		if to := target.FindStringSubmatch(m[3]); to != nil && (strings.HasPrefix(m[2], "j") || strings.HasPrefix(m[2], "b") ||
			strings.HasPrefix(m[2], "cb") || strings.HasPrefix(m[2], "tb")) {
			branches = append(branches, [2]string{to[1], line})
		}
	}
	require.Greater(t, len(addrs), 50, "the section's instructions:\n%s", out)
	for _, b := range branches {
		to, err := strconv.ParseUint(b[0], 16, 64)
		require.NoError(t, err)
		assert.True(t, to >= addrs[0] && to <= addrs[len(addrs)-1], "a branch out: %s", b[1])
	}
	assert.NotEmpty(t, branches, "(the pattern finds the branches)")
}
