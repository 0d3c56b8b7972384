package worker

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/elastic/go-seccomp-bpf/arch"
	"github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// The seccomp filter of sandboxed workers is an allowlist: Docker's default profile (moby's
// profiles/seccomp, resolved for this architecture and kernel as for a container with no
// capability, which is what a worker has), plus what the worker needs, minus what a code
// interpreter never needs. It is built here, once per process, and sent to the worker in
// its config frame (seccomp=HEX), so every Python a worker runs gets the same filter.
// docs/isolated.md lists what it denies and why; testdata/seccomp-GOARCH.txt pins it.

// seccompDenied are system calls Docker's profile allows to a container without
// capabilities that workers never get (EPERM): reading or writing another process's memory
// (the guardian and the snapshots run as the code's user: ptrace, process_vm_*), and file
// handles, which name files by inode and sidestep paths (name_to_handle_at; its partner
// open_by_handle_at needs CAP_DAC_READ_SEARCH, which Docker's profile already requires).
// Docker's profile already leaves out, for a process without capabilities, pidfd_getfd,
// process_madvise and kcmp (CAP_SYS_PTRACE), syslog, mount and the new mount API, unshare,
// setns, bpf, perf_event_open (CAP_SYS_ADMIN), and io_uring, userfaultfd and the keyrings
// altogether; TestSeccompFilter holds each of them denied.
var seccompDenied = []string{"ptrace", "process_vm_readv", "process_vm_writev", "name_to_handle_at"}

// seccompSocketFamilies are the address families a worker may open sockets of: local
// sockets, IP, and netlink (glibc's getaddrinfo asks the kernel for the interfaces' addresses
// through it). Others fail with EAFNOSUPPORT, as on a kernel built without them: AF_VSOCK
// above all (network namespaces do not cover it, and CID 2 is the hypervisor), AF_PACKET,
// AF_ALG, Bluetooth, CAN. Raw IP sockets need CAP_NET_RAW, which workers never hold.
var seccompSocketFamilies = []uint64{unix.AF_UNIX, unix.AF_INET, unix.AF_INET6, unix.AF_NETLINK}

// seccompTerminalIoctls are the terminal ioctls a worker never gets (EPERM), though a
// command may run on a terminal (Command.Terminal): TIOCSETD changes the terminal's line
// discipline, which reaches kernel code few terminals use and that has had its share of
// holes (n_gsm, n_hdlc: CVE-2023-6546, CVE-2017-2636); TIOCSTI types into the terminal as
// if from its keyboard (the classic escape from a shell that shares a terminal with a more
// privileged one); TIOCLINUX and TIOCCONS are the console's. Matched on the low 32 bits
// of the request alone, as the kernel reads it (an unsigned int): set high bits do not
// slip past.
var seccompTerminalIoctls = []uint64{unix.TIOCSETD, unix.TIOCSTI, unix.TIOCLINUX, unix.TIOCCONS}

// The filter's verdicts (linux/seccomp.h).
const (
	seccompAllow = 0x7FFF0000 // SECCOMP_RET_ALLOW
	seccompErrno = 0x00050000 // SECCOMP_RET_ERRNO | errno
)

// seccompArgs are a rule's conditions on the arguments, all of which must hold.
type seccompArgs []specs.LinuxSeccompArg

// seccompRule is what the filter does with one system call: the first of terms whose
// conditions hold gives its verdict (an OR of ANDs), else otherwise. A rule without terms
// gives otherwise whatever the arguments.
type seccompRule struct {
	nr        uint32
	terms     []seccompArgs
	verdicts  []uint32
	otherwise uint32
}

// seccompPolicy is the filter's content: a rule per system call it does not refuse with
// EPERM, by number.
type seccompPolicy struct {
	arch  *arch.Info
	rules map[uint32]*seccompRule
}

// seccompShm are the system calls that make memory nothing but a cgroup counts (RLIMIT_AS
// counts a memfd only while it is mapped, a secret memfd likewise, and a SysV segment or
// message queue outlives every mapping and the process: issue 48 held 512 MiB in
// memfd_secret and 400 MiB in 25,626 message queues under a 256 MiB limit): a sandbox
// under a MemoryLimit without a cgroup is refused them (Spec.DenyShm). Its worker captures
// output in files of its /dev/shm instead, which TmpSize bounds.
var seccompShm = []string{"memfd_create", "memfd_secret", "shmget", "msgget"}

