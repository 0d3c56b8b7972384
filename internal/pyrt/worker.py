"""minipy's isolated-engine worker: one python3 process that serves runs for the Go side.

The Go side starts `python3 -c BOOTSTRAP`; the bootstrap reads this file as one frame from
stdin and runs it with `_read` (an unbuffered exact read of fd 0). It is compiled with the
runtime's file name, so its frames are left out of tracebacks and the hard-stop tracer
ignores them. The rules of a run are runtime.py's (sent after the config frame); this file only
adds the process around them:

* The protocol moves off fds 0/1 to private descriptors before anything else runs; fd 0
  becomes /dev/null, fds 1 and 2 become memory files that the worker reads back after each
  run, so os.write(1, ...), C printf and subprocess output are captured too and user output
  can never corrupt a frame.
* Frames both ways are u32 length (little-endian) then a kind byte then the payload; the
  kinds (F_* on the constants line) and their payloads are in docs/protocol.md. Host ->
  worker: request, kick. Worker -> host: ready, output events of a live run (_Pump), answer;
  the guardian's exit status last.
* A control thread reads every frame. Requests go to the main thread; a kick interrupts the
  main thread only when it names the run in progress (under a lock), so a late kick never
  reaches the next run. The host kills the whole process when a kick is not enough.
* The process the host started forks: it stays the guardian (pid 1 of the sandbox's pid
  namespace, else a subreaper), which reaps orphans, reports the worker's wait status as
  the last frame (b"X", i32) and kills the worker's tree when the worker ends or the host
  is gone; the child is the worker. Each run with a deadline arms the worker's deadman
  timer, which kills it at the host's hard-kill time plus slack (_Deadman).
"""

import _thread
import io
import os
import signal
import struct
import sys
import threading
import time
import types

_LEN = struct.Struct("<I")
_real_fork = os.fork  # before the runtime wraps it: a snapshot is not a child of a run
_snap_sock = None  # the worker's end of its socket to the guardian (config control=1)
_forkable = False  # the worker can fork snapshots and copies that start their threads again
_CTL_FD = 3  # the host's control socket, when the config says control=1
_kept = []  # a snapshot's objects over the worker's closed pipes (see _Worker.snapshot)
_shm_denied = False  # the seccomp filter refuses memfd_create (config deny_shm)
_RUN_ID = struct.Struct("<Q")
_STOP_MS = struct.Struct("<I")
_COUNT = struct.Struct("<H")
_FLAGS = struct.Struct("<I")  # of a run request, after op, globals, locals and output cap
_COUNT_ID = struct.Struct("<I")  # a run request's globals id, after the op
# @constants: pyrt.go puts the constants shared with Go on this line


def _move_fds():
    """Take the protocol off fds 0/1 and point fds 0, 1, 2 at what user code may use."""
    proto_in = os.dup(0)
    proto_out = os.dup(1)
    host_err = os.dup(2)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    out_mem = _mem_file("minipy-stdout")
    err_mem = _mem_file("minipy-stderr")
    os.dup2(out_mem, 1)
    os.dup2(err_mem, 2)
    for fd in (proto_in, proto_out, host_err, out_mem, err_mem):
        os.set_inheritable(fd, False)
    return proto_in, proto_out, host_err, out_mem, err_mem


def _mem_file(name):
    """A file in memory for fd 1 or 2: a memfd, or, where the seccomp filter refuses memfds
    (config deny_shm: a MemoryLimit without a cgroup to count them), an unnamed file of the
    sandbox's /dev/shm, which TmpSize bounds."""
    if _shm_denied:
        return os.open("/dev/shm", os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600)
    return os.memfd_create(name)


class _FdStream(io.TextIOWrapper):
    """sys.stdout/sys.stderr of a run: text written straight through to fd 1 or 2, whose
    memory file getvalue() reads back (capped like the in-process Capture)."""

    def write(self, s):
        pump = self._pump
        if pump.active and pump.last != self._fd:
            pump.switch(self._fd)  # what the other stream got first goes out first
        return super().write(s)

    def getvalue(self):
        try:
            self.flush()
        except (ValueError, OSError):
            pass
        if self._pump.active:
            self._pump.send()  # the last live output, before _drain empties the file
        return _drain(self._mem, self._limit, self._what)


def _drain(mem, limit, what):
    size = os.fstat(mem).st_size
    if not size:
        return ""
    if limit < 0 or size <= 4 * limit + 4096:
        text = os.pread(mem, size, 0).decode("utf-8", "replace")
        text = _rt.cap_text(text, limit, what)
    else:
        # Do not read a huge output whole: the head and the tail are all that is kept.
        keep_head = limit // 2
        keep_tail = limit - keep_head
        head = os.pread(mem, 4 * keep_head, 0).decode("utf-8", "replace")[:keep_head]
        tail = os.pread(mem, 4 * keep_tail, size - 4 * keep_tail).decode("utf-8", "replace")
        tail = tail[-keep_tail:] if keep_tail else ""
        omitted = size - len(head.encode()) - len(tail.encode())
        text = head + OMITTED % (omitted, what) + tail
    _reset(mem)
    return text


def _reset(mem):
    os.ftruncate(mem, 0)
    os.lseek(mem, 0, os.SEEK_SET)  # the offset is shared with fd 1/2 and every child's copy


class _Pump:
    """Live output (docs/protocol.md): while a run that asked for it goes on, sends what
    reached the memory files of fds 1 and 2 since the last time as F_OUTPUT frames, every
    _INTERVAL from its own thread and at once when a run's Python code switches from one
    stream to the other. Started before any run, so the kick never takes it for a thread of
    the code."""

    _INTERVAL = 0.010  # output.go's liveInterval

    def __init__(self, w):
        self.w = w
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.active = False
        self.last = 0
        self.run_id = b""
        self.sent = {}
        threading.Thread(target=self.loop, name="minipy-output", daemon=True).start()

    def start(self, run_id):
        with self.lock:
            self.run_id = run_id
            self.sent = {1: 0, 2: 0}
            self.last = 0
            self.active = True
        self.wake.set()

    def stop(self):
        with self.lock:
            self.active = False
            self.wake.clear()

    def switch(self, fd):
        self.send()
        self.last = fd

    def send(self):
        with self.lock:
            if not self.active:
                return
            for fd, mem in ((1, self.w.out_mem), (2, self.w.err_mem)):
                size = os.fstat(mem).st_size
                while self.sent[fd] < size:
                    data = os.pread(mem, min(size - self.sent[fd], OUTPUT_CHUNK), self.sent[fd])
                    if not data:
                        break
                    self.sent[fd] += len(data)
                    self.w.write_frame(F_OUTPUT, self.run_id, bytes((fd,)), data)

    def loop(self):
        tick = threading.Event()  # never set: a sleep that is not the runtime's time.sleep
        while True:
            self.wake.wait()
            tick.wait(self._INTERVAL)
            try:
                self.send()
            except OSError:
                pass  # the host is gone; the control thread ends the worker


