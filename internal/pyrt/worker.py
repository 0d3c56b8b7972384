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
* Frames both ways are u32 length (little-endian) then a kind byte then the payload.
  Host -> worker: b"R" request (u64 run id, u16 count, count x u32 namespace ids to create
  if missing, runtime request); b"K" kick (u64 run id, u8 stage).
  Worker -> host: b"Y" ready (encoded [version, executable]); b"A" answer (u64 run id,
  u8 kicked, runtime response).
* A control thread reads every frame. Requests go to the main thread; a kick interrupts the
  main thread only when it names the run in progress (under a lock), so a late kick never
  reaches the next run. The host kills the whole process when a kick is not enough.
* Started as pid 1 of a pid namespace (local, sandboxed workers), the process forks: pid 1
  stays a reaper that reports the worker's wait status as the last frame (b"X", i32), and
  the child is the worker. Otherwise the worker makes itself its descendants' subreaper, so
  that the host finds all of them in /proc when it kills the tree.
"""

import io
import os
import signal
import struct
import sys
import threading
import types

_LEN = struct.Struct("<I")
_RUN_ID = struct.Struct("<Q")
_COUNT = struct.Struct("<H")
_RUNTIME_FILE = "<minipy-runtime>"


def _move_fds():
    """Take the protocol off fds 0/1 and point fds 0, 1, 2 at what user code may use."""
    proto_in = os.dup(0)
    proto_out = os.dup(1)
    host_err = os.dup(2)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    out_mem = os.memfd_create("minipy-stdout")
    err_mem = os.memfd_create("minipy-stderr")
    os.dup2(out_mem, 1)
    os.dup2(err_mem, 2)
    for fd in (proto_in, proto_out, host_err, out_mem, err_mem):
        os.set_inheritable(fd, False)
    return proto_in, proto_out, host_err, out_mem, err_mem


class _FdStream(io.TextIOWrapper):
    """sys.stdout/sys.stderr of a run: text written straight through to fd 1 or 2, whose
    memory file getvalue() reads back (capped like the in-process Capture)."""

    def getvalue(self):
        try:
            self.flush()
        except (ValueError, OSError):
            pass
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
        text = "%s\n[... %d characters of %s omitted ...]\n%s" % (head, omitted, what, tail)
    _reset(mem)
    return text


def _reset(mem):
    os.ftruncate(mem, 0)
    os.lseek(mem, 0, os.SEEK_SET)  # the offset is shared with fd 1/2 and every child's copy


class _Worker:
    def __init__(self, proto_in, proto_out, host_err, out_mem, err_mem):
        self.rin = os.fdopen(proto_in, "rb", buffering=1 << 16)
        self.out_fd = proto_out
        self.host_err = host_err
        self.out_mem = out_mem
        self.err_mem = err_mem
        self.streams = {}
        self.lock = threading.Lock()
        self.request_ready = threading.Lock()
        self.request_ready.acquire()
        self.request = None
        self.current = 0
        self.running = False
        self.kicked = False
        self.main_ident = threading.get_ident()

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
        while data:
            data = data[os.write(self.out_fd, data):]

    # -- output ---------------------------------------------------------------------------

    def captures(self, max_output):
        # Point fds 1 and 2 at the memory files again: the code of an earlier run may have
        # closed or redirected them.
        os.dup2(self.out_mem, 1)
        os.dup2(self.err_mem, 2)
        if os.fstat(self.out_mem).st_size:
            _reset(self.out_mem)  # written between runs (a lingering thread or child)
        if os.fstat(self.err_mem).st_size:
            _reset(self.err_mem)
        return self.stream(1, self.out_mem, "stdout", max_output), self.stream(2, self.err_mem, "stderr", max_output)

    def stream(self, fd, mem, what, limit):
        s = self.streams.get(fd)
        if s is None or s.closed:
            s = _FdStream(io.FileIO(fd, "w", closefd=False), encoding="utf-8", errors="surrogateescape",
                          write_through=True)
            s._mem, s._what = mem, what
            self.streams[fd] = s
        s._limit = limit
        return s

    # -- threads --------------------------------------------------------------------------

    def control(self):
        """Read every frame: hand requests to the main thread, apply kicks."""
        while True:
            body = self.read_frame()
            if body is None:
                os._exit(0)  # the host is gone: nothing may outlive it
            kind = body[:1]
            if kind == b"K":
                run_id = _RUN_ID.unpack_from(body, 1)[0]
                stage = body[9]
                with self.lock:
                    if run_id == self.current and self.running:
                        self.kicked = True
                        if stage > _rt._state.stage:
                            _rt._state.stage = stage
                        signal.pthread_kill(self.main_ident, self.kick_signal)
            elif kind == b"R":
                self.request = body
                self.request_ready.release()
            else:
                os.write(self.host_err, b"minipy worker: unknown frame kind %r\n" % kind)
                os._exit(70)

    def serve(self, dispatch):
        state = _rt._state
        while True:
            self.request_ready.acquire()
            body, self.request = self.request, None
            run_id = _RUN_ID.unpack_from(body, 1)[0]
            count = _COUNT.unpack_from(body, 9)[0]
            pos = 11
            for ident in struct.unpack_from("<%dI" % count, body, pos):
                if ident not in _rt._spaces:
                    _rt.new_namespace(ident)
            pos += 4 * count
            if self.cpu_limit:
                self.arm_cpu_limit()
            with self.lock:
                # stage 0 first: a kick signal of an earlier run that is delivered late then
                # finds nothing to raise (runtime._on_kick ignores stage 0).
                state.stage = 0
                self.current = run_id
                self.running = True
                self.kicked = False
            resp = dispatch(body[pos:])
            with self.lock:
                self.running = False
                kicked = self.kicked
                state.stage = 0
            self.write_frame(b"A", body[1:9], b"\x01" if kicked else b"\x00", resp)

    # -- limits ---------------------------------------------------------------------------

    def arm_cpu_limit(self):
        # RLIMIT_CPU counts the process's whole life; each run gets cpu_limit more seconds.
        import resource

        ru = resource.getrusage(resource.RUSAGE_SELF)
        used = ru.ru_utime + ru.ru_stime
        soft = int(used + self.cpu_limit + 0.999)
        resource.setrlimit(resource.RLIMIT_CPU, (soft, resource.RLIM_INFINITY))


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


def _become_init():
    """In its own pid namespace the worker starts as pid 1, which the kernel shields from
    every signal it has no handler for (SIGXCPU from RLIMIT_CPU, the code's own os.kill).
    So pid 1 forks the real worker, reaps every orphan in the namespace (no zombies pile
    up), and when the worker ends sends its wait status as the last frame (b"X", i32) and
    exits, upon which the kernel kills whatever is left in the namespace."""
    pid = os.fork()
    if pid == 0:
        return
    os.close(0)
    status = 0
    while True:
        try:
            got, status = os.wait()
        except ChildProcessError:
            break
        if got == pid:
            break
    os.write(1, _LEN.pack(5) + b"X" + struct.pack("<i", status))
    os._exit(0)


def _become_subreaper():
    """Without a pid namespace of its own (AllowUnsandboxed, Command), the worker adopts
    its orphaned descendants (PR_SET_CHILD_SUBREAPER), so a double fork or a setsid child
    stays in its process tree, where the host finds and kills it."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        pass  # not Linux: the host still kills the process group


def main(read):
    global _rt
    if os.getpid() == 1:
        _become_init()
    else:
        _become_subreaper()
    fds = _move_fds()
    try:
        _start(_Worker(*fds))
    except BaseException:
        # fd 2 is captured by now: say why on the host's stderr pipe.
        import traceback

        os.write(fds[2], ("minipy worker failed to start:\n" + traceback.format_exc()).encode())
        os._exit(70)


def _start(w):
    global _rt
    # The config frame: "key=value" lines (integers but for workdir and code_tag); then the
    # runtime's source; then the runtime compiled by an earlier worker of the engine
    # (marshal, empty at first), usable when code_tag is this interpreter's. (Not JSON:
    # importing json would cost ~6 ms of a worker's start; compiling the runtime ~13 ms.)
    cfg = {}
    for line in w.read_frame().decode("utf-8", "surrogateescape").splitlines():
        key, _, value = line.partition("=")
        cfg[key] = value if key in ("workdir", "code_tag") else int(value)
    runtime_src = w.read_frame()
    runtime_code = w.read_frame()
    tag = "%s %x" % (sys.version, sys.hexversion)
    compiled = None
    workdir = cfg.get("workdir")
    if workdir:
        os.makedirs(workdir, exist_ok=True)
        os.chdir(workdir)
        if sys.path and sys.path[0] in ("", "."):
            sys.path[0] = workdir
    _rt = types.ModuleType("_minipy_runtime")
    _rt.__dict__["__builtins__"] = __builtins__
    import marshal

    if runtime_code and cfg.get("code_tag") == tag:
        code = marshal.loads(runtime_code)
    else:
        code = compile(runtime_src, _RUNTIME_FILE, "exec")
        compiled = marshal.dumps(code)  # made before any user code runs: safe to reuse
    exec(code, _rt.__dict__)
    sys.modules["_minipy_runtime"] = _rt
    _rt.new_captures = w.captures
    w.kick_signal = cfg["kick_signal"]
    w.cpu_limit = cfg.get("cpu_seconds", 0)
    dispatch = _rt.install(w.kick_signal, None)
    sys.stdout, sys.stderr, sys.stdin = _rt._discard, _rt._discard, io.StringIO()
    # A crash (segfault, abort) prints where it happened to the host's stderr pipe, which the
    # Go side keeps for the crash error.
    import faulthandler

    w.fault_file = os.fdopen(w.host_err, "w")
    faulthandler.enable(file=w.fault_file)
    threading.Thread(target=w.control, name="minipy-control", daemon=True).start()
    _set_limits(cfg)  # after the control thread: RLIMIT_AS must leave room for its stack
    ready = ["%d.%d.%d" % sys.version_info[:3], sys.executable, os.getpid()]
    if compiled is not None:
        ready += [tag, compiled]
    w.write_frame(b"Y", _rt.encode(ready))
    w.serve(dispatch)


_rt = None
main(_read)
