# minipy's worker sandbox: the file system, the privileges and the system calls of a local
# worker. Part of the worker's program (pyrt.go's WorkerSource joins worker.py, this file,
# template.py, guardian.py and proctree.py); the names it uses are worker.py's.
#
# The layers, in the order a worker's start builds them, and what each stops (docs/isolated.md,
# "Threats", says what each does not):
#  1. Namespaces (made by the host: internal/worker/sandbox.go, sandboxAttr; by the template's
#     fork: _become_tenant): user (the code's uid is 1000 inside, nobody or the host's user
#     outside; capabilities only over its own namespaces), pid (it sees and signals only its
#     own; its pid 1 ending ends them all), mount, IPC, UTS, and network without Network (no
#     interface but loopback). With Egress the loopback is up and holds one listening socket,
#     handed to the host (_egress_listener): the host's proxy, the one way out, judges each
#     destination after resolving it itself.
#  2. A cgroup per sandbox, when the engine has one (the host makes it; a template's fork
#     joins it first thing: _become_tenant): memory that RLIMIT_AS misses (memfd, SysV shared
#     memory, tmpfs files) and processes, whoever their user.
#  3. Descriptors (worker.py's main): what the host process inherited without close-on-exec
#     is closed before anything else, so nothing of the host's reaches the code that way.
#  4. _Mounter.reach: the host paths to bind are opened with the access the worker starts
#     with (root's on a root host), and closed once bound (release): none stays open.
#  5. _Mounter.become_user: on a root host, root becomes the sandbox's user (nobody outside)
#     holding CAP_SYS_ADMIN of its own namespaces alone, before it builds anything.
#  6. A tmpfs root holding read-only binds of what Python needs, a few files of /etc, stub
#     accounts, the Mounts (idmapped ones attached: _Mounter.attach), /work, /namespaces, a
#     private /tmp and /dev/shm (TmpSize), a minimal /dev and a /proc of its pid namespace;
#     pivot_root and the host's root unmounted: no host file that is not bound is reachable.
#     A template's fork leaves its own tree alone at /namespaces (_own_tree): no other
#     namespace's tree or working directory is reachable or listed in /proc/self/mountinfo.
#  7. _Mounter.drop_privileges: every capability cleared (ambient, then all sets) and
#     no_new_privs: no mount, chroot, raised limit or setuid program from here on.
#  8. The seccomp filter (built by the host, internal/worker/seccomp.go; installed here):
#     nested namespaces, ptrace and cross-process memory, AF_VSOCK and other socket
#     families, file handles, io_uring, userfaultfd, keyrings, bpf and the like.
#  9. The guardian out of reach (guardian.py, _out_of_reach): undumpable, the signals it
#     handles ignored, so the code cannot take over the process that kills its processes.
# 10. rlimits (worker.py, _set_limits): address space, processes, files, file size; CPU per run.

# Mount flags (linux/mount.h) and the statvfs flags that a bind mount made in a user
# namespace must keep when it is remounted (the kernel locks them: EPERM otherwise).
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE, _MS_SLAVE, _MS_SHARED = 32, 4096, 16384, 1 << 18, 1 << 19, 1 << 20
_LOCKED = ((2, _MS_NOSUID), (4, _MS_NODEV), (8, _MS_NOEXEC), (1024, 1024), (2048, 2048), (4096, 1 << 21))
_CAP_SYS_ADMIN = 21  # linux/capability.h
_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "loongarch64": 41, "ppc64le": 203, "s390x": 217}
_MOVE_MOUNT = 429  # the generic table's number: the same on every architecture _PIVOT_ROOT names
_OPEN_TREE = 428  # likewise

# What a sandboxed worker sees of the host besides its python: the system directories
# (read-only; symlinks such as Debian's /bin -> usr/bin are copied as symlinks) and the few
# files under /etc that programs read. alternatives/ is how Debian's numpy finds its BLAS;
# python3.X/ holds the sitecustomize that /usr/lib/python3.X links to.
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_ETC = ("alternatives", "ca-certificates", "ca-certificates.conf", "debian_version", "fonts", "gai.conf",
        "host.conf", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "matplotlibrc",
        "mime.types", "nsswitch.conf", "os-release", "pip.conf", "protocols", "resolv.conf", "services", "ssl",
        "timezone")
_DEVICES = ("null", "zero", "full", "random", "urandom")
# The sandbox's own accounts: the worker runs as "user" (uid and gid _SANDBOX_ID inside).
_PASSWD = "root:x:0:0:root:/root:/usr/sbin/nologin\nuser:x:%d:%d:user:%s:/bin/sh\n" \
          "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
_GROUP = "root:x:0:\nuser:x:%d:\nnogroup:x:65534:\n"
_HOSTNAME = "minipy"
# A sandbox with a root user (the config's root_user: IsolatedConfig.RootUser): root's home,
# its shell (E2B's), and the directory of its sudo, first on the sandbox's PATH
# (internal/worker's SudoDir, pinned by a test).
_ROOT_HOME, _ROOT_SHELL, _SUDO_DIR = "/root", "/bin/bash", "/.minipy/bin"
_ROOT_NS = [None]  # the template's user namespace its sandboxes are made in (an fd: _root_namespace)
# sudo in a sandbox with a root user: any of its processes may become its root, or its user,
# without a password, as E2B's passwordless sudo; setpriv (util-linux) does it with the
# capabilities of the sandbox's own user namespace that every process there holds
# (_root_user). The environment is sudo's own reset one unless -E keeps it.
_SUDO = r"""#!/bin/sh
# minipy's sudo: this sandbox's processes may become its root (or its user) without a
# password. Root here is root over the sandbox alone. Options: -u USER, -E, -i, -s, -H, -n.
user=root keep= login= shell=
while [ $# -gt 0 ]; do
  case $1 in
    -u) user=$2; shift 2 ;;
    -u*) user=${1#-u}; shift ;;
    --user=*) user=${1#--user=}; shift ;;
    -E|--preserve-env) keep=1; shift ;;
    -i|--login) login=1; shift ;;
    -s|--shell) shell=1; shift ;;
    -H|--set-home|-n|--non-interactive|-k|--reset-timestamp|-S|--stdin) shift ;;
    --) shift; break ;;
    -*) echo "sudo: $1: not an option of minipy's sudo (-u USER, -E, -i, -s, -H, -n)" >&2; exit 1 ;;
    *) break ;;
  esac
done
case $user in '#'*) user=$(getent passwd "${user#'#'}" | cut -d: -f1) ;; esac
entry=$(getent passwd "$user") || { echo "sudo: unknown user $user" >&2; exit 1; }
uid=$(echo "$entry" | cut -d: -f3); gid=$(echo "$entry" | cut -d: -f4); home=$(echo "$entry" | cut -d: -f6)
name=$(echo "$entry" | cut -d: -f1); sh=$(echo "$entry" | cut -d: -f7)
case $sh in */nologin|*/false|'') sh=/bin/sh ;; esac
if [ -n "$login" ] || [ -n "$shell" ]; then
  if [ $# -gt 0 ]; then set -- "$sh" -c "$*"; else set -- "$sh"; fi
  [ -n "$login" ] && [ $# -eq 1 ] && set -- "$sh" -l
elif [ $# -eq 0 ]; then
  echo "usage: sudo [-u USER] [-E] [-i | -s] [COMMAND [ARG...]]" >&2; exit 1
fi
if [ -z "$keep" ]; then
  set -- env -i PATH="$PATH" HOME="$home" USER="$name" LOGNAME="$name" SHELL="$sh" ${TERM:+TERM="$TERM"} \
    ${LANG:+LANG="$LANG"} SUDO_USER="$(id -un)" SUDO_UID="$(id -u)" SUDO_GID="$(id -g)" "$@"
  [ -n "$login" ] && cd "$home" 2>/dev/null
fi
exec setpriv --reuid="$uid" --regid="$gid" --init-groups -- "$@" || exit 1
"""