class _Worker:
    def __init__(self, proto_in, proto_out, host_err, out_mem, err_mem):
        self.rin = os.fdopen(proto_in, "rb", buffering=1 << 16)
        self.in_fd = proto_in  # rin's: a snapshot must not call rin (the control thread may hold it)
        self.out_fd = proto_out
        self.host_err = host_err
        self.out_mem = out_mem
        self.err_mem = err_mem
        self.streams = {}
        self.write_lock = threading.Lock()  # frames come from the main and pump threads
        self.pump = None
        self.lock = threading.Lock()
        self.request_ready = threading.Lock()
        self.request_ready.acquire()
        self.request = None
        self.run_id = b""
        self.current = 0
        self.running = False
        self.busy = False  # a request is in progress (from its frame to its answer)
        self.heard = time.monotonic()  # when the host last spoke (a frame), or a request ended
        self.kicked = False
        self.host_calls = False  # the run in progress may call host functions
        self.calls = {}  # call id -> [event, status, reply] of host calls waiting for the host
        self.call_seq = 0
        self.main_ident = threading.get_ident()
        self.deadman = None
        self.snap_sock = _snap_sock  # the worker's socket to the guardian (snapshots, forks), or None
        self.snapshots = False  # fork a rollback snapshot after each request that may change state
        self.snap_pid = 0
        self.unreaped = []  # replaced snapshots, killed, not yet reaped
        self.changed = True  # the last request may have changed the state: snapshot again
        # Working directories (IsolatedConfig's per-namespace ones): the worker's own, and the
        # tree that holds those of the namespaces sharing the worker (packed ones, a Fork copy).
        self.workdir = None
        self.tree = None
        self.packed = False
        self.roots = {}  # namespace id -> its working directory, where root_of's rule does not give it
        self.cwds = {}  # packed: namespace id -> the directory it was in when another one ran
        self.space = DEFAULT_NAMESPACE  # the namespace whose directory is the process's
        self.moving = None  # a Fork copy's (source root, own root, current directory) until it has moved

    # -- frames ---------------------------------------------------------------------------

    def read_frame(self):
        head = self.rin.read(4)
        if len(head) < 4:
            return None
        n = _LEN.unpack(head)[0]
        body = self.rin.read(n)
        if len(body) < n:
            return None
        return body

    def write_frame(self, kind, *parts):
        body = b"".join(parts)
        data = memoryview(_LEN.pack(len(body) + 1) + kind + body)
        with self.write_lock:
            while data:
                data = data[os.write(self.out_fd, data):]

    # -- output ---------------------------------------------------------------------------

    def captures(self, max_output, live):
        # Point fds 1 and 2 at the memory files again: the code of an earlier run may have
        # closed or redirected them.
        os.dup2(self.out_mem, 1)
        os.dup2(self.err_mem, 2)
        if os.fstat(self.out_mem).st_size:
            _reset(self.out_mem)  # written between runs (a lingering thread or child)
        if os.fstat(self.err_mem).st_size:
            _reset(self.err_mem)
        if live:
            self.pump.start(self.run_id)
        return self.stream(1, self.out_mem, "stdout", max_output), self.stream(2, self.err_mem, "stderr", max_output)

    def stream(self, fd, mem, what, limit):
        s = self.streams.get(fd)
        if s is None or s.closed:
            s = _FdStream(io.FileIO(fd, "w", closefd=False), encoding="utf-8", errors="surrogateescape",
                          write_through=True)
            s._mem, s._what, s._fd, s._pump = mem, what, fd, self.pump
            self.streams[fd] = s
        s._limit = limit
        return s

    # -- host calls -----------------------------------------------------------------------

    def call_host(self, payload, inline=False):
        """runtime.call_host: send a call event (F_CALL) and wait for the host's F_REPLY,
        which the control thread hands over; a kick of the run ends the wait (on the main
        thread the kick's signal interrupts it and its handler raises)."""
        with self.lock:
            if not self.running or not self.host_calls:
                return CALL_REFUSED, b"host functions can be called only while a run of their namespace is in progress"
            if self.kicked:
                return CALL_STOPPED, b""
            self.call_seq += 1
            cid = self.call_seq
            done = _thread.allocate_lock()
            done.acquire()
            slot = self.calls[cid] = [done, CALL_STOPPED, b""]
            # Written under the lock: serve() marks the run ended under it too, so the host
            # reads every call event of a run before the run's answer.
            self.write_frame(F_CALL, self.run_id, _RUN_ID.pack(cid), payload)
        try:
            done.acquire()  # released by the control thread (a plain lock: no frames of threading's)
        finally:
            with self.lock:
                self.calls.pop(cid, None)
        return slot[1], slot[2]

    def stop_calls(self):
        """End every wait for the host (the run was kicked). Under self.lock."""
        for cid in list(self.calls):
            self.finish_call(cid, CALL_STOPPED, b"")

    def finish_call(self, cid, status, data):
        """Hand a call its reply, once. Under self.lock."""
        slot = self.calls.pop(cid, None)
        if slot is not None:
            slot[1], slot[2] = status, data
            slot[0].release()

    # -- threads --------------------------------------------------------------------------

    def control(self):
        """Read every frame: hand requests to the main thread, apply kicks."""
        while True:
            body = self.read_frame()
            if body is None:
                os._exit(0)  # the host is gone: nothing may outlive it
            self.heard = time.monotonic()
            kind = body[:1]
            if kind == F_BEAT:
                pass
            elif kind == F_KICK:
                run_id = _RUN_ID.unpack_from(body, 1)[0]
                stage = body[9]
                with self.lock:
                    if run_id == self.current and self.running:
                        self.kicked = True
                        if stage > _rt._state.stage:
                            _rt._state.stage = stage
                        signal.pthread_kill(self.main_ident, self.kick_signal)
                        self.stop_calls()  # after the signal: the main thread's handler raises
            elif kind == F_REPLY:
                cid = _RUN_ID.unpack_from(body, 1)[0]
                with self.lock:
                    self.finish_call(cid, body[9], body[10:])
            elif kind == F_REQUEST:
                self.busy = True
                self.request = body
                self.request_ready.release()
            else:
                os.write(self.host_err, b"minipy worker: unknown frame kind %r\n" % kind)
                os._exit(70)

    def serve(self, dispatch):
        state = _rt._state
        warm = True
        while True:
            if self.snapshots and self.changed:
                while self.snapshot():  # a snapshot that took over snapshots itself again
                    pass
            if warm:
                # Once, after the first snapshot (which shares the pages again), and only
                # when no request waits: a spare's first run then finds its pages its own.
                warm = False
                if self.request is None:
                    _rt.warm_up()
            self.request_ready.acquire()
            body, self.request = self.request, None
            run_id = _RUN_ID.unpack_from(body, 1)[0]
            stop_ms = _STOP_MS.unpack_from(body, 9)[0]
            count = _COUNT.unpack_from(body, 13)[0]
            pos = 15
            for ident in struct.unpack_from("<%dI" % count, body, pos):
                if ident not in _rt._spaces:
                    _rt.new_namespace(ident)
                    if self.packed and ident != DEFAULT_NAMESPACE:
                        try:
                            os.makedirs(self.root_of(ident), exist_ok=True)
                        except OSError:
                            pass  # the host made it (local workers); enter() falls back
            pos += 4 * count
            if self.cpu_limit:
                self.arm_cpu_limit()
            request = body[pos:]
            if self.packed and request[:1] == bytes((OP_RUN,)):
                self.enter(_COUNT_ID.unpack_from(request, 1)[0])
            # Reading requests change nothing: the snapshot stays good.
            self.changed = bool(count) or request[:1] not in (
                bytes((OP_GET,)), bytes((OP_NAMES,)), bytes((OP_INFO,)), bytes((OP_FORK,)),
                bytes((OP_SAVE,)))
            if request[:1] == bytes((OP_FORK,)):
                resp = self.fork(request)
                if resp is None:
                    continue  # in the copy, which has taken over: its requests come on its own pipes
                self.write_frame(F_ANSWER, body[1:9], b"\x00", resp)
                self.busy = False
                continue
            host_calls = request[0] == OP_RUN and bool(_FLAGS.unpack_from(request, 13)[0] & RUN_HOST_CALLS)
            with self.lock:
                # stage 0 first: a kick signal of an earlier run that is delivered late then
                # finds nothing to raise (runtime._on_kick ignores stage 0).
                state.stage = 0
                self.current = run_id
                self.running = True
                self.kicked = False
                self.host_calls = host_calls
            if stop_ms and self.deadman is not None:
                self.deadman.arm(stop_ms)
            self.run_id = body[1:9]  # for captures() and call_host(): the run id of events
            resp = dispatch(request)
            self.pump.stop()
            if stop_ms and self.deadman is not None:
                self.deadman.disarm()
            with self.lock:
                self.running = False
                self.host_calls = False
                kicked = self.kicked
                state.stage = 0
            if self.packed and request[:1] == bytes((OP_FREE,)):
                for ident in [i for i in self.cwds if i not in _rt._spaces]:
                    del self.cwds[ident]
            self.write_frame(F_ANSWER, body[1:9], b"\x01" if kicked else b"\x00", resp)
            self.heard = time.monotonic()  # (beats that queued while the GIL was held are read after)
            self.busy = False

    def hear_host(self, silence):
        """A Command worker's watch on its host (config silence_ms): a transport that never
        tells the worker its host is gone (a relay, a half-open connection) keeps its stdin
        open, so an idle worker that has heard no frame (the host beats, F_BEAT) for silence
        seconds ends. A request in progress has its deadline (the deadman) instead."""
        while True:
            time.sleep(silence / 4)
            if not self.busy and time.monotonic() - self.heard > silence:
                try:
                    os.write(self.host_err, b"minipy worker: the host has been silent for %.0f s: ending\n" % silence)
                finally:
                    os._exit(0)

    # -- working directories --------------------------------------------------------------

    def root_of(self, ident):
        """The working directory of namespace ident: the worker's own, or, for a namespace
        that shares the worker with others (packed), its own in the tree."""
        root = self.roots.get(ident)
        if root is None:
            root = self.workdir
            if self.packed and ident != DEFAULT_NAMESPACE and self.tree:
                root = os.path.join(self.tree, str(ident))
        return root

    def enter(self, ident):
        """Before a run of namespace ident in a packed worker: make the directory it was in
        (%cd moves it) the process's, and its root HOME and sys.path's first entry."""
        if ident == self.space:
            return
        try:
            self.cwds[self.space] = os.getcwd()
        except OSError:
            pass  # removed under it: that namespace starts from its root next time
        old, root = self.root_of(self.space), self.root_of(ident)
        for d in (self.cwds.get(ident), root, "/"):  # "/": never another namespace's directory
            try:
                if d:
                    os.chdir(d)
                    break
            except OSError:
                if d == root:
                    try:
                        os.makedirs(root, exist_ok=True)
                        os.chdir(root)
                        break
                    except OSError:
                        pass
        self.follow(old, root)
        self.space = ident

    def follow(self, old, root):
        """HOME and sys.path's first entry move from the working directory old to root."""
        if os.environ.get("HOME") == old:
            os.environ["HOME"] = root
        if sys.path and sys.path[0] == old:
            sys.path[0] = root

    def move_into_own(self):
        """In a Fork copy, before it answers: copy the files of the source namespace's
        working directory into the copy's own (which the host made, empty, in the tree) and
        move there, to the same relative place as the source's current directory."""
        src, root, cwd = self.moving
        self.moving = None
        _copy_files(src, root)
        rel = os.path.relpath(cwd, src)
        target = root if rel == ".." or rel.startswith("../") else os.path.normpath(os.path.join(root, rel))
        try:
            os.chdir(target)
        except OSError:
            os.chdir(root)
        self.follow(src, root)

    # -- rollback -------------------------------------------------------------------------

    def snapshot(self):
        """Fork a copy of this worker as it is between requests (the snapshot), replacing the
        previous one, and tell the guardian its pid. Returns False in the worker; in the
        snapshot it waits, and returns True once it has taken over from a worker that died
        (the host sent it fresh pipes through the guardian)."""
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # 3.12+: fork() of a multi-threaded process
            try:
                pid = _real_fork()
            except OSError:
                # EAGAIN under the Processes limit: no snapshot this time. The previous one
                # holds an older state, which is not "before this run": it goes (pid 0).
                pid = -1
        if pid:
            pid = max(pid, 0)
            # The guardian learns of the new one before the old one goes, so that a crash
            # in between still finds a snapshot; the old one is reaped later, without waiting.
            try:
                os.write(self.snap_sock, b"S" + pid.to_bytes(4, "little"))
            except OSError:
                pass
            old, self.snap_pid = self.snap_pid, pid
            if old:
                try:
                    os.kill(old, signal.SIGKILL)
                except OSError:
                    pass
                self.unreaped.append(old)
            for p in list(self.unreaped):
                try:
                    if os.waitpid(p, os.WNOHANG)[0]:
                        self.unreaped.remove(p)
                except ChildProcessError:
                    self.unreaped.remove(p)
            return False
        _oom_first(False)
        self.leave_pipes()
        self.resume()
        return True

    def leave_pipes(self):
        """In a snapshot or a copy: close this process's copies of the worker's pipes, which
        are the worker's own (held here too, they would not end when it does). The objects
        over them are kept, never used again: collected, they would close their fd numbers,
        which the new pipes may have by then."""
        _kept.extend((self.rin, getattr(self, "fault_file", None)))
        for fd in (self.in_fd, self.out_fd, self.host_err):
            try:
                os.close(fd)
            except OSError:
                pass

    def resume(self):
        """In a snapshot or a copy: wait for the host's pipes and become the worker on them."""
        fds = self.wait_for_pipes()
        try:
            if self.moving:
                self.move_into_own()
            self.take_over(fds)
        except BaseException:
            import traceback

            os.write(fds[2], ("minipy worker: the snapshot or copy failed to take over:\n" +
                              traceback.format_exc()).encode())
            os._exit(70)

    def fork(self, request):
        """OpFork (Namespace.Fork): fork a copy of this worker whose namespace copy_id is a
        copy of namespace src. The copy is forked by a child that exits at once, so that it
        is the guardian's child, not this worker's: it reports itself to the guardian with
        its own socket, waits for the host's pipes, and returns None as the worker on them.
        The worker returns the reply to the host."""
        import socket

        token, src, dst = struct.unpack_from("<QII", request, 1)
        if self.snap_sock is None or not _forkable:
            return b"\x01" + _rt.encode(["fork", "this worker cannot fork (no control socket to its guardian, "
                                                  "or a free-threaded Python under a MemoryLimit)"])
        if src not in _rt._spaces:
            return b"\x01" + _rt.encode(["namespace", "namespace %d is closed or unknown" % src])
        import warnings

        try:
            mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        except OSError as exc:
            return b"\x01" + _rt.encode(["fork", "the worker cannot fork: %s" % exc])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # 3.12+: fork() of a multi-threaded process
            try:
                mid = _real_fork()
            except OSError as exc:  # EAGAIN: the Processes limit, which a namespace and its copies share
                mine.close()
                theirs.close()
                return b"\x01" + _rt.encode(["fork", "the worker cannot fork: %s" % exc])
            if mid == 0:
                try:
                    pid = _real_fork()
                except BaseException:
                    pid = -1
                if pid:
                    os._exit(0 if pid > 0 else 1)  # the middle child
                try:
                    self.become_copy(mine, theirs, token, src, dst)
                except BaseException:
                    os._exit(70)  # the host's wait for its ready frame fails
                return None
        mine.close()
        theirs.close()
        if os.waitpid(mid, 0)[1]:
            return b"\x01" + _rt.encode(["fork", "the worker cannot fork (the Processes limit, which a namespace "
                                                  "and its copies share?)"])
        return b"\x00N"

    def become_copy(self, mine, theirs, token, src, dst):
        import array
        import socket

        # To the guardian, over the parent's socket: who the copy is, and its own socket.
        parent = socket.socket(fileno=os.dup(self.snap_sock))
        parent.sendmsg([b"F" + struct.pack("<QI", token, os.getpid())],
                       [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [theirs.fileno()]).tobytes())])
        parent.close()
        theirs.close()
        os.close(self.snap_sock)
        self.snap_sock = mine.detach()
        # Memory files of its own for fds 1 and 2 (the parent's are shared by the fork).
        for fd, name in ((self.out_mem, "minipy-stdout"), (self.err_mem, "minipy-stderr")):
            new = _mem_file(name)
            os.dup2(new, fd, inheritable=False)
            os.close(new)
        os.dup2(self.out_mem, 1)
        os.dup2(self.err_mem, 2)
        # Only the namespace copied is the copy's; the processes of the parent's runs are not
        # its children.
        space = _rt._spaces.pop(src)
        for ident in [i for i in _rt._spaces if i != DEFAULT_NAMESPACE]:
            del _rt._spaces[ident]
        _rt._spaces[dst] = space
        _rt._space_procs.clear()
        # Its working directory is its own, in the tree (the file copy waits for the host's
        # pipes, so that a failure reaches the host at once, on the copy's stderr).
        src_root = self.root_of(src)
        try:
            cwd = os.getcwd()
        except OSError:
            cwd = src_root
        root = os.path.join(self.tree, str(dst))
        self.roots = {dst: root}
        self.cwds = {}
        self.space = dst
        self.moving = (src_root, root, cwd)
        self.leave_pipes()
        self.resume()

    def wait_for_pipes(self):
        """In the snapshot: wait for the guardian to hand over the host's new pipes."""
        import socket

        sock = socket.socket(fileno=os.dup(self.snap_sock))
        while True:
            try:
                msg, fds = _recv_fds(sock)
            except InterruptedError:
                continue
            if not msg:
                os._exit(0)  # the guardian is gone
            if msg[:1] == C_TAKE_OVER and len(fds) == 3:
                sock.close()
                return fds
            for fd in fds:
                os.close(fd)

    def take_over(self, fds):
        """In the snapshot: become the worker, on the new pipes. Only this thread survived the
        fork: the control and output threads start again, and every lock is new (another
        thread may have held one when the fork happened)."""
        import faulthandler

        self.in_fd, self.out_fd, self.host_err = fds
        _oom_first(True)
        for fd in fds:
            os.set_inheritable(fd, False)
        self.rin = os.fdopen(self.in_fd, "rb", buffering=1 << 16)
        self.write_lock = threading.Lock()
        self.lock = threading.Lock()
        self.request_ready = threading.Lock()
        self.request_ready.acquire()
        self.request = None
        self.current = 0
        self.running = self.kicked = self.host_calls = False
        self.calls = {}
        self.snap_pid, self.unreaped, self.changed = 0, [], True  # the worker's, not this one's
        self.deadman = None  # POSIX timers are not inherited by a fork
        self.main_ident = threading.get_ident()
        _rt._main_ident = self.main_ident
        self.fault_file = os.fdopen(self.host_err, "w", closefd=False)
        faulthandler.enable(file=self.fault_file)
        # RLIMIT_AS is set by now (the worker started its threads before setting it): small
        # stacks, which these loops need, still fit under it.
        size = threading.stack_size(1 << 18)
        try:
            threading.Thread(target=self.control, name="minipy-control", daemon=True).start()
            self.pump = _Pump(self)
        finally:
            threading.stack_size(size)
        for s in self.streams.values():
            s._pump = self.pump
        self.write_frame(F_READY, _rt.encode(["%d.%d.%d" % sys.version_info[:3], sys.executable, os.getpid()]))

    # -- limits ---------------------------------------------------------------------------

    def arm_cpu_limit(self):
        # RLIMIT_CPU counts the process's whole life; each run gets cpu_limit more seconds.
        import resource

        ru = resource.getrusage(resource.RUSAGE_SELF)
        used = ru.ru_utime + ru.ru_stime
        soft = int(used + self.cpu_limit + 0.999)
        resource.setrlimit(resource.RLIMIT_CPU, (soft, resource.RLIM_INFINITY))


