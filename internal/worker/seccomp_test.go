package worker

import (
	"encoding/binary"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/elastic/go-seccomp-bpf/arch"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

var updateSeccomp = flag.Bool("update-seccomp", false, "rewrite testdata/seccomp-GOARCH.txt from the filter")

// seccompVM runs the filter's bytes, as the kernel would get them, on seccomp_data.
type seccompVM struct {
	vm   *bpf.VM
	info *arch.Info
}

func newSeccompVM(t *testing.T) *seccompVM {
	return newSeccompVMOf(t, false)
}

func newSeccompVMOf(t *testing.T, denyShm bool) *seccompVM {
	raw, err := SeccompFilter(denyShm)
	require.NoError(t, err)
	require.Zero(t, len(raw)%8)
	var prog []bpf.RawInstruction
	for b := raw; len(b) > 0; b = b[8:] {
		prog = append(prog, bpf.RawInstruction{Op: binary.NativeEndian.Uint16(b), Jt: b[2], Jf: b[3],
			K: binary.NativeEndian.Uint32(b[4:])})
	}
	insns, ok := bpf.Disassemble(prog)
	require.True(t, ok)
	vm, err := bpf.NewVM(insns)
	require.NoError(t, err)
	info, err := arch.GetInfo("")
	require.NoError(t, err)
	return &seccompVM{vm: vm, info: info}
}

// run is the filter's verdict on the system call nr of ABI auditArch with args. The VM
// loads words big-endian; the filter loads each half of a 64-bit argument at its offset in
// this machine's layout, so each word is stored big-endian at the offset the filter reads.
func (s *seccompVM) run(t *testing.T, auditArch, nr uint32, args ...uint64) uint32 {
	data := make([]byte, 64) // struct seccomp_data
	binary.BigEndian.PutUint32(data[0:], nr)
	binary.BigEndian.PutUint32(data[4:], auditArch)
	for i, a := range args {
		lo, hi := 16+8*i, 16+8*i+4
		if binary.NativeEndian.Uint16([]byte{0, 1}) == 1 { // big-endian machine
			lo, hi = hi, lo
		}
		binary.BigEndian.PutUint32(data[lo:], uint32(a))
		binary.BigEndian.PutUint32(data[hi:], uint32(a>>32))
	}
	out, err := s.vm.Run(data)
	require.NoError(t, err)
	return uint32(out)
}

func (s *seccompVM) call(t *testing.T, name string, args ...uint64) uint32 {
	nr, ok := s.info.SyscallNames[name]
	require.True(t, ok, name)
	return s.run(t, uint32(s.info.ID), uint32(nr), args...)
}

const retAllow = uint32(seccompAllow)

func retErrno(e unix.Errno) uint32 { return seccompErrno | uint32(e) }

func TestSeccompFilter(t *testing.T) {
	if runtime.GOARCH != "amd64" && runtime.GOARCH != "arm64" {
		t.Skip("the workers' filter is tested on amd64 and arm64")
	}
	s := newSeccompVM(t)
	for _, name := range []string{"read", "write", "openat", "close", "mmap", "futex", "wait4", "pidfd_open",
		"pidfd_send_signal", "memfd_create", "socketpair", "recvmsg", "sendmsg", "prctl", "seccomp", "kill",
		"timer_create", "getrandom", "execve", "pipe2", "inotify_init1", "statx", "close_range", "faccessat2"} {
		assert.Equal(t, retAllow, s.call(t, name), name)
	}
	// A fork (SIGCHLD as the clone flags) is allowed; a clone into new namespaces is not.
	assert.Equal(t, retAllow, s.call(t, "clone", uint64(unix.SIGCHLD)))
	for _, flag := range []uint64{unix.CLONE_NEWUSER, unix.CLONE_NEWNS, unix.CLONE_NEWNET, unix.CLONE_NEWPID} {
		assert.Equal(t, retErrno(unix.EPERM), s.call(t, "clone", flag|uint64(unix.SIGCHLD)), "clone %#x", flag)
	}
	// clone3's flags are behind a pointer: ENOSYS, so that libc falls back to clone.
	assert.Equal(t, retErrno(unix.ENOSYS), s.call(t, "clone3"))
	for _, family := range []uint64{unix.AF_UNIX, unix.AF_INET, unix.AF_INET6, unix.AF_NETLINK} {
		assert.Equal(t, retAllow, s.call(t, "socket", family, unix.SOCK_STREAM), "socket family %d", family)
	}
	for _, family := range []uint64{unix.AF_VSOCK, unix.AF_PACKET, unix.AF_ALG, unix.AF_BLUETOOTH, unix.AF_CAN,
		unix.AF_KEY, unix.AF_XDP, unix.AF_VSOCK | 1<<32} {
		assert.Equal(t, retErrno(unix.EAFNOSUPPORT), s.call(t, "socket", family, unix.SOCK_STREAM), "socket family %d", family)
	}
	// A terminal's everyday ioctls are allowed; its line disciplines, faked input and the
	// console's are not, whatever the request's high bits (the kernel reads 32 of them).
	for _, req := range []uint64{unix.TCGETS, unix.TCSETS, unix.TIOCGWINSZ, unix.TIOCSWINSZ, unix.TIOCSCTTY,
		unix.TIOCGPGRP, unix.TIOCSPGRP, unix.TIOCINQ, unix.TIOCGETD} {
		assert.Equal(t, retAllow, s.call(t, "ioctl", 0, req), "ioctl %#x", req)
	}
	for _, req := range []uint64{unix.TIOCSETD, unix.TIOCSTI, unix.TIOCLINUX, unix.TIOCCONS,
		unix.TIOCSETD | 1<<32, unix.TIOCSTI | 0xFFFFFFFF00000000} {
		assert.Equal(t, retErrno(unix.EPERM), s.call(t, "ioctl", 0, req), "ioctl %#x", req)
	}
	// What only attacks the kernel, the guardian or another process, or escapes.
	for _, name := range []string{"ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd",
		"process_madvise", "kcmp", "syslog", "name_to_handle_at", "open_by_handle_at", "userfaultfd",
		"io_uring_setup", "io_uring_enter", "io_uring_register", "unshare", "setns", "mount", "umount2",
		"pivot_root", "chroot", "fsopen", "fsmount", "move_mount", "open_tree", "mount_setattr", "bpf",
		"perf_event_open", "keyctl", "add_key", "request_key", "init_module", "finit_module", "delete_module",
		"kexec_load", "kexec_file_load", "swapon", "swapoff", "reboot", "acct", "quotactl", "settimeofday",
		"clock_settime", "sethostname", "setdomainname", "iopl", "ioperm", "lookup_dcookie", "fanotify_init",
		"vhangup", "mbind", "set_mempolicy", "move_pages"} {
		if _, ok := s.info.SyscallNames[name]; !ok {
			continue // (iopl, ioperm: x86 only)
		}
		assert.Equal(t, retErrno(unix.EPERM), s.call(t, name), name)
	}
	// Another ABI is refused whole, and on amd64 the x32 one too.
	assert.Equal(t, retErrno(unix.EPERM), s.run(t, uint32(s.info.ID)^1, 0))
	if runtime.GOARCH == "amd64" {
		assert.Equal(t, retErrno(unix.ENOSYS), s.run(t, uint32(s.info.ID), 0x40000000))
	}
	// A number no table knows yet: refused.
	assert.Equal(t, retErrno(unix.EPERM), s.run(t, uint32(s.info.ID), 1023))
}

// TestSeccompGolden pins the filter's verdict on every system call this architecture has
// (with zero arguments), so that an upgrade of Docker's profile shows up in review.
func TestSeccompGolden(t *testing.T) {
	if runtime.GOARCH != "amd64" && runtime.GOARCH != "arm64" {
		t.Skip("pinned on amd64 and arm64")
	}
	s := newSeccompVM(t)
	var lines []string
	for nr, name := range s.info.SyscallNumbers {
		verdict := "allow"
		switch ret := s.run(t, uint32(s.info.ID), uint32(nr)); {
		case ret == retAllow:
		case ret&0xFFFF0000 == seccompErrno:
			verdict = unix.ErrnoName(unix.Errno(ret & 0xFFFF))
		default:
			verdict = fmt.Sprintf("%#x", ret)
		}
		lines = append(lines, fmt.Sprintf("%s %s", name, verdict))
	}
	slices.Sort(lines)
	got := strings.Join(lines, "\n") + "\n"
	path := filepath.Join("testdata", "seccomp-"+runtime.GOARCH+".txt")
	if *updateSeccomp {
		require.NoError(t, os.MkdirAll("testdata", 0o755))
		require.NoError(t, os.WriteFile(path, []byte(got), 0o644))
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "go test ./internal/worker -run TestSeccompGolden -update-seccomp writes it")
	assert.Equal(t, string(want), got, "the filter changed: review the difference, then -update-seccomp")
}

// TestSeccompConditions runs the assembler on conditions Docker's profile has few or none of
// today: both halves of 64-bit arguments, not-equal, a masked compare with a value, several
// terms, and a call whose terms fail (its number must not be taken for an argument after).
func TestSeccompConditions(t *testing.T) {
	info, err := arch.GetInfo("")
	require.NoError(t, err)
	eperm, einval := retErrno(unix.EPERM), retErrno(unix.EINVAL)
	p := &seccompPolicy{arch: info, rules: map[uint32]*seccompRule{
		10: {nr: 10, otherwise: einval, terms: []seccompArgs{
			{{Index: 0, Op: specs.OpEqualTo, Value: 1 << 40}, {Index: 2, Op: specs.OpNotEqual, Value: 7}},
			{{Index: 1, Op: specs.OpMaskedEqual, Value: 0xF0000000F, ValueTwo: 0x300000002}},
		}, verdicts: []uint32{retAllow, retErrno(unix.ENOSYS)}},
		20: {nr: 20, otherwise: retAllow},
	}}
	for i := uint32(30); i < 60; i++ {
		p.rules[i] = &seccompRule{nr: i, otherwise: retAllow}
	}
	prog, err := p.program()
	require.NoError(t, err)
	vm, err := bpf.NewVM(prog)
	require.NoError(t, err)
	s := &seccompVM{vm: vm, info: info}
	id := uint32(info.ID)
	assert.Equal(t, retAllow, s.run(t, id, 10, 1<<40, 0, 8))
	assert.Equal(t, retAllow, s.run(t, id, 10, 1<<40, 0, 7|1<<32), "the high half differs")
	assert.Equal(t, einval, s.run(t, id, 10, 1<<40, 0, 7), "not-equal fails")
	assert.Equal(t, einval, s.run(t, id, 10, 1<<41, 0, 8), "the high half of an equal")
	assert.Equal(t, retErrno(unix.ENOSYS), s.run(t, id, 10, 0, 0x3000000F2))
	assert.Equal(t, einval, s.run(t, id, 10, 0, 0x200000002))
	assert.Equal(t, einval, s.run(t, id, 10, 20), "an argument that equals another call's number")
	assert.Equal(t, retAllow, s.run(t, id, 20))
	for i := uint32(30); i < 60; i++ {
		assert.Equal(t, retAllow, s.run(t, id, i), i)
	}
	for _, nr := range []uint32{0, 11, 21, 29, 60, 1000} {
		assert.Equal(t, eperm, s.run(t, id, nr), nr)
	}
}

func TestSeccompPersonality(t *testing.T) {
	s := newSeccompVM(t)
	assert.Equal(t, retAllow, s.call(t, "personality", 0))
	assert.Equal(t, retAllow, s.call(t, "personality", 0xffffffff))
	nr := uint64(s.info.SyscallNames["socket"]) // (a failed term leaves an argument in the accumulator)
	assert.Equal(t, retErrno(unix.EPERM), s.call(t, "personality", nr))
	assert.Equal(t, retErrno(unix.EPERM), s.call(t, "personality", 0x0040000))
}

// Without a cgroup, a sandbox under a MemoryLimit is refused what only a cgroup counts.
func TestSeccompDenyShm(t *testing.T) {
	s, deny := newSeccompVM(t), newSeccompVMOf(t, true)
	for _, name := range []string{"memfd_create", "shmget"} {
		assert.Equal(t, retAllow, s.call(t, name), name)
		assert.Equal(t, retErrno(unix.EPERM), deny.call(t, name), name)
	}
	for _, name := range []string{"read", "shmat", "openat", "mmap"} {
		assert.Equal(t, retAllow, deny.call(t, name), name)
	}
}
