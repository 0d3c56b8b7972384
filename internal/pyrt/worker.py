"""minipy's isolated-engine worker: one python3 process that serves runs for the Go side.

The Go side starts `python3 -c BOOTSTRAP`; the bootstrap reads this file as one frame from
stdin and runs it with `_read` (an unbuffered exact read of fd 0). It is compiled with the
runtime's file name, so its frames are left out of tracebacks and the hard-stop tracer
ignores them. The rules of a run are runtime.py's (sent after the config frame); this file only
adds the process around them. pyrt.go joins it with the sandbox (sandbox.py, whose head says
what each layer stops), the template (template.py), the guardian (guardian.py) and
proctree.py into one program, WorkerSource:

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

import _signal
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
_WRITEV_PAST = 1 << 18  # a frame this large is written from its parts (write_frame)


def _write_all(fd, parts):
    """Writes the buffers parts to fd in a row, with writev (whatever it wrote of them)."""
    views = [memoryview(p) for p in parts if len(p)]
    while views:
        n = os.writev(fd, views[:512])
        while n:
            if n < len(views[0]):
                views[0] = views[0][n:]
                break
            n -= len(views[0])
            del views[0]
def _answer(request, flags, resp):
    """An answer's frame (F_ANSWER) to the request frame request, as a tuple of buffers: its
    header (the length, the kind, the run id, flags last), then the reply's parts."""
    return (_LEN.pack(10 + sum(map(len, resp))) + F_ANSWER + request[1:9] + bytes((flags,)),) + tuple(resp)


_real_fork = os.fork  # before the runtime wraps it: a snapshot, a sandbox's processes are no run's children
_snap_sock = None  # the worker's end of its socket to the guardian (config control=1)
_forkable = False  # the worker can fork snapshots and copies that start their threads again
_CTL_FD = 3  # the host's control socket, when the config says control=1
_kept = []  # a snapshot's objects over the worker's closed pipes (see _Worker.snapshot)
_shm_denied = False  # the seccomp filter refuses memfd_create (config deny_shm)
_LIBC = None  # libc through ctypes (_libc)
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

    def mark(self, text):
        """A display's place in the output (runtime's Capture.mark): the bytes the memory
        file holds so far. Its text goes to the live output there, not into the file."""
        try:
            self.flush()
        except (ValueError, OSError):
            pass
        at = os.fstat(self._mem).st_size
        self._marks.append(at)
        if self._pump.active:
            self._pump.insert(self._fd, text)
        return at

    def place(self, marks, text):
        """Where marks (of mark()) are in text, what getvalue() returned: computed by
        getvalue, which reads the bytes they count before it empties the file."""
        places = self._places
        return [places.get(m, len(text)) if m >= 0 else -1 for m in marks]

    def getvalue(self):
        try:
            self.flush()
        except (ValueError, OSError):
            pass
        if self._pump.active:
            self._pump.send()  # the last live output, before _drain empties the file
        marks, self._marks = self._marks, []
        text, self._places = _drain(self._mem, self._limit, self._what, marks)
        return text


def _drain(mem, limit, what, marks=()):
    """The text of memory file mem, capped to limit characters like the in-process Capture,
    and where each byte offset of marks is in it ({offset: character index}); empties mem."""
    size = os.fstat(mem).st_size
    if not size:
        return "", {m: 0 for m in marks}
    if limit < 0 or size <= 4 * limit + 4096:
        data = os.pread(mem, size, 0)
        whole = data.decode("utf-8", "replace")
        text = _rt.cap_text(whole, limit, what)
        places = {}
        if marks:
            ordered = sorted(set(marks))
            chars = _char_counts(data, ordered)
            for m, at in zip(ordered, _rt.place_marks(chars, len(whole), limit, text)):
                places[m] = at
    else:
        # Do not read a huge output whole: the head and the tail are all that is kept.
        keep_head = limit // 2
        keep_tail = limit - keep_head
        head = os.pread(mem, 4 * keep_head, 0).decode("utf-8", "replace")[:keep_head]
        tail_from = size - 4 * keep_tail
        tail_bytes = os.pread(mem, 4 * keep_tail, tail_from)
        tail = tail_bytes.decode("utf-8", "replace")
        tail = tail[-keep_tail:] if keep_tail else ""
        omitted = size - len(head.encode()) - len(tail.encode())
        text = head + OMITTED % (omitted, what) + tail
        after = len(text) - len(tail)  # just after the omission marker
        places = {}
        for m in set(marks):
            at = after
            if m <= 4 * keep_head:
                n = len(os.pread(mem, m, 0).decode("utf-8", "replace"))
                if n <= keep_head:
                    at = n
            elif m >= tail_from:
                n = len(tail_bytes[m - tail_from:].decode("utf-8", "replace"))  # characters after m
                if n <= len(tail):
                    at = len(text) - n
            places[m] = at
    _reset(mem)
    return text, places


def _char_counts(data, offsets):
    """The characters that data's first n bytes decode to, for each n of offsets (ascending),
    in one pass."""
    import codecs

    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    counts = []
    chars = pos = 0
    for n in offsets:
        chars += len(decoder.decode(data[pos:n]))
        pos = n
        counts.append(chars)
    return counts


def _reset(mem):
    os.ftruncate(mem, 0)
    os.lseek(mem, 0, os.SEEK_SET)  # the offset is shared with fd 1/2 and every child's copy