_oom_base = None  # the guardian's oom_score_adj, which a snapshot takes back


def _oom_first(first):
    """The process that runs the code is the first the OOM killer picks (oom_score_adj
    1000): when its sandbox's cgroup (or the machine) runs out of memory, it is the worker
    that goes, not its guardian or its rollback snapshot, which then takes over. A snapshot
    goes back to the guardian's score (first=False); no process needs a privilege to raise
    its score, or to lower it back to where it started. Best effort: /proc may refuse it."""
    global _oom_base
    try:
        fd = os.open("/proc/self/oom_score_adj", os.O_RDWR)
        try:
            if _oom_base is None:
                _oom_base = os.pread(fd, 16, 0).strip() or b"0"
            os.pwrite(fd, b"1000" if first else _oom_base, 0)
        finally:
            os.close(fd)
    except OSError:
        pass


def _set_limits(cfg):
    import resource

    def cap(which, value):
        if value and value > 0:
            resource.setrlimit(which, (value, value))

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    cap(resource.RLIMIT_AS, cfg.get("memory", 0))
    cap(resource.RLIMIT_FSIZE, cfg.get("file_size", 0))
    cap(resource.RLIMIT_NOFILE, cfg.get("open_files", 0))
    cap(resource.RLIMIT_NPROC, cfg.get("processes", 0))