// newSeccompPolicy resolves the filter's policy for this machine's architecture and kernel;
// denyShm refuses seccompShm too.
func newSeccompPolicy(denyShm bool) (*seccompPolicy, error) {
	info, err := arch.GetInfo("")
	if err != nil {
		return nil, err
	}
	profile, err := seccomp.GetDefaultProfile(&specs.Spec{Process: &specs.Process{
		Capabilities: &specs.LinuxCapabilities{}}})
	if err != nil {
		return nil, fmt.Errorf("docker's default seccomp profile: %w", err)
	}
	p := &seccompPolicy{arch: info, rules: map[uint32]*seccompRule{}}
	rule := func(name string) *seccompRule {
		nr := uint32(info.SyscallNames[name])
		r := p.rules[nr]
		if r == nil {
			r = &seccompRule{nr: nr, otherwise: seccompErrno | uint32(unix.EPERM)}
			p.rules[nr] = r
		}
		return r
	}
	for _, sc := range profile.Syscalls {
		for _, name := range sc.Names {
			if _, ok := info.SyscallNames[name]; !ok || slices.Contains(seccompDenied, name) || name == "socket" ||
				denyShm && slices.Contains(seccompShm, name) {
				continue // (names of other architectures: chown32, _llseek...; socket: below)
			}
			verdict := uint32(seccompAllow)
			switch {
			case sc.Action == specs.ActErrno && sc.ErrnoRet != nil:
				verdict = seccompErrno | uint32(*sc.ErrnoRet)
			case sc.Action != specs.ActAllow:
				return nil, fmt.Errorf("docker's default seccomp profile: %s: action %s", name, sc.Action)
			}
			for _, a := range sc.Args {
				if a.Op != specs.OpEqualTo && a.Op != specs.OpNotEqual && a.Op != specs.OpMaskedEqual {
					return nil, fmt.Errorf("docker's default seccomp profile: %s: operator %s", name, a.Op)
				}
			}
			r := rule(name)
			if len(sc.Args) == 0 {
				r.otherwise = verdict
			} else {
				r.terms = append(r.terms, sc.Args)
				r.verdicts = append(r.verdicts, verdict)
			}
		}
	}
	ioctl := rule("ioctl")
	for _, req := range seccompTerminalIoctls {
		ioctl.terms = append(ioctl.terms, seccompArgs{{Index: 1, Value: 0xFFFFFFFF, ValueTwo: req, Op: specs.OpMaskedEqual}})
		ioctl.verdicts = append(ioctl.verdicts, seccompErrno|uint32(unix.EPERM))
	}
	socket := rule("socket")
	socket.otherwise = seccompErrno | uint32(unix.EAFNOSUPPORT)
	for _, family := range seccompSocketFamilies {
		socket.terms = append(socket.terms, seccompArgs{{Index: 0, Value: family, Op: specs.OpEqualTo}})
		socket.verdicts = append(socket.verdicts, seccompAllow)
	}
	return p, nil
}

// seccompProgram assembles p. The filter checks the ABI (another one, or x32 on amd64, is
// refused whole), then the system calls with conditions on their arguments (a few: clone,
// personality, socket), each a block that ends in a verdict, then looks the number up in a
// binary tree of the others (~10 comparisons for any call), and refuses what it does not
// find with EPERM.
//
// (elastic/go-seccomp-bpf's assembler is not used: as of v1.6.0 a failed argument check falls
// through to the next rule with the argument, not the call's number, in the accumulator.)
func (p *seccompPolicy) program() ([]bpf.Instruction, error) {
	eperm := seccompErrno | uint32(unix.EPERM)
	prog := []bpf.Instruction{
		bpf.LoadAbsolute{Off: seccompOffArch, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(p.arch.ID), SkipTrue: 1},
		bpf.RetConstant{Val: eperm},
		bpf.LoadAbsolute{Off: seccompOffNr, Size: 4},
	}
	if p.arch.ID == arch.X86_64.ID {
		prog = append(prog, bpf.JumpIf{Cond: bpf.JumpGreaterOrEqual, Val: uint32(arch.X32.SeccompMask), SkipFalse: 1},
			bpf.RetConstant{Val: seccompErrno | uint32(unix.ENOSYS)})
	}
	var plain []*seccompRule
	for _, nr := range slices.Sorted(maps.Keys(p.rules)) {
		r := p.rules[nr]
		if len(r.terms) == 0 {
			plain = append(plain, r)
			continue
		}
		var block []bpf.Instruction
		for i, term := range r.terms {
			t, err := seccompTerm(term, r.verdicts[i])
			if err != nil {
				return nil, fmt.Errorf("seccomp: a term of system call %d is %w", nr, err)
			}
			block = append(block, t...)
		}
		block = append(block, bpf.RetConstant{Val: r.otherwise})
		prog = append(prog, bpf.JumpIf{Cond: bpf.JumpEqual, Val: nr, SkipTrue: 1}, bpf.Jump{Skip: uint32(len(block))})
		prog = append(prog, block...)
	}
	return append(prog, seccompTree(plain, eperm)...), nil
}

// Offsets in struct seccomp_data.
const (
	seccompOffNr   = 0
	seccompOffArch = 4
	seccompOffArgs = 16
)