class _Pump:
    """Live output (docs/protocol.md): while a run that asked for it goes on, sends what
    reached the memory files of fds 1 and 2 since the last time as F_OUTPUT frames: when
    the host asks (F_PUMP, every output.go's liveInterval of a run, read by the control
    thread), at once when a run's Python code switches from one stream to the other, and at
    its end. No thread of its own: a run shorter than the interval costs no wake-up, and a
    worker one thread less."""

    def __init__(self, w):
        self.w = w
        self.lock = threading.Lock()
        self.active = False
        self.last = 0
        self.run_id = b""
        self.sent = {}

    def start(self, run_id):
        with self.lock:
            self.run_id = run_id
            self.sent = {1: 0, 2: 0}
            self.last = 0
            self.active = True

    def stop(self):
        with self.lock:
            self.active = False

    def switch(self, fd):
        self.send()
        self.last = fd

    def send(self, run_id=None):
        """Sends what is pending, if a run with live output goes on (run_id: that run)."""
        with self.lock:
            if self.active and run_id in (None, self.run_id):
                self._send()

    def insert(self, fd, text):
        """Sends text as live output of stream fd (a display's text, which the memory file
        does not hold), after what the files got before it."""
        with self.lock:
            if self.active:
                self._send()
                self.w.write_frame(F_OUTPUT, self.run_id, bytes((fd,)), text.encode("utf-8", "surrogateescape"))

    def _send(self):
        for fd, mem in ((1, self.w.out_mem), (2, self.w.err_mem)):
            size = os.fstat(mem).st_size
            while self.sent[fd] < size:
                data = os.pread(mem, min(size - self.sent[fd], OUTPUT_CHUNK), self.sent[fd])
                if not data:
                    break
                self.sent[fd] += len(data)
                self.w.write_frame(F_OUTPUT, self.run_id, bytes((fd,)), data)