# Mount flags (linux/mount.h) and the statvfs flags that a bind mount made in a user
# namespace must keep when it is remounted (the kernel locks them: EPERM otherwise).
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE, _MS_SHARED = 32, 4096, 16384, 1 << 18, 1 << 20
_LOCKED = ((2, _MS_NOSUID), (4, _MS_NODEV), (8, _MS_NOEXEC), (1024, 1024), (2048, 2048), (4096, 1 << 21))
_CAP_SYS_ADMIN = 21  # linux/capability.h
_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "loongarch64": 41, "ppc64le": 203, "s390x": 217}
_MOVE_MOUNT = 429  # the generic table's number: the same on every architecture _PIVOT_ROOT names

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
        self.libc = ctypes.CDLL(None, use_errno=True)
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

    def pivot(self):
        number = _PIVOT_ROOT.get(os.uname().machine)
        if number is None:
            raise OSError(38, "pivot_root: no syscall number known for " + os.uname().machine)
        os.chdir(self.root)
        # pivot_root(".", "."): the old root ends up stacked under the new one, where a lazy
        # unmount takes it away whole.
        self.check("pivot_root", self.libc.syscall(number, b".", b"."))
        self.check("umount the host's root", self.libc.umount2(b".", 2))  # MNT_DETACH
        os.chdir("/")
        self.mount(None, "/", None, _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV)

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
    m.become_user(cfg["sandbox_id"])
    socket.sethostname(_HOSTNAME)  # its own UTS namespace: the host's name is not the code's business
    m.mount(None, "/", None, _MS_REC | _MS_PRIVATE)
    m.tmpfs("", 0o755, 8 << 20)
    _root_files(m, cfg, etc)
    _bind_sources(m, cfg, python, template, workdir)
    m.release()
    _devices(m, cfg["tmp_size"])
    m.place("/proc", True)
    m.mount("proc", m.root + "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    m.pivot()
    m.dumpable()
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
        f.write(_PASSWD % (sid, sid, cfg["workdir"]))
    with open(m.root + "/etc/group", "w") as f:
        f.write(_GROUP % sid)
    with open(m.root + "/etc/hostname", "w") as f:
        f.write(_HOSTNAME + "\n")
    if cfg.get("network"):
        m.bind("/etc/hosts", "/etc/hosts", optional=True)  # the names the host resolves
    else:
        with open(m.root + "/etc/hosts", "w") as f:
            f.write("127.0.0.1\tlocalhost\n127.0.1.1\t%s\n::1\tlocalhost ip6-localhost ip6-loopback\n" % _HOSTNAME)
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
_LIFE_FD = 4  # a tenant guardian's end of its life pipe: the host sees it close when it exits
_tenant = False  # this process is a tenant guardian forked from the template
_filter = None  # the template's seccomp filter
_template_binds = []  # the targets of the template's binds (_enter_sandbox), for its tenants


def _serve_template(cfg, runtime):
    """IsolatedConfig's template (docs/protocol.md, "Template"): a sandboxed process that has
    loaded the runtime and the Preload modules, and forks a worker sandbox for each b"N"
    (followed by the names of the new one's tree and, in it, its working directory,
    separated by a NUL; with five fds: stdin, stdout, stderr, control socket and life pipe
    of the new one, then, when the engine has a cgroup, the cgroup.procs of the new one's
    group in each hierarchy) that the host sends over the control socket (fd 3). It returns only in such a fork, as the
    new sandbox's pid 1 (_become_tenant), which goes on as a guardian. The host closing the
    socket ends the template, and with it (pid 1 of the pid namespace they are all in)
    every worker forked from it."""
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
    global _filter
    _filter = _Mounter("").filter(cfg.get("seccomp"))  # made once here, installed by each fork
    compiled = _load_runtime(cfg, runtime)
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
            if msg[:1] == C_NEW and len(fds) >= 5:
                try:
                    pid = os.fork()
                except OSError:
                    pass
                if pid == 0:
                    gc.enable()
                    ctl.detach()  # fd 3 is the tenant's control socket from here on
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    os.close(wake_r)
                    os.close(wake_w)
                    _become_tenant(cfg, fds, msg[1:])
                    return
            for f in fds:  # the fork's now, or (refused) closed here: the host's reads end
                os.close(f)


def _open_workdir(cfg, tree_name, name):
    """An O_PATH fd of the working directory name in the tree tree_name (names under the
    engine's trees, cfg["tree"] here), opened a component at a time without following a
    symlink: as a non-root host's user, the code of a tree's workers owns the tree and may
    have put one there."""
    if not tree_name or not name or "/" in tree_name + name or ".." in (tree_name, name) or "." in (tree_name, name):
        raise OSError(22, "bad working directory names %r, %r" % (tree_name, name))
    flags = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW
    trees = os.open(cfg["tree"], flags)
    try:
        tree = os.open(tree_name, flags, dir_fd=trees)
    finally:
        os.close(trees)
    try:
        return os.open(name, flags, dir_fd=tree)
    finally:
        os.close(tree)


def _mount_workdir(cfg, ctl, body):
    """C_MOUNT (IsolatedConfig.WorkSize): mounts a tmpfs of the given size over the working
    directory TREE/NAME (body: b"TREE\0NAME\0SIZE"), owned by the sandbox's user, mode 0700,
    with an inode per 4 KiB (empty files cost kernel memory that size does not count); then
    sends the host an O_PATH fd of its root, through which the host reaches the files (the
    mount exists in this mount namespace and, as slave copies, in the workers' only). A
    refusal is answered C_REFUSED and the reason. The host removing the directory (the
    namespace closed) detaches the mount everywhere."""
    import array
    import socket

    try:
        tree_name, name, size = os.fsdecode(body).split("\0")
        size = int(size)
        if size <= 0:
            raise OSError(22, "bad size %d" % size)
        d = _open_workdir(cfg, tree_name, name)
        try:
            st = os.fstat(d)
            _Mounter("").mount("tmpfs", "/proc/self/fd/%d" % d, "tmpfs", _MS_NOSUID | _MS_NODEV,
                               "mode=0700,uid=%d,gid=%d,size=%d,nr_inodes=%d" % (
                                   os.getuid(), os.getgid(), size, max(size >> 12, 1024)))
        finally:
            os.close(d)
        root = _open_workdir(cfg, tree_name, name)  # a lookup by name enters the mount
        try:
            if os.fstat(root).st_dev == st.st_dev:
                raise OSError(16, "the working directory %s/%s moved while it was mounted" % (tree_name, name))
            ctl.sendmsg([C_MOUNT], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [root]).tobytes())])
        finally:
            os.close(root)
    except Exception as exc:
        try:
            ctl.send(C_REFUSED + ("%s: %s" % (_rt.type_name(type(exc)), exc)).encode("utf-8", "replace"))
        except OSError:
            pass