class _Unreachable(OSError):
    """A host path that the sandbox binds could not be opened (_Mounter.reach): the host's
    files, not the kernel, are in the way."""


class _Mounter:
    """Builds the sandbox's root file system in a fresh tmpfs, then pivots into it. The host
    paths it binds are opened first (reach), with the access the worker started with, and
    bound through those fds once it is the sandbox's user (become_user)."""

    def __init__(self, root):
        import ctypes

        self.ctypes = ctypes
        self.libc = _libc()
        self.root = root
        self.bound = []
        self.held = {}  # host path -> O_PATH fd (reach)
        self.dropped = False  # become_user changed the uid

    def check(self, what, ret):
        if ret != 0:
            err = self.ctypes.get_errno()
            raise OSError(err, "%s: %s" % (what, os.strerror(err)))

    def mount(self, source, target, fstype, flags, data=None, name=None):
        enc = lambda s: None if s is None else os.fsencode(s)
        self.check("mount %s on %s" % (name or source or fstype, target),
                   self.libc.mount(enc(source), enc(target), enc(fstype), self.ctypes.c_ulong(flags), enc(data)))

    def reach(self, source, optional=False):
        """Opens the host's source (following symlinks, as a bind does) as an O_PATH fd for
        bind, with the access the worker started with. On a root host that is root's, which
        become_user gives up: reached here, a source under a private directory of root's is
        bound all the same. An optional source that is missing or unreachable is left out;
        a required one raises _Unreachable."""
        if source in self.held:
            return
        try:
            self.held[source] = os.open(source, os.O_PATH | os.O_CLOEXEC)
        except OSError as e:
            if not optional:
                raise _Unreachable(e.errno, e.strerror, source) from None

    def release(self):
        """Closes the fds reach opened: nothing of the host stays open once the sandbox is built."""
        for fd in self.held.values():
            os.close(fd)
        self.held = {}

    def become_user(self, sid):
        """On a root host the worker starts as root of its user namespace, mapped to the host's
        root (sandboxAttr), so that it can exec the python and reach what the sandbox binds;
        this makes it the sandbox's user sid (nobody on the host) before it builds anything:
        no supplementary group, uid and gid sid (real, effective, saved), CAP_SYS_ADMIN of its
        namespaces alone (permitted, effective, inheritable, ambient), as an unprivileged host
        starts it. No code but the interpreter's start and this file has run as root, and
        root's uid is out of reach from here on: nothing keeps CAP_SETUID."""
        if os.getuid() != 0:
            return
        self.check("keep capabilities", self.libc.prctl(8, 1, 0, 0, 0))  # PR_SET_KEEPCAPS: setresuid keeps the permitted set
        os.setgroups([])
        os.setresgid(sid, sid, sid)
        os.setresuid(sid, sid, sid)
        self.check("keep capabilities off", self.libc.prctl(8, 0, 0, 0, 0))
        header = (self.ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
        data = (self.ctypes.c_uint32 * 6)()
        data[0] = data[1] = data[2] = 1 << _CAP_SYS_ADMIN  # effective, permitted, inheritable
        self.check("capset", self.libc.capset(header, data))
        self.check("raise the ambient CAP_SYS_ADMIN", self.libc.prctl(47, 2, _CAP_SYS_ADMIN, 0, 0))  # PR_CAP_AMBIENT_RAISE
        if os.getresuid() != (sid,) * 3 or os.getresgid() != (sid,) * 3 or os.getgroups():
            raise OSError(1, "becoming the sandbox's user %d failed" % sid)
        self.dropped = True

    def dumpable(self):
        """Makes the process dumpable again after become_user (a change of uid clears it), as a
        worker exec'd as the sandbox's user is: its /proc/self/ files are then its user's, not
        root's. Called once reach's fds are closed."""
        if self.dropped:
            self.check("dumpable", self.libc.prctl(4, 1, 0, 0, 0))  # PR_SET_DUMPABLE

    def place(self, target, is_dir):
        """Makes the mount point for target inside the new root."""
        dest = self.root + target
        if is_dir:
            os.makedirs(dest, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            os.close(os.open(dest, os.O_WRONLY | os.O_CREAT, 0o644))
        return dest

    def bind(self, source, target, writable=False, optional=False, fd=None):
        """Binds the host's source (through the fd reach opened, or fd) at target, read-only
        unless writable, never setuid or device files. An optional source that reach could
        not open is skipped."""
        import stat

        if fd is None:
            fd = self.held.get(source)
        if fd is None:
            if optional:
                return
            raise OSError(2, "bind %s: not opened before the sandbox's user took over" % source)
        dest = self.place(target, stat.S_ISDIR(os.fstat(fd).st_mode))
        self.mount("/proc/self/fd/%d" % fd, dest, None, _MS_BIND | _MS_REC, name=source)
        self.restrict(target, dest, writable)

    def attach(self, source, target, writable, fd):
        """Puts at target the idmapped mount of the host's source that the host made (fd: a
        mount in no namespace yet; see internal/worker/idmap.go), instead of a bind of source,
        and closes fd; then restricts it as bind does."""
        import stat

        try:
            dest = self.place(target, stat.S_ISDIR(os.fstat(fd).st_mode))
            self.check("move the idmapped mount of %s to %s" % (source, target),
                       self.libc.syscall(_MOVE_MOUNT, fd, b"", -100, os.fsencode(dest), 4))  # AT_FDCWD, MOVE_MOUNT_F_EMPTY_PATH
        finally:
            os.close(fd)
        self.restrict(target, dest, writable)

    def restrict(self, target, dest, writable):
        """Remounts the mount at dest (target in the new root) read-only unless writable, never
        setuid or device files."""
        flags = _MS_REMOUNT | _MS_BIND | _MS_NOSUID | _MS_NODEV | (0 if writable else _MS_RDONLY)
        vfs = os.statvfs(dest).f_flag
        for st_flag, ms_flag in _LOCKED:
            if vfs & st_flag:
                flags |= ms_flag
        self.mount(None, dest, None, flags)
        self.bound.append(target)

    def covered(self, path):
        return any(path == b or path.startswith(b.rstrip("/") + "/") for b in self.bound)

    def tmpfs(self, target, mode, size, flags=_MS_NOSUID | _MS_NODEV):
        dest = self.place(target, True)
        self.mount("tmpfs", dest, "tmpfs", flags, "mode=%o,size=%d" % (mode, size))

    def pivot(self, writable=False):
        number = _PIVOT_ROOT.get(os.uname().machine)
        if number is None:
            raise OSError(38, "pivot_root: no syscall number known for " + os.uname().machine)
        os.chdir(self.root)
        # pivot_root(".", "."): the old root ends up stacked under the new one, where a lazy
        # unmount takes it away whole.
        self.check("pivot_root", self.libc.syscall(number, b".", b"."))
        self.check("umount the host's root", self.libc.umount2(b".", 2))  # MNT_DETACH
        os.chdir("/")
        self.mount(None, "/", None, _MS_REMOUNT | (0 if writable else _MS_RDONLY) | _MS_NOSUID | _MS_NODEV)

    def drop_privileges(self):
        """Gives up the CAP_SYS_ADMIN the sandbox was built with, for good: the ambient set,
        then every set (capset to zero), and no exec may gain any (no_new_privs)."""
        self.check("clear ambient capabilities", self.libc.prctl(47, 4, 0, 0, 0))
        header = (self.ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
        data = (self.ctypes.c_uint32 * 6)()
        self.check("capset", self.libc.capset(header, data))
        self.check("no_new_privs", self.libc.prctl(38, 1, 0, 0, 0))

    def seccomp(self, built):
        """Installs the seccomp filter (one filter() built) on this process and all it will start."""
        self.check("seccomp", self.libc.prctl(22, 2, self.ctypes.byref(built), 0, 0))  # PR_SET_SECCOMP, FILTER

    def filter(self, code):
        """The seccomp filter (the config's seccomp: struct sock_filter instructions, built
        by the host: internal/worker/seccomp.go), as prctl takes it."""
        if not code or len(code) % 8:
            raise OSError(22, "seccomp: the host sent no filter")
        ct = self.ctypes
        insns = ct.create_string_buffer(code, len(code))

        class Prog(ct.Structure):
            _fields_ = [("len", ct.c_ushort), ("filter", ct.c_void_p)]

        fprog = Prog(len(code) // 8, ct.addressof(insns))
        fprog._insns = insns  # kept alive with it
        return fprog


_CLONE_NEWUSER = 0x10000000


def _site_dirs():
    """The directories that site.main() will add to sys.path, found without running it: a
    sandboxed worker starts with -S, so that no .pth file or sitecustomize (which code that
    may write there, through a writable Mount of a venv, could have planted) runs before the
    sandbox exists, with the host's access; main() runs site.main() inside it. Like
    site.addpackage, minus the "import" lines, which it would execute."""
    if not sys.flags.no_site:
        return []
    import site

    dirs = []
    prefixes = list(site.PREFIXES)
    # A venv, found as site.venv finds it (which would run its .pth files): its directory
    # (pyvenv.cfg, which site.main() reads in the sandbox) and its site-packages first.
    exe_dir = os.path.dirname(os.path.abspath(sys.executable))
    for conf in (os.path.join(exe_dir, "pyvenv.cfg"), os.path.join(os.path.dirname(exe_dir), "pyvenv.cfg")):
        if os.path.isfile(conf):
            system = True
            try:
                with open(conf, encoding="utf-8") as f:
                    for line in f:
                        key, eq, value = line.partition("=")
                        if eq and key.strip().lower() == "include-system-site-packages":
                            system = value.strip().lower() == "true"
            except OSError:
                pass
            venv = os.path.dirname(exe_dir)
            dirs.append(venv)
            prefixes = [venv] + (prefixes if system else [])
            break
    for sitedir in site.getsitepackages(prefixes):
        if not os.path.isdir(sitedir):
            continue
        dirs.append(sitedir)
        try:
            names = sorted(n for n in os.listdir(sitedir) if n.endswith(".pth") and not n.startswith("."))
        except OSError:
            continue
        for name in names:
            try:
                with open(os.path.join(sitedir, name), encoding="utf-8", errors="replace") as f:
                    for line in f:
                        line = line.rstrip()
                        if line and not line.startswith(("#", "import ", "import\t")):
                            path = os.path.join(sitedir, line)
                            if os.path.isdir(path):
                                dirs.append(os.path.normpath(path))
            except OSError:
                pass
    return dirs


def _python_path(cfg):
    """IsolatedConfig.Env's PYTHONPATH, which the host keeps out of a sandboxed worker's
    environment so that nothing is imported from it before the sandbox exists (see
    _site_dirs); main() puts it on sys.path and back in os.environ inside."""
    pp = cfg.get("pythonpath")
    return [p for p in pp.split(os.pathsep) if p] if pp else []


def _enter_sandbox(cfg, template=False):
    """Turns this process (pid 1 of fresh user, mount, pid, IPC and network namespaces,
    holding CAP_SYS_ADMIN there, or root there on a root host) into the sandbox. First it
    opens every host path the sandbox binds, with the access it started with (_Mounter.reach;
    root's on a root host), then becomes the sandbox's user with CAP_SYS_ADMIN alone
    (_Mounter.become_user) and builds, as that user, a tmpfs root holding read-only binds of
    what Python needs, the caller's Mounts, the worker's working directory (workdir, from
    host_workdir) and tree (the working directories of the namespaces that may share the
    sandbox: Fork copies, packed namespaces; from host_tree), /tmp, /dev and /proc; then
    pivots into it, drops every capability and sets no_new_privs. Nothing of the host that
    is not bound here is reachable afterwards. A host path that cannot be opened raises
    _Unreachable, any refusal of the kernel OSError. The template binds every tree of the
    engine instead, and keeps CAP_SYS_ADMIN: each worker forked from it makes namespaces of
    its own, binds its own tree and working directory over them, and drops it there
    (_become_tenant)."""
    import socket

    m = _Mounter(cfg["root"])
    python, etc = _sandbox_sources(cfg)
    workdir = _reach_sources(m, cfg, python, etc, template)
    if not cfg.get("network") and not template:
        _loopback_up()
    if cfg.get("egress") and not template:
        _egress_listener(_CTL_FD)  # (while it may still bring the loopback up: become_user keeps CAP_SYS_ADMIN alone)
    if template and cfg.get("root_user"):
        _root_namespace(m, cfg)  # (while it may still map ids: become_user gives that up)
    m.become_user(cfg["sandbox_id"])
    socket.sethostname(_HOSTNAME)  # its own UTS namespace: the host's name is not the code's business
    m.mount(None, "/", None, _MS_REC | _MS_PRIVATE)
    # The root: the template's, shared by its tenants, is read-only (each tenant makes a root
    # of its own: _own_root); a worker's own is writable (TmpSize, as a tenant's).
    m.tmpfs("", 0o755, 8 << 20 if template else cfg["tmp_size"])
    _root_files(m, cfg, etc)
    _bind_sources(m, cfg, python, template, workdir)
    m.release()
    _devices(m, cfg["tmp_size"])
    m.place("/proc", True)
    if template:
        # The template is in the host's pid namespace (sandboxAttr: its forks make their own),
        # whose /proc a user namespace may bind but not mount: it serves its own /proc/self
        # paths, and lets each fork's pid 1 mount a /proc of its pid namespace over it.
        m.mount("/proc", m.root + "/proc", None, _MS_BIND | _MS_REC)
    else:
        m.mount("proc", m.root + "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    m.pivot(writable=not template)
    m.dumpable()
    if not template:
        _own_boot_id(m)  # (the template's forks make theirs in _tenant_mounts)
    if template:
        # Shared: the workers forked from the template get slave copies of it (their user
        # namespace is another), so a working directory's tmpfs that the template mounts
        # later (_mount_workdir: a Fork copy's, a packed namespace's) appears in the sandbox
        # of the worker whose tree holds it.
        m.mount(None, cfg["tree"], None, _MS_SHARED)
        _template_binds[:] = m.bound
        return
    m.drop_privileges()
    m.seccomp(m.filter(cfg.get("seccomp")))


def _root_idmap(cfg):
    """The uid_map and gid_map of a sandbox's user namespace when it has a root user: its
    root is the template's root id (root_user), its user the sandbox's."""
    sid = cfg["sandbox_id"]
    return "0 %d 1\n%d %d 1" % (cfg["root_user"], sid, sid)


def _cap_last():
    """The highest capability's number that this kernel knows."""
    with open("/proc/sys/kernel/cap_last_cap", "rb") as f:
        return int(f.read())


def _root_namespace(m, cfg):
    """A sandbox's root (IsolatedConfig.RootUser) is root in a user namespace of the
    sandbox's own, uid 0 there standing for the template's root_user id (which the host maps
    to a host user of its own, internal/worker's rootHostID), its user for the sandbox's
    user; no other id, and neither the host's root nor the template's (which stands for the
    host's root) is mapped there. A map of two ids needs CAP_SETUID and CAP_SETGID over the
    namespace's parent, which the template gives up (become_user) and a sandbox's code must
    never hold. So, as root here, before it gives them up, the template makes a user
    namespace of its own for its sandboxes, owned by its user, mapping that user and the
    root id alone (not the template's root): each sandbox joins it (it has every capability
    there as the owner's), makes its namespaces in it, and its pid 1 goes on in a namespace
    of its own, a child of this one, whose two ids its parent maps (mp_map_ids; _root_user).
    The code's capabilities are those of that child namespace, which owns nothing: no mount,
    network, pid, IPC or UTS namespace (those are this one's), only the sandbox's processes
    and the files of its two ids (docs/isolated.md, "A root user")."""
    sid, rid = cfg["sandbox_id"], cfg["root_user"]
    made_r, made_w = os.pipe()
    done_r, done_w = os.pipe()
    pid = _real_fork()
    if pid == 0:
        try:
            os.close(made_r)
            os.close(done_w)
            os.setgroups([])
            os.setresgid(sid, sid, sid)
            os.setresuid(sid, sid, sid)
            m.libc.prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE: the template opens its namespace
            if m.libc.unshare(_CLONE_NEWUSER) == 0:
                os.write(made_w, b"\1")
                os.read(done_r, 1)
        finally:
            os._exit(0)
    os.close(made_w)
    os.close(done_r)
    try:
        if os.read(made_r, 1) != b"\1":
            raise OSError(1, "making the user namespace of the sandboxes' root users failed")
        text = ("%d %d 1\n%d %d 1" % (sid, sid, rid, rid)).encode()
        for name in ("uid_map", "gid_map"):
            f = os.open("/proc/%d/%s" % (pid, name), os.O_WRONLY)
            try:
                os.write(f, text)
            finally:
                os.close(f)
        _ROOT_NS[0] = os.open("/proc/%d/ns/user" % pid, os.O_RDONLY | os.O_CLOEXEC)
    finally:
        os.close(made_r)
        os.close(done_w)
        os.waitpid(pid, 0)


def _map_ids(cfg, proc, pid, ready):
    """T of a sandbox with a root user: writes its pid 1's maps once it has unshared its user
    namespace (the fork code's mp_map_ids)."""
    if os.read(ready, 1) != b"\1":
        raise OSError(1, "the sandbox's pid 1 ended before its ids were mapped")
    text = _root_idmap(cfg).encode()
    for name in ("uid_map", "gid_map"):
        f = os.open("%d/%s" % (pid, name), os.O_WRONLY, dir_fd=proc)
        try:
            os.write(f, text)
        finally:
            os.close(f)


def _root_user(m, sync):
    """Pid 1 of a sandbox with a root user, its mounts made (the fork code's mp_root_user):
    goes on in a user namespace of its own, whose ids T maps (_map_ids), makes root's home
    root's, and makes every capability of that namespace ambient, so that the sandbox's
    processes (its user's, the code's) may become its root: sudo, a command as root
    (_root_namespace says why this gives no power outside the sandbox). no_new_privs follows."""
    ct = m.ctypes
    m.check("unshare a user namespace", m.libc.unshare(_CLONE_NEWUSER))
    os.write(sync[0], b"\1")
    os.read(sync[1], 1)  # its end: T has written the maps, or failed
    os.close(sync[0])
    os.close(sync[1])
    os.chown(_ROOT_HOME, 0, 0, follow_symlinks=False)  # (fails while the ids are unmapped)
    os.chmod(_ROOT_HOME, 0o700)
    header = (ct.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
    data = (ct.c_uint32 * 6)()
    m.check("capget", m.libc.capget(header, data))
    data[2], data[5] = data[1], data[4]  # inheritable = permitted
    m.check("capset", m.libc.capset(header, data))
    for cap in range(_cap_last() + 1):
        m.check("raise an ambient capability", m.libc.prctl(47, 2, cap, 0, 0))  # PR_CAP_AMBIENT_RAISE
    m.check("no_new_privs", m.libc.prctl(38, 1, 0, 0, 0))


# The sandbox's network's lowest port that needs no privilege (_low_ports).
_LOW_PORTS = "/proc/sys/net/ipv4/ip_unprivileged_port_start"


def _low_ports():
    """In a sandbox with a root user, in its own network namespace: every port may be bound
    without a privilege, so that its root binds below 1024 as root does (the network's
    namespace is the template's user namespace's for its sandboxes, not the root's own, whose
    capabilities would let it: _root_namespace). The fork code does it too (mp_sandbox_t)."""
    f = os.open(_LOW_PORTS, os.O_WRONLY)
    try:
        os.write(f, b"0")
    finally:
        os.close(f)


def _loopback_up():
    """Brings the loopback of the sandbox's own network namespace up (without Network): its
    processes talk to each other over 127.0.0.1 (a server and its client, git daemon, a
    notebook's kernel), as on any machine; nothing outside the sandbox is reachable that way.
    Done while CAP_NET_ADMIN of the namespace is still held."""
    import fcntl
    import socket
    import struct

    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        ifreq = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s, 0x8913, ifreq))[1]  # SIOCGIFFLAGS
        fcntl.ioctl(s, 0x8914, struct.pack("16sH14x", b"lo", flags | 1))  # SIOCSIFFLAGS, IFF_UP
    finally:
        s.close()


def _egress_listener(ctl_fd):
    """IsolatedConfig.Egress: listens on 127.0.0.1:EGRESS_PORT in this network namespace (its
    loopback up), and hands the listening socket to the host over the control socket ctl_fd
    (C_LISTEN, the fd as SCM_RIGHTS), which serves the egress proxy on it from outside: the
    sandbox's one way out. Nothing here keeps the socket."""
    import array
    import socket

    lst = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        lst.bind(("127.0.0.1", EGRESS_PORT))
        lst.listen(128)
        ctl = socket.socket(fileno=os.dup(ctl_fd))
        try:
            ctl.sendmsg([C_LISTEN], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [lst.fileno()]).tobytes())])
        finally:
            ctl.close()
    finally:
        lst.close()
    _egress_env()


def _egress_env():
    """The usual clients (requests, urllib, httpx, pip, curl, wget) take the proxy from these."""
    proxy = "http://127.0.0.1:%d" % EGRESS_PORT
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        os.environ[name] = os.environ[name.lower()] = proxy
    os.environ["NO_PROXY"] = os.environ["no_proxy"] = "localhost,127.0.0.1,::1"


def _sandbox_sources(cfg):
    """What the sandbox binds of the host besides the trees and Mounts: the interpreter (its
    prefixes, a venv's and its base's, and every absolute directory on sys.path, the site
    directories and PYTHONPATH), and the names under /etc."""
    python = [sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix,
              os.path.dirname(sys.executable), os.path.dirname(os.path.realpath(sys.executable))]
    python += [p for p in sys.path + _site_dirs() + _python_path(cfg) if p and os.path.isabs(p)]
    python = [p for p in sorted(set(python), key=len) if os.path.isabs(p) and p != "/"]
    etc = list(_ETC) + sorted(d for d in os.listdir("/etc") if d.startswith("python3"))
    return python, etc


def _reach_sources(m, cfg, python, etc, template):
    """Opens every host path the sandbox binds, with the access the worker started with
    (_Mounter.reach); returns the O_PATH fd of the working directory (None: the template,
    which binds every tree)."""
    for d in _SYSTEM_DIRS:
        if not os.path.islink(d) and os.path.isdir(d):
            m.reach(d)
    for name in etc + (["hosts"] if cfg.get("network") else []):
        m.reach("/etc/" + name, optional=True)
    for p in python:
        m.reach(p, optional=True)
    for source, _, _, _ in cfg["mounts"]:
        m.reach(source)  # (an idmapped one too: the workers may reach it)
    if template:
        m.reach(cfg["host_tree"])
        return None
    # The working directory is a directory of the tree, which the code of an earlier worker
    # of that tree could have replaced with a symlink: opened without following one, and
    # bound through the fd.
    tree = os.open(cfg["host_tree"], os.O_PATH | os.O_DIRECTORY)
    m.held[cfg["host_tree"]] = tree
    name = os.path.relpath(cfg["host_workdir"], cfg["host_tree"])
    if "/" in name or name in (".", ".."):
        raise OSError(22, "the working directory %r is not in the tree" % cfg["host_workdir"])
    return os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=tree)