class _Worker:
    def __init__(self, proto_in, proto_out, host_err, out_mem, err_mem, kick=None):
        self.rin = os.fdopen(proto_in, "rb", buffering=1 << 16)
        self.in_fd = proto_in  # rin's: a snapshot must not call rin (the control thread may hold it)
        # A local worker's control pipe (KICK_FD): kicks and host-call replies, read by the
        # control thread; the main thread reads its requests on rin itself. A Command
        # worker has none: the control thread reads every frame and hands requests over.
        self.kick_fd = kick
        self.cin = None
        if kick is not None:
            os.set_inheritable(kick, False)
            self.cin = os.fdopen(kick, "rb", buffering=1 << 12)
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
        self.snap_wait = None  # a socket over snap_sock, for the snapshots' wait (made once)
        self.own_threads = 0  # the threads of the worker's own (_thread._count()), once started
        self.unreaped = []  # replaced snapshots, killed, not yet reaped
        # The last request may have changed the state: snapshot again. A new worker's state
        # is any new worker's, so it makes no snapshot until a request changes it: the host
        # rolls a run that crashed before that back to a new worker (isolated.go's lost),
        # and a sandbox's start saves a fork and the ~170 pages it would copy.
        self.changed = False
        self.gen = 0  # the requests that may have changed the state (ANSWER_CHANGED): numbers snapshots
        # Working directories (IsolatedConfig's per-namespace ones): the worker's own, and the
        # tree that holds those of the namespaces sharing the worker (packed ones, a Fork copy).
        self.workdir = None
        self.tree = None
        self.packed = False
        self.roots = {}  # namespace id -> its working directory, where root_of's rule does not give it
        self.cwds = {}  # packed: namespace id -> the directory it was in when another one ran
        self.space = DEFAULT_NAMESPACE  # the namespace whose directory is the process's
        self.moving = None  # a Fork copy's (source root, own root, current directory) until it has moved
        self.serve_loop = None  # the loop in the host's fork code (_ServeLoop), once serving
        self.copy_ahead = True  # the loop copies ahead the pages the next run will write (_ServeLoop)

    # -- frames ---------------------------------------------------------------------------

    def read_frame(self, f=None):
        f = f or self.rin
        head = f.read(4)
        if len(head) < 4:
            return None
        n = _LEN.unpack(head)[0]
        body = f.read(n)
        if len(body) < n:
            return None
        return body

    def write_frame(self, kind, *parts):
        size = sum(map(len, parts))
        if size >= _WRITEV_PAST:
            # Large (a Save's reply): written from where its parts are, not joined into a
            # copy (each copy of fresh memory costs a page fault per page: runtime.Chunks).
            with self.write_lock:
                _write_all(self.out_fd, [_LEN.pack(size + 1) + kind, *parts])
            return
        data = memoryview(_LEN.pack(size + 1) + kind + b"".join(parts))
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
            s._marks, s._places = [], {}
            self.streams[fd] = s
        s._limit = limit
        s._marks = []  # a run that ended without getvalue (the worker's own error) left some
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
            body = self.read_frame(self.cin)
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
            elif kind == F_PUMP:
                try:
                    self.pump.send(body[1:9])
                except OSError:
                    pass  # the host is gone: the next read ends the worker
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
        self.dispatch = dispatch
        if self.snapshots and self.changed:
            while self.snapshot():  # a snapshot that took over snapshots itself again
                pass
        # Once, and only when no request waits: a spare's first run then finds its pages its
        # own (not shared with the template's, which copies each written).
        if not self.waiting():
            _rt.warm_up()
        # A local worker's loop is the host's fork code's (_ServeLoop), when it has it.
        loop = self.serve_loop = _SERVE_LOOP.bind(self) if _SERVE_LOOP is not None and self.cin is not None else None
        while True:
            if loop is not None:
                loop.run()
                continue
            if self.snapshots and self.changed:
                while self.snapshot():
                    pass
            answer = self.handle(self.next_request())
            if answer is None:
                continue  # in a Fork's copy, which has taken over: its requests come on its own pipes
            with self.write_lock:
                _write_all(self.out_fd, answer)
            self.changed = bool(answer[0][-1] & ANSWER_CHANGED)
            self.gen += self.changed
            self.heard = time.monotonic()  # (beats that queued while the GIL was held are read after)
            self.busy = False

    def handle(self, body):
        """The answer to the request frame body: a tuple of buffers, its frame's header first
        (whose last byte holds the answer's flags), or None in a Fork's copy, which has taken
        over on pipes of its own. Nothing else writes to the answer pipe until it has been
        written: the run's live output and host calls have ended."""
        if body[:1] != F_REQUEST:
            os.write(self.host_err, b"minipy worker: frame kind %r on the request pipe\n" % body[:1])
            os._exit(70)
        state = _rt._state
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
        # (A Restore's megabytes are not copied out of the frame: decode takes a view.)
        request = memoryview(body)[pos:] if body[pos:pos + 1] == bytes((OP_RESTORE,)) else body[pos:]
        if self.packed and request[:1] == bytes((OP_RUN,)):
            self.enter(_COUNT_ID.unpack_from(request, 1)[0])
        # Reading requests change nothing: the snapshot stays good.
        changed = ANSWER_CHANGED if count or request[:1] not in (
            bytes((OP_GET,)), bytes((OP_NAMES,)), bytes((OP_INFO,)), bytes((OP_FORK,)),
            bytes((OP_SAVE,))) else 0
        if request[:1] == bytes((OP_FORK,)):
            resp = self.fork(request)
            return None if resp is None else _answer(body, changed, (resp,))
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
        resp = self.dispatch(request)  # (buffers: runtime.dispatch_parts)
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
        return _answer(body, changed | (ANSWER_KICKED if kicked else 0), resp)

    def waiting(self):
        """Whether a request has come that the worker has not taken yet."""
        if self.cin is None:
            return self.request is not None
        import select

        return bool(select.select([self.in_fd], [], [], 0)[0])  # (the host sends one request at a time)

    def next_request(self):
        """The next request's frame: read by this thread on rin when the worker has a
        control pipe, else handed over by the control thread."""
        if self.cin is None:
            self.request_ready.acquire()
            body, self.request = self.request, None
            return body
        body = self.read_frame()
        if body is None:
            os._exit(0)  # the host is gone: nothing may outlive it
        self.heard = time.monotonic()
        self.busy = True
        return body  # (handle() checks its kind)

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
        (the host sent it fresh pipes through the guardian).

        Every page either process writes after the fork is copied (a page fault), and the
        snapshot is almost never used: it runs as little as it can before it waits. With
        the host's fork code (_SnapFork) it runs no Python at all, and CPython's after-fork
        work waits for the take-over; else Python's after-fork hooks in Python (threading's,
        and logging's when loaded) wait (_defer_child_hooks): run at the fork, they and the
        code they call wrote ~100 pages of each snapshot. The snapshot's OOM score is the
        guardian's to set."""
        try:
            if _SNAP_FORK is not None:
                pid, fds = _SNAP_FORK.fork(self.snap_sock, (self.in_fd, self.out_fd, self.host_err, self.kick_fd))
            else:
                pid, fds = self.py_snapshot()
        except OSError as exc:
            # EAGAIN under the Processes limit: no snapshot this time. The previous one
            # holds an older state, which is not "before this run": it goes (pid 0).
            # Said on the host's stderr pipe: a crash's error (WorkerLostError.Stderr)
            # then tells why its namespace was lost, not rolled back.
            pid, fds = 0, None
            try:
                os.write(self.host_err, b"minipy worker: no rollback snapshot after this answer: %s\n" %
                         str(exc).encode("utf-8", "replace"))
            except OSError:
                pass
        if fds is None:
            self.snapshot_made(pid)
            return False
        self.took_over(fds)
        return True

    def took_over(self, fds):
        """In a snapshot that has taken over: become the worker on fds."""
        # The objects over the worker's pipes, which the wait closed, are kept: collected,
        # they would close their fd numbers, which the new pipes may have (leave_pipes).
        _kept.extend((self.rin, self.cin))
        self.become(fds)

    def py_snapshot(self):
        """snapshot() through os.fork: (the snapshot's pid, None) in the worker, (0, the new
        pipes) in the snapshot once it takes over."""
        import warnings

        if self.snap_wait is None:
            import socket

            self.snap_wait = socket.socket(fileno=os.dup(self.snap_sock))
            _cmsg_fds()  # (for the snapshots' wait: _recv_fds)
        deferred = _defer_child_hooks(self.own_threads)
        quiet = _fork_warning_ignored()
        fds = None
        with (_no_context if quiet else warnings.catch_warnings()):
            if not quiet:
                warnings.simplefilter("ignore")  # 3.12+: fork() of a multi-threaded process
            try:
                pid = _real_fork()
            except OSError:
                _run_deferred(deferred, False)
                raise
            if pid == 0:
                # The snapshot (the guardian gives it its OOM score): off the worker's pipes,
                # and wait (inside this block: its exit is Python that can wait too).
                fds = _await_pipes(self.snap_wait, self.in_fd, self.out_fd, self.host_err, self.kick_fd)
                self.snap_wait = None  # (closed by the wait)
        _run_deferred(deferred, pid == 0)
        return pid, fds

    def snapshot_made(self, pid):
        """In the worker, after snapshot()'s fork: pid (0: none) replaces the previous
        snapshot."""
        old, self.snap_pid = self.snap_pid, pid
        died = False
        if old:  # (ended before this one replaced it: killed from outside; the host counts it)
            try:
                died = os.waitpid(old, os.WNOHANG)[0] == old
            except ChildProcessError:
                died = True
        # The guardian learns of the new one before the old one goes, so that a crash
        # in between still finds a snapshot; the old one is reaped later, without waiting.
        try:
            os.write(self.snap_sock, _SNAP_MSG.pack(_V_SNAP, pid, self.gen & 0xFFFFFFFF, died))
        except OSError:
            pass
        if old and not died:
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

    def leave_pipes(self):
        """In a copy: close this process's copies of the worker's pipes, which
        are the worker's own (held here too, they would not end when it does). The objects
        over them are kept, never used again: collected, they would close their fd numbers,
        which the new pipes may have by then."""
        _kept.extend((self.rin, self.cin))
        for fd in (self.in_fd, self.out_fd, self.host_err, self.kick_fd):
            try:
                os.close(fd)
            except OSError:
                pass

    def become(self, fds):
        """In a snapshot or a copy: become the worker on fds, the host's new pipes."""
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
        parent.sendmsg([_V_FORK + struct.pack("<QI", token, os.getpid())],
                       [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [theirs.fileno()]).tobytes())])
        parent.close()
        theirs.close()
        os.close(self.snap_sock)
        self.snap_sock = mine.detach()
        if self.snap_wait is not None:
            self.snap_wait.close()  # over the parent's socket
            self.snap_wait = None
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
        self.become(self.wait_for_pipes())

    def wait_for_pipes(self):
        """In a copy: wait for the guardian to hand over the host's new pipes."""
        import socket

        return _await_pipes(socket.socket(fileno=os.dup(self.snap_sock)))

    def take_over(self, fds):
        """In the snapshot: become the worker, on the new pipes. Only this thread survived the
        fork: the control and output threads start again, and every lock is new (another
        thread may have held one when the fork happened)."""
        import faulthandler

        self.in_fd, self.out_fd, self.host_err, self.kick_fd = fds
        _oom_first()
        for fd in fds:
            os.set_inheritable(fd, False)
        self.rin = os.fdopen(self.in_fd, "rb", buffering=1 << 16)
        self.cin = os.fdopen(self.kick_fd, "rb", buffering=1 << 12)
        self.write_lock = threading.Lock()
        self.lock = threading.Lock()
        self.request_ready = threading.Lock()
        self.request_ready.acquire()
        self.request = None
        self.current = 0
        self.running = self.kicked = self.host_calls = False
        self.calls = {}
        self.snap_pid, self.unreaped, self.changed = 0, [], True  # the worker's, not this one's
        self.deadman = _deadman()  # (POSIX timers are not inherited by a fork)
        self.main_ident = threading.get_ident()
        _rt._main_ident = self.main_ident
        faulthandler.enable(file=self.host_err)
        # RLIMIT_AS is set by now (the worker started its threads before setting it): small
        # stacks, which these loops need, still fit under it.
        size = threading.stack_size(1 << 18)
        try:
            threading.Thread(target=self.control, name="minipy-control", daemon=True).start()
            self.pump = _Pump(self)
            self.own_threads = _thread._count()
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