def _tenant_mounts(cfg, dirs):
    """A tenant's pid 1, in its fresh namespaces: a /proc of its pid namespace, its own tree
    (dirs: b"TREE\0HOME", names under the engine's trees) over every tree and its working
    directory over the workdir, a fresh /tmp and /dev/shm, and the binds these cover bound
    again on top. Returns the _Mounter, still privileged."""
    m = _Mounter("")
    m.mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    # The tree and the working directory, each opened a component at a time without
    # following a symlink (the code of an earlier worker of the tree may have made one).
    tree_name, _, home_name = os.fsdecode(dirs).partition("\0")
    home = _open_workdir(cfg, tree_name, home_name)  # (which checks the names)
    flags = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW
    trees = os.open(cfg["tree"], flags)
    tree = os.open(tree_name, flags, dir_fd=trees)
    os.close(trees)
    # The working directory, the fresh /tmp and /dev/shm cover the binds at and under
    # them (Mounts, a python under /tmp): held open, they are bound again on top (each
    # keeps the flags it has, which are locked here).
    workdir = cfg["workdir"]
    under = [t for t in _template_binds if t == workdir or t.startswith((workdir + "/", "/tmp/", "/dev/shm/"))]
    held = [(t, os.open(t, os.O_PATH)) for t in sorted(under, key=len)]
    # Recursive: the tmpfs of each working directory in the tree (IsolatedConfig.WorkSize)
    # comes with it; the bind is a slave of the template's, so later ones come too.
    m.mount("/proc/self/fd/%d" % tree, cfg["tree"], None, _MS_BIND | _MS_REC)
    m.mount("/proc/self/fd/%d" % home, workdir, None, _MS_BIND)
    os.close(tree)
    os.close(home)
    for d in ("/tmp", "/dev/shm"):
        m.mount("tmpfs", d, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=1777,size=%d" % cfg["tmp_size"])
    import stat

    for target, fd in held:
        dest = m.place(target, stat.S_ISDIR(os.fstat(fd).st_mode))
        m.mount("/proc/self/fd/%d" % fd, dest, None, _MS_BIND | _MS_REC)
        os.close(fd)
    return m


def _become_tenant(cfg, fds, dirs):
    """In a fork of the template: make the worker's own sandbox, as a process started by the
    host gets it (sandboxAttr): a user namespace of its own (its Processes count is its own)
    mapping only the sandbox's user, then mount, pid, IPC, UTS and (without Network) network
    namespaces; fork its pid 1, which mounts a /proc of its pid namespace, binds its own tree
    (dirs: b"TREE\0HOME", names under the engine's trees) over them all and its working
    directory over the workdir, mounts a fresh /tmp and /dev/shm, names the host, drops every
    capability, applies the seccomp filter, takes the fds as 0-4 and returns (to become the
    guardian). Before anything else it joins its cgroup (fds after the fifth: the
    cgroup.procs files the host opened, which take "0" from the writer on the opener's
    authority), so that everything of the sandbox is counted there. A failure exits: the
    host's read of the new worker's pipes ends."""
    import ctypes

    err_fd = [fds[2]]
    try:
        for f in fds[5:]:
            os.write(f, b"0")
            os.close(f)
        del fds[5:]
        libc = ctypes.CDLL(None, use_errno=True)

        def check(what, ret):
            if ret != 0:
                err = ctypes.get_errno()
                raise OSError(err, "%s: %s" % (what, os.strerror(err)))

        uid, gid = os.getuid(), os.getgid()
        check("unshare a user namespace", libc.unshare(_CLONE_NEWUSER))
        for name, text in (("setgroups", "deny"), ("uid_map", "%d %d 1" % (uid, uid)),
                           ("gid_map", "%d %d 1" % (gid, gid))):
            with open("/proc/self/" + name, "w") as f:
                f.write(text)
        flags = _CLONE_NEWNS | _CLONE_NEWPID | _CLONE_NEWIPC | _CLONE_NEWUTS
        if not cfg.get("network"):
            flags |= _CLONE_NEWNET
        check("unshare", libc.unshare(flags))
        if os.fork():
            os._exit(0)  # the template reaps this one and adopts its child
        global _tenant
        _tenant = True
        import socket

        socket.sethostname(_HOSTNAME)
        m = _tenant_mounts(cfg, dirs)
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
            os.write(err_fd[0], ("minipy worker: making the sandbox of a worker forked from the template failed: %s\n"
                              % exc).encode())
        finally:
            os._exit(70)


def _child_wakeup():
    """A pipe that SIGCHLD writes to (set_wakeup_fd), for a loop that polls it with others."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # a handler: the wakeup fd is written
    signal.set_wakeup_fd(wake_w)
    return wake_r, wake_w


def _poll(poller):
    """poller's events; none when a signal interrupted the wait."""
    try:
        return poller.poll()
    except InterruptedError:
        return ()


class _Deadman:
    """A POSIX timer that SIGKILLs the worker when it expires: the host arms it with each
    run's hard-kill time plus slack, so the run's deadline holds even when the host cannot
    reach the worker (a Command worker over ssh whose connection died while a C loop held
    the GIL: the control thread never reads the closed stdin). The kernel delivers it; no
    Python code has to run."""

    def __init__(self):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if not hasattr(libc, "timer_create"):
            libc = ctypes.CDLL("librt.so.1", use_errno=True)  # glibc before 2.34
        self.settime = libc.timer_settime
        event = (ctypes.c_byte * 64)()  # struct sigevent: sigval, then signo and notify ints
        offset = ctypes.sizeof(ctypes.c_void_p)
        ctypes.c_int.from_buffer(event, offset).value = signal.SIGKILL
        ctypes.c_int.from_buffer(event, offset + 4).value = 0  # SIGEV_SIGNAL
        self.timer = ctypes.c_void_p()
        if libc.timer_create(time.CLOCK_MONOTONIC, event, ctypes.byref(self.timer)) != 0:
            raise OSError(ctypes.get_errno(), "timer_create")
        self.spec = (ctypes.c_long * 4)()  # struct itimerspec: interval, then value

    def arm(self, ms):
        self.spec[2], self.spec[3] = ms // 1000, ms % 1000 * 1000000
        self.settime(self.timer, 0, self.spec, None)

    def disarm(self):
        self.spec[2] = self.spec[3] = 0
        self.settime(self.timer, 0, self.spec, None)


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
    import select

    init = os.getpid() == 1
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        prctl = None  # not Linux: the host still kills the process group
    if not init and prctl:
        prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    wake_r, wake_w = _child_wakeup()
    control = bool(cfg.get("control"))
    if control:
        import socket

        v_g, v_w = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.close(wake_r)
        os.close(wake_w)
        if _tenant:
            os.close(_LIFE_FD)  # the guardian's: it tells the host when the guardian is gone
        if control:
            global _snap_sock, _forkable
            os.close(_CTL_FD)
            v_g.close()
            _snap_sock = v_w.detach()
            # A snapshot or a copy starts its threads again under the worker's RLIMIT_AS; a
            # free-threaded build's allocator has reserved too much address space by then
            # for any new thread, so there such a worker neither snapshots nor forks.
            _forkable = not (cfg.get("memory") and not getattr(sys, "_is_gil_enabled", lambda: True)())
        return
    _out_of_reach(prctl)
    if control:
        v_w.close()
        _guard_lines(pid, v_g, wake_r)
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
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _copy_files(src, dst):
    """Copies the directories, regular files (contents, modes, times) and symlinks (as
    symlinks: never followed) under src into dst, which exists. Leaves out special files
    and whatever is mounted under src (a Mount under the working directory). Runs as the
    code's own user, in its sandbox: it can copy only what the code could."""
    if not os.listdir(src):
        return
    import re
    import shutil
    import stat

    mounted = set()
    try:
        with open("/proc/self/mountinfo", "rb") as f:
            for line in f:
                point = line.split()[4].decode("utf-8", "surrogateescape")
                # mountinfo escapes space, tab, newline and backslash as \ooo (octal)
                point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), point)
                if point.startswith(src.rstrip("/") + "/"):
                    mounted.add(point)
    except OSError:
        pass

    def skip(directory, names):
        out = []
        for name in names:
            path = os.path.join(directory, name)
            try:
                mode = os.lstat(path).st_mode
            except OSError:
                mode = 0
            if path in mounted or not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode)):
                out.append(name)
        return out

    shutil.copytree(src, dst, symlinks=True, ignore=skip, dirs_exist_ok=True)