def _root_files(m, cfg, etc):
    """The new root's system directories (read-only binds; symlinks such as /bin copied as
    symlinks), the files of /etc it shares, its own accounts, host name and hosts, and /tmp."""
    for d in _SYSTEM_DIRS:
        if os.path.islink(d):
            os.symlink(os.readlink(d), m.root + d)
        elif os.path.isdir(d):
            m.bind(d, d)
    for name in etc:
        m.bind("/etc/" + name, "/etc/" + name, optional=True)
    sid = cfg["sandbox_id"]
    with open(m.root + "/etc/passwd", "w") as f:
        text = _PASSWD % (sid, sid, cfg["workdir"])
        if cfg.get("root_user"):
            text = text.replace(_ROOT_HOME + ":/usr/sbin/nologin", _ROOT_HOME + ":" + _ROOT_SHELL, 1)
        f.write(text)
    if cfg.get("root_user"):
        # Root's home (each sandbox's root has its own, made root's: _root_user) and sudo,
        # read-only, a mount so that each sandbox's root holds it (_root_layout), at a name
        # of its own (a directory holding a mount is read-only in a sandbox's root).
        os.mkdir(m.root + _ROOT_HOME, 0o700)
        os.makedirs(m.root + _SUDO_DIR)
        with open(m.root + _SUDO_DIR + "/sudo", "w") as f:
            f.write(_SUDO)
        os.chmod(m.root + _SUDO_DIR + "/sudo", 0o555)
        top = m.root + "/" + _SUDO_DIR.split("/")[1]
        m.mount(top, top, None, _MS_BIND | _MS_REC)
        m.mount(None, top, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)
        m.bound.append(top[len(m.root):])
    with open(m.root + "/etc/group", "w") as f:
        f.write(_GROUP % sid)
    with open(m.root + "/etc/hostname", "w") as f:
        f.write(_HOSTNAME + "\n")
    if cfg.get("network"):
        m.bind("/etc/hosts", "/etc/hosts", optional=True)  # the names the host resolves
    else:
        with open(m.root + "/etc/hosts", "w") as f:
            f.write("127.0.0.1\tlocalhost\n127.0.1.1\t%s\n::1\tlocalhost ip6-localhost ip6-loopback\n" % _HOSTNAME)
    # /etc is the image's, read-only, whoever may write the root.
    etc = m.root + "/etc"
    m.mount(etc, etc, None, _MS_BIND | _MS_REC)
    m.mount(None, etc, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)
    m.tmpfs("/tmp", 0o1777, cfg["tmp_size"])


