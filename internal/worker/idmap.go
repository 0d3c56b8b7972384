package worker

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"runtime"
	"syscall"
	"unsafe"

	"github.com/minipy-go/minipy/internal/pyrt"
)

// Idmapped mounts. A sandboxed worker's code runs as the sandbox's user: nobody on a root
// host, whose Go services keep their directories root's (os.MkdirTemp makes them 0700,
// os.Mkdir 0755 under the usual umask). A Mount of such a directory that this user could
// not use as the Mount says (write a Writable one, read a read-only one) is handed to the
// workers as an idmapped bind mount that the host makes: through it the directory's owner
// and group are the sandbox's user, and what the code writes is stored as theirs. Only the
// host can make it: an idmapped mount needs CAP_SYS_ADMIN in the user namespace that owns
// the file system (the initial one, for the host's files). PrepareMounts makes the user
// namespaces that carry the mappings once, as the engine starts, and refuses there what
// cannot work (never at the code's first write); each start of a worker process (Launch)
// gets a detached mount of each such Mount as an extra fd, which sandbox.py's
// _Mounter.attach moves into its root. An unprivileged host's workers are its own user,
// whose access they have: a Mount that user may not use is refused as the engine starts.

// The new mount API (linux/mount.h, linux/fcntl.h).
const (
	openTreeClone   = 0x1
	atEmptyPath     = 0x1000
	atRecursive     = 0x8000
	mountAttrRdonly = 0x1
	mountAttrNosuid = 0x2
	mountAttrNodev  = 0x4
	mountAttrIdmap  = 0x100000
	mountFDs        = pyrt.KickFD + 1 // the first fd of the idmapped mounts in a worker (after the control socket and pipe)
	sysOpenTree     = 428
	sysMountSetattr = 442
)

// sysBase is added to the generic table's numbers of the new mount API's system calls,
// which are those of every Linux architecture but MIPS's ABIs.
var sysBase = map[string]uintptr{"mips": 4000, "mipsle": 4000, "mips64": 5000, "mips64le": 5000}[runtime.GOARCH]

// mountAttr is struct mount_attr.
type mountAttr struct {
	set, clr, propagation, userns uint64
}

// PrepareMounts decides, for each Mount of a sandboxed Spec, whether the sandbox's user can
// use it as it is or needs an idmapped mount, and makes the user namespaces that map each
// such Mount's owner to that user (one per owner), trying a mount of each: a Mount the
// workers could not use fails here with ErrSandboxAccess, naming it and the fix. It is part
// of making the Spec, before any worker starts; Close releases what it holds.
func (s *Spec) PrepareMounts() error {
	if !s.Sandbox || !s.local() {
		return nil
	}
	owners := map[[2]uint32]*os.File{}
	for i := range s.Mounts {
		if err := s.prepareMount(&s.Mounts[i], owners); err != nil {
			for _, f := range owners {
				f.Close()
			}
			for i := range s.Mounts {
				s.Mounts[i].userns = nil
			}
			return err
		}
	}
	return nil
}

// Close releases the user namespaces of the idmapped mounts (PrepareMounts); a worker that
// starts afterwards fails to.
func (s *Spec) Close() {
	seen := map[*os.File]bool{}
	for _, m := range s.Mounts {
		if m.userns != nil && !seen[m.userns] {
			seen[m.userns] = true
			m.userns.Close()
		}
	}
}

func (s *Spec) prepareMount(m *Mount, owners map[[2]uint32]*os.File) error {
	var st syscall.Stat_t
	if err := syscall.Stat(m.Source, &st); err != nil { // (following symlinks, as a bind does)
		return mountAccessError(m, err)
	}
	want := uint32(4) // read
	if st.Mode&syscall.S_IFMT == syscall.S_IFDIR {
		want |= 1 // search
	}
	verb, adjective := "read", "readable"
	if m.Writable {
		want |= 2
		verb, adjective = "write", "writable"
	}
	if os.Geteuid() != 0 {
		// The workers are the host's user, with its groups: what it may do, they may.
		if err := syscall.Faccessat(atFDCWD, m.Source, want, atEaccess); err != nil {
			return mountAccessError(m, fmt.Errorf("the workers run as the host's user (uid %d), who may not %s it (%w); "+
				"make it %s by that user, or run the host as root, whose workers get an idmapped mount of it",
				os.Geteuid(), verb, err, adjective))
		}
		return nil
	}
	if nobodyMay(&st, want) {
		return nil
	}
	if st.Uid == nobodyID {
		return mountAccessError(m, fmt.Errorf("%s owns it and may not %s it (its mode is %04o); make it %s by its owner",
			nobody, verb, st.Mode&0o7777, adjective))
	}
	key := [2]uint32{st.Uid, st.Gid}
	userns := owners[key]
	if userns == nil {
		var err error
		if userns, err = ownerNamespace(st.Uid, st.Gid); err != nil {
			return mountAccessError(m, fmt.Errorf("%s may not %s it, and making the user namespace of the idmapped mount "+
				"that would make it theirs failed: %w", nobody, verb, err))
		}
		owners[key] = userns
	}
	m.userns = userns
	f, err := m.detached()
	if err != nil {
		m.userns = nil
		if errors.Is(err, syscall.EINVAL) {
			err = fmt.Errorf("%w: its file system, or one mounted under it, does not support idmapped mounts", err)
		}
		return mountAccessError(m, fmt.Errorf("%s may not %s it, and the idmapped mount that would make it theirs "+
			"failed (%w); make it %s by uid 65534, or put it on a file system that supports idmapped mounts (Linux 5.12 "+
			"or later: ext4, xfs, btrfs; tmpfs since 6.3)", nobody, verb, err, adjective))
	}
	f.Close()
	return nil
}