def _noop():
    pass


def _deferrable_hooks():
    """The after-fork hooks in Python that a snapshot may run later, when it takes over: of
    the standard library's modules loaded, those that os.register_at_fork(after_in_child=)
    runs and nothing else calls: threading's (its threads are gone in the child) and
    logging's (its locks made again). (random's reseed runs at the fork as always: its
    Random.seed is everybody's.)"""
    hooks = []
    for module, name in (("threading", "_after_fork"), ("logging", "_after_at_fork_child_reinit_locks")):
        fn = getattr(sys.modules.get(module), name, None)
        if isinstance(fn, types.FunctionType) and not fn.__code__.co_freevars:
            hooks.append(fn)
    return hooks


_V_SNAP, _V_FORK = b"S", b"F"  # what a worker tells its guardian over its v: a snapshot, a Fork's copy
_SNAP_MSG = struct.Struct("<cIIB")  # a snapshot's report to the guardian: _V_SNAP, pid, number, the old one died
_FORK_FILTER = None  # the warnings filter that _quiet_snapshot_forks installed, on 3.12+
_no_context = None  # contextlib.nullcontext(), once _quiet_snapshot_forks has run


def _quiet_snapshot_forks():
    """Python 3.12+ warns (DeprecationWarning) at each fork of a process with threads, which
    the worker always is, and the code's filters may turn that warning into an error. A
    filter first in warnings.filters ignores it for the worker's own frames (its module,
    _minipy_worker, never the code's), so that a snapshot's fork need not swap the filters
    around it (catch_warnings: ~45 pages of the worker written after each fork, each a
    copy-on-write fault). Before any code runs. The template runs it first (_prepare_template):
    in its workers it then finds its filter in place and does nothing, where adding it
    (compiling its two patterns) wrote 45 pages of a worker's start on 3.13, 85 on 3.14."""
    global _FORK_FILTER, _no_context
    import contextlib

    if _no_context is not None and (_FORK_FILTER is None or _fork_warning_ignored()):
        return  # (done: in the template this worker was forked from)
    _no_context = contextlib.nullcontext()
    if sys.version_info < (3, 12):
        return  # no warning to silence
    import warnings

    warnings.filterwarnings("ignore", message="This process ", category=DeprecationWarning,
                            module=r"_minipy_worker\Z")
    _FORK_FILTER = warnings.filters[0]


def _fork_warning_ignored():
    """Whether a fork from the worker's own code warns nothing without catch_warnings: no
    warning (before 3.12), or _FORK_FILTER still first (the code may have put its own
    filters before it, or replaced the list), and the filters are the module's list (not
    a context's: 3.14's context_aware_warnings)."""
    if _FORK_FILTER is None:
        return _no_context is not None
    import warnings

    f = warnings.filters
    return bool(f) and f[0] is _FORK_FILTER and not getattr(sys.flags, "context_aware_warnings", False)


def _defer_child_hooks(own_threads):
    """Make the deferrable after-fork hooks do nothing in the child of the next fork;
    _run_deferred gives them their code back. Only while no thread but the worker's own
    (own_threads, _thread._count()) can run Python: another could fork meanwhile, and its
    child would miss them. Returns what it changed: [(hook, its code)]."""
    if _thread._count() > own_threads:
        return []
    changed = []
    for fn in _deferrable_hooks():
        changed.append((fn, fn.__code__))
        fn.__code__ = _noop.__code__
    return changed


def _await_pipes(sock, *pipes):
    """In a snapshot or a copy: close the worker's pipes (held here too, they would not end
    when it does), and wait on sock for the guardian to hand over the host's new ones;
    returns them. A snapshot runs as little Python as it can before it waits: whatever it
    runs writes pages, and each is copied."""
    for fd in pipes:
        try:
            os.close(fd)
        except OSError:
            pass
    while True:
        try:
            msg, fds = _recv_fds(sock)
        except InterruptedError:
            continue
        except OSError:
            msg = b""  # (raised, it would reach the worker's code as the fork's failure)
        if not msg:
            os._exit(0)  # the guardian is gone
        if msg[:1] == C_TAKE_OVER and len(fds) == 4:
            sock.close()
            return fds
        for fd in fds:
            os.close(fd)


def _run_deferred(changed, child):
    """Give the hooks their code back, and in the child of the fork run them now, as the
    fork would have, in the order they were registered (threading's is first: the worker
    imports it before any code runs)."""
    for fn, code in changed:
        fn.__code__ = code
    if child:
        for fn, _ in changed:
            fn()



