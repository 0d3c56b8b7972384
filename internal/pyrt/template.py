# minipy's template: the process that sandboxed workers are forked from (docs/protocol.md,
# "Template"). Part of the worker's program (pyrt.go's WorkerSource); the names it uses are
# worker.py's and sandbox.py's.

_LIFE_FD = KICK_FD + 1  # a tenant guardian's end of its life pipe: the host sees it close when it exits
_tenant = False  # this process is a tenant guardian forked from the template
_filter = None  # the template's seccomp filter
_template_binds = []  # the targets of the template's binds (_enter_sandbox), for its tenants
_tenant_hooks = []  # in a tenant: the after-fork hooks its worker runs (_defer_child_hooks)
_tree_owner = None  # the owner of the trees' tmpfs (_tree_root): root where it is mapped
_SANDBOX_FORK = None  # a _SandboxFork, where the host's fork code runs here
_GUARDED = None  # in a sandbox that the fork code made: (the worker's pid, 0 in the worker; its v; the snapshot's pid; its number)


def _serve_template(cfg, runtime):
    """IsolatedConfig's template (docs/protocol.md, "Template"): a sandboxed process that has
    loaded the runtime and the Preload modules, and forks a worker sandbox for each b"N"
    (followed by the names of the new one's tree and, in it, its working directory,
    separated by a NUL; with six fds: stdin, stdout, stderr, control socket, control pipe
    and life pipe of the new one, then, when the engine has a cgroup, the cgroup.procs of the new one's
    group in each hierarchy) that the host sends over the control socket (fd 3). It returns only in such a fork, as the
    new sandbox's pid 1 (_become_tenant), which goes on as a guardian. The host closing the
    socket ends the template alone: the sandboxes forked from it are in pid namespaces of
    their own, each ended by its own guardian (docs/isolated.md, "Who may die")."""
    _prepare_template(cfg, runtime)
    _template_loop(cfg)


def _prepare_template(cfg, runtime):
    """The template's work before its loop: everything its workers share, loaded, warmed
    up and frozen once here; then it tells the host it is ready (F_READY)."""
    import gc
    import importlib

    # Copy-on-write: what the template loads is shared by every worker forked from it until
    # one writes to its page, and each such write costs the worker a page fault and a copy.
    # Collections would write to every object's GC header, and the free slots they leave
    # would be filled by the workers' own objects: no collection here, and what is loaded
    # is frozen (gc.freeze), out of the workers' collections too (Python's own advice for a
    # process that forks without exec; the workers collect again).
    gc.disable()
    # The sandboxes' pid 1s are orphaned as they start (_become_tenant): a subreaper, the
    # template adopts and reaps them. When it dies they go on, adopted by whatever reaps
    # above it; they are in no pid namespace of its (sandboxAttr).
    import ctypes

    if _libc().prctl(36, 1, 0, 0, 0) != 0:  # PR_SET_CHILD_SUBREAPER
        raise OSError(ctypes.get_errno(), "PR_SET_CHILD_SUBREAPER")
    global _filter
    _filter = _Mounter("").filter(cfg.get("seccomp"))  # made once here, installed by each fork
    compiled = _load_runtime(cfg, runtime)
    # What each fork would otherwise make for itself, made here once and shared: the libc
    # functions the sandbox's setup calls (_libc), the modules it imports, the package site.
    for name in ("mount", "umount2", "unshare", "syscall", "prctl", "capset", "timer_create", "timer_settime"):
        getattr(_libc(), name, None)
    import faulthandler  # noqa: F401
    import fcntl  # noqa: F401
    import resource  # noqa: F401  (the worker's limits: an import there cost ~115 faults a start)
    import stat  # noqa: F401
    import warnings  # noqa: F401  (3.12+: _quiet_snapshot_forks; 3.15 loads it only on demand)

    _package_site()
    # Save and Restore's pickle (and the re it imports): a new namespace's first Restore is
    # what a paused sandbox's resume and a saved session's bring-back run, and importing
    # them there cost 15-40 ms (state.py imports them on first use where there is no template).
    _rt._state_picklers()
    _load_fork_code(cfg)  # (the sandboxes fork with it, and the workers their snapshots and their loop)
    global _SANDBOX_FORK
    _SANDBOX_FORK = _SandboxFork.make(cfg)
    for name in filter(None, cfg.get("preload", "").split(",")):
        try:
            importlib.import_module(name)
        except BaseException as exc:
            os.write(2, ("minipy worker: IsolatedConfig.Preload: importing %s failed: %s: %s\n" % (
                name, _rt.type_name(type(exc)), exc)).encode())
            os._exit(70)
    _startup(cfg, 2)
    # The runtime prepared and warmed up once here, for every worker (each page a worker
    # writes is a copy of its own): its install then only sets its kick handler, which no
    # process on the way (the template, T, the sandbox's pid 1) has.
    _rt.prepare()
    _rt.warm_up()
    _quiet_snapshot_forks()  # (its filter's patterns compiled once here, not in each worker)
    try:
        _Deadman.prepare()
    except (OSError, AttributeError):
        pass  # (no POSIX timers: the workers find out themselves)
    _immortalize(_immortal_refcount())
    gc.freeze()
    _rt.fill_pools()  # (last: what the workers allocate goes to pools of their own)
    ready = _rt.encode(["%d.%d.%d" % sys.version_info[:3], sys.executable, os.getpid()] + compiled)
    os.write(1, _LEN.pack(len(ready) + 1) + F_READY + ready)