def _recv_fds(sock):
    """One message of sock and the fds it carries (SCM_RIGHTS, at most eight: a new
    tenant's five and its cgroup.procs in two v1 hierarchies)."""
    import array
    import socket

    msg, anc, _, _ = sock.recvmsg(256, socket.CMSG_SPACE(8 * array.array("i").itemsize))
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
    and its snapshot talk to the guardian, snap its snapshot's pid (0: none), dead that
    the worker ended and its snapshot waits for the host's b"T"."""

    __slots__ = ("worker", "ctl", "v", "snap", "dead")

    def __init__(self, worker, ctl, v):
        self.worker, self.ctl, self.v, self.snap, self.dead = worker, ctl, v, 0, False


def _guard_lines(worker, v, wake_r):
    """The guardian of local workers, each with its own control socket from the host
    (docs/protocol.md, "Rollback" and "Fork"). A worker tells it each snapshot's pid
    (b"S" u32) over its v; over its control socket the host sends b"K" (kill the worker,
    not its snapshot) and b"T" with three fds (the new stdin, stdout, stderr pipes, which
    the guardian hands to the snapshot: it becomes the worker). When a worker ends, the
    guardian kills what is left of its tree, but the snapshot and the other workers, and
    sends b"D" i32 wait status, u8 snapshot alive. A Fork's copy reports itself over its
    parent's v (b"F" u64 token, u32 pid, with its own v's other end); the host sends b"F"
    u64 token with four fds (the copy's pipes and its control socket); the guardian pairs
    them by token and hands the copy its pipes. The host closing a worker's control socket
    ends that worker (and its snapshot); a worker that ends without a snapshot ends its
    line. When no worker is left, the guardian ends it all as the plain guardian does."""
    _Guardian(worker, v, wake_r).serve()