# The slots of the fork code's table (internal/cpython's MP_FT_*, pinned by a test there).
_FT_BEFORE_FORK, _FT_AFTER_PARENT, _FT_AFTER_CHILD, _FT_FORK, _FT_CLOSE, _FT_RECVMSG = 0, 1, 2, 3, 4, 5
_FT_EXIT, _FT_ERRNO, _FT_SOCK, _FT_KIND, _FT_WANT, _FT_NCLOSE, _FT_CLOSE_FDS = 6, 7, 8, 9, 10, 11, 12
_FT_FDS, _FT_OP, _FT_SYSCALL, _FT_S_FDS, _FT_S_NCG, _FT_S_CG, _FT_S_TREES, _FT_S_TREE = 20, 28, 29, 30, 36, 37, 39, 40
_FT_S_HOME, _FT_S_WORKDIR, _FT_S_MAPS, _FT_S_UNSHARE, _FT_S_PORT, _FT_S_LISTEN = 41, 42, 43, 49, 50, 51
_FT_S_HOSTNAME, _FT_S_PROC, _FT_S_PROC_DIR, _FT_S_TMPFS, _FT_S_TMP_DIRS, _FT_S_TMP_DATA = 52, 53, 54, 55, 56, 58
_FT_S_FD_PATH, _FT_S_NCOVERED, _FT_S_COVERED, _FT_S_COVERED_DIR, _FT_S_FILTER, _FT_S_LIFE = 59, 60, 61, 62, 63, 64
_FT_S_WHY, _FT_G_CTL, _FT_G_KICK, _FT_G_REPORT, _FT_G_SNAP_DIED, _FT_G_OOM_SELF, _FT_G_OOM_PID = 65, 66, 67, 68, 69, 70, 71
_FT_G_WORKER, _FT_G_V, _FT_G_SNAP, _FT_G_GEN, _FT_T_NEW, _FT_T_MOUNT, _FT_T_REFUSED, _FT_T_MOVED = 73, 74, 75, 76, 77, 78, 79, 80
_FT_T_DATA, _FT_T_SFD, _FT_T_MASK, _FT_W_SAVE, _FT_W_RESTORE, _FT_W_NEW_BYTES, _FT_W_BYTES_AT = 81, 84, 85, 86, 87, 88, 89
_FT_W_CALL, _FT_W_DECREF, _FT_W_GET_BUF, _FT_W_REL_BUF, _FT_W_TUPLE_LEN, _FT_W_TUPLE_AT = 90, 91, 92, 93, 94, 95
_FT_W_SIGNALS, _FT_W_STRERROR, _FT_W_HANDLE, _FT_W_NONE, _FT_W_IN, _FT_W_OUT, _FT_W_ERR = 96, 97, 98, 99, 100, 101, 102
_FT_W_SNAPSHOTS, _FT_W_CHANGED, _FT_W_CHANGED_BIT, _FT_W_NO_SNAP, _FT_W_PAGES, _FT_W_PREV = 103, 104, 105, 106, 107, 108
_FT_W_PAGES_CAP, _FT_W_NPAGES, _FT_W_NPREV, _FT_W_AHEAD, _FT_W_CYCLE, _FT_W_SCRATCH = 109, 110, 111, 112, 113, 114
_FT_W_MAPS, _FT_W_PAGEMAP, _FT_W_NREAPED, _FT_W_UNREAPED, _FT_S_BOOT_ID = 115, 116, 117, 118, 126
_FT_S_ROOT_N, _FT_S_ROOT_KINDS, _FT_S_ROOT_NAMES, _FT_S_ROOT_LINKS, _FT_S_ROOT_OPTS, _FT_S_ROOT_AT = 128, 129, 130, 131, 132, 133
_FT_S_ROOT_PROC, _FT_S_USERNS, _FT_S_IDMAP, _FT_S_ID_FILES, _FT_S_ROOT_HOME, _FT_S_CAP_LAST = 134, 135, 136, 137, 139, 140
_FT_S_SYNC, _FT_S_LOW_PORTS, _FT_SIZE = 141, 143, 144
# Its ops (MP_OP_*, pinned by the same test).
_OP_SNAPSHOT, _OP_SANDBOX, _OP_TEMPLATE, _OP_SERVE = 0, 1, 2, 3
_FORK_CODE = None  # a _ForkCode, once _load_fork_code has made one
_SNAP_FORK = None  # its _SnapFork
_SERVE_LOOP = None  # its _ServeLoop
_MACHINES = {"x86_64": "amd64", "aarch64": "arm64", "riscv64": "riscv64", "ppc64le": "ppc64le",
             "s390x": "s390x", "loongarch64": "loong64"}  # os.uname().machine: Go's GOARCH


class _ForkCode:
    """The host's fork code (internal/cpython's mp_fork_code): machine code the host compiled
    for its own machine, which reaches nothing but through a table of function pointers,
    copied here into an executable mapping once and called with the GIL held. It forks as
    os.fork does (PyOS_BeforeFork, PyOS_AfterFork_Parent); its child runs no Python until
    CPython's after-fork work (PyOS_AfterFork_Child, with the at-fork hooks in Python) in
    the process that goes on in Python: a rollback snapshot (_SnapFork), or a new sandbox's
    pid 1 (template.py's _SandboxFork)."""

    __slots__ = ("mem", "call")

    def __init__(self, code):
        import ctypes

        start = self._sealed(code) or self._private(code)
        self.call = ctypes.PYFUNCTYPE(ctypes.c_long, ctypes.c_void_p)(start)

    @staticmethod
    def _sealed(code):
        """The code in a sealed memfd, mapped shared, read and execute: no process, not one
        the template forks, can make it writable (the seals take write access from every
        mapping of it, for good), and the forks share its pages without copying their page
        tables. Its address, or 0 where memfds or seals are refused."""
        import ctypes
        import fcntl
        import mmap

        try:
            fd = os.memfd_create("minipy-fork-code", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        except (OSError, AttributeError):
            return 0
        try:
            _write_all(fd, [code])
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW |
                        fcntl.F_SEAL_SEAL)
            mm = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                                  ctypes.c_int, ctypes.c_long)(("mmap", _libc()))
            start = mm(None, len(code), mmap.PROT_READ | mmap.PROT_EXEC, mmap.MAP_SHARED, fd, 0)
            return 0 if start in (None, ctypes.c_void_p(-1).value) else start
        except (OSError, AttributeError):
            return 0
        finally:
            os.close(fd)

    def _private(self, code):
        """The code in a private mapping (a shared anonymous one would be shared with every
        fork of the template, and code in one sandbox could make it writable again and change
        what the others run): its address."""
        import ctypes
        import mmap

        self.mem = mmap.mmap(-1, len(code), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS,
                             prot=mmap.PROT_READ | mmap.PROT_WRITE)
        self.mem.write(code)
        start = ctypes.addressof(ctypes.c_char.from_buffer(self.mem))
        mprotect = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                    use_errno=True)(("mprotect", _libc()))
        if mprotect(start, len(code), mmap.PROT_READ | mmap.PROT_EXEC) != 0:
            raise OSError(ctypes.get_errno(), "mprotect of the fork code")
        return start

    def table(self, op):
        """A table for op (_OP_*) with its function pointers filled."""
        import ctypes

        libc = _libc()
        table = (ctypes.c_int64 * _FT_SIZE)()
        api = ctypes.pythonapi
        for slot, fn in ((_FT_BEFORE_FORK, api.PyOS_BeforeFork), (_FT_AFTER_PARENT, api.PyOS_AfterFork_Parent),
                         (_FT_AFTER_CHILD, api.PyOS_AfterFork_Child), (_FT_FORK, libc.fork),
                         (_FT_CLOSE, libc.close), (_FT_RECVMSG, libc.recvmsg), (_FT_EXIT, libc._exit),
                         (_FT_ERRNO, getattr(libc, "__errno_location")),  # (not mangled)
                         (_FT_SYSCALL, libc.syscall)):
            table[slot] = ctypes.cast(fn, ctypes.c_void_p).value
        table[_FT_OP] = op
        return table


