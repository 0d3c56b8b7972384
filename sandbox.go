package minipy

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
)

// The sandbox of a local worker (worker.py's _enter_sandbox builds it from the config frame).
const (
	// sandboxWorkdir is where a sandboxed worker sees its namespace's working directory.
	sandboxWorkdir = "/work"
	// sandboxTree is where a sandboxed worker sees its tree: the working directories of the
	// namespaces that may share its sandbox (Fork copies; packed namespaces), by id.
	sandboxTree = "/namespaces"
	// sandboxID is the uid and gid of the worker inside its user namespace ("user").
	sandboxID = 1000
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
	// defaultTmpSize caps /tmp and /dev/shm when IsolatedConfig.TmpSize is 0.
	defaultTmpSize = 256 << 20
	// capSysAdmin (linux/capability.h) is what the worker needs, inside its own user
	// namespace only, to build its root file system; it drops it before any code runs.
	capSysAdmin = 21
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
// itself must start and find its venv. Before it builds anything, worker.py's become_user
// makes it sandboxID (nobody on the host) with no supplementary group and CAP_SYS_ADMIN
// alone, exactly as an unprivileged host starts it, so the sandbox it builds, the template
// and the code it runs are the same either way. As root there it passes root's own
// directories, private ones too, but not another user's private ones: the capabilities of a
// user namespace (CAP_DAC_OVERRIDE) cover only files whose owner and group it maps.
func sandboxAttr(network bool) *syscall.SysProcAttr {
	flags := uintptr(syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS | syscall.CLONE_NEWPID | syscall.CLONE_NEWIPC |
		syscall.CLONE_NEWUTS)
	if !network {
		flags |= syscall.CLONE_NEWNET
	}
	if os.Geteuid() == 0 {
		return &syscall.SysProcAttr{
			Setpgid:     true,
			Cloneflags:  flags,
			UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 1}, {ContainerID: sandboxID, HostID: nobodyID, Size: 1}},
			GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 1}, {ContainerID: sandboxID, HostID: nobodyID, Size: 1}},
			// Root may (and does) drop its supplementary groups, which would otherwise keep
			// root's group access inside.
			GidMappingsEnableSetgroups: true,
			Credential:                 &syscall.Credential{Uid: 0, Gid: 0},
		}
	}
	uid, gid := sandboxIDs()
	return &syscall.SysProcAttr{
		Setpgid:     true,
		Cloneflags:  flags,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: sandboxID, HostID: uid, Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: sandboxID, HostID: gid, Size: 1}},
		// An unprivileged host may not call setgroups in the namespace at all.
		Credential:  &syscall.Credential{Uid: sandboxID, Gid: sandboxID, NoSetGroups: true},
		AmbientCaps: []uintptr{capSysAdmin},
	}
}

func sandboxIDs() (uid, gid int) {
	if os.Geteuid() == 0 {
		return nobodyID, nobodyID
	}
	return os.Geteuid(), os.Getegid()
}

func sandboxUID() int {
	uid, _ := sandboxIDs()
	return uid
}

// probeNamespaces reports whether the kernel lets this process make the sandbox's
// namespaces, by starting /bin/true in them (~2 ms), once per process once it has
// succeeded. (Whether it lets the worker mount its root is known when the first worker
// starts.)
func probeNamespaces() error {
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
	path, err := exec.LookPath("true")
	if err != nil {
		return err
	}
	cmd := exec.Command(path)
	cmd.SysProcAttr = sandboxAttr(false)
	return cmd.Run()
}

// breakSandboxRoot makes the tests' engines give their workers a root mount point that does
// not exist (see NewIsolatedRefusingMounts).
var breakSandboxRoot bool

