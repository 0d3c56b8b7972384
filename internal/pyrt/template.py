# minipy's template: the process that sandboxed workers are forked from (docs/protocol.md,
# "Template"). Part of the worker's program (pyrt.go's WorkerSource); the names it uses are
# worker.py's and sandbox.py's.

_LIFE_FD = KICK_FD + 1  # a tenant guardian's end of its life pipe: the host sees it close when it exits
_tenant = False  # this process is a tenant guardian forked from the template
_filter = None  # the template's seccomp filter
_template_binds = []  # the targets of the template's binds (_enter_sandbox), for its tenants
_tenant_hooks = []  # in a tenant: the after-fork hooks its worker runs (_defer_child_hooks)
_tree_owner = None  # the owner of the trees' tmpfs (_tree_root): root where it is mapped


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
    import gc
    import importlib
    import select

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
    import stat  # noqa: F401

    _package_site()
    # Save and Restore's pickle (and the re it imports): a new namespace's first Restore is
    # what a paused sandbox's resume and a saved session's bring-back run, and importing
    # them there cost 15-40 ms (state.py imports them on first use where there is no template).
    _rt._state_picklers()
    _load_fork_code(cfg)  # (the workers' snapshots fork with it: _SnapFork)
    for name in filter(None, cfg.get("preload", "").split(",")):
        try:
            importlib.import_module(name)
        except BaseException as exc:
            os.write(2, ("minipy worker: IsolatedConfig.Preload: importing %s failed: %s: %s\n" % (
                name, _rt.type_name(type(exc)), exc)).encode())
            os._exit(70)
    gc.freeze()
    ready = _rt.encode(["%d.%d.%d" % sys.version_info[:3], sys.executable, os.getpid()] + compiled)
    os.write(1, _LEN.pack(len(ready) + 1) + F_READY + ready)
    wake_r, wake_w = _child_wakeup()
    import socket

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
        for fd, _ in _poll(poller):
            if fd == wake_r:
                os.read(wake_r, 512)
                continue
            try:
                msg, fds = _recv_fds(ctl)
            except OSError:
                msg, fds = b"", []
            if not msg:
                os._exit(0)  # the engine is closed (or the host gone)
            if msg[:1] == C_MOUNT and not fds:
                _mount_workdir(cfg, ctl, msg[1:])
                continue
            pid = -1
            if msg[:1] == C_NEW and len(fds) >= 6:
                # The after-fork hooks in Python (threading's, logging's) run once, in the
                # worker (main), not in each process on the way (this fork, the sandbox's
                # pid 1, the worker): each run writes ~100 pages of its process.
                deferred = _defer_child_hooks(0)
                try:
                    pid = os.fork()
                except OSError:
                    pass
                if pid == 0:
                    global _tenant_hooks
                    _tenant_hooks = deferred
                    gc.enable()
                    ctl.detach()  # fd 3 is the tenant's control socket from here on
                    signal.set_wakeup_fd(-1)
                    # (_signal's: signal.signal's wrapper turns the old handler into an enum, ~35 pages of
                    # Python objects copied in each fork)
                    _signal.signal(_signal.SIGCHLD, _signal.SIG_DFL)
                    os.close(wake_r)
                    os.close(wake_w)
                    _become_tenant(cfg, fds, msg[1:])
                    return
                _run_deferred(deferred, False)
            for f in fds:  # the fork's now, or (refused) closed here: the host's reads end
                os.close(f)


def _check_names(tree_name, name):
    """Refuses names of a tree and a working directory in it that are not one component each."""
    if not tree_name or not name or "/" in tree_name + name or ".." in (tree_name, name) or "." in (tree_name, name):
        raise OSError(22, "bad working directory names %r, %r" % (tree_name, name))


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
            global _tree_owner
            if _tree_owner is None:
                with open("/proc/self/uid_map") as f:
                    _tree_owner = 0 if any(line.split()[0] == "0" for line in f) else os.getuid()
            owner = _tree_owner
            _Mounter("").mount("tmpfs", "/proc/self/fd/%d" % tree, "tmpfs", _MS_NOSUID | _MS_NODEV,
                               "mode=0755,uid=%d,gid=%d,size=%d,nr_inodes=%d" % (
                                   owner, owner, size, max(size >> 12, 1024)))
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
                                   "mode=0700,uid=%d,gid=%d,size=%d,nr_inodes=%d" % (
                                       os.getuid(), os.getgid(), size, max(size >> 12, 1024)))
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