class _SnapFork:
    """A rollback snapshot forked by the host's fork code (_ForkCode): its child closes the
    worker's pipes and waits for its take-over in C, and runs CPython's after-fork work only
    then. A snapshot so writes ~20 pages where os.fork's wrote ~105, and the worker defers
    no hooks."""

    __slots__ = ("table", "addr", "call")

    def __init__(self, code):
        import ctypes

        self.table = code.table(_OP_SNAPSHOT)
        self.table[_FT_KIND] = C_TAKE_OVER[0]
        self.table[_FT_WANT] = 4
        self.addr = ctypes.addressof(self.table)
        self.call = code.call

    def fork(self, sock, pipes):
        """(the snapshot's pid, None) in the worker; (0, the new pipes) in the snapshot once
        it takes over. The table is written only where it changed (a take-over's new pipes):
        each write after a fork is a page copied."""
        t = self.table
        for slot, value in ((_FT_SOCK, sock), (_FT_NCLOSE, len(pipes))) + tuple(enumerate(pipes, _FT_CLOSE_FDS)):
            if t[slot] != value:
                t[slot] = value
        pid = self.call(self.addr)
        if pid < 0:
            raise OSError(-pid, os.strerror(-pid))
        if pid:
            return pid, None
        return 0, [t[i] for i in range(_FT_FDS, _FT_FDS + 4)]