// makeDirs makes the engine's private directory: work/ (the trees of the namespaces'
// working directories; see workTree) and, sandboxed, root/ (the mount point of each
// worker's root).
func (e *Isolated) makeDirs() error {
	dir, err := os.MkdirTemp("", "minipy-isolated-")
	if err != nil {
		return fmt.Errorf("minipy: making the workers' directory: %w", err)
	}
	e.dir = dir
	e.trees = filepath.Join(dir, "work")
	err = os.Mkdir(e.trees, 0o711)
	if err == nil && e.sandbox {
		// The workers' user must pass through dir and trees (owned by the host) to reach
		// their own directories, but may list neither.
		e.rootdir = filepath.Join(dir, "root")
		err = errors.Join(os.Chmod(dir, 0o711), os.Chmod(e.trees, 0o711), os.Mkdir(e.rootdir, 0o755))
	}
	if err == nil && breakSandboxRoot {
		e.rootdir = "/proc/minipy-no-such-dir" // nobody can make it
	}
	if err == nil && strings.ContainsAny(dir, "\n\r\t") {
		err = errors.New("the temporary directory's name has a line break or tab")
	}
	if err != nil {
		os.RemoveAll(dir)
		return fmt.Errorf("minipy: making the workers' directory: %w", err)
	}
	return nil
}

// workerEnv is a local worker's whole environment (see IsolatedConfig.Env), home its
// working directory on the host.
func (e *Isolated) workerEnv(home string) []string {
	tmp := os.TempDir()
	if e.sandbox {
		home, tmp = sandboxWorkdir, "/tmp"
	}
	path := "/usr/local/bin:/usr/bin:/bin"
	if dir := filepath.Dir(e.cfg.Python); filepath.IsAbs(e.cfg.Python) && !strings.Contains(":"+path+":", ":"+dir+":") {
		path = dir + ":" + path
	}
	env := []string{"PATH=" + path, "HOME=" + home, "TMPDIR=" + tmp, "LANG=C.UTF-8"}
	if e.sandbox {
		env = append(env, "USER=user", "LOGNAME=user")
	}
	return append(env, e.cfg.Env...)
}

// checkEnv checks IsolatedConfig.Env; a Command worker gets it (and a sandboxed worker
// PYTHONPATH) through a config frame of lines, so those values may not hold line breaks.
func checkEnv(env []string, command bool) error {
	for _, kv := range env {
		key, _, ok := strings.Cut(kv, "=")
		// A Command worker gets Env, and a sandboxed one PYTHONPATH, through the config frame.
		lines := command || key == "PYTHONPATH"
		if !ok || key == "" || strings.ContainsRune(kv, 0) || lines && strings.ContainsAny(kv, "\n\r") {
			return fmt.Errorf("minipy: IsolatedConfig.Env entry %q is not KEY=VALUE (a non-empty key, no NUL byte"+
				", no line break for Command workers or in PYTHONPATH)", kv)
		}
	}
	return nil
}

// checkMounts checks IsolatedConfig.Mounts and returns them with clean paths and targets
// filled in.
func checkMounts(mounts []Mount) ([]Mount, error) {
	out := make([]Mount, 0, len(mounts))
	for _, m := range mounts {
		if m.Target == "" {
			m.Target = m.Source
		}
		bad := func(why string) error {
			return fmt.Errorf("minipy: IsolatedConfig.Mounts: %q -> %q: %s", m.Source, m.Target, why)
		}
		if !filepath.IsAbs(m.Source) || !filepath.IsAbs(m.Target) {
			return nil, bad("paths must be absolute")
		}
		m.Source, m.Target = filepath.Clean(m.Source), filepath.Clean(m.Target)
		if strings.ContainsAny(m.Source+m.Target, "\n\r\t\x00") {
			return nil, bad("paths may not hold line breaks, tabs or NUL bytes")
		}
		for _, reserved := range []string{"/proc", "/dev", sandboxTree} {
			if m.Target == reserved || strings.HasPrefix(m.Target, reserved+"/") {
				return nil, bad("the sandbox makes " + reserved + " itself")
			}
		}
		if m.Target == "/" {
			return nil, bad("the target cannot be the root")
		}
		if _, err := os.Stat(m.Source); err != nil {
			return nil, bad(err.Error())
		}
		out = append(out, m)
	}
	return out, nil
}