def _template_loop(cfg):
    """The template's loop (_serve_template): it reaps, and forks a sandbox for each
    request. It returns only in a fork, as the new sandbox's pid 1."""
    import select
    import socket

    wake_r, wake_w = _child_wakeup()
    ctl = socket.socket(fileno=_CTL_FD)
    poller = select.poll()
    poller.register(wake_r, select.POLLIN)
    poller.register(_CTL_FD, select.POLLIN)
    while True:
        while True:  # the tenants' first processes, which exit at once, and their guardians
            try:
                if not os.waitpid(-1, os.WNOHANG)[0]:
                    break
            except ChildProcessError:
                break
        if _SANDBOX_FORK is not None:
            # The loop in C while the host asks only for sandboxes and working directories:
            # each page the template writes after a fork is a page copied (~200 a start in
            # Python). The after-fork hooks in Python (threading's, logging's) run once, in
            # the worker (main), not in each process on the way (each run writes ~100 pages).
            deferred = _defer_child_hooks(0)
            if _SANDBOX_FORK.serve() == 0:
                _in_new_sandbox(ctl, deferred)
                _tenant_made(cfg)  # (the wakeup pipe closed)
                return
            _run_deferred(deferred, False)
        for fd, _ in _poll(poller):  # what the loop in C left to this one
            if fd == wake_r:
                os.read(wake_r, 512)
            elif _template_request(cfg, ctl, wake_r, wake_w):
                return


def _template_request(cfg, ctl, wake_r, wake_w):
    """Serves one message of the host's on the control socket (a working directory's mount,
    or a new sandbox). True in the new sandbox's pid 1, made."""
    try:
        msg, fds = _recv_fds(ctl)
    except OSError:
        msg, fds = b"", []
    if not msg:
        os._exit(0)  # the engine is closed (or the host gone)
    if msg[:1] == C_MOUNT and not fds:
        _mount_workdir(cfg, ctl, msg[1:])
        return False
    if msg[:1] == C_NEW and len(fds) >= 6:
        deferred = _defer_child_hooks(0)
        if _fork_tenant(fds, msg[1:]) == 0:
            _in_new_sandbox(ctl, deferred)
            if _SANDBOX_FORK is not None:  # made (the wakeup pipe closed)
                _tenant_made(cfg)
                return True
            os.close(wake_r)
            os.close(wake_w)
            _become_tenant(cfg, fds, msg[1:])
            return True
        _run_deferred(deferred, False)
    for f in fds:  # the fork's now, or (refused) closed here: the host's reads end
        os.close(f)
    return False