def _bind_sources(m, cfg, python, template, workdir):
    """The interpreter's directories the system directories do not cover (read-only), the
    working directory and tree (writable), then the caller's Mounts."""
    for p in python:
        if not m.covered(p):
            m.bind(p, p, optional=True)
    home = cfg["workdir"]
    if template:
        # The engine's trees, whole: each worker forked from the template binds its own
        # tree over this and its working directory at home (_become_tenant).
        m.place(home, True)
        m.bind(cfg["host_tree"], cfg["tree"], writable=True)
    else:
        try:
            m.bind(cfg["host_workdir"], home, writable=True, fd=workdir)
        finally:
            os.close(workdir)
        m.bind(cfg["host_tree"], cfg["tree"], writable=True)
    for source, target, writable, fd in cfg["mounts"]:
        if fd is None:
            m.bind(source, target, writable)
        else:
            m.attach(source, target, writable, fd)


def _devices(m, tmp_size):
    """A minimal /dev: the harmless devices bound from the host, the fd links, and /dev/shm."""
    m.tmpfs("/dev", 0o755, 64 << 10, _MS_NOSUID | _MS_NOEXEC)
    for name in _DEVICES:
        dest = m.place("/dev/" + name, False)
        m.mount("/dev/" + name, dest, None, _MS_BIND)
    for name, to in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                     ("stderr", "/proc/self/fd/2")):
        os.symlink(to, m.root + "/dev/" + name)
    m.tmpfs("/dev/shm", 0o1777, tmp_size)


