package worker

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync/atomic"
	"syscall"
)

// ErrNoSandbox: the kernel refuses what isolates workers (the root package re-exports it,
// with its documentation).
var ErrNoSandbox = errors.New("minipy: the kernel refuses the namespaces and mounts that isolate workers")

// ErrSandboxAccess: sandboxed workers may not reach a path they need (re-exported by the
// root package).
var ErrSandboxAccess = errors.New("minipy: the sandboxed workers may not reach a path they need")

// SandboxReserved are the directories that a sandbox makes or binds itself (sandbox.py's
// _SYSTEM_DIRS, its /etc, /proc, /dev, /tmp and tree), where a working directory cannot be.
var SandboxReserved = []string{"/proc", "/dev", "/tmp", "/etc", SandboxTree,
	"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"}

// The sandbox of a local worker (sandbox.py's _enter_sandbox builds it from the config frame).
const (
	// SandboxWorkdir is where a sandboxed worker sees its namespace's working directory
	// when Spec.Workdir does not say (IsolatedConfig.WorkDirPath's default).
	SandboxWorkdir = "/work"
	// SandboxTree is where a sandboxed worker sees its tree: the working directories of the
	// namespaces that may share its sandbox (Fork copies; packed namespaces), by id.
	SandboxTree = "/namespaces"
	// sandboxID is the uid and gid of the worker inside its user namespace ("user").
	sandboxID = 1000
	// sandboxRootID is the id that a sandbox's root (uid and gid 0 inside, Spec.RootUser)
	// has in the namespace the host makes (sandboxAttr), where it stands for rootHostID.
	sandboxRootID = sandboxID + 1
	// rootHostID is the host user and group of a sandbox's root (Spec.RootUser): not
	// nobody, so that what the sandbox's root owns is not its user's, and not the host's
	// root, which owns the image (no capability of the sandbox's root reaches a file of
	// the host's root: the sandbox's user namespaces do not map it).
	rootHostID = nobodyID - 1
	// nobodyID is the host user and group that sandboxed workers run as when the host runs
	// as root, so that they own nothing of the host and RLIMIT_NPROC binds them.
	nobodyID = 65534
	// sandboxRefusedExit is the exit status of a worker whose kernel refused a mount of
	// its sandbox (sent to it in the config frame).
	sandboxRefusedExit = 71
	// sandboxAccessExit is the exit status of a worker that could not reach a host path its
	// sandbox binds (a Mount's Source; EACCES or EPERM): a permission problem of the host's
	// files, not the kernel's refusal (sent to it in the config frame).
	sandboxAccessExit = 72
	// DefaultTmpSize caps /tmp and /dev/shm when IsolatedConfig.TmpSize is 0.
	DefaultTmpSize = 256 << 20
	// capSysAdmin (linux/capability.h) is what the worker needs, inside its own user
	// namespace only, to build its root file system; it drops it before any code runs.
	capSysAdmin = 21
	// capNetAdmin brings the sandbox's loopback up (Spec.Egress), dropped likewise.
	capNetAdmin = 12
)