def _immortal_refcount():
    """The reference count that makes an object immortal (PEP 683: Python never writes it
    again, nor frees the object), where this Python has immortal objects and the layout of
    their count is known: CPython 3.12+ with the GIL on a 64-bit little-endian machine, not
    a debug build. The count is the object's first 32 bits there. 3.12 and 3.13 count
    up to 2**32-1 and stop there; 3.14+ take anything from 2**31 and set 3 << 30 (its
    _Py_IMMORTAL_INITIAL_REFCNT, the widest margin for old extensions that count
    anyway). 0 elsewhere (3.11 has none: every count is written)."""
    if (sys.implementation.name != "cpython" or sys.version_info < (3, 12) or sys.maxsize < 1 << 62
            or sys.byteorder != "little" or set(getattr(sys, "abiflags", "")) & set("td")
            or hasattr(sys, "gettotalrefcount")):
        return 0
    return 0xFFFFFFFF if sys.version_info < (3, 14) else 3 << 30


def _immortalize(count):
    """Make what the template has loaded immortal (count: _immortal_refcount's), as CPython
    makes its own static objects: a worker that calls a function, takes a module's
    attribute or passes a template's object on then writes no reference count of it. Every
    page a worker writes is a copy of the template's at its start, and again a copy of its
    snapshot's after each run that changed its state (a rollback cycle): on 3.12-3.15 the
    cycle wrote 211-219 pages, 123-142 with this, and a new namespace's start 805-919,
    560-783 (docs/benchmarks.md). The objects are those the collector tracks and what they refer
    to (a code object's constants and names, which no traversal gives), but the
    namespaces: a namespace is the code's, and freeing it must free what it holds. They
    are never freed (the template's objects live as long as any worker anyway); the
    collections that follow leave them out (gc.freeze)."""
    if not count:
        return
    import ctypes
    import gc

    objs = gc.get_objects()
    mortal = {id(space) for space in _rt._spaces.values()}
    seen = set(map(id, objs)) | mortal
    objs = [o for o in objs if id(o) not in mortal]
    code = types.CodeType
    i = 0
    while i < len(objs):
        o = objs[i]
        i += 1
        refs = gc.get_referents(o)
        if type(o) is code:
            refs = (o.co_consts, o.co_names, o.co_varnames, o.co_freevars, o.co_cellvars, o.co_filename, o.co_name,
                    o.co_qualname, o.co_linetable, o.co_exceptiontable)
        for r in refs:
            if id(r) not in seen:
                seen.add(id(r))
                objs.append(r)
    at = ctypes.c_uint32.from_address
    for o in objs:
        c = at(id(o))
        if c.value < 1 << 31:  # (immortal already: the static objects, the interned strings)
            c.value = count


def _in_new_sandbox(ctl, deferred):
    """In a new sandbox forked from the template (its pid 1, or its worker when the fork code
    made it): what the template's loop set up is not its own."""
    global _tenant_hooks
    import gc

    _tenant_hooks = deferred
    gc.enable()
    ctl.detach()  # fd 3 is the tenant's control socket from here on
    signal.set_wakeup_fd(-1)
    # (_signal's: signal.signal's wrapper turns the old handler into an enum, ~35 pages of
    # Python objects copied in each fork)
    _signal.signal(_signal.SIGCHLD, _signal.SIG_DFL)


def _fork_tenant(fds, dirs):
    """Forks a new tenant: its sandbox's pid 1 made by the host's fork code (_SandboxFork,
    returning 0 there), or a plain fork that makes it in Python (_become_tenant); the pid
    the template reaps, or -1 (a failure the host sees as the new worker's pipes ending)."""
    if _SANDBOX_FORK is None:
        try:
            return _real_fork()
        except OSError:
            return -1
    try:
        tree_name, _, home_name = os.fsdecode(dirs).partition("\0")
        _check_names(tree_name, home_name)
        return _SANDBOX_FORK.fork(fds, tree_name, home_name)
    except OSError as exc:
        try:
            os.write(fds[2], (_SS_FAILED + "%s\n" % exc).encode())
        except OSError:
            pass
        return -1


def _tenant_made(cfg):
    """In a sandbox's pid 1 that the host's fork code made: what _become_tenant does in Python."""
    global _tenant
    _tenant = True
    if cfg.get("egress"):
        _egress_env()