class _Guardian:
    """_guard_lines' state: the lines, the sockets it polls, and the halves of Fork copies
    waiting to be paired."""

    def __init__(self, worker, v, wake_r):
        import select
        import socket

        self.me = os.getpid()
        self.lines = []
        self.by_fd = {}  # fd -> (socket, its line)
        self.from_host = {}  # fork token -> the copy's fds, from the host
        self.from_copy = {}  # fork token -> (pid, v), from the copy
        self.wake_r = wake_r
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
        return pids

    def drop(self, line):
        self.lines.remove(line)
        # The worker may have ended already (the host closed its stdin too), its orphans
        # the guardian's children now: whatever is no line's worker or snapshot goes too.
        kill_tree([p for p in (line.worker, line.snap) if p], self.known(), self.me)
        for sock in (line.ctl, line.v):
            self.unwatch(sock)
            sock.close()
        if not self.lines:
            self.end(None)

    def end(self, status):
        kill_tree([], (), self.me)
        if status is not None:
            _report_exit(status)
        os._exit(0)

    def ended(self, line, status):
        if line is self.first:
            # The guardian's fd 2 is the first worker's stderr pipe: the host reads it to its
            # end (a crash's traceback) before a rollback, so it must end with the worker.
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 2)
            os.close(null)
        # Its orphans are the guardian's children now: whatever is no worker or snapshot.
        kill_tree([], self.known() - {line.worker}, self.me)
        alive = 1 if line.snap else 0
        try:
            line.ctl.send(C_DIED + struct.pack("<i", status) + bytes((alive,)))
        except OSError:
            alive = 0
        if not alive:
            if len(self.lines) == 1:
                self.end(status)
            self.drop(line)
        line.dead = True

    def pair(self, token):
        import array
        import socket

        if token not in self.from_host or token not in self.from_copy:
            return
        fds = self.from_host.pop(token)
        pid, cv = self.from_copy.pop(token)
        line = _Line(pid, socket.socket(fileno=fds[3]), cv)
        try:
            cv.sendmsg([C_TAKE_OVER], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds[:3]).tobytes())])
        except OSError:
            line.ctl.close()
            cv.close()
            kill_tree([pid], self.known() - {pid})
        else:
            self.add(line)
        for f in fds[:3]:
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
        elif msg[:1] == b"S" and len(msg) == 5 and not line.dead:
            line.snap = int.from_bytes(msg[1:5], "little")
        elif msg[:1] == b"F" and len(msg) == 13 and len(fds) == 1:
            token = msg[1:9]
            self.from_copy[token] = (int.from_bytes(msg[9:13], "little"), socket.socket(fileno=fds.pop()))
            self.pair(token)

    def from_host_ctl(self, line, msg, fds):
        """A message on a line's control socket (docs/protocol.md); its end drops the line."""
        import array
        import socket

        if not msg:
            self.drop(line)  # the host is done with this worker (or gone)
        elif msg[:1] == C_KILL and not line.dead:
            kill_tree([line.worker], self.known() - {line.worker})
        elif msg[:1] == C_TAKE_OVER and line.dead and line.snap and len(fds) == 3:
            try:
                line.v.sendmsg([C_TAKE_OVER], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())])
                line.worker, line.snap, line.dead = line.snap, 0, False
            except OSError:
                self.drop(line)
        elif msg[:1] == C_FORK and len(msg) == 9 and len(fds) == 4:
            self.from_host[msg[1:9]] = fds[:]
            del fds[:]
            self.pair(msg[1:9])

    def serve(self):
        while True:
            self.reap()
            for fd, _ in _poll(self.poller):
                if fd == self.wake_r:
                    os.read(self.wake_r, 512)
                    continue
                sock, line = self.by_fd.get(fd, (None, None))
                if line is None or line not in self.lines:
                    continue  # dropped while handling an earlier event of this round
                try:
                    msg, fds = _recv_fds(sock)
                except OSError:
                    msg, fds = b"", []
                if sock is line.v:
                    self.from_worker(line, msg, fds)
                else:
                    self.from_host_ctl(line, msg, fds)
                for f in fds:
                    os.close(f)


