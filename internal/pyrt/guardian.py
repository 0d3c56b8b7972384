# minipy's guardian: the process a worker's start leaves outside the worker, which reaps its
# orphans, kills its tree when it or the host ends, and hands its rollback snapshot and Fork
# copies the host's pipes (docs/protocol.md, "Rollback" and "Fork"). Part of the worker's
# program (pyrt.go's WorkerSource); the names it uses are worker.py's.

def _child_wakeup():
    """A pipe that SIGCHLD writes to (set_wakeup_fd), for a loop that polls it with others."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    # A handler: the wakeup fd is written. (_signal's: signal.signal's wrapper makes enums of
    # the old handler, ~30 pages a guardian copies.)
    _signal.signal(_signal.SIGCHLD, lambda signum, frame: None)
    signal.set_wakeup_fd(wake_w)
    return wake_r, wake_w


def _poll(poller):
    """poller's events; none when a signal interrupted the wait."""
    try:
        return poller.poll()
    except InterruptedError:
        return ()


def _become_guardian(cfg, runtime):
    """The process the host started stays outside the worker as its guardian: it forks the
    worker (before anything else is loaded: the smaller the process, the cheaper the fork)
    and returns in it; it never returns itself. The guardian reaps every orphan (it is pid 1
    of the sandbox's pid namespace, else the worker's subreaper), and when the worker ends,
    or the host is gone (its ends of the protocol pipes, fds 0 and 1, closed: a crashed
    host, a dead ssh connection), it kills whatever is left of the worker's tree, reports
    the worker's wait status as the last frame (b"X", i32) and exits. As pid 1 it also
    shields the worker from the kernel's rule that pid 1 ignores signals it has no handler
    for (SIGXCPU from RLIMIT_CPU, the code's own os.kill)."""
    if _GUARDED is not None:
        _guarded(cfg, *_GUARDED)
        return
    import select

    init = os.getpid() == 1
    try:
        prctl = _libc().prctl
    except (OSError, AttributeError):
        prctl = None  # not Linux: the host still kills the process group
    if not init and prctl:
        prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    wake_r, wake_w = _child_wakeup()
    control = bool(cfg.get("control"))
    if control:
        import socket

        v_g, v_w = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = _real_fork()  # (not the runtime's wrapper, which the template prepared: no run's child)
    if pid == 0:
        signal.set_wakeup_fd(-1)
        _signal.signal(_signal.SIGCHLD, _signal.SIG_DFL)  # (not the enum wrapper: template.py)
        os.close(wake_r)
        os.close(wake_w)
        if _tenant:
            os.close(_LIFE_FD)  # the guardian's: it tells the host when the guardian is gone
        if control:
            os.close(_CTL_FD)
            v_g.close()
            _guarded_worker(cfg, v_w.detach())
        return
    _out_of_reach(prctl)
    if cfg.get("kicks"):
        os.close(KICK_FD)  # the worker's
    if control:
        v_w.close()
        _guard_lines(pid, v_g, wake_r, cfg)
    poller = select.poll()
    poller.register(wake_r, select.POLLIN)
    poller.register(0, 0)  # only POLLHUP/POLLERR: the host closed its end
    poller.register(1, 0)
    status = None
    host_gone = False
    while status is None and not host_gone:
        while True:
            try:
                got, st = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                got = 0
            if not got:
                break
            if got == pid:
                status = st
        if status is not None:
            break
        for fd, _ in _poll(poller):
            if fd == wake_r:
                os.read(wake_r, 512)
            else:
                host_gone = True
    if not init:  # (pid 1's exit makes the kernel kill the whole namespace)
        kill_tree([], (), os.getpid())  # its children: the worker, and the orphans it adopted
    if status is not None and not host_gone:
        _report_exit(status)
    os._exit(0)