const (
	atFDCWD   = -100
	atEaccess = 0x200
	nobody    = "the sandbox's user (nobody, uid and gid 65534)"
)

// nobodyMay reports whether the sandbox's user on a root host (nobody, no supplementary
// group) has the access want (r=4, w=2, x=1) to a file of st, by its mode.
func nobodyMay(st *syscall.Stat_t, want uint32) bool {
	perm := st.Mode & 0o7
	switch {
	case st.Uid == nobodyID:
		perm = st.Mode >> 6 & 0o7
	case st.Gid == nobodyID:
		perm = st.Mode >> 3 & 0o7
	}
	return perm&want == want
}

// mountAccessError is the error of a Mount that the sandboxed workers could not use.
func mountAccessError(m *Mount, why error) error {
	return fmt.Errorf("%w (%w): IsolatedConfig.Mounts: %s: %w", ErrSandboxAccess, fs.ErrPermission, m.Source, why)
}

// ownerNamespace is a user namespace that maps the user uid and group gid (as its ids) to
// the sandbox's user on a root host, for an idmapped mount that makes files of uid and gid
// the sandbox's user's. It is taken from a process started in it (true, as ProbeNamespaces
// runs, whose exit does not end it: its namespace stays while an fd holds it).
func ownerNamespace(uid, gid uint32) (*os.File, error) {
	path, err := exec.LookPath("true")
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(path)
	cmd.Env = []string{}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: int(uid), HostID: nobodyID, Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: int(gid), HostID: nobodyID, Size: 1}},
		Pdeathsig:   syscall.SIGKILL,
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	// Not reaped before Wait: its namespace can be opened even once it has exited.
	f, err := os.Open(fmt.Sprintf("/proc/%d/ns/user", cmd.Process.Pid))
	cmd.Wait() //nolint:errcheck // true
	return f, err
}

// detached makes an idmapped mount of m (PrepareMounts chose one) that is in no mount
// namespace yet, with the whole tree under its source (as a bind, recursive), never
// setuid or device files, read-only unless Writable: the file that a worker moves into
// its root (close-on-exec; Launch passes it as an extra fd).
func (m *Mount) detached() (*os.File, error) {
	src, err := syscall.BytePtrFromString(m.Source)
	if err != nil {
		return nil, err
	}
	cwd := atFDCWD
	r, _, errno := syscall.Syscall(sysBase+sysOpenTree, uintptr(cwd), uintptr(unsafe.Pointer(src)),
		openTreeClone|syscall.O_CLOEXEC|atRecursive)
	if errno != 0 {
		return nil, fmt.Errorf("open_tree: %w", errno)
	}
	f := os.NewFile(r, m.Source)
	attr := mountAttr{set: mountAttrIdmap | mountAttrNosuid | mountAttrNodev}
	if !m.Writable {
		attr.set |= mountAttrRdonly
	}
	empty, _ := syscall.BytePtrFromString("")
	ctl, err := m.userns.SyscallConn()
	if err == nil {
		// (Through Control: the engine's Close may close the namespace's fd meanwhile.)
		cerr := ctl.Control(func(userns uintptr) {
			attr.userns = uint64(userns)
			_, _, e := syscall.Syscall6(sysBase+sysMountSetattr, r, uintptr(unsafe.Pointer(empty)),
				atEmptyPath|atRecursive, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr), 0)
			if e != 0 {
				err = fmt.Errorf("mount_setattr: %w", e)
			}
		})
		if err == nil {
			err = cerr
		}
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// mountFiles are the detached idmapped mounts of a worker that starts now, in the order
// of s.Mounts: its fds mountFDs, mountFDs+1, ... (configFrame tells the worker which is
// which). The caller closes them once the worker has started.
func (s *Spec) mountFiles() ([]*os.File, error) {
	var files []*os.File
	for i := range s.Mounts {
		if s.Mounts[i].userns == nil {
			continue
		}
		f, err := s.Mounts[i].detached()
		if err != nil {
			closeFiles(files...)
			return nil, mountAccessError(&s.Mounts[i], fmt.Errorf("its idmapped mount failed: %w", err))
		}
		files = append(files, f)
	}
	return files, nil
}