# The steps of a sandbox's set-up in the host's fork code (internal/cpython's MP_SS_*, pinned
# by a test there), named in the message of a failure.
_SS_SETSID, _SS_CGROUP, _SS_TREE_NS, _SS_TREE_SLAVE, _SS_TREE_OPEN, _SS_TREE_COPY, _SS_TREE_DETACH = 0, 1, 2, 3, 4, 5, 6
_SS_TREE_MOVE, _SS_USERNS, _SS_MAPS, _SS_UNSHARE, _SS_EGRESS, _SS_FORK, _SS_HOSTNAME = 7, 8, 9, 10, 11, 12, 13
_SS_PROC, _SS_HOME, _SS_BIND_HOME, _SS_TMPFS, _SS_COVERED, _SS_CAPS, _SS_SECCOMP = 14, 15, 16, 17, 18, 19, 20
_SS_FDS, _SS_GUARDIAN, _SS_DUMPABLE, _SS_TEMPLATE_FORK, _SS_BOOT_ID, _SS_ROOT, _SS_ROOT_HOME = 21, 22, 23, 24, 25, 26, 27
_SS_COUNT = 28
_SS_WHY = {
    _SS_SETSID: "setsid", _SS_CGROUP: "join the cgroup", _SS_TREE_NS: "unshare a mount namespace",
    _SS_TREE_SLAVE: "make the trees slaves", _SS_TREE_OPEN: "open the tree", _SS_TREE_COPY: "copy the tree",
    _SS_TREE_DETACH: "detach every tree", _SS_TREE_MOVE: "move the tree", _SS_USERNS: "unshare a user namespace",
    _SS_MAPS: "write the user namespace's maps", _SS_UNSHARE: "unshare",
    _SS_EGRESS: "the sandbox's network (its loopback up, the egress listener)",
    _SS_FORK: "fork the sandbox's pid 1", _SS_HOSTNAME: "sethostname", _SS_PROC: "mount /proc",
    _SS_HOME: "open the working directory", _SS_BIND_HOME: "bind the working directory",
    _SS_TMPFS: "mount /tmp and /dev/shm", _SS_COVERED: "bind again what they cover",
    _SS_CAPS: "drop every capability", _SS_SECCOMP: "seccomp", _SS_FDS: "take the fds",
    _SS_GUARDIAN: "fork the worker", _SS_DUMPABLE: "make the guardian undumpable",
    _SS_TEMPLATE_FORK: "fork the template", _SS_BOOT_ID: "make its boot id", _SS_ROOT: "make its own root",
    _SS_ROOT_HOME: "make root's home root's",
}
# The kinds of a name at a sandbox's own root (internal/cpython's MP_RK_*; _root_layout's).
_RK = {"dir": 0, "link": 1, "copy dir": 2, "copy file": 3}
_SS_FAILED = "minipy worker: making the sandbox of a worker forked from the template failed: "
# After an EAGAIN's errno (11), which a fork meets at the host's process limits.
_SS_EAGAIN = (" (the host's process limit is reached: kernel.pid_max, kernel.threads-max, a cgroup's pids.max or "
              "RLIMIT_NPROC; docs/deploy.md says what a host needs for N sandboxes)")


