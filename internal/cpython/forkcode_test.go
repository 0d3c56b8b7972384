//go:build cgo

package cpython

import (
	"encoding/hex"
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

// worker.py's _FT_* are mp_fork_code's table slots (MP_FT_*), its _OP_* the ops (MP_OP_*),
// and template.py's _SS_* its steps (MP_SS_*), name for name.
func TestForkCodeTableMatchesTheWorker(t *testing.T) {
	assert.Equal(t, forkTable(), pythonConstants(t, "_FT_"))
	assert.Equal(t, forkSteps(), pythonConstants(t, "_SS_"))
	assert.Equal(t, forkOps(), pythonConstants(t, "_OP_"))
}

// pythonConstants are the worker's program's integer constants named prefix + NAME,
// assigned as "_P_A, _P_B = 1, 2", by NAME.
func pythonConstants(t *testing.T, prefix string) map[string]int {
	py := map[string]int{}
	assign := regexp.MustCompile(`(?m)^(` + prefix + `\w+(?:, ` + prefix + `\w+)*) = ([0-9, ]+)$`)
	for _, m := range assign.FindAllStringSubmatch(pyrt.WorkerSource, -1) {
		names, values := strings.Split(m[1], ", "), strings.Split(m[2], ", ")
		require.Len(t, values, len(names), m[0])
		for i, name := range names {
			v, err := strconv.Atoi(values[i])
			require.NoError(t, err)
			py[strings.TrimPrefix(name, prefix)] = v
		}
	}
	return py
}

// The code is its section's bytes, whole, read once.
func TestForkCode(t *testing.T) {
	code := ForkCode()
	require.NotEmpty(t, code, "section %s in this binary", forkSection)
	assert.Less(t, len(code), 5*4096, "a few pages")
	assert.Equal(t, readForkCode(), code)
}

// The compiler kept mp_fork_code to itself: in this binary's copy of its section, no
// instruction reaches outside it but through a register (the table's pointers): no direct
// call, no branch out, no address relative to where the code lies (globals, literals, jump
// tables: they would be wrong in the worker's copy), no thread-local storage (the stack
// protector's canary). objdump is binutils', which cgo's gcc needs.
func TestForkCodeReachesNothingOutside(t *testing.T) {
	self, err := os.Executable()
	require.NoError(t, err)
	out, err := exec.Command("objdump", "-d", "--section=minipy_fork_code", self).CombinedOutput()
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

// A sandbox whose set-up fails in the fork code says where and why on its stderr and exits
// 70, as the set-up in Python does: a python maps the code, as a template does, and forks a
// sandbox whose trees are not there.
func TestForkCodeSandboxSaysWhyItFailed(t *testing.T) {
	python, err := exec.LookPath("python3")
	require.NoError(t, err)
	code := ForkCode()
	require.NotEmpty(t, code)
	args := []string{"-c", forkFailScript, hex.EncodeToString(code)}
	for name, slot := range forkTable() {
		args = append(args, name+"="+strconv.Itoa(slot))
	}
	for name, step := range forkSteps() {
		args = append(args, "SS_"+name+"="+strconv.Itoa(step))
	}
	out, err := exec.Command(python, args...).CombinedOutput()
	require.NoError(t, err, "%s", out)
	// As root the mount namespace is made and the trees' mount fails; else unshare does.
	want := "status 70: minipy test failed: step TREE_SLAVE: [Errno 2]\n"
	if os.Geteuid() != 0 {
		want = "status 70: minipy test failed: step TREE_NS: [Errno 1]\n"
	}
	assert.Equal(t, want, string(out))
}

// forkFailScript forks a sandbox with the fork code (argv[1], hex) and a table whose slots
// argv[2:] name (NAME=N; SS_NAME=N: the steps), its trees a path that does not exist; it
// prints the child's exit status and what it wrote on its stderr.
const forkFailScript = `
import ctypes, mmap, os, sys
code = bytes.fromhex(sys.argv[1])
slots = {k: int(v) for k, v in (a.split("=") for a in sys.argv[2:])}
mem = mmap.mmap(-1, len(code), prot=mmap.PROT_READ | mmap.PROT_WRITE)
mem.write(code)
start = ctypes.addressof(ctypes.c_char.from_buffer(mem))
libc = ctypes.CDLL(None, use_errno=True)
assert libc.mprotect(ctypes.c_void_p(start), ctypes.c_size_t(len(code)), mmap.PROT_READ | mmap.PROT_EXEC) == 0
t = (ctypes.c_int64 * slots["SIZE"])()
api = ctypes.pythonapi
for name, fn in (("BEFORE_FORK", api.PyOS_BeforeFork), ("AFTER_PARENT", api.PyOS_AfterFork_Parent),
                 ("AFTER_CHILD", api.PyOS_AfterFork_Child), ("FORK", libc.fork), ("CLOSE", libc.close),
                 ("RECVMSG", libc.recvmsg), ("EXIT", libc._exit), ("ERRNO", libc.__errno_location),
                 ("SYSCALL", libc.syscall)):
    t[slots[name]] = ctypes.cast(fn, ctypes.c_void_p).value
keep = []
def s(text):
    b = ctypes.create_string_buffer(text.encode())
    keep.append(b)
    return ctypes.addressof(b)
steps = sorted((v, k[3:]) for k, v in slots.items() if k.startswith("SS_") and k != "SS_COUNT")
why = (ctypes.c_void_p * (slots["SS_COUNT"] + 2))(*[s("step " + name) for _, name in steps],
                                                   s("minipy test failed: "), s(": [Errno "))
r, w = os.pipe()
t[slots["OP"]] = 1
for i in range(6):
    t[slots["S_FDS"] + i] = w
t[slots["S_TREES"]] = s("/nonexistent/minipy-test-trees")
t[slots["S_WHY"]] = ctypes.addressof(why)
pid = ctypes.PYFUNCTYPE(ctypes.c_long, ctypes.c_void_p)(start)(ctypes.addressof(t))
assert pid > 0, pid
os.close(w)
said = os.read(r, 4096).decode()
_, status = os.waitpid(pid, 0)
sys.stdout.write("status %d: %s" % (os.waitstatus_to_exitcode(status), said))
`