// seccompHalf loads the half of the 64-bit argument index: the low word comes first on a
// little-endian machine.
func seccompHalf(index uint, high bool) bpf.LoadAbsolute {
	off := uint32(seccompOffArgs + 8*index)
	if high == (binary.NativeEndian.Uint16([]byte{1, 0}) == 1) {
		off += 4
	}
	return bpf.LoadAbsolute{Off: off, Size: 4}
}

// seccompTerm is the code of one term: it returns verdict when every condition of term
// holds, and falls through to the code after it (the next term) as soon as one does not.
func seccompTerm(term seccompArgs, verdict uint32) ([]bpf.Instruction, error) {
	// Each check jumps to fail, the next term, when it does not hold: patched below.
	var t []bpf.Instruction
	var fails []int
	check := func(ins ...bpf.Instruction) {
		t = append(t, ins...)
		fails = append(fails, len(t)-1)
	}
	for _, a := range term {
		for _, high := range []bool{true, false} {
			val, mask := uint32(a.Value), uint32(a.ValueTwo)
			if high {
				val, mask = uint32(a.Value>>32), uint32(a.ValueTwo>>32)
			}
			t = append(t, seccompHalf(a.Index, high))
			switch a.Op {
			case specs.OpEqualTo:
				check(bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: val})
			case specs.OpMaskedEqual: // (arg & Value) == ValueTwo
				t = append(t, bpf.ALUOpConstant{Op: bpf.ALUOpAnd, Val: val})
				check(bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: mask})
			case specs.OpNotEqual: // either half differs
				if high {
					t = append(t, bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: val}) // to the next argument: patched
				} else {
					check(bpf.JumpIf{Cond: bpf.JumpEqual, Val: val})
				}
			}
		}
		if a.Op == specs.OpNotEqual { // the high half differed: this argument holds
			at := len(t) - 3
			j := t[at].(bpf.JumpIf)
			j.SkipTrue = uint8(len(t) - at - 1)
			t[at] = j
		}
	}
	t = append(t, bpf.RetConstant{Val: verdict})
	for _, at := range fails {
		j := t[at].(bpf.JumpIf)
		skip := len(t) - at - 1
		if skip > 255 {
			return nil, errors.New("too long (a jump past 255 instructions)")
		}
		j.SkipTrue = uint8(skip) // (every check jumps to fail when it is true)
		t[at] = j
	}
	return t, nil
}

// seccompTree looks the number in the accumulator up among rules (sorted by number), each
// of which gives its verdict; any other number gets otherwise.
func seccompTree(rules []*seccompRule, otherwise uint32) []bpf.Instruction {
	if len(rules) <= 4 {
		var out []bpf.Instruction
		for _, r := range rules {
			out = append(out, bpf.JumpIf{Cond: bpf.JumpEqual, Val: r.nr, SkipFalse: 1}, bpf.RetConstant{Val: r.otherwise})
		}
		return append(out, bpf.RetConstant{Val: otherwise})
	}
	mid := len(rules) / 2
	left, right := seccompTree(rules[:mid], otherwise), seccompTree(rules[mid:], otherwise)
	// Above the left half's last number: the jump over the left half.
	out := []bpf.Instruction{bpf.JumpIf{Cond: bpf.JumpGreaterThan, Val: rules[mid-1].nr, SkipFalse: 1},
		bpf.Jump{Skip: uint32(len(left))}}
	out = append(out, left...)
	return append(out, right...)
}

// SeccompFilter is the filter as the kernel takes it (an array of struct sock_filter, in
// this machine's byte order), built once; denyShm refuses seccompShm too.
func SeccompFilter(denyShm bool) ([]byte, error) {
	f := &seccompFilters[0]
	if denyShm {
		f = &seccompFilters[1]
	}
	f.once.Do(func() { f.code, f.err = buildSeccompFilter(denyShm) })
	return f.code, f.err
}

// seccompFilters are the two filters, built on first use.
var seccompFilters [2]struct {
	once sync.Once
	code []byte
	err  error
}

func buildSeccompFilter(denyShm bool) ([]byte, error) {
	policy, err := newSeccompPolicy(denyShm)
	if err != nil {
		return nil, err
	}
	prog, err := policy.program()
	if err != nil {
		return nil, err
	}
	raw, err := bpf.Assemble(prog)
	if err != nil {
		return nil, err
	}
	if len(raw) > 4096 { // BPF_MAXINSNS
		return nil, fmt.Errorf("the seccomp filter has %d instructions, more than the kernel takes", len(raw))
	}
	var code []byte
	for _, ins := range raw {
		code = binary.NativeEndian.AppendUint16(code, ins.Op)
		code = append(code, ins.Jt, ins.Jf)
		code = binary.NativeEndian.AppendUint32(code, ins.K)
	}
	return code, nil
}