class _SandboxFork:
    """The template's fork of a new sandbox by the host's fork code (_ForkCode, MP_OP_SANDBOX):
    _become_tenant's work, done in C by the fork (T) and its child (the sandbox's pid 1),
    which forks the worker and guards it in C until something needs _Guardian (each page
    Python writes in a fork is a page copied: ~1,000 of a sandbox's start). The table holds what every tenant shares, made once
    here; each fork writes its fds and names."""

    __slots__ = ("table", "addr", "call", "keep")

    @classmethod
    def make(cls, cfg):
        """One, or None where the code is not here or the tenants' set-up does not fit it."""
        if _FORK_CODE is None or not (cfg.get("control") and cfg.get("kicks")):
            return None  # (a template's workers have both: launch.go)
        workdir = cfg["workdir"]
        covered = sorted((t for t in _template_binds if t == workdir or t.startswith((workdir + "/", "/tmp/", "/dev/shm/"))),
                         key=len)
        layout = _root_layout(cfg)
        if len(covered) > 16 or len(layout) > 64:
            return None  # (more than the code holds: _become_tenant)
        return cls(_FORK_CODE, cfg, covered, layout)

    def __init__(self, code, cfg, covered, layout):
        import ctypes

        self.keep = []
        t = self.table = code.table(_OP_SANDBOX)
        uid, gid = os.getuid(), os.getgid()
        maps = ("/proc/self/setgroups", "deny", "/proc/self/uid_map", "%d %d 1" % (uid, uid),
                "/proc/self/gid_map", "%d %d 1" % (gid, gid))
        for slot, text in ((_FT_S_TREES, cfg["tree"]), (_FT_S_WORKDIR, cfg["workdir"]), (_FT_S_HOSTNAME, _HOSTNAME),
                           (_FT_S_PROC, "proc"), (_FT_S_PROC_DIR, "/proc"), (_FT_S_TMPFS, "tmpfs"),
                           (_FT_S_TMP_DIRS, "/tmp"), (_FT_S_TMP_DIRS + 1, "/dev/shm"),
                           (_FT_S_TMP_DATA, "mode=1777,size=%d" % cfg["tmp_size"]), (_FT_S_FD_PATH, "/proc/self/fd/"),
                           (_FT_S_BOOT_ID, _BOOT_ID_FILE), (_FT_S_BOOT_ID + 1, _BOOT_ID)
                           ) + tuple(enumerate(maps, _FT_S_MAPS)):
            t[slot] = self.string(text)
        flags = _CLONE_NEWNS | _CLONE_NEWPID | _CLONE_NEWIPC | _CLONE_NEWUTS
        t[_FT_S_UNSHARE] = flags if cfg.get("network") else flags | _CLONE_NEWNET
        t[_FT_S_PORT] = EGRESS_PORT if cfg.get("egress") else 0
        t[_FT_S_LISTEN] = C_LISTEN[0]
        paths = (ctypes.c_void_p * 16)(*[self.string(p) for p in covered])
        dirs = (ctypes.c_int64 * 16)(*[1 if os.path.isdir(p) else 0 for p in covered])
        why = (ctypes.c_void_p * (_SS_COUNT + 3))(*[self.string(_SS_WHY[i]) for i in range(_SS_COUNT)],
                                                  self.string(_SS_FAILED), self.string(": [Errno "),
                                                  self.string(_SS_EAGAIN))
        self.keep += [paths, dirs, why]
        t[_FT_S_NCOVERED] = len(covered)
        if _ROOT_NS[0] is not None:
            t[_FT_S_USERNS], t[_FT_S_IDMAP] = _ROOT_NS[0], self.string(_root_idmap(cfg))
            t[_FT_S_ID_FILES], t[_FT_S_ID_FILES + 1] = self.string("/uid_map"), self.string("/gid_map")
            t[_FT_S_ROOT_HOME], t[_FT_S_CAP_LAST] = self.string(_ROOT_HOME), _cap_last()
            t[_FT_S_LOW_PORTS] = self.string(_LOW_PORTS)
        self.root_layout(cfg, layout)
        t[_FT_S_COVERED], t[_FT_S_COVERED_DIR], t[_FT_S_WHY] = (ctypes.addressof(a) for a in (paths, dirs, why))
        t[_FT_S_FILTER] = ctypes.addressof(_filter)
        t[_FT_S_LIFE] = _LIFE_FD
        t[_FT_G_CTL], t[_FT_G_KICK], t[_FT_G_REPORT], t[_FT_G_SNAP_DIED] = _CTL_FD, KICK_FD, _V_SNAP[0], C_SNAP_DIED[0]
        owner, uid, gid = _tree_owner_here(), os.getuid(), os.getgid()
        for slot, text in ((_FT_G_OOM_SELF, "/proc/self/oom_score_adj"), (_FT_G_OOM_PID, "/proc/"),
                           (_FT_G_OOM_PID + 1, "/oom_score_adj"),
                           (_FT_T_MOVED, "OSError: [Errno 16] the tmpfs moved while it was mounted"),
                           (_FT_T_DATA, _TREE_TMPFS % (owner, owner)), (_FT_T_DATA + 1, _HOME_TMPFS % (uid, gid)),
                           (_FT_T_DATA + 2, ",nr_inodes=")):
            t[slot] = self.string(text)
        t[_FT_T_NEW], t[_FT_T_MOUNT], t[_FT_T_REFUSED], t[_FT_T_SFD] = C_NEW[0], C_MOUNT[0], C_REFUSED[0], -1
        self.addr = ctypes.addressof(t)
        self.call = code.call

    def root_layout(self, cfg, layout):
        """The table's slots for the sandbox's own root (_own_root): layout (_root_layout) and
        the options of its tmpfs."""
        import ctypes

        kinds = (ctypes.c_int64 * 64)(*[_RK[e[0]] for e in layout])
        names = (ctypes.c_void_p * 64)(*[self.string("/" + e[1]) for e in layout])
        links = (ctypes.c_void_p * 64)(*[self.string(e[2]) if e[0] == "link" else None for e in layout])
        opts = (ctypes.c_void_p * 4)(*[self.string(o) for o in ("mode", "0755", "size", str(cfg["tmp_size"]))])
        self.keep += [kinds, names, links, opts]
        t = self.table
        t[_FT_S_ROOT_N] = len(layout)
        t[_FT_S_ROOT_KINDS], t[_FT_S_ROOT_NAMES], t[_FT_S_ROOT_LINKS], t[_FT_S_ROOT_OPTS] = (
            ctypes.addressof(a) for a in (kinds, names, links, opts))
        t[_FT_S_ROOT_AT], t[_FT_S_ROOT_PROC] = self.string(_ROOT_AT), self.string(_ROOT_AT + "/proc")

    def string(self, text):
        """The address of text's bytes, NUL-terminated, kept as long as this."""
        import ctypes

        b = ctypes.create_string_buffer(os.fsencode(text))
        self.keep.append(b)
        return ctypes.addressof(b)

    def serve(self):
        """The template's loop in C (MP_OP_TEMPLATE) until it has a message for the loop in
        Python (1), or in a new sandbox (0, as fork)."""
        t = self.table
        t[_FT_OP] = _OP_TEMPLATE
        r = self.call(self.addr)
        if r == 0:
            global _GUARDED
            _GUARDED = tuple(t[i] for i in (_FT_G_WORKER, _FT_G_V, _FT_G_SNAP, _FT_G_GEN))
        t[_FT_OP] = _OP_SANDBOX
        return r

    def fork(self, fds, tree_name, home_name):
        """The fork's pid in the template; 0 in the new sandbox, made, its fds 0-5: in its
        worker, or in its pid 1 once its guardian leaves C (_GUARDED says which)."""
        import ctypes

        t = self.table
        for i, f in enumerate(fds[:8]):
            t[_FT_S_FDS + i if i < 6 else _FT_S_CG + i - 6] = f
        t[_FT_S_NCG] = max(len(fds) - 6, 0)
        names = [ctypes.create_string_buffer(os.fsencode(n)) for n in (tree_name, home_name)]
        t[_FT_S_TREE], t[_FT_S_HOME] = (ctypes.addressof(b) for b in names)
        pid = self.call(self.addr)
        if pid < 0:
            raise OSError(-pid, os.strerror(-pid))
        if pid == 0:
            global _GUARDED
            _GUARDED = tuple(t[i] for i in (_FT_G_WORKER, _FT_G_V, _FT_G_SNAP, _FT_G_GEN))
        return pid