class _ServeLoop:
    """A local worker's loop in the host's fork code (MP_OP_SERVE): it forks the rollback
    snapshots (as _SnapFork does), reports them to the guardian, reads each request and
    writes its answer in C, and calls Python for the answer alone (_Worker.handle). A
    rollback cycle then writes the pages the run writes and few more: the loop in Python
    (its functions, its frames, the objects it made and the counts it wrote) wrote ~30
    more. After each snapshot's fork it copies ahead, while it waits, the pages the worker
    wrote since the last one: the next run finds most of its pages copied
    (docs/benchmarks.md). Made once, in the template when there is one; bind() gives it
    its worker."""

    __slots__ = ("w", "table", "addr", "call", "handle", "strings", "pages")

    # The most pages copied ahead after a snapshot's fork (4 MiB): past that, a run that
    # writes more each time finds the rest to copy, as without.
    _AHEAD = 1024

    def __init__(self, code):
        import ctypes

        self.w = self.handle = None
        t = self.table = code.table(_OP_SERVE)
        api = ctypes.pythonapi
        for slot, fn in ((_FT_W_SAVE, api.PyEval_SaveThread), (_FT_W_RESTORE, api.PyEval_RestoreThread),
                         (_FT_W_NEW_BYTES, api.PyBytes_FromStringAndSize), (_FT_W_BYTES_AT, api.PyBytes_AsString),
                         (_FT_W_CALL, api.PyObject_CallFunctionObjArgs), (_FT_W_DECREF, api.Py_DecRef),
                         (_FT_W_GET_BUF, api.PyObject_GetBuffer), (_FT_W_REL_BUF, api.PyBuffer_Release),
                         (_FT_W_TUPLE_LEN, api.PyTuple_Size), (_FT_W_TUPLE_AT, api.PyTuple_GetItem),
                         (_FT_W_SIGNALS, api.PyErr_CheckSignals), (_FT_W_STRERROR, _libc().strerror)):
            t[slot] = ctypes.cast(fn, ctypes.c_void_p).value
        self.strings = [ctypes.create_string_buffer(b) for b in (
            b"minipy worker: no rollback snapshot after this answer: [Errno \0] ", b"/proc/self/maps",
            b"/proc/self/pagemap")]
        for slot, text in zip((_FT_W_NO_SNAP, _FT_W_MAPS, _FT_W_PAGEMAP), self.strings):
            t[slot] = ctypes.addressof(text)
        # The loop's memory (the notes' two lists of pages, the buffers of the notes' and the
        # requests' reads), which each cycle writes: wiped in a fork's child (a snapshot
        # takes over with no notes), so that no snapshot shares it and the worker's writes
        # copy none of it.
        import mmap

        self.pages = mmap.mmap(-1, 16 * self._AHEAD + 12288, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        try:
            self.pages.madvise(mmap.MADV_WIPEONFORK)
        except (AttributeError, OSError):
            pass  # (before Linux 4.14: kept in a fork's child, and copied)
        start = ctypes.addressof(ctypes.c_char.from_buffer(self.pages))
        t[_FT_W_PAGES], t[_FT_W_PREV], t[_FT_W_SCRATCH] = start, start + 8 * self._AHEAD, start + 16 * self._AHEAD
        t[_FT_W_PAGES_CAP] = self._AHEAD
        t[_FT_W_NONE] = id(None)
        t[_FT_KIND], t[_FT_WANT], t[_FT_G_REPORT] = C_TAKE_OVER[0], 4, _V_SNAP[0]
        t[_FT_W_CHANGED_BIT] = ANSWER_CHANGED
        self.addr = ctypes.addressof(t)
        self.call = code.call

    def bind(self, w):
        """The loop of worker w (this process's only one)."""
        self.w, self.handle = w, w.handle  # (the table holds the handle's address: kept alive here)
        self.table[_FT_W_HANDLE] = id(self.handle)
        self.table[_FT_W_PAGES_CAP] = self._AHEAD if w.copy_ahead else 0
        return self

    def copied_ahead(self):
        """How many pages the loop has copied ahead (for the benchmarks: a copy made ahead
        is no page fault of the kernel's counters)."""
        return self.table[_FT_W_AHEAD]

    def run(self):
        """Serve until the loop returns: in a snapshot once it has taken over (it becomes the
        worker), in a Fork's copy (handle's None), or on an error (raised)."""
        w, t = self.w, self.table
        pipes = (w.in_fd, w.out_fd, w.host_err, w.kick_fd)
        for slot, value in ((_FT_SOCK, w.snap_sock if w.snap_sock is not None else -1), (_FT_NCLOSE, len(pipes)),
                            (_FT_W_IN, w.in_fd), (_FT_W_OUT, w.out_fd), (_FT_W_ERR, w.host_err),
                            (_FT_W_SNAPSHOTS, int(w.snapshots)), (_FT_W_CHANGED, int(w.changed)),
                            (_FT_G_SNAP, w.snap_pid), (_FT_G_GEN, w.gen & 0xFFFFFFFF),
                            (_FT_W_NREAPED, len(w.unreaped[:8]))) + tuple(enumerate(pipes, _FT_CLOSE_FDS)) + \
                tuple(enumerate(w.unreaped[:8], _FT_W_UNREAPED)):
            t[slot] = value
        del w.unreaped[:8]  # (the loop's now; more than 8 stay here, reaped by snapshot_made)
        r = self.call(self.addr)
        w.gen = t[_FT_G_GEN]  # (a snapshot's or a Fork copy's too: the requests its state has seen)
        if r == 1:  # the snapshot, taken over (take_over makes the rollback state its own)
            w.took_over([t[i] for i in range(_FT_FDS, _FT_FDS + 4)])
        elif r < 0:  # (0: a Fork's copy, which has taken over: the loop's state is its worker's)
            w.changed, w.snap_pid = bool(t[_FT_W_CHANGED]), t[_FT_G_SNAP]
            w.unreaped.extend(t[i] for i in range(_FT_W_UNREAPED, _FT_W_UNREAPED + t[_FT_W_NREAPED]))
            raise OSError(-r, os.strerror(-r))


def _load_fork_code(cfg):
    """The host's fork code (config fork_code, for its machine fork_arch), when this Python
    runs on that machine and can map it; else snapshots and sandboxes fork with os.fork, and
    the workers' loop is Python's."""
    global _FORK_CODE, _SNAP_FORK, _SERVE_LOOP
    import ctypes

    code = cfg.get("fork_code")
    if not code or _MACHINES.get(os.uname().machine) != cfg.get("fork_arch") or ctypes.sizeof(ctypes.c_void_p) != 8:
        return
    try:
        _FORK_CODE = _ForkCode(code)
        _SNAP_FORK = _SnapFork(_FORK_CODE)
        _SERVE_LOOP = _ServeLoop(_FORK_CODE)
    except (OSError, AttributeError, ValueError):
        _FORK_CODE = _SNAP_FORK = _SERVE_LOOP = None  # (a system that refuses executable mappings: os.fork)


def _libc():
    """libc through ctypes, made once: a template's forks share it, and the function objects
    it caches (ctypes makes one at an attribute's first use) with it. A CDLL made in each
    fork, and each function looked up again, would be pages that every sandbox's start
    writes (copy-on-write faults)."""
    global _LIBC
    if _LIBC is None:
        import ctypes

        _LIBC = ctypes.CDLL(None, use_errno=True)
    return _LIBC


def _oom_first():
    """The process that runs the code is the first the OOM killer picks (oom_score_adj
    1000): when its sandbox's cgroup (or the machine) runs out of memory, it is the worker
    that goes, not its guardian or its rollback snapshot, which then takes over (the
    guardian gives each snapshot its own score back: guardian.py's
    give_snapshot_oom_score). No process needs a privilege to raise its score. Best effort:
    /proc may refuse it."""
    try:
        fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
        try:
            os.write(fd, b"1000")
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


def _deadman():
    """A new _Deadman, or None where there are no POSIX timers (not Linux): the guardian
    still sees a dead host."""
    try:
        return _Deadman()
    except (OSError, AttributeError):
        return None


class _Deadman:
    """A POSIX timer that SIGKILLs the worker when it expires: the host arms it with each
    run's hard-kill time plus slack, so the run's deadline holds even when the host cannot
    reach the worker (a Command worker over ssh whose connection died while a C loop held
    the GIL: the control thread never reads the closed stdin). The kernel delivers it; no
    Python code has to run."""

    made = None  # what every deadman shares: made once (the template makes it for its workers)

    @classmethod
    def prepare(cls):
        """(timer_create, timer_settime, the sigevent, the itimerspec type): made once, so that
        a template's worker only makes its timer (each page its own ctypes calls wrote would
        be a copy of its start)."""
        if cls.made is None:
            import ctypes

            libc = _libc()
            if not hasattr(libc, "timer_create"):
                libc = ctypes.CDLL("librt.so.1", use_errno=True)  # glibc before 2.34
            event = (ctypes.c_byte * 64)()  # struct sigevent: sigval, then signo and notify ints
            offset = ctypes.sizeof(ctypes.c_void_p)
            ctypes.c_int.from_buffer(event, offset).value = signal.SIGKILL
            ctypes.c_int.from_buffer(event, offset + 4).value = 0  # SIGEV_SIGNAL
            cls.made = libc.timer_create, libc.timer_settime, event, ctypes.c_long * 4  # (itimerspec: interval, value)
        return cls.made

    def __init__(self):
        import ctypes

        create, self.settime, event, spec = self.prepare()
        self.timer = ctypes.c_void_p()
        if create(time.CLOCK_MONOTONIC, event, ctypes.byref(self.timer)) != 0:
            raise OSError(ctypes.get_errno(), "timer_create")
        self.spec = spec()

    def arm(self, ms):
        self.spec[2], self.spec[3] = ms // 1000, ms % 1000 * 1000000
        self.settime(self.timer, 0, self.spec, None)

    def disarm(self):
        self.spec[2] = self.spec[3] = 0
        self.settime(self.timer, 0, self.spec, None)


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


def main(read):
    cfg = _read_config(read)
    global _shm_denied
    _shm_denied = bool(cfg.get("deny_shm"))
    # Whatever the host process inherited without close-on-exec (a shell's or a service
    # manager's descriptors: Go closes only its own) would reach the code: none but the
    # protocol's stdin, stdout, stderr and control socket stay, and the idmapped mounts
    # that follow it (the sandbox moves each into place and closes its fd: _Mounter.attach).
    kept = max([KICK_FD if cfg.get("kicks") else _CTL_FD] + [m[3] for m in cfg["mounts"] if m[3] is not None])
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
    if cfg.get("root") and not _tenant:
        _package_site()  # (a template's forks have its)
    _become_guardian(cfg, runtime)
    _run_deferred(_tenant_hooks, True)  # a template's: the hooks its fork deferred
    fds = _move_fds()
    try:
        w = _Worker(*fds, kick=KICK_FD if cfg.get("kicks") else None)
        _start(w, cfg, runtime)
    except BaseException:
        # fd 2 is captured by now: say why on the host's stderr pipe.
        import traceback

        os.write(fds[2], ("minipy worker failed to start:\n" + traceback.format_exc()).encode())
        os._exit(70)


def _package_site():
    """A sandboxed worker's own site for packages, where /usr and the python's prefix are
    read-only: the user site, HOME/.local (HOME is the namespace's working directory). pip
    installs there (%pip, !pip: PIP_USER; Debian's pip refuses that for its system python
    without PIP_BREAK_SYSTEM_PACKAGES, and the system stays read-only anyway); the files
    count against WorkSize, survive a rollback, and Fork and Save/Restore carry them. The
    worker puts the directory on sys.path at once, ahead of the system's site, whether it
    exists or not (after a shell command or %pip, notebook.py's _refresh_package_site makes
    the path importer look again); every python the code starts adds it itself once it
    exists. Its scripts go on PATH. A venv's worker is left alone: pip installs into the
    venv, which the host mounts writable when it should be (Auto)."""
    import site

    if sys.prefix != sys.base_prefix or not site.ENABLE_USER_SITE:
        return
    user_site = site.getusersitepackages()
    if user_site not in sys.path:
        at = next((i for i, p in enumerate(sys.path) if p.endswith("-packages")), len(sys.path))
        sys.path.insert(at, user_site)
    os.environ.setdefault("PIP_USER", "1")
    os.environ.setdefault("PIP_BREAK_SYSTEM_PACKAGES", "1")
    os.environ.setdefault("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    os.environ["PATH"] = os.path.join(site.getuserbase(), "bin") + os.pathsep + os.environ.get("PATH", "/usr/bin:/bin")
    os.environ["MINIPY_PACKAGE_SITE"] = user_site


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
        elif key in ("seccomp", "fork_code", "startup"):
            cfg[key] = bytes.fromhex(value)
        else:
            cfg[key] = value if key in _TEXT_KEYS else int(value)
    return cfg


_TEXT_KEYS = ("workdir", "tree", "code_tag", "root", "host_workdir", "host_tree", "preload", "pythonpath",
              "fork_arch")


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


_startup_done = False  # IsolatedConfig.Startup has run in this process, or in the template it came from


def _startup(cfg, err_fd):
    """IsolatedConfig.Startup: run its code once, before the first run, in a module of its
    own (IPython's startup files); in the template when there is one, so that each worker
    forked from it starts with it done. What it prints is dropped with the next run's fresh
    capture; an error ends the process, saying why, as a Preload import's does."""
    global _startup_done
    code = cfg.get("startup")
    if not code or _startup_done:
        return
    _startup_done = True
    try:
        exec(compile(code, "<IsolatedConfig.Startup>", "exec"), {"__name__": "__minipy_startup__"})
    except BaseException as exc:
        os.write(err_fd, ("minipy worker: IsolatedConfig.Startup failed: %s: %s\n" % (
            _rt.type_name(type(exc)), exc)).encode("utf-8", "replace"))
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
    # Under a MemoryLimit the loop copies nothing ahead: a page copied for a run that does
    # not write it would count towards the limit (and could bring its OOM killer).
    w.copy_ahead = not cfg.get("memory")
    w.snapshots = bool(cfg.get("rollback")) and _forkable and w.snap_sock is not None
    if _FORK_CODE is None:  # (a template's fork has it)
        _load_fork_code(cfg)
    _rt.max_transfer = cfg.get("max_transfer", -1)
    _rt.install(w.kick_signal, None)
    dispatch = _rt.dispatch_parts
    _quiet_snapshot_forks()
    _rt.call_host = w.call_host
    _rt.adopter = os.getppid()  # the guardian
    w.deadman = _deadman()
    sys.stdout, sys.stderr, sys.stdin = _rt._discard, _rt._discard, io.StringIO()
    # A crash (segfault, abort) prints where it happened to the host's stderr pipe, which the
    # Go side keeps for the crash error.
    import faulthandler

    faulthandler.enable(file=w.host_err)  # (the fd: a file object over it is pages each worker writes, for nothing)
    threading.Thread(target=w.control, name="minipy-control", daemon=True).start()
    if cfg.get("silence_ms"):
        threading.Thread(target=w.hear_host, args=(cfg["silence_ms"] / 1000,), name="minipy-silence", daemon=True).start()
    w.pump = _Pump(w)
    w.own_threads = _thread._count()
    _set_limits(cfg)  # after the control thread: RLIMIT_AS must leave room for its stack
    _oom_first()
    _preload(w, cfg.get("preload", ""))
    _startup(cfg, w.host_err)
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
# (pyrt.go appends sandbox.py, template.py, guardian.py, proctree.py, then the call of main: WorkerSource)