_CLONE_NEWNS, _CLONE_NEWUTS, _CLONE_NEWIPC, _CLONE_NEWPID, _CLONE_NEWNET = (
    0x20000, 0x4000000, 0x8000000, 0x20000000, 0x40000000)
# The new mount API (linux/mount.h; the generic table's numbers, as _MOVE_MOUNT's) that a
# tenant's root is made with (_own_root): a tmpfs that needs no mount point to be made.
_FSOPEN, _FSCONFIG, _FSMOUNT = 430, 431, 432
_FSCONFIG_SET_STRING, _FSCONFIG_CMD_CREATE = 1, 6
_MOUNT_ATTR_NOSUID, _MOUNT_ATTR_NODEV = 0x2, 0x4
_OPEN_TREE_CLONE, _AT_RECURSIVE, _MOVE_MOUNT_F_EMPTY_PATH = 0x1, 0x8000, 0x4
_ROOT_AT = "/tmp"  # where a tenant's root is attached while it is made (_own_root)


def _root_layout(cfg):
    """What a tenant's root holds of the template's (_own_root): the names at the template's
    root, each ("copy", name) when mounts are in it (the system directories, /etc and its
    binds, /dev, the trees, the python's and the Mounts' places: copied with them), else
    ("dir", name) or ("link", name, target); /proc and /tmp are the tenant's own (what the
    template bound under /tmp is bound again by _tenant_mounts)."""
    held = {t.split("/")[1] for t in _template_binds} | {"dev", cfg["tree"].split("/")[1]}
    out = []
    for name in sorted(os.listdir("/")):
        path = "/" + name
        if os.path.islink(path):
            out.append(("link", name, os.readlink(path)))
        elif name in held and name not in ("proc", "tmp"):
            out.append(("copy dir" if os.path.isdir(path) else "copy file", name))
        elif os.path.isdir(path):
            out.append(("dir", name))
    # The working directory's mount point, and the directories it is in.
    parts = cfg["workdir"].strip("/").split("/")
    for i in range(1, len(parts) + 1):
        name = "/".join(parts[:i])
        if not any(e[1] == name for e in out):
            out.append(("dir", name))
    return out