def _check_names(tree_name, name):
    """Refuses names of a tree and a working directory in it that are not one component each."""
    if not tree_name or not name or "/" in tree_name + name or ".." in (tree_name, name) or "." in (tree_name, name):
        raise OSError(22, "bad working directory names %r, %r" % (tree_name, name))


# The options of a tree's tmpfs and of a working directory's, up to their size (then
# ",nr_inodes=", an inode per 4 KiB, at least 1024: _tree_root, _mount_home, and the
# template's loop in C).
_TREE_TMPFS = "mode=0755,uid=%d,gid=%d,size="
_HOME_TMPFS = "mode=0700,uid=%d,gid=%d,size="


def _tree_owner_here():
    """The owner of the trees' tmpfs: root where it is mapped here, else the sandbox's user."""
    global _tree_owner
    if _tree_owner is None:
        with open("/proc/self/uid_map") as f:
            _tree_owner = 0 if any(line.split()[0] == "0" for line in f) else os.getuid()
    return _tree_owner


def _tree_root(cfg, tree_name, size):
    """An O_PATH fd of the root of the tree tree_name's tmpfs, mounting it first over the
    host's empty directory (the tree's first request): a file system of its own, so that a
    sandbox's /proc/self/mountinfo names no host path (the tree is the root of what it binds
    at /namespaces), which the host reaches only by the fd it is sent. The host makes the
    working directories in it; it is root's when root is mapped here (a root host's: the
    code cannot add to it), else the sandbox's user's."""
    flags = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW
    trees = os.open(cfg["tree"], flags)
    try:
        tree = os.open(tree_name, flags, dir_fd=trees)
        try:
            if os.fstat(tree).st_dev != os.fstat(trees).st_dev:
                return os.dup(tree)  # mounted already
            owner = _tree_owner_here()
            _Mounter("").mount("tmpfs", "/proc/self/fd/%d" % tree, "tmpfs", _MS_NOSUID | _MS_NODEV,
                               (_TREE_TMPFS + "%d,nr_inodes=%d") % (owner, owner, size, max(size >> 12, 1024)))
        finally:
            os.close(tree)
        root = os.open(tree_name, flags, dir_fd=trees)  # a lookup by name enters the mount
        if os.fstat(root).st_dev == os.fstat(trees).st_dev:
            os.close(root)
            raise OSError(16, "the tree %s moved while it was mounted" % tree_name)
        return root
    finally:
        os.close(trees)