def main(read):
    cfg = _read_config(read)
    global _shm_denied
    _shm_denied = bool(cfg.get("deny_shm"))
    # Whatever the host process inherited without close-on-exec (a shell's or a service
    # manager's descriptors: Go closes only its own) would reach the code: none but the
    # protocol's stdin, stdout, stderr and control socket stay, and the idmapped mounts
    # that follow it (the sandbox moves each into place and closes its fd: _Mounter.attach).
    kept = max([_CTL_FD] + [m[3] for m in cfg["mounts"] if m[3] is not None])
    os.closerange(kept + 1 if cfg.get("control") else 3, 1 << 20)
    if cfg.get("root"):
        try:
            _enter_sandbox(cfg, bool(cfg.get("template")))
        except _Unreachable as e:
            import errno

            if e.errno not in (errno.EACCES, errno.EPERM):
                os.write(2, ("minipy worker: opening %s for the sandbox failed: %s\n" % (e.filename, e.strerror)).encode())
                os._exit(70)
            who = "root in a user namespace of their own, which passes root's private directories but " \
                  "not another user's" if os.getuid() == 0 else "the host's user"
            os.write(2, ("minipy worker: %s, which the sandbox binds: %s (the workers open it as %s)\n" % (
                e.filename, e.strerror, who)).encode())
            os._exit(cfg["sandbox_access"])
        except OSError as e:
            os.write(2, ("minipy worker: the kernel refused the sandbox: %s\n" % e).encode())
            os._exit(cfg["sandbox_refused"])
    if sys.flags.no_site:
        import site

        # In the sandbox now, as its user (see _site_dirs). python -c puts the current
        # directory ("") first after site has run, which would make it absolute.
        first = sys.path.pop(0) if sys.path and sys.path[0] in ("", ".") else None
        site.main()
        if first is not None:
            sys.path.insert(0, first)
    if cfg.get("pythonpath") is not None:
        os.environ["PYTHONPATH"] = cfg["pythonpath"]  # for the code's own subprocesses
        at = 1 if sys.path and sys.path[0] in ("", ".") else 0
        sys.path[at:at] = _python_path(cfg)  # where Python puts it: after the script's directory
    # The runtime's source, then the runtime compiled by an earlier worker of the engine
    # (marshal, empty at first), usable when code_tag is this interpreter's (compiling it
    # costs ~13 ms of a worker's start). Read before the guardian forks, which keeps both.
    runtime = read(int.from_bytes(read(4), "little")), read(int.from_bytes(read(4), "little"))
    if cfg.get("template"):
        _serve_template(cfg, runtime)  # returns in a worker's fork of it
    _become_guardian(cfg, runtime)
    fds = _move_fds()
    try:
        w = _Worker(*fds)
        _start(w, cfg, runtime)
    except BaseException:
        # fd 2 is captured by now: say why on the host's stderr pipe.
        import traceback

        os.write(fds[2], ("minipy worker failed to start:\n" + traceback.format_exc()).encode())
        os._exit(70)


def _read_config(read):
    """The config frame: "key=value" lines, integers but for the keys in _TEXT_KEYS and
    "mount" (repeated: "ro|rw SOURCE\tTARGET", then "\tFD" when the host passes the mount
    itself, idmapped, as that fd). Read unbuffered, before anything else, since
    the sandbox is built from it. (Not JSON: importing json costs ~6 ms of a start.)"""
    cfg = {"mounts": []}
    body = read(int.from_bytes(read(4), "little"))
    for line in body.decode("utf-8", "surrogateescape").splitlines():
        key, _, value = line.partition("=")
        if key == "env":
            name, _, val = value.partition("=")
            os.environ[name] = val
        elif key == "mount":
            mode, _, paths = value.partition(" ")
            source, _, target = paths.partition("\t")
            target, _, fd = target.partition("\t")
            cfg["mounts"].append((source, target, mode == "rw", int(fd) if fd else None))
        elif key == "seccomp":
            cfg[key] = bytes.fromhex(value)
        else:
            cfg[key] = value if key in _TEXT_KEYS else int(value)
    return cfg


_TEXT_KEYS = ("workdir", "tree", "code_tag", "root", "host_workdir", "host_tree", "preload", "pythonpath")


def _preload(w, names):
    """IsolatedConfig.Preload: import the modules now, before the first run. What they
    print at import is dropped with the next run's fresh capture."""
    import importlib

    for name in filter(None, names.split(",")):
        try:
            importlib.import_module(name)
        except BaseException as exc:
            os.write(w.host_err, ("minipy worker: IsolatedConfig.Preload: importing %s failed: %s: %s\n" % (
                name, _rt.type_name(type(exc)), exc)).encode())
            os._exit(70)


def _load_runtime(cfg, runtime):
    """Runs the runtime's code in a fresh module (set as _rt); returns [tag, marshal] when it
    had to compile it (for the ready frame), else []."""
    global _rt
    source, compiled = runtime
    tag = "%s %x" % (sys.version, sys.hexversion)
    _rt = types.ModuleType("_minipy_runtime")
    _rt.__dict__["__builtins__"] = __builtins__
    import marshal

    if compiled and cfg.get("code_tag") == tag:
        exec(marshal.loads(compiled), _rt.__dict__)
        return []
    code = compile(source, RUNTIME_FILE, "exec")
    exec(code, _rt.__dict__)
    return [tag, marshal.dumps(code)]  # made before any user code runs: safe to reuse


def _start(w, cfg, runtime):
    compiled = _load_runtime(cfg, runtime) if _rt is None else []  # a template's fork has it
    workdir = cfg.get("workdir")
    # The working directory goes first on sys.path, as the current directory does for
    # python -c, but only once the worker's own imports, limits and Preload are done: a
    # module the code left there (faulthandler.py, numpy.py) must not run before the limits
    # or shadow what the worker imports.
    cwd_first = bool(sys.path) and sys.path[0] in ("", ".")
    if cwd_first:
        del sys.path[0]
    if workdir:
        os.makedirs(workdir, exist_ok=True)
        os.chdir(workdir)
    w.workdir, w.tree, w.packed = workdir, cfg.get("tree"), bool(cfg.get("packed"))
    sys.modules["_minipy_runtime"] = _rt
    _rt.new_captures = w.captures
    w.kick_signal = cfg["kick_signal"]
    w.cpu_limit = cfg.get("cpu_seconds", 0)
    w.snapshots = bool(cfg.get("rollback")) and _forkable and w.snap_sock is not None
    _rt.max_transfer = cfg.get("max_transfer", -1)
    dispatch = _rt.install(w.kick_signal, None)
    _rt.call_host = w.call_host
    _rt.adopter = os.getppid()  # the guardian
    try:
        w.deadman = _Deadman()
    except (OSError, AttributeError):
        w.deadman = None  # no POSIX timers (not Linux): the guardian still sees a dead host
    sys.stdout, sys.stderr, sys.stdin = _rt._discard, _rt._discard, io.StringIO()
    # A crash (segfault, abort) prints where it happened to the host's stderr pipe, which the
    # Go side keeps for the crash error.
    import faulthandler

    w.fault_file = os.fdopen(w.host_err, "w")
    faulthandler.enable(file=w.fault_file)
    threading.Thread(target=w.control, name="minipy-control", daemon=True).start()
    if cfg.get("silence_ms"):
        threading.Thread(target=w.hear_host, args=(cfg["silence_ms"] / 1000,), name="minipy-silence", daemon=True).start()
    w.pump = _Pump(w)
    _set_limits(cfg)  # after the control thread: RLIMIT_AS must leave room for its stack
    _oom_first(True)
    _preload(w, cfg.get("preload", ""))
    if cwd_first:
        sys.path.insert(0, workdir or "")
    # The worker's own objects live as long as it does: frozen, the collections of the
    # code's objects never write to them, so their pages stay shared with the rollback
    # snapshots (fewer copy-on-write faults per run).
    import gc

    gc.freeze()
    ready = ["%d.%d.%d" % sys.version_info[:3], sys.executable, os.getpid()] + compiled
    w.write_frame(F_READY, _rt.encode(ready))
    w.serve(dispatch)


_rt = None
# (pyrt.go appends proctree.py, then the call of main: WorkerSource)