def _own_root(m, cfg, layout):
    """Gives a tenant a root of its own, which its code may write anywhere in (but in what is
    mounted there: the image's read-only binds, /dev, /proc): a tmpfs of the sandbox's own
    (TmpSize, its worker's, as /tmp is; freed with it) holding the template's root names
    (layout: _root_layout), those that hold mounts copied with them (open_tree: the copies a
    user namespace may move), then pivoted into. (Not an overlay of the template's root: its
    mounts, locked in the tenant's user namespace, make it a lower layer the kernel refuses.)"""
    libc, enc = m.libc, os.fsencode

    def call(what, ret):
        if ret < 0:
            m.check(what, -1)
        return ret

    fs = call("fsopen tmpfs", libc.syscall(_FSOPEN, b"tmpfs", 1))  # FSOPEN_CLOEXEC
    try:
        for key, value in (("mode", "0755"), ("size", str(cfg["tmp_size"]))):
            call("fsconfig " + key, libc.syscall(_FSCONFIG, fs, _FSCONFIG_SET_STRING, enc(key), enc(value), 0))
        call("make the root's tmpfs", libc.syscall(_FSCONFIG, fs, _FSCONFIG_CMD_CREATE, None, None, 0))
        root = call("fsmount", libc.syscall(_FSMOUNT, fs, 1, _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV))
    finally:
        os.close(fs)
    try:
        # Attached at the template's /tmp (the tenant's is a fresh one), so that what is moved
        # into it is in this mount namespace.
        m.check("attach the root", libc.syscall(_MOVE_MOUNT, root, b"", -100, enc(_ROOT_AT), _MOVE_MOUNT_F_EMPTY_PATH))
        for entry in layout:
            kind, name = entry[0], entry[1]
            if kind == "link":
                os.symlink(entry[2], name, dir_fd=root)
                continue
            if kind == "copy file":
                os.close(os.open(name, os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=root))
            elif not os.path.isdir("/proc/self/fd/%d/%s" % (root, name)):
                os.mkdir(name, 0o755, dir_fd=root)
            if kind.startswith("copy"):
                tree = call("copy /" + name, libc.syscall(_OPEN_TREE, -100, enc("/" + name),
                                                        _OPEN_TREE_CLONE | _AT_RECURSIVE | 0o2000000))
                try:
                    m.check("move /" + name, libc.syscall(_MOVE_MOUNT, tree, b"", root, enc(name), _MOVE_MOUNT_F_EMPTY_PATH))
                finally:
                    os.close(tree)
        # A /proc of its pid namespace, while the template's (the host's, bound) is still in
        # sight: a user namespace may mount a proc only where one is fully visible already.
        m.mount("proc", _ROOT_AT + "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
        os.fchdir(root)
    finally:
        os.close(root)
    m.check("pivot_root", libc.syscall(_PIVOT_ROOT[os.uname().machine], b".", b"."))
    m.check("umount the template's root", libc.umount2(b".", 2))  # MNT_DETACH
    os.chdir("/")


def _tenant_mounts(cfg, home_name):
    """A tenant's pid 1, in its fresh namespaces, its own tree alone at cfg["tree"]
    (_own_tree): a /proc of its pid namespace, its working directory (home_name, a name in
    the tree) over the workdir, a fresh /tmp and /dev/shm, and the binds these cover bound
    again on top, on a root of its own (_own_root). Returns the _Mounter, still privileged."""
    m = _Mounter("")
    # The binds that the working directory, the fresh /tmp and /dev/shm cover (Mounts, a
    # python under /tmp), copied (open_tree) while the template's root is there: moved on top
    # below, each with the flags it has, which are locked here.
    workdir = cfg["workdir"]
    under = [t for t in _template_binds if t == workdir or t.startswith((workdir + "/", "/tmp/", "/dev/shm/"))]
    held = []
    for t in sorted(under, key=len):
        fd = m.libc.syscall(_OPEN_TREE, -100, os.fsencode(t), _OPEN_TREE_CLONE | _AT_RECURSIVE | 0o2000000)
        m.check("copy " + t, 0 if fd >= 0 else -1)
        held.append((t, fd))
    _own_root(m, cfg, _root_layout(cfg))
    # Opened without following a symlink (the code of an earlier worker of the tree may
    # have made one).
    flags = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW
    tree = os.open(cfg["tree"], flags)
    try:
        home = os.open(home_name, flags, dir_fd=tree)
    finally:
        os.close(tree)
    m.mount("/proc/self/fd/%d" % home, workdir, None, _MS_BIND)
    os.close(home)
    for d in ("/tmp", "/dev/shm"):
        m.mount("tmpfs", d, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=1777,size=%d" % cfg["tmp_size"])
    import stat

    for target, fd in held:
        dest = m.place(target, stat.S_ISDIR(os.fstat(fd).st_mode))
        try:
            m.check("bind %s again" % target,
                    m.libc.syscall(_MOVE_MOUNT, fd, b"", -100, os.fsencode(dest), _MOVE_MOUNT_F_EMPTY_PATH))
        finally:
            os.close(fd)
    _own_boot_id(m)
    return m


# The sandbox's own boot id (_own_boot_id; the host's fork code's mp_boot_id takes these
# from its table): the file it is made in, in the fresh /dev/shm of a sandbox no code has
# run in yet, and the path it is bound over.
_BOOT_ID_FILE, _BOOT_ID = "/dev/shm/.minipy-boot-id", "/proc/sys/kernel/random/boot_id"


def _own_boot_id(m):
    """Gives the sandbox a boot id of its own (/proc/sys/kernel/random/boot_id, read-only):
    the host's would tell code in two sandboxes, of two users, that they share a kernel and
    when it booted, and a new sandbox process is a new boot for what runs in it (nothing of
    its processes survives a pause or a crash; E2B's SDK reads a changed boot id as a cold
    boot). The id's file is made in the fresh /dev/shm before any code runs there, bound
    over the host's, and unlinked: the bind alone holds it."""
    b = bytearray(os.urandom(16))
    b[6], b[8] = b[6] & 0x0F | 0x40, b[8] & 0x3F | 0x80  # a random (version 4) UUID
    h = b.hex()
    text = "%s-%s-%s-%s-%s\n" % (h[:8], h[8:12], h[12:16], h[16:20], h[20:])
    path = _BOOT_ID_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o444)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    try:
        m.mount(path, _BOOT_ID, None, _MS_BIND)
        m.restrict(_BOOT_ID, _BOOT_ID, False)
    finally:
        os.unlink(path)


def _own_tree(cfg, tree_name):
    """Leaves the tenant's own tree (tree_name, a name under the engine's trees) alone at
    cfg["tree"], where the template binds every tree with the working directories mounted in
    them, so that the code's /proc/self/mountinfo names no other namespace's tree or working
    directory. Done in a mount namespace of its own, in the template's user namespace: the
    one _become_tenant makes next, under a user namespace of its own, locks every mount it
    copies, and a mount that is covered there still shows. The copy of the tree is recursive
    (the tmpfs of each working directory in it, IsolatedConfig.WorkSize, comes with it) and a
    slave of the template's bind, as is everything here once made a slave before the detach
    (which would otherwise take the template's working directories with it): working
    directories the template mounts later in this tree (a Fork copy's, a packed namespace's)
    appear here too."""
    m = _Mounter("")
    m.check("unshare a mount namespace", m.libc.unshare(_CLONE_NEWNS))
    target = cfg["tree"]
    m.mount(None, target, None, _MS_REC | _MS_SLAVE)
    flags = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW
    trees = os.open(target, flags)
    try:
        tree = os.open(tree_name, flags, dir_fd=trees)  # (a name _check_names checked)
    finally:
        os.close(trees)
    try:
        clone = m.libc.syscall(_OPEN_TREE, tree, b"", 0x1 | 0x8000 | 0x1000)  # OPEN_TREE_CLONE, AT_RECURSIVE, AT_EMPTY_PATH
        m.check("copy the tree %s" % tree_name, 0 if clone >= 0 else -1)
    finally:
        os.close(tree)
    try:
        m.check("detach every tree", m.libc.umount2(os.fsencode(target), 2))  # MNT_DETACH
        m.check("move the tree %s to %s" % (tree_name, target),
                m.libc.syscall(_MOVE_MOUNT, clone, b"", -100, os.fsencode(target), 4))  # AT_FDCWD, MOVE_MOUNT_F_EMPTY_PATH
    finally:
        os.close(clone)


def _tenant_namespaces(cfg, fds, libc, check):
    """T of _become_tenant: its user namespace (its own, mapping its one id; or, with a root
    user, the template's: _root_namespace), the sandbox's other namespaces, its network,
    then the fork of its pid 1, where this returns (T exits once it has mapped pid 1's ids,
    with a root user): pid 1's ends of the pipes to T (_root_user), or None."""
    uid, gid = os.getuid(), os.getgid()
    root_ns = _ROOT_NS[0]
    if root_ns is not None:  # a root user: the template's namespace (_root_namespace)
        check("join the template's user namespace", libc.setns(root_ns, _CLONE_NEWUSER))
    else:
        check("unshare a user namespace", libc.unshare(_CLONE_NEWUSER))
        for name, text in (("setgroups", "deny"), ("uid_map", "%d %d 1" % (uid, uid)),
                           ("gid_map", "%d %d 1" % (gid, gid))):
            f = os.open("/proc/self/" + name, os.O_WRONLY)  # (not open(): a text file's objects are pages to copy)
            try:
                os.write(f, text.encode())
            finally:
                os.close(f)
    flags = _CLONE_NEWNS | _CLONE_NEWPID | _CLONE_NEWIPC | _CLONE_NEWUTS
    if not cfg.get("network"):
        flags |= _CLONE_NEWNET
    check("unshare", libc.unshare(flags))
    if not cfg.get("network"):
        _loopback_up()
        if root_ns is not None:
            _low_ports()
    if cfg.get("egress"):
        _egress_listener(fds[3])
    sync = None
    if root_ns is not None:
        proc = os.open("/proc", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)  # (pid 1 mounts its own over it)
        (up_r, up_w), (down_r, down_w) = os.pipe(), os.pipe()
    pid = _real_fork()
    if pid:
        if root_ns is not None:
            os.close(up_w)
            os.close(down_r)
            _map_ids(cfg, proc, pid, up_r)
        os._exit(0)  # the template reaps this one and adopts its child (it is a subreaper)
    if root_ns is not None:
        for f in (proc, up_r, down_w):
            os.close(f)
        sync = (up_w, down_r)
    return sync


def _become_tenant(cfg, fds, dirs):
    """In a fork of the template: make the worker's own sandbox, as a process started by the
    host gets it (sandboxAttr): a user namespace of its own (its Processes count is its own)
    mapping only the sandbox's user, then mount, pid, IPC, UTS and (without Network) network
    namespaces (with a root user, those of the template's namespace for them, pid 1 going
    on in one of its own: _root_namespace); fork its pid 1, which mounts a /proc of its pid
    namespace, binds its own tree
    (dirs: b"TREE\0HOME", names under the engine's trees) over them all and its working
    directory over the workdir, mounts a fresh /tmp and /dev/shm, names the host, drops every
    capability, applies the seccomp filter, takes the fds as 0-5 and returns (to become the
    guardian). Before anything else it joins its cgroup (fds after the fifth: the
    cgroup.procs files the host opened, which take "0" from the writer on the opener's
    authority), so that everything of the sandbox is counted there. A failure exits: the
    host's read of the new worker's pipes ends."""
    import ctypes

    err_fd = [fds[2]]
    try:
        os.setsid()  # out of the template's process group: a signal to that group is the template's alone
        for f in fds[6:]:
            os.write(f, b"0")
            os.close(f)
        del fds[6:]
        libc = _libc()

        def check(what, ret):
            if ret != 0:
                err = ctypes.get_errno()
                raise OSError(err, "%s: %s" % (what, os.strerror(err)))

        tree_name, _, home_name = os.fsdecode(dirs).partition("\0")
        _check_names(tree_name, home_name)
        _own_tree(cfg, tree_name)
        sync = _tenant_namespaces(cfg, fds, libc, check)
        global _tenant
        _tenant = True
        import socket

        socket.sethostname(_HOSTNAME)
        m = _tenant_mounts(cfg, home_name)
        if sync:
            _root_user(m, sync)
        else:
            m.drop_privileges()
        m.seccomp(_filter)
        import fcntl

        high = [fcntl.fcntl(f, fcntl.F_DUPFD_CLOEXEC, 10) for f in fds]  # none is clobbered below
        for f in fds:
            os.close(f)
        err_fd[0] = high[2]
        for i, f in enumerate(high):
            os.dup2(f, i, inheritable=i < 3)
            os.close(f)
        os.closerange(_LIFE_FD + 1, 1 << 20)  # anything else the template held: not the code's
    except BaseException as exc:
        try:
            hint = _SS_EAGAIN if isinstance(exc, OSError) and exc.errno == 11 else ""  # EAGAIN (template.py)
            os.write(err_fd[0], ("%s%s%s\n" % (_SS_FAILED, exc, hint)).encode())
        finally:
            os._exit(70)