def _guarded(cfg, worker, v, snap, gen):
    """_become_guardian where the host's fork code made the sandbox (template.py's
    _SandboxFork): it forked the worker, which goes on (worker 0) with its end v of the
    socket to the guardian; the guardian stayed in C until something needed more than its
    loop there (internal/cpython's cpython.h), and goes on here as _Guardian, with the
    snapshot the worker reported to it; it never returns."""
    if not worker:
        _guarded_worker(cfg, v)
        return
    import socket

    wake_r, _ = _child_wakeup()  # (undumpable, SIGINT ignored and KICK_FD closed in C)
    g = _Guardian(worker, socket.socket(fileno=v), wake_r, cfg)
    g.first.snap, g.first.gen = snap, gen
    g.serve()


def _guarded_worker(cfg, v):
    """The worker's side of a guardian of local workers: v, its socket to the guardian."""
    global _snap_sock, _forkable
    _snap_sock = v
    # A snapshot or a copy starts its threads again under the worker's RLIMIT_AS; a
    # free-threaded build's allocator has reserved too much address space by then for any
    # new thread, so there such a worker neither snapshots nor forks.
    _forkable = not (cfg.get("memory") and not getattr(sys, "_is_gil_enabled", lambda: True)())


def _out_of_reach(prctl):
    """The guardian runs as the code's user: made undumpable once it has forked the worker
    (which stays dumpable: it is the code's own), the code can neither open its
    /proc/PID/mem nor ptrace it nor take its fds (pidfd_getfd), which the seccomp filter
    denies as well; and the signals Python handles (SIGINT) are ignored, since pid 1 of a
    pid namespace gets from inside it only the signals it handles. (The template is out of
    reach already: it is in no worker's pid namespace.)"""
    if prctl and prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE
        os.write(2, b"minipy worker: the guardian could not make itself undumpable\n")
        os._exit(70)
    _signal.signal(_signal.SIGINT, _signal.SIG_IGN)  # (_signal's: _child_wakeup)


_CMSG_FDS = 0  # the ancillary space of eight fds (_cmsg_fds)


def _cmsg_fds():
    """The ancillary space of eight fds, computed once: before its forks, the template's and
    a worker's snapshots have it (worker.py's snapshot)."""
    global _CMSG_FDS
    if not _CMSG_FDS:
        import array
        import socket

        _CMSG_FDS = socket.CMSG_SPACE(8 * array.array("i").itemsize)
    return _CMSG_FDS


def _recv_fds(sock, flags=0):
    """One message of sock and the fds it carries (SCM_RIGHTS, at most eight: a new
    tenant's five and its cgroup.procs in two v1 hierarchies). Nothing is made before the
    wait: a rollback snapshot waits here, and each page it writes is a page copied."""
    msg, anc, _, _ = sock.recvmsg(256, _CMSG_FDS or _cmsg_fds(), flags)
    import array
    import socket

    fds = array.array("i")
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
    return msg, list(fds)


def _report_exit(status):
    """The guardian's last frame: the worker's wait status (b"X" i32)."""
    try:
        os.write(1, _LEN.pack(5) + F_EXIT + struct.pack("<i", status))
    except OSError:
        pass


class _Line:
    """A worker the guardian serves: the first one, or a copy that Namespace.Fork made. ctl
    is the host's control socket for it (fd 3 for the first), v the socket over which it
    and its snapshot talk to the guardian, snap its snapshot's pid (0: none) and gen its
    number (the worker's count of requests that may have changed its state), dead that the
    worker ended and its snapshot waits for the host's b"T", handover the four fds of a b"T"
    the guardian holds until it may send them (_Guardian.hand_over)."""

    __slots__ = ("worker", "ctl", "v", "snap", "gen", "dead", "handover")

    def __init__(self, worker, ctl, v):
        self.worker, self.ctl, self.v, self.snap, self.gen, self.dead = worker, ctl, v, 0, 0, False
        self.handover = None