def _mount_home(cfg, tree_name, name, size):
    """An O_PATH fd of the root of a tmpfs of size bytes mounted over the working directory
    name that the host made in the tree tree_name's tmpfs, owned by the sandbox's user, mode
    0700, with an inode per 4 KiB (empty files cost kernel memory that size does not count)."""
    flags = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW
    trees = os.open(cfg["tree"], flags)
    try:
        tree = os.open(tree_name, flags, dir_fd=trees)
        try:
            if os.fstat(tree).st_dev == os.fstat(trees).st_dev:
                raise OSError(22, "the tree %s has no tmpfs" % tree_name)
            d = os.open(name, flags, dir_fd=tree)
            try:
                st = os.fstat(d)
                _Mounter("").mount("tmpfs", "/proc/self/fd/%d" % d, "tmpfs", _MS_NOSUID | _MS_NODEV,
                                   (_HOME_TMPFS + "%d,nr_inodes=%d") % (os.getuid(), os.getgid(), size,
                                                                        max(size >> 12, 1024)))
            finally:
                os.close(d)
            root = os.open(name, flags, dir_fd=tree)  # a lookup by name enters the mount
        finally:
            os.close(tree)
    finally:
        os.close(trees)
    if os.fstat(root).st_dev == st.st_dev:
        os.close(root)
        raise OSError(16, "the working directory %s/%s moved while it was mounted" % (tree_name, name))
    return root


def _mount_workdir(cfg, ctl, body):
    """C_MOUNT (IsolatedConfig.WorkSize), body b"TREE\0NAME\0SIZE": without a NAME, mounts
    the tree's own tmpfs of SIZE bytes (_tree_root); with one, a tmpfs of SIZE bytes over the
    working directory NAME that the host made in it (_mount_home). Either way it sends the
    host an O_PATH fd of the tmpfs's root, through which the host reaches it (the mounts
    exist in this mount namespace and, as slave copies, in the workers' only). A refusal is
    answered C_REFUSED and the reason. The host removing a directory detaches the mounts on
    it everywhere."""
    import array
    import socket

    try:
        tree_name, name, size = os.fsdecode(body).split("\0")
        size = int(size)
        if size <= 0:
            raise OSError(22, "bad size %d" % size)
        _check_names(tree_name, name or "-")
        root = _mount_home(cfg, tree_name, name, size) if name else _tree_root(cfg, tree_name, size)
        try:
            ctl.sendmsg([C_MOUNT], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [root]).tobytes())])
        finally:
            os.close(root)
    except Exception as exc:
        try:
            ctl.send(C_REFUSED + ("%s: %s" % (_rt.type_name(type(exc)), exc)).encode("utf-8", "replace"))
        except OSError:
            pass