// sandboxAttr puts a local worker in its own user, mount, pid, IPC, UTS and (without
// Network) network namespaces. On an unprivileged host it runs as the unprivileged sandboxID
// inside, mapped to the host's user, holding CAP_SYS_ADMIN of its namespaces as an ambient
// capability until it has built its root.
//
// A root host maps its root as well and starts the worker as root inside (mapped to root):
// the worker then execs the python and opens what its sandbox binds with root's access, so a
// venv or a Mount under a private directory of root's (/root, t.TempDir()) works. It cannot
// be given root's access otherwise: bind sources could be passed as open fds, but the python
// itself must start and find its venv. Before it builds anything, sandbox.py's become_user
// makes it sandboxID (nobody on the host) with no supplementary group and CAP_SYS_ADMIN
// alone, exactly as an unprivileged host starts it, so the sandbox it builds, the template
// and the code it runs are the same either way. As root there it passes root's own
// directories, private ones too, but not another user's private ones: the capabilities of a
// user namespace (CAP_DAC_OVERRIDE) cover only files whose owner and group it maps.
// In a network namespace of its own (without Network) it holds CAP_NET_ADMIN of it too,
// until it has brought its loopback up (sandbox.py's _loopback_up; with egress, before it
// listens there).
//
// The template (pidNS false) gets no pid namespace: every sandbox forked from it makes one of
// its own, a child of the host's, so that no process but a sandbox's own pid 1 ends it. In a
// pid namespace of the template's, whose pid 1 it would be, or an init's, the death of that
// one process would end every sandbox at once (docs/isolated.md, "Who may die").
//
// With rootUser (a root host's template only: CheckRootUser) the map holds the sandbox's
// root too, sandboxRootID for rootHostID, which the template's sandboxes map to their root
// (sandbox.py's _root_namespace).
func sandboxAttr(network, pidNS, rootUser bool) *syscall.SysProcAttr {
	flags := uintptr(syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS | syscall.CLONE_NEWIPC | syscall.CLONE_NEWUTS)
	if pidNS {
		flags |= syscall.CLONE_NEWPID
	}
	if !network {
		flags |= syscall.CLONE_NEWNET
	}
	if os.Geteuid() == 0 {
		ids := []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 1}, {ContainerID: sandboxID, HostID: nobodyID, Size: 1}}
		if rootUser {
			ids = append(ids, syscall.SysProcIDMap{ContainerID: sandboxRootID, HostID: rootHostID, Size: 1})
		}
		return &syscall.SysProcAttr{
			Setpgid:     true,
			Cloneflags:  flags,
			UidMappings: ids,
			GidMappings: ids,
			// Root may (and does) drop its supplementary groups, which would otherwise keep
			// root's group access inside.
			GidMappingsEnableSetgroups: true,
			Credential:                 &syscall.Credential{Uid: 0, Gid: 0},
		}
	}
	uid, gid := sandboxIDs()
	caps := []uintptr{capSysAdmin}
	if !network {
		caps = append(caps, capNetAdmin)
	}
	return &syscall.SysProcAttr{
		Setpgid:     true,
		Cloneflags:  flags,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: sandboxID, HostID: uid, Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: sandboxID, HostID: gid, Size: 1}},
		// An unprivileged host may not call setgroups in the namespace at all.
		Credential:  &syscall.Credential{Uid: sandboxID, Gid: sandboxID, NoSetGroups: true},
		AmbientCaps: caps,
	}
}

// SudoDir is where a sandbox with a root user (Spec.RootUser) has its sudo, first on its
// PATH: a directory of the template's root (sandbox.py's _SUDO_DIR, pinned by a test).
const SudoDir = "/.minipy/bin"

// ErrNoRootUser is matched by CheckRootUser's error.
var ErrNoRootUser = errors.New("minipy: a sandbox cannot have a root user here")

// CheckRootUser says why a sandbox of this Spec cannot have a root user (Spec.RootUser):
// its root stands for a host user of its own (rootHostID), which only a root host can map,
// in user namespaces that the template makes for its sandboxes.
func (s *Spec) CheckRootUser(template bool) error {
	switch {
	case !s.RootUser:
		return nil
	case !s.Sandbox || !s.local():
		return fmt.Errorf("%w: only a sandboxed local worker's (Sandbox, no Command)", ErrNoRootUser)
	case os.Geteuid() != 0:
		return fmt.Errorf("%w: the host must run as root, to map the sandbox's root to a host user of its own (uid %d)",
			ErrNoRootUser, rootHostID)
	case !template:
		return fmt.Errorf("%w: the sandboxes must be forked from the engine's template (NoTemplate is set)", ErrNoRootUser)
	}
	return nil
}

// RootUID is the host user (and group) of a sandbox's root (Spec.RootUser).
func RootUID() int { return rootHostID }

func sandboxIDs() (uid, gid int) {
	if os.Geteuid() == 0 {
		return nobodyID, nobodyID
	}
	return os.Geteuid(), os.Getegid()
}

// UID is the host user of sandboxed workers (and of their files): nobody on a root host,
// else the host's own user.
func UID() int {
	uid, _ := sandboxIDs()
	return uid
}

// ProbeNamespaces reports whether the kernel lets this process make the sandbox's
// namespaces, by starting /bin/true in them (~2 ms), once per process once it has
// succeeded, and whether the sandbox's seccomp filter can be built for this architecture. (Whether it lets the worker mount its root is known when the first worker
// starts.)
func ProbeNamespaces() error {
	if namespacesWork.Load() {
		return nil
	}
	err := probeNamespacesNow()
	if err == nil {
		namespacesWork.Store(true)
	}
	return err
}

var namespacesWork atomic.Bool

func probeNamespacesNow() error {
	if _, err := SeccompFilter(false); err != nil {
		return err
	}
	path, err := exec.LookPath("true")
	if err != nil {
		return err
	}
	cmd := exec.Command(path)
	cmd.SysProcAttr = sandboxAttr(false, true, false)
	return cmd.Run()
}