def _guard_lines(worker, v, wake_r, cfg):
    """The guardian of local workers, each with its own control socket from the host
    (docs/protocol.md, "Rollback" and "Fork"). A worker tells it each snapshot's pid and
    number (b"S" u32 u32 u8, the last: the snapshot it replaces had died) over its v; over its control socket the host sends b"K" (kill the worker,
    not its snapshot) and b"T" with four fds (the new stdin, stdout, stderr, control pipes,
    which the guardian hands to the snapshot: it becomes the worker). When a worker ends, the
    guardian kills what is left of its tree, but the snapshot and the other workers, and
    sends b"D" i32 wait status, u8 snapshot alive, u32 its number. A Fork's copy reports itself over its
    parent's v (b"F" u64 token, u32 pid, with its own v's other end); the host sends b"F"
    u64 token with five fds (the copy's four pipes and its control socket); the guardian pairs
    them by token and hands the copy its pipes. The host closing a worker's control socket
    ends that worker (and its snapshot); a worker that ends without a snapshot ends its
    line. When no worker is left, the guardian ends it all as the plain guardian does. The
    host's b"P" starts a command (start_command), b"G" signals one; the guardian reports
    each one's end (b"Q")."""
    _Guardian(worker, v, wake_r, cfg).serve()


class _Guardian:
    """_guard_lines' state: the lines, the sockets it polls, and the halves of Fork copies
    waiting to be paired."""

    def __init__(self, worker, v, wake_r, cfg):
        import select
        import socket

        self.me = os.getpid()
        self.cfg = cfg
        self.procs = {}  # a command's pid -> the line whose host started it
        self.lines = []
        self.by_fd = {}  # fd -> (socket, its line)
        self.from_host = {}  # fork token -> the copy's fds, from the host
        self.from_copy = {}  # fork token -> (pid, v), from the copy
        self.wake_r = wake_r
        self.oom = None  # the guardian's oom_score_adj, read once: its snapshots' too
        self.dying = set()  # pidfds of the processes killed as a worker ended, until each ends
        self.poller = select.poll()
        self.poller.register(wake_r, select.POLLIN)
        self.first = _Line(worker, socket.socket(fileno=_CTL_FD), v)
        self.add(self.first)

    def watch(self, sock, line):
        import select

        self.by_fd[sock.fileno()] = (sock, line)
        self.poller.register(sock.fileno(), select.POLLIN)

    def unwatch(self, sock):
        fd = sock.fileno()
        if self.by_fd.pop(fd, None) is not None:
            self.poller.unregister(fd)

    def add(self, line):
        self.lines.append(line)
        self.watch(line.ctl, line)
        self.watch(line.v, line)

    def known(self):
        """The pids of every line's worker and snapshot, and of the copies not paired yet."""
        pids = {p for line in self.lines for p in (line.worker, line.snap) if p}
        pids.update(p for p, _ in self.from_copy.values())
        pids.update(self.procs)  # commands outlive a worker's death: they are the sandbox's
        return pids

    def drop(self, line):
        self.lines.remove(line)
        mine = [p for p, l in self.procs.items() if l is line]
        for p in mine:
            del self.procs[p]
        if mine:
            kill_tree(mine, self.known(), self.me)
        # The worker may have ended already (the host closed its stdin too), its orphans
        # the guardian's children now: whatever is no line's worker or snapshot goes too.
        kill_tree([p for p in (line.worker, line.snap) if p], self.known(), self.me)
        for sock in (line.ctl, line.v):
            self.unwatch(sock)
            sock.close()
        for fd in line.handover or ():
            os.close(fd)
        line.handover = None
        if not self.lines:
            self.end(None)

    def end(self, status):
        kill_tree([], (), self.me)
        if status is not None:
            _report_exit(status)
        os._exit(0)

    def ended(self, line, status):
        import select

        if line is self.first:
            # The guardian's fd 2 is the first worker's stderr pipe: the host reads it to its
            # end (a crash's traceback) before a rollback, so it must end with the worker.
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 2)
            os.close(null)
        # What the worker said before it ended (a snapshot it made just before: the host
        # reads the answer that preceded it, and must get that snapshot, not the one before).
        self.drain(line)
        # Its orphans are the guardian's children now: whatever is no worker or snapshot.
        # Until each has ended, the snapshot is not handed the host's pipes (hand_over).
        dying = []
        kill_tree([], self.known() - {line.worker}, self.me, dying)
        for fd in dying:
            self.dying.add(fd)
            self.poller.register(fd, select.POLLIN)
        alive = 1 if line.snap else 0
        try:
            line.ctl.send(C_DIED + struct.pack("<i", status) + bytes((alive,)) + struct.pack("<I", line.gen))
        except OSError:
            alive = 0
        if not alive:
            if len(self.lines) == 1:
                self.end(status)
            self.drop(line)
        line.dead = True

    def drain(self, line):
        """Reads the messages waiting on line's v."""
        import select

        p = select.poll()
        p.register(line.v.fileno(), select.POLLIN)
        while line.v.fileno() in self.by_fd and p.poll(0):
            try:
                msg, fds = _recv_fds(line.v)
            except OSError:
                return
            self.from_worker(line, msg, fds)
            for f in fds:
                os.close(f)
            if not msg:
                return

    def pair(self, token):
        import array
        import socket

        if token not in self.from_host or token not in self.from_copy:
            return
        fds = self.from_host.pop(token)
        pid, cv = self.from_copy.pop(token)
        line = _Line(pid, socket.socket(fileno=fds[4]), cv)
        try:
            cv.sendmsg([C_TAKE_OVER], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds[:4]).tobytes())])
        except OSError:
            line.ctl.close()
            cv.close()
            kill_tree([pid], self.known() - {pid})
        else:
            self.add(line)
        for f in fds[:4]:
            os.close(f)

    def reap(self):
        """Reaps the children that ended: a copy that died before the host's half came, a
        snapshot, a line's worker (ended)."""
        while True:
            try:
                got, st = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                got = 0
            if not got:
                return
            for token, (pid, cv) in list(self.from_copy.items()):
                if pid == got:
                    del self.from_copy[token]
                    cv.close()
            line = self.procs.pop(got, None)
            if line is not None:
                try:
                    line.ctl.send(C_EXITED + struct.pack("<Ii", got, st))
                except OSError:
                    pass
                continue
            for line in list(self.lines):
                if got == line.snap:
                    line.snap = 0
                if got == line.worker and not line.dead:
                    self.ended(line, st)

    def from_worker(self, line, msg, fds):
        """A message on a line's v: its worker's snapshot pid, or a Fork copy's report."""
        import socket

        if not msg:  # no worker or snapshot holds the other end any more
            self.unwatch(line.v)
        elif msg[:1] == _V_SNAP and len(msg) == _SNAP_MSG.size and not line.dead:
            line.snap, line.gen = int.from_bytes(msg[1:5], "little"), int.from_bytes(msg[5:9], "little")
            if line.snap:
                self.give_snapshot_oom_score(line.snap)
            if msg[9]:  # the snapshot it replaces had died while it waited: the host counts it
                try:
                    line.ctl.send(C_SNAP_DIED)
                except OSError:
                    pass
        elif msg[:1] == _V_FORK and len(msg) == 13 and len(fds) == 1:
            token = msg[1:9]
            self.from_copy[token] = (int.from_bytes(msg[9:13], "little"), socket.socket(fileno=fds.pop()))
            self.pair(token)

    def give_snapshot_oom_score(self, pid):
        """Give a new snapshot (pid) the guardian's OOM score: the worker it was forked from
        has 1000, so that the OOM killer picks the worker, and the snapshot is there to take
        over (worker.py's _oom_first). Set from here, the snapshot runs no code for it: each
        page it writes after its fork is a page copied. Best effort, as there."""
        if self.oom is None:
            try:
                with open("/proc/self/oom_score_adj", "rb") as f:
                    self.oom = f.read().strip() or b"0"
            except OSError:
                self.oom = b""
        if self.oom:
            try:
                fd = os.open("/proc/%d/oom_score_adj" % pid, os.O_WRONLY)
                try:
                    os.write(fd, self.oom)
                finally:
                    os.close(fd)
            except OSError:
                pass  # gone already, or /proc refuses

    def from_host_ctl(self, line, msg, fds):
        """A message on a line's control socket (docs/protocol.md); its end drops the line."""
        import array
        import socket

        if not msg:
            self.drop(line)  # the host is done with this worker (or gone)
        elif msg[:1] == C_KILL and not line.dead:
            # The worker's reports first: a snapshot it made before the request the host
            # kills it for may be reported but unread (this socket polls first), and the
            # tree's kill spares only the snapshots known.
            self.drain(line)
            kill_tree([line.worker], self.known() - {line.worker})
        elif msg[:1] == C_TAKE_OVER and line.dead and line.snap and len(fds) == 4 and line.handover is None:
            line.handover = fds[:]
            del fds[:]
            self.hand_over()
        elif msg[:1] == C_START and len(msg) == 10 and len(fds) in (4, 5):
            self.start_command(line, msg[1:9], fds, bool(msg[9] & START_TERMINAL))
        elif msg[:1] == C_SIGNAL and len(msg) == 6:
            pid = int.from_bytes(msg[1:5], "little")
            if pid in self.procs:  # its own command's, never another process
                try:
                    os.killpg(pid, msg[5])
                except OSError:
                    try:
                        os.kill(pid, msg[5])
                    except OSError:
                        pass
        elif msg[:1] == C_ROOT and len(msg) == 9:
            self.send_root(line, msg[1:9])
        elif msg[:1] == C_CONNECT and len(msg) == 11:
            self.connect_port(line, msg[1:9], int.from_bytes(msg[9:11], "little"))
        elif msg[:1] == C_FORK and len(msg) == 9 and len(fds) == 5:
            self.from_host[msg[1:9]] = fds[:]
            del fds[:]
            self.pair(msg[1:9])

    def hand_over(self):
        """Sends each line's b"T" that waits (its snapshot becomes the worker), once every
        process killed as a worker ended has ended. Until a killed process runs again, it is
        still in the call it was killed in, and one that was waiting on the socket the snapshot
        waits on (the worker's old snapshot, which the worker kills without waiting when it
        makes a new one, or the code's own process) takes the message waiting there as it
        wakes, and dies with it: on a loaded machine, the rollback was lost."""
        import array
        import socket

        if self.dying:
            return
        for line in list(self.lines):
            fds, line.handover = line.handover, None
            if fds is None:
                continue
            try:
                if not line.snap:
                    raise OSError("the snapshot ended")
                line.v.sendmsg([C_TAKE_OVER], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())])
                line.worker, line.snap, line.dead = line.snap, 0, False
            except OSError:
                self.drop(line)
            finally:
                for fd in fds:
                    os.close(fd)

    def send_root(self, line, token):
        """Answers C_ROOT: an O_PATH fd of the sandbox's root, as its code sees it (none if it
        cannot be opened), for the host to reach the sandbox's /tmp and /dev/shm."""
        import array
        import socket

        try:
            fd = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            fd = -1
        try:
            rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]).tobytes())] if fd >= 0 else []
            line.ctl.sendmsg([C_ROOT + token], rights)
        except OSError:
            pass
        finally:
            if fd >= 0:
                os.close(fd)

    def connect_port(self, line, token, port):
        """Answers C_CONNECT: a TCP socket connected (or connecting: it never blocks) to
        127.0.0.1:port in the sandbox's network namespace, for the host to reach a server the
        code or a command started (Namespace.DialPort), or the errno why not."""
        import array
        import errno
        import socket

        s, err = None, 0
        try:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setblocking(False)
            try:
                s.connect(("127.0.0.1", port))
            except BlockingIOError:
                pass  # (loopback: it completes at once unless the server's backlog is full)
        except OSError as e:
            err = e.errno or errno.EIO
        try:
            rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [s.fileno()]).tobytes())] if not err else []
            line.ctl.sendmsg([C_CONNECT + token + struct.pack("<I", err)], rights)
        except OSError:
            pass
        finally:
            if s is not None:
                s.close()

    def start_command(self, line, token, fds, terminal):
        """Starts a command (C_START) for line's host: a child of the guardian, in a process
        group of its own, with fds (stdin, stdout, stderr) as 0, 1, 2 and nothing else open, the
        worker's limits and signals at their defaults, the sandbox's environment plus the
        spec's; it answers the pid, or 0 and why. A terminal's command (START_TERMINAL) makes
        its own session instead, with stdin (a pseudo terminal the host holds the other end
        of) as its controlling terminal."""
        pid, why = 0, b""
        try:
            spec = b""
            while True:
                chunk = os.read(fds[3], 65536)
                if not chunk:
                    break
                spec += chunk
            fields = [os.fsdecode(f) for f in spec.split(b"\0")]
            cwd, user, nargs = fields[0], fields[1], int(fields[2])
            args, env = fields[3:3 + nargs], dict(os.environ)
            if user == "root":
                if not self.cfg.get("root_user"):
                    raise ValueError("this sandbox has no root user")
                env.update(HOME=_ROOT_HOME, USER="root", LOGNAME="root", SHELL=_ROOT_SHELL)
            elif user:
                raise ValueError("unknown user %r" % user)
            env.update(kv.split("=", 1) for kv in fields[3 + nargs:] if "=" in kv)
            if not args:
                raise ValueError("no command")
            pid = _real_fork()
            if pid == 0:
                _exec_command(self.cfg, fds, cwd, args, env, terminal, user == "root")
            if not terminal:  # (a session leader's group is its own already; setsid fails in a group leader)
                try:  # (the child does it too: whichever runs first, the group is there before the answer)
                    os.setpgid(pid, pid)
                except OSError:
                    pass  # it has exec'd already, or ended
            self.procs[pid] = line
        except Exception as exc:
            why = ("%s: %s" % (type(exc).__name__, exc)).encode("utf-8", "replace")
        try:
            line.ctl.send(C_START + token + struct.pack("<I", pid) + why[:200])
        except OSError:
            pass

    def serve(self):
        import socket

        while True:
            self.reap()
            for fd, _ in _poll(self.poller):
                if fd == self.wake_r:
                    os.read(self.wake_r, 512)
                    continue
                if fd in self.dying:  # (a killed process ended)
                    self.dying.discard(fd)
                    self.poller.unregister(fd)
                    os.close(fd)
                    self.hand_over()
                    continue
                sock, line = self.by_fd.get(fd, (None, None))
                if line is None or line not in self.lines:
                    continue  # dropped while handling an earlier event of this round
                try:
                    # (without waiting: an earlier event of this round may have read it, a
                    # kill draining the worker's reports)
                    msg, fds = _recv_fds(sock, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    continue
                except OSError:
                    msg, fds = b"", []
                if sock is line.v:
                    self.from_worker(line, msg, fds)
                else:
                    self.from_host_ctl(line, msg, fds)
                for f in fds:
                    os.close(f)


def _exec_command(cfg, fds, cwd, args, env, terminal, root=False):
    """A command's child (C_START), as the sandbox's root if root (the sandbox has a root
    user: its processes hold the capabilities that make it, _root_user): never returns."""
    try:
        if len(fds) > 4:  # the sandbox's work group, out of the guardian's: the host's cgroup.go says why
            os.write(fds[4], b"0")
        if terminal:
            os.setsid()  # (its group too: signals for the command reach what it started, as setpgid's)
        else:
            os.setpgid(0, 0)
        for i in range(3):
            os.dup2(fds[i], i)
        if terminal:
            import fcntl
            import termios

            fcntl.ioctl(0, termios.TIOCSCTTY, 0)
        os.closerange(3, 1 << 20)
        for sig in (_signal.SIGINT, _signal.SIGPIPE, _signal.SIGXFSZ, _signal.SIGCHLD):
            _signal.signal(sig, _signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        if root:
            os.setgroups([])
            os.setresgid(0, 0, 0)
            os.setresuid(0, 0, 0)
        if cwd:
            os.chdir(cwd)
        _set_limits(cfg)
        cpu = int(cfg.get("cpu_seconds", 0) or 0)
        if cpu:
            import resource

            resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5))
        try:
            with open("/proc/self/oom_score_adj", "w") as f:
                f.write("1000")  # the OOM killer's first pick, as the worker is, not the guardian
        except OSError:
            pass
        os.execvpe(args[0], args, env)
    except BaseException as exc:
        try:
            os.write(2, ("minipy: the command %r did not start: %s\n" % (args[0], exc)).encode("utf-8", "replace"))
        finally:
            os._exit(127)
