# minipy's one way to kill a tree of processes. pyrt.go puts this file after runtime.py (the
# in-process engine: a stopped run's children, a stopped !cmd) and after worker.py (the
# isolated engine's guardian: a worker and everything below it), so the rule is written once.
#
# The rule. The tree comes from /proc's parent links, and its processes are stopped round
# after round until a scan finds none it has not stopped (so none forks or leaves the tree
# past the scan); then all are killed. Each is held by a pidfd, opened after the scan and
# kept only while the process's start time is still the one the scan read (a root given
# with its start time: that one), and signalled through it: a pid that was freed and given
# to another process between the scan and the signal is never signalled. (Without pidfds,
# a kernel before 5.3, the start time is checked just before each signal.)

_pt_kill = os.kill  # (the in-process runtime wraps os.kill when it installs, after this)


def proc_stat(pid):
    """(parent pid, start time in clock ticks since boot) of pid from /proc/PID/stat, or None."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            data = f.read()
        fields = data[data.rindex(b")") + 2:].split()
        return int(fields[1]), int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def proc_start(pid):
    """The process's start time (clock ticks since boot), or None when it is gone."""
    st = proc_stat(pid)
    return st and st[1]


def children_by_parent():
    """{parent pid: [(child pid, its start time)]} from /proc."""
    children = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return children
    for name in names:
        if name.isdigit():
            st = proc_stat(int(name))
            if st is not None:
                children.setdefault(st[0], []).append((int(name), st[1]))
    return children


def _pt_hold(pid, start):
    """A pidfd of pid if it is still the process that started at start (None: any), -1 when
    the kernel has no pidfds; None when it is gone or another process."""
    try:
        fd = os.pidfd_open(pid)
    except OSError as e:
        if e.errno != 38:  # ENOSYS: no pidfds
            return None
        fd = -1
    now = proc_start(pid)
    if now is None or start is not None and now != start:
        if fd >= 0:
            os.close(fd)
        return None
    return fd


def _pt_signal(pid, fd, start, sig):
    try:
        if fd >= 0:
            signal.pidfd_send_signal(fd, sig)
        elif start is None or proc_start(pid) == start:
            _pt_kill(pid, sig)
    except OSError:
        pass  # it has ended


def kill_tree(roots, spare=(), adopter=0, keep=None):
    """SIGKILL the processes roots (pids, or (pid, start time) pairs: then only if it is still
    the process that started then) and all their descendants but the pids in spare and
    theirs; with adopter, its children are roots too, found again each round (a worker that
    is ending hands its children to the guardian while the scan runs). Returns the pids
    killed; with keep (a list), the pidfds they were signalled through go there, open (each
    readable once its process has ended), instead of being closed."""
    held = {}  # pid -> (pidfd or -1, start)
    gone = set()  # scanned, but ended or replaced before it was held
    try:
        for _ in range(20):
            children = children_by_parent()
            started = {pid: st for kids in children.values() for pid, st in kids}
            queue = [r if isinstance(r, tuple) else (r, None) for r in roots]
            if adopter:
                queue += children.get(adopter, ())
            fresh, seen = [], set()
            while queue:
                pid, start = queue.pop()
                if pid in spare or pid in seen:
                    continue
                seen.add(pid)
                if start is not None and started.get(pid) != start:
                    continue  # gone, or another process has its pid: neither it nor its children are the tree's
                if pid not in held and pid not in gone:
                    fresh.append((pid, start))
                queue.extend(children.get(pid, ()))
            if not fresh:
                break
            for pid, start in fresh:
                fd = _pt_hold(pid, start)
                if fd is None:
                    gone.add(pid)
                    continue
                held[pid] = (fd, start)
                _pt_signal(pid, fd, start, signal.SIGSTOP)
        for pid, (fd, start) in held.items():
            _pt_signal(pid, fd, start, signal.SIGKILL)
    finally:
        for fd, _ in held.values():
            if fd < 0:
                continue
            if keep is None:
                os.close(fd)
            else:
                keep.append(fd)
    return set(held)
