"""minipy's Python half.

Loaded into the embedded interpreter by the in-process engine and into every worker process
by the isolated engine, so the rules of a run (last expression, capture, tracebacks,
timeouts, the value codec) are written once. Everything crosses to Go as bytes through
dispatch(); see codec.go for the other side of the value format.
"""

import ast
import builtins
import io
import linecache
import opcode
import os
import signal
import struct
import sys
import threading
import time
import tokenize
import types

# @constants: pyrt.go puts the constants shared with Go on this line

# ---------------------------------------------------------------------------------------
# Value codec. One tag byte per value:
#   N None, T/F bool, i int64, I big int (sign byte, u32 length, magnitude big-endian),
#   f float64, s str (u32 length, UTF-8), b bytes, l list (u32 count, items),
#   d dict with str keys (u32 count, (u32 length, key UTF-8, value) pairs),
#   X a value with no Go equivalent (only at the top level of a result).
# ---------------------------------------------------------------------------------------

_Q = struct.Struct("<q")
_D = struct.Struct("<d")
_U = struct.Struct("<I")
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


class Unconvertible(Exception):
    """The value (or something inside it) has no plain Go equivalent."""


def _enc_str(s, out):
    b = s.encode("utf-8", "surrogatepass")
    out += _U.pack(len(b))
    out += b


def _enc_int(v, out):
    if _INT64_MIN <= v <= _INT64_MAX:
        out += b"i"
        out += _Q.pack(v)
    else:
        mag = abs(v)
        raw = mag.to_bytes((mag.bit_length() + 7) // 8, "big")
        out += b"I-" if v < 0 else b"I+"
        out += _U.pack(len(raw))
        out += raw


def _enc(v, out, depth):
    t = type(v)
    if v is None:
        out += b"N"
    elif t is bool:
        out += b"T" if v else b"F"
    elif t is int:
        _enc_int(v, out)
    elif t is float:
        out += b"f"
        out += _D.pack(v)
    elif t is str:
        out += b"s"
        _enc_str(v, out)
    elif t is list or t is tuple:
        if depth >= MAX_DEPTH:
            raise Unconvertible("nested too deeply (or contains itself)")
        out += b"l"
        out += _U.pack(len(v))
        for item in v:
            _enc(item, out, depth + 1)
    elif t is dict:
        if depth >= MAX_DEPTH:
            raise Unconvertible("nested too deeply (or contains itself)")
        out += b"d"
        out += _U.pack(len(v))
        for key, item in v.items():
            if type(key) is not str:
                raise Unconvertible("dict key of type %s" % type(key).__name__)
            _enc_str(key, out)
            _enc(item, out, depth + 1)
    elif t is bytes or t is bytearray:
        out += b"b"
        out += _U.pack(len(v))
        out += v
    elif t is Chunks:
        out += b"b"
        out += _U.pack(v.size)
        if type(out) is _Parts:
            out.spans.append((len(out), v))  # not copied: encode_parts writes them where they go
        else:
            for c in v:
                out += c
    else:
        _enc_other(v, out, depth)


def _enc_other(v, out, depth):
    # Subclasses of the plain types (IntEnum, str enums, numpy.float64 is a float) and
    # numpy scalars convert as their plain value; anything else has no Go equivalent.
    if isinstance(v, bool):
        out += b"T" if v else b"F"
    elif isinstance(v, int):
        _enc_int(int(v), out)
    elif isinstance(v, float):
        out += b"f"
        out += _D.pack(float(v))
    elif isinstance(v, str):
        out += b"s"
        _enc_str(str.__str__(v), out)
    elif type(v).__module__ == "numpy" and getattr(v, "shape", None) == () and hasattr(v, "item"):
        plain = v.item()
        if type(plain) not in (bool, int, float, str, bytes):
            raise Unconvertible(type(v).__name__)
        _enc(plain, out, depth)
    else:
        raise Unconvertible(type(v).__name__)


class Chunks(list):
    """Bytes objects that encode as one byte string, their concatenation (size bytes), and
    that encode_parts never joins: a pickle of many megabytes, as the pickler wrote it.
    Each copy of a large value into fresh memory costs a page fault per 4 KiB page, more
    than the copy itself (a 10 MB copy: 2,560 faults, 27-42 ms on the VM of
    docs/benchmarks.md, against 0.7 ms into memory already mapped)."""

    def __init__(self):
        super().__init__()
        self.size = 0

    def write(self, b):
        """A file's write (pickle.Pickler's file): bytes are kept as they are, anything
        else (a bytearray, a PickleBuffer: memory the code may change) copied once, in its
        memory's order, as a file's write takes it (bytes() would reorder a Fortran-ordered
        buffer)."""
        if type(b) is not bytes:
            b = memoryview(b).tobytes("A")
        self.append(b)
        self.size += len(b)
        return len(b)


class _Parts(bytearray):
    """encode_parts' output: the encoding, less the Chunks' bytes, which spans places."""


def encode_parts(v, head=b""):
    """head and v's encoding as a list of buffers whose concatenation is it, for a writev:
    the bytes of Chunks in v are not copied."""
    out = _Parts(head)
    out.spans = []
    _enc(v, out, 0)
    if not out.spans:
        return [out]
    whole, parts, at = memoryview(out), [], 0
    for pos, chunks in out.spans:
        parts.append(whole[at:pos])
        parts.extend(chunks)
        at = pos
    parts.append(whole[at:])
    return parts


def encode(v):
    """Encode v, raising Unconvertible when it has no Go equivalent."""
    out = bytearray()
    _enc(v, out, 0)
    return bytes(out)


def encode_or_opaque(v):
    try:
        return encode(v)
    except Unconvertible:
        return b"X"
    except RecursionError:
        return b"X"


# The most bytes a worker may send the host in one message (IsolatedConfig.MaxTransfer; the
# host kills a worker that sends more): replies and host calls keep under it. worker.py sets
# it; -1 in-process, where nothing crosses a pipe.
max_transfer = -1


def _too_large(what, size):
    return "%s is %d bytes, more than a worker may send the host (IsolatedConfig.MaxTransfer: %d bytes)" % (
        what, size, max_transfer)


def _dec(buf, pos, views=False):
    tag = buf[pos]
    pos += 1
    if tag == 0x4E:  # N
        return None, pos
    if tag == 0x54:  # T
        return True, pos
    if tag == 0x46:  # F
        return False, pos
    if tag == 0x69:  # i
        return _Q.unpack_from(buf, pos)[0], pos + 8
    if tag == 0x66:  # f
        return _D.unpack_from(buf, pos)[0], pos + 8
    if tag == 0x73:  # s
        n = _U.unpack_from(buf, pos)[0]
        pos += 4
        return bytes(buf[pos:pos + n]).decode("utf-8", "surrogatepass"), pos + n
    if tag == 0x62:  # b
        n = _U.unpack_from(buf, pos)[0]
        pos += 4
        return (buf[pos:pos + n] if views else bytes(buf[pos:pos + n])), pos + n
    if tag == 0x49:  # I
        neg = buf[pos] == 0x2D
        n = _U.unpack_from(buf, pos + 1)[0]
        pos += 5
        v = int.from_bytes(buf[pos:pos + n], "big")
        return (-v if neg else v), pos + n
    if tag == 0x6C:  # l
        n = _U.unpack_from(buf, pos)[0]
        pos += 4
        items = []
        for _ in range(n):
            item, pos = _dec(buf, pos, views)
            items.append(item)
        return items, pos
    if tag == 0x64:  # d
        n = _U.unpack_from(buf, pos)[0]
        pos += 4
        d = {}
        for _ in range(n):
            k = _U.unpack_from(buf, pos)[0]
            pos += 4
            key = bytes(buf[pos:pos + k]).decode("utf-8", "surrogatepass")
            pos += k
            d[key], pos = _dec(buf, pos, views)
        return d, pos
    raise ValueError("minipy codec: unknown tag %r" % chr(tag))


def decode(buf, pos=0, views=False):
    """The value encoded in buf at pos; with views, its byte strings are memoryviews of buf,
    not copies (a Restore's megabytes, read once more by the unpickler)."""
    v, _ = _dec(memoryview(buf), pos, views)
    return v


# ---------------------------------------------------------------------------------------
# Output capture: a text stream that keeps the first and last halves of `limit`
# characters and counts what it dropped in between.
# ---------------------------------------------------------------------------------------


class _BinaryView:
    """What code that writes bytes (sys.stdout.buffer.write) sees."""

    def __init__(self, text):
        self._text = text

    def write(self, b):
        self._text.write(bytes(b).decode("utf-8", "replace"))
        return len(b)

    def flush(self):
        pass


class Capture(io.TextIOBase):
    def __init__(self, limit, name):
        self._name = name
        self.reset(limit)

    def reset(self, limit, emit=None):
        """Empty the stream for another run (the in-process engine reuses its two streams).
        emit, when given, also sends each write on to the host as it happens (live output):
        emit(F_OUTPUT, stream number, text)."""
        self._emit = emit
        self._stream = 2 if self._name == "stderr" else 1
        self._limit = limit
        self._head = []
        self._head_len = 0
        self._tail = []
        self._tail_len = 0
        self._total = 0
        self._children = None  # _ChildOutput, once the run's child processes write here

    @property
    def encoding(self):
        return "utf-8"

    @property
    def errors(self):
        return "strict"

    @property
    def name(self):
        return self._name

    @property
    def buffer(self):
        return _BinaryView(self)

    def writable(self):
        return True

    def isatty(self):
        return False

    def fileno(self):
        # In-process, the write end of the pipe that child processes write to (so that
        # subprocess.run(..., stdout=sys.stdout) and os.write(sys.stdout.fileno(), ...) reach
        # the run's output, never the host's fd).
        if _native is None or _memory_streams is None or self not in _memory_streams:
            raise io.UnsupportedOperation("minipy captures %s in memory; it has no file descriptor" % self._name)
        return _child_output.fds()[self._stream - 1]

    def write(self, s, drain=True):
        if not isinstance(s, str):
            raise TypeError("write() argument must be str, not %s" % type(s).__name__)
        if drain and self._children is not None:
            self._children.drain()  # what child processes wrote before this comes first
        n = len(s)
        if not n:
            return 0
        if self._emit is not None:
            self._emit(F_OUTPUT, self._stream, s)
        # No lock: threads printing at once may interleave their writes, as on a terminal,
        # but each write is appended whole under the GIL.
        limit = self._limit
        self._total += n
        if limit < 0 or self._head_len + n <= limit:
            self._head.append(s)
            self._head_len += n
            return n
        if self._head_len < limit:
            room = limit - self._head_len
            self._head.append(s[:room])
            self._head_len = limit
            s = s[room:]
        # Keep at most half of the limit as the tail.
        half = limit - limit // 2
        self._tail.append(s)
        self._tail_len += len(s)
        if self._tail_len > 2 * half + 4096:
            joined = "".join(self._tail)[-half:]
            self._tail = [joined]
            self._tail_len = len(joined)
        return n

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def flush(self):
        pass

    def mark(self, text):
        """A display's place in the output: the characters written so far. Its text goes to
        the live output there, as a terminal shows it, but not into the captured text
        (Result.Stdout holds what the code wrote; Result.Output puts the text back)."""
        if self._children is not None:
            self._children.drain()
        if self._emit is not None:
            self._emit(F_OUTPUT, self._stream, text)
        return self._total

    def place(self, marks, text):
        """Where marks (of mark()) are in text, what getvalue() returned."""
        return place_marks(marks, self._total, self._limit, text)

    def getvalue(self):
        if self._children is not None:
            self._children.drain()
        if not self._total:
            return ""
        head = "".join(self._head)
        if self._total <= self._limit or self._limit < 0:
            return head + "".join(self._tail)
        keep_head = self._limit // 2
        keep_tail = self._limit - keep_head
        tail = "".join(self._tail)
        tail = (head[keep_head:] + tail)[-keep_tail:] if keep_tail else ""
        omitted = self._total - keep_head - len(tail)
        return head[:keep_head] + OMITTED % (omitted, self._name) + tail


class _Discard(io.TextIOBase):
    """sys.stdout/sys.stderr between runs: a thread still printing must not reach the host's fds."""

    encoding = "utf-8"

    def writable(self):
        return True

    def write(self, s):
        return len(s)


class _EOFStdin(io.TextIOBase):
    """sys.stdin during and between runs: always at end of file, so input() raises EOFError
    instead of waiting for a terminal. Closing it (exit() does) changes nothing."""

    encoding = "utf-8"

    def readable(self):
        return True

    def read(self, size=-1):
        return ""

    def readline(self, size=-1):
        return ""

    def isatty(self):
        return False

    def close(self):
        pass


_eof_stdin = _EOFStdin()


class _ChildOutput:
    """In-process, child processes must not write to fds 1 and 2: those are the host's, and
    other goroutines write there. Children that would inherit them (subprocess without
    capture, os.system, os.popen's stderr) get the write ends of two pipes instead, made at
    the first such child; a thread of the runtime copies what arrives into the run's
    Capture, and every write of the run's Python code first drains the pipes, so the text
    keeps the order in which it was written. Output arriving between runs is dropped, as the
    isolated worker drops it."""

    def __init__(self):
        self.lock = threading.Lock()
        self.pipes = ()  # ((read, write) of stdout, (read, write) of stderr)
        self.decoders = ()
        self.active = False  # a run is in progress: what arrives is its output

    def fds(self):
        """The write ends (stdout, stderr), made on first use."""
        with self.lock:
            if not self.pipes:
                import codecs

                pipes = []
                for _ in range(2):
                    r, w = os.pipe2(os.O_CLOEXEC)
                    os.set_blocking(r, False)
                    pipes.append((r, w))
                self.decoders = tuple(codecs.getincrementaldecoder("utf-8")("replace") for _ in pipes)
                self.pipes = tuple(pipes)
                t = threading.Thread(target=self._loop, name="minipy-child-output", daemon=True)
                t.start()
                _own_threads.add(t.ident)
        if not self.active and _state.active:  # the first child of the run in progress
            self.active = True
        if self.active:
            for c in _memory_streams:
                c._children = self
        return self.pipes[0][1], self.pipes[1][1]

    def start(self):
        """A run begins: drop what arrived since the last one, then take output."""
        self.drain()
        self.active = True
        for c in _memory_streams:
            c._children = self

    def stop(self):
        self.drain()
        self.active = False

    def _loop(self):
        import select

        poller = select.poll()
        for r, _ in self.pipes:
            poller.register(r, select.POLLIN)
        while True:
            poller.poll()
            self.drain()

    def drain(self):
        with self.lock:
            for i, (r, _) in enumerate(self.pipes):
                while True:
                    try:
                        data = os.read(r, 65536)
                    except (BlockingIOError, InterruptedError):
                        break
                    if not data:
                        break
                    text = self.decoders[i].decode(data)
                    if text and self.active:
                        _memory_streams[i].write(text, False)


_child_output = _ChildOutput()
_own_threads = set()  # idents of the runtime's threads, which a stopped run does not stop


def place_marks(marks, total, limit, text):
    """Where positions in a stream of total characters are in text, the stream as a Capture of
    limit keeps it: the first limit // 2 characters, the omission marker, the last ones. A
    position in the part left out lands just after the marker; -1 (no place) stays -1."""
    n = len(text)
    if limit < 0 or total <= limit:
        return [min(p, n) if p >= 0 else -1 for p in marks]
    keep_head = limit // 2
    keep_tail = limit - keep_head
    cut = total - keep_tail  # where the kept tail starts in the stream
    after = n - keep_tail  # where it starts in text: just after the marker
    return [-1 if p < 0 else max(0, min(n, p if p <= keep_head else after + p - cut if p >= cut else after))
            for p in marks]


def _utf8_offsets(text, places):
    """The byte offsets in text's UTF-8 encoding (as _enc_str makes it) of character indexes
    places (-1 stays -1), in one pass over text."""
    offsets = {}
    n = pos = 0
    for p in sorted(set(p for p in places if p >= 0)):
        n += len(text[pos:p].encode("utf-8", "surrogatepass"))
        pos = p
        offsets[p] = n
    return [offsets.get(p, -1) for p in places]


def cap_text(s, limit, what):
    if limit < 0 or len(s) <= limit:
        return s
    c = Capture(limit, what)
    c.write(s)
    return c.getvalue()


# ---------------------------------------------------------------------------------------
# Cells: source registration for tracebacks, the last-expression rule, error descriptions.
# ---------------------------------------------------------------------------------------

_MAX_CELLS = 2000
_MAX_CELL_CHARS = 16 << 20
_cells = {}  # source -> cell name, oldest first
_cell_chars = 0
_cell_counter = 0


def register_cell(src):
    """Give src a `<cell-N>` name linecache can show; identical sources share a name."""
    global _cell_counter, _cell_chars
    name = _cells.pop(src, None)
    if name is not None and name in linecache.cache:
        _cells[src] = name
        return name
    _cell_counter += 1
    name = "<cell-%d>" % _cell_counter
    lines = src.splitlines(True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    linecache.cache[name] = (len(src), None, lines, name)
    _cells[src] = name
    _cell_chars += len(src)
    while len(_cells) > _MAX_CELLS or (_cell_chars > _MAX_CELL_CHARS and len(_cells) > 1):
        old_src = next(iter(_cells))
        linecache.cache.pop(_cells.pop(old_src), None)
        _cell_chars -= len(old_src)
    return name


def ends_with_semicolon(src):
    """IPython's rule: a trailing `;` (comments aside) hides the last expression's value."""
    if ";" not in src:
        return False
    last = None
    skip = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.ENDMARKER,
            tokenize.INDENT, tokenize.DEDENT)
    try:
        for tok in tokenize.generate_tokens(io.StringIO(src).readline):
            if tok.type not in skip:
                last = tok
    except (tokenize.TokenError, SyntaxError):
        return False
    return last is not None and last.type == tokenize.OP and last.string == ";"


# Top-level `await` works as in IPython: such a cell compiles to a coroutine, which runs on
# an event loop kept for the interpreter's life (so tasks made in one run live on).
_COMPILE_FLAGS = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
_CO_COROUTINE = 0x80
_loop = None


def _run_code(code, g, l):
    # eval runs exec-mode code too (returning None), and returns the coroutine of a cell
    # that awaits at top level.
    if code.co_flags & _CO_COROUTINE:
        return _await(eval(code, g, l))
    return eval(code, g, l)


def _await(coro):
    global _loop
    import asyncio

    if _loop is None or _loop.is_closed():
        _loop = asyncio.new_event_loop()
    # The current loop for code outside coroutines too (asyncio.ensure_future in a later
    # plain cell); asyncio.run() in user code unsets it, so set it every time.
    asyncio.set_event_loop(_loop)
    task = _loop.create_task(coro)
    try:
        return _loop.run_until_complete(task)
    except BaseException:
        task.cancel()
        raise


def exec_cell(src, name, g, l):
    """Run src in (g, l) as exec would; return (has_value, value) of its last expression.
    A cell that is not valid Python may be IPython syntax (notebook.py's transform_cell); it
    runs transformed, line for line, and any other syntax error is raised as it is."""
    src = dedent_cell(src)
    try:
        whole, body, last = _compile_cell(src, name)
    except SyntaxError:
        shell = transform_cell(src)
        if shell is None:
            raise
        whole, body, last = _compile_cell(shell, name)
    if whole is not None:
        value = _run_code(whole, g, l)
        return value is not None, value
    if body is not None:
        _run_code(body, g, l)
    if last is None:
        return False, None
    value = _run_code(last, g, l)
    return value is not None, value


def dedent_cell(src):
    """src as IPython runs a cell: when its first line that is not blank is indented, that
    indentation is taken off each line that starts with it (a cell pasted from inside a
    function, or a model's indented code block). IPython also drops the blank lines before
    it; here they stay, emptied, so that a traceback's line numbers are the cell's own."""
    if not src or src[0] not in " \t\r\n\f":
        return src  # (every cell that starts at its first column: nothing to look at)
    lines = src.split("\n")
    first = 0
    while first < len(lines) and (not lines[first] or lines[first].isspace()):
        first += 1
    if first == len(lines):
        return src
    line = lines[first]
    indent = line[:len(line) - len(line.lstrip(" \t"))]
    if not indent:
        return src
    n = len(indent)
    return "\n".join(["" for _ in range(first)] + [l[n:] if l.startswith(indent) else l for l in lines[first:]])


def _compile_cell(src, name):
    """(whole, body, last): the cell as one expression (whole), or its statements (body) and
    its last expression (last), each None when there is none."""
    try:
        return compile(src, name, "eval", _COMPILE_FLAGS, True), None, None
    except SyntaxError:
        pass
    tree = compile(src, name, "exec", ast.PyCF_ONLY_AST | _COMPILE_FLAGS, True)
    stmts = tree.body
    last = None
    if stmts and isinstance(stmts[-1], ast.Expr) and not ends_with_semicolon(src):
        last = stmts.pop()
        last = compile(ast.Expression(last.value), name, "eval", _COMPILE_FLAGS, True)
    body = compile(tree, name, "exec", _COMPILE_FLAGS, True) if stmts else None
    return None, body, last


def value_repr(value, limit):
    """The value's text as IPython shows it (pretty.py), cut to limit characters."""
    return cap_text(pretty_text(value, limit), limit, "repr")


def type_name(exc_type):
    module = getattr(exc_type, "__module__", "builtins")
    qual = getattr(exc_type, "__qualname__", exc_type.__name__)
    return qual if module in ("builtins", "__main__", None) else "%s.%s" % (module, qual)


def describe_error(exc, limit):
    """[type, message, traceback] with the runtime's own frames left out. Without a
    traceback (importing the module failed: code that used up its file descriptors gets
    EMFILE opening traceback.py), the type and message alone."""
    try:
        message = str(exc)
    except BaseException:
        message = "<unprintable %s>" % type(exc).__name__
    try:
        import traceback

        te = traceback.TracebackException(type(exc), exc, exc.__traceback__, compact=True)
        # Leave out the runtime's frames wherever they are: the caller of the cell at the
        # top, and wrappers such as the sliced time.sleep or the kick handler at the bottom.
        seen = set()
        stack = [te]
        while stack:
            t = stack.pop()
            if t is None or id(t) in seen:
                continue
            seen.add(id(t))
            t.stack = traceback.StackSummary.from_list([f for f in t.stack if f.filename != RUNTIME_FILE])
            stack += [t.__cause__, t.__context__] + list(getattr(t, "exceptions", None) or ())
        text = "".join(te.format())
    except BaseException:
        text = "%s: %s\n" % (type_name(type(exc)), message)
    return [type_name(type(exc)), message, cap_text(text, limit, "the traceback")]


# ---------------------------------------------------------------------------------------
# Timeouts. The engine sends a signal to the thread running the cell (the "kick"); the
# handler raises TimeoutInterrupt, a BaseException so `except Exception` cannot swallow it.
# Stage 1 raises once; stage 2 (code that swallowed stage 1) raises on every line.
# ---------------------------------------------------------------------------------------


class TimeoutInterrupt(BaseException):
    """The run was stopped by minipy: its deadline passed or its context was cancelled."""


TimeoutInterrupt.__module__ = "minipy"


class _RunState:
    __slots__ = ("active", "stage_raised", "threads_before", "stage", "tracing", "deferred")

    def __init__(self):
        self.active = False
        self.stage_raised = 0
        self.threads_before = None
        self.stage = 0  # set by the worker's control thread; in-process the C layer holds it
        self.tracing = False  # a Python tracer of _raise_at_next_line may be set
        self.deferred = False  # stage 1 waits for the next line (see _on_kick)


_state = _RunState()
_native = None  # the in-process engine's C helpers (module _minipy_c), else None
_main_ident = threading.get_ident()
_STOPPED = "the run was stopped: its time ran out or it was cancelled"
_STOPPED_HARD = "the run was stopped: it swallowed the first interrupt"
# 3.13's compiler repeats a loop's test at its bottom and leaves the backward jump after it
# outside the enclosing try (gh-130279); 3.11, 3.12 and 3.14+ cover it. (Deferring where
# it is covered is not harmless: a one-line loop gets no line event to raise at.)
_JUMP_BACKWARD = opcode.opmap["JUMP_BACKWARD"] if sys.version_info[:2] == (3, 13) else None


def _kick_stage():
    return _native.kick_stage() if _native is not None else _state.stage


def _on_kick(signum, frame):
    if not _state.active:
        return
    stage = _kick_stage()
    if stage <= _state.stage_raised and stage < 2:
        if _state.deferred:
            # No line came since the deferral (a jump that lands on itself, as in a
            # one-line `while 1: pass`, may get no line event): raise here after all.
            _state.deferred = False
            raise TimeoutInterrupt(_STOPPED)
        return  # a repeat of a stage already raised: let cleanup (finally, __exit__) run
    first = _state.stage_raised == 0
    _state.stage_raised = stage
    if first:
        _stop_threads()
    if stage >= 2:
        _hard_stop(frame)
    elif _at_backward_jump(frame):
        # The interrupt would be raised at a loop's backward jump, which 3.13's exception
        # table can leave outside the enclosing try (`while cond: pass`, gh-130279), so
        # that `finally:` and `with` exits would be skipped: raise at the next line
        # instead, which is inside the loop and so inside the try.
        _state.deferred = True
        _raise_at_next_line(frame, _deferred_tracer)
        return
    raise TimeoutInterrupt(_STOPPED)


def _at_backward_jump(frame):
    if frame is None or _JUMP_BACKWARD is None:
        return False
    lasti = frame.f_lasti
    code = frame.f_code.co_code  # unspecialised: JUMP_BACKWARD whatever the adaptive form
    return 0 <= lasti < len(code) and code[lasti] == _JUMP_BACKWARD


def _next_line_raiser(message):
    def tracer(frame, event, arg):
        if frame.f_code.co_filename == RUNTIME_FILE or not _state.active:
            return None
        _state.deferred = False
        raise TimeoutInterrupt(message)

    return tracer


_deferred_tracer = _next_line_raiser(_STOPPED)
_py_hard_tracer = _next_line_raiser(_STOPPED_HARD)


def _raise_at_next_line(frame, tracer):
    """Raise the interrupt at the next line or call of user code, through a Python tracer:
    CPython removes such a tracer once it raises, so it raises once."""
    _state.tracing = True
    sys.settrace(tracer)
    while frame is not None:
        if frame.f_code.co_filename != RUNTIME_FILE:
            frame.f_trace = tracer
        frame = frame.f_back


def _hard_stop(frame):
    if _native is not None:
        _native.hard_stop()  # a C tracer that raises on every line and is not unset by raising
        return
    # Worker processes, 3.12+: a sys.monitoring LINE callback, which (unlike a sys.settrace
    # tracer) stays registered when it raises, so it raises on every line, a swallower's
    # `except:` body included, as the in-process C tracer does.
    if _monitor_lines():
        return
    # 3.11, or the tool id is taken: a Python tracer raises once, so the engine's repeated
    # kicks re-install it; a swallower catches each, and the engine kills the worker.
    _raise_at_next_line(frame, _py_hard_tracer)


# The sys.monitoring tool id of the hard stage: ids 3 and 4 have no assigned role (0
# debugger, 1 coverage, 2 profiler, 5 optimizer), so user code is unlikely to hold it.
_MONITOR_TOOL = 4
_monitoring = False


def _on_monitored_line(code, line):
    if _state.active and code.co_filename != RUNTIME_FILE and threading.get_ident() == _main_ident:
        raise TimeoutInterrupt(_STOPPED_HARD)


def _monitor_lines():
    global _monitoring
    mon = getattr(sys, "monitoring", None)
    if mon is None:
        return False
    if not _monitoring:
        try:
            mon.use_tool_id(_MONITOR_TOOL, "minipy timeout")
        except ValueError:  # taken by the user's code
            return False
        mon.register_callback(_MONITOR_TOOL, mon.events.LINE, _on_monitored_line)
        mon.set_events(_MONITOR_TOOL, mon.events.LINE)
        _monitoring = True
    return True


def _stop_monitoring():
    global _monitoring
    if _monitoring:
        mon = sys.monitoring
        mon.set_events(_MONITOR_TOOL, 0)
        mon.register_callback(_MONITOR_TOOL, mon.events.LINE, None)
        mon.free_tool_id(_MONITOR_TOOL)
        _monitoring = False


def _forget_orphaned_modules():
    """An import cut short by the interrupt leaves the submodules it had finished in
    sys.modules while importlib removes the packages that failed; importing the package again
    would then pair a new package object with old submodules bound to the dead one (numpy:
    "module 'numpy' has no attribute 'ndarray'"). Forget such orphans so that the next import
    starts clean. Only after an interrupted run: it scans sys.modules."""
    modules = sys.modules
    for name in [n for n in modules if "." in n]:
        parent = name
        while "." in parent:
            parent = parent.rpartition(".")[0]
            if parent not in modules:
                modules.pop(name, None)
                break


def _clear_hard_stop():
    if _native is not None:
        _native.clear_hard_stop()
    _stop_monitoring()
    if _state.tracing:
        _state.tracing = _state.deferred = False
        sys.settrace(None)


def _async_raise(ident):
    if _native is not None:
        _native.async_raise(ident, TimeoutInterrupt)
        return
    import ctypes

    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(TimeoutInterrupt))


def _stop_threads():
    """Stop the threads this run started (they would otherwise outlive its deadline)."""
    before = _state.threads_before or ()
    for ident, thread in list(threading._active.items()):
        if (ident != _main_ident and ident not in before and ident not in _own_threads
                and not isinstance(thread, threading._DummyThread)):
            _async_raise(ident)


def _thread_excepthook(args, _default=threading.excepthook):
    if args.exc_type is TimeoutInterrupt:
        return
    _default(args)


_real_sleep = time.sleep


def _sliced_sleep(secs):
    """time.sleep that a stopped thread leaves within 50 ms (the main thread sleeps whole:
    the kick interrupts it)."""
    if threading.get_ident() == _main_ident or not secs or secs <= 0.05:
        return _real_sleep(secs)
    end = time.monotonic() + secs
    while True:
        left = end - time.monotonic()
        if left <= 0:
            return None
        _real_sleep(min(left, 0.05))


_sliced_sleep.__name__ = "sleep"
_sliced_sleep.__qualname__ = "sleep"
_sliced_sleep.__doc__ = _real_sleep.__doc__


# ---------------------------------------------------------------------------------------
# Processes a run starts. Every way Python starts one (os.fork, os.forkpty, os.posix_spawn[p],
# _posixsubprocess.fork_exec under subprocess and multiprocessing, os.system) is wrapped to
# note the child (pid and start time, so a reused pid is never mistaken for it). When a run
# is stopped (timeout, cancel) its children and all their descendants are killed; the
# children of a run that ended normally belong to its namespace and are killed when the
# namespace is freed. Nothing else is touched: in-process, the Go host's own children are
# never noted. (Code that forks through ctypes is not seen; in a sandboxed worker the pid
# namespace still takes it down with the worker.)
# ---------------------------------------------------------------------------------------

_run_procs = None  # [(pid, start, reap)] of the run in progress, else None
_space_procs = {}  # namespace id -> [(pid, start, reap)] left running by finished runs
_last_space = DEFAULT_NAMESPACE  # the namespace of the latest run
_real_fork = os.fork


def _note_child(pid, reap, born):
    """Note a child of the run in progress (or of the namespace of the latest run). born is
    (lo, hi): clock ticks since boot just before and after the fork, between which the
    child's start time lies. It is read from /proc only when needed (_start_of): read at
    once, it would wait for a child that exits at once, its memory's teardown (4 ms of a
    13 ms fork and exit of a worker with numpy)."""
    entry = (pid, born, reap)
    procs = _run_procs
    if procs is None:  # a thread of a finished run: its namespace owns the child
        procs = _space_procs.setdefault(_last_space, [])
    procs.append(entry)
    if len(procs) >= 256 and len(procs) & 255 == 0:
        procs[:] = [e for e in procs if _start_of(e) is not None]


def _start_of(entry):
    """The start time of a noted process (pid, start or (lo, hi), reap) if it still lives and
    is the process noted (a pid reused since started at another time), else None."""
    pid, start = entry[0], entry[1]
    now = proc_start(pid)
    if now is None or start is None:
        return None
    if type(start) is tuple:
        return now if start[0] <= now <= start[1] else None
    return now if now == start else None


def kill_processes(entries):
    """Kill the noted children that still live and every descendant of theirs (kill_tree,
    proctree.py), then reap the children that no subprocess.Popen owns."""
    alive = [(e[0], _start_of(e)) for e in entries]
    killed = kill_tree([(pid, start) for pid, start in alive if start is not None])
    for pid, start, reap in entries:
        if reap and pid in killed:
            try:
                os.waitpid(pid, 0)
            except (OSError, InterruptedError):
                pass


# In a worker, the process that adopts orphans (pid 1 of its pid namespace, or the worker
# itself as subreaper): the orphans it adopted since a stopped run began were that run's
# (a double fork, a daemon), so they die with it. None in-process: the host's orphans go
# elsewhere and are none of the runtime's business.
adopter = None
_run_began = 0


def _ticks():
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * _CLK_TCK)


_CLK_TCK = os.sysconf("SC_CLK_TCK")


def _orphans_since(began):
    found = []
    me = os.getpid()
    for pid, start in children_by_parent().get(adopter, ()):
        if pid != me and start >= began:
            found.append((pid, start, False))
    return found


def _begin_run_processes(gid):
    global _run_procs, _last_space, _run_began
    _run_procs, _last_space = [], gid
    if adopter is not None:
        _run_began = _ticks()


def _end_run_processes(gid, stopped):
    global _run_procs
    procs, _run_procs = _run_procs, None
    if stopped and adopter is not None:
        procs += _orphans_since(_run_began)
    if not procs:
        return
    if stopped:
        kill_processes(procs)
    else:
        _space_procs.setdefault(gid, []).extend(procs)


def _track_processes():
    import _posixsubprocess

    def noting(real, result_pid, reap):
        def wrapper(*args, **kwargs):
            lo = _ticks()
            result = real(*args, **kwargs)
            pid = result_pid(result)
            if pid:
                # (one tick of slack each side: the floats' rounding at a tick's edge)
                _note_child(pid, reap, (lo - 1, _ticks() + 1))
            return result

        wrapper.__name__ = wrapper.__qualname__ = real.__name__
        wrapper.__doc__ = real.__doc__
        return wrapper

    first = lambda r: r[0]
    same = lambda r: r
    os.fork = noting(_real_fork, same, True)
    if hasattr(os, "forkpty"):
        os.forkpty = noting(os.forkpty, first, True)
    for name in ("posix_spawn", "posix_spawnp"):
        if hasattr(os, name):
            spawn = noting(getattr(os, name), same, True)
            setattr(os, name, _spawn_redirecting(spawn) if _native is not None else spawn)
    # subprocess binds fork_exec when it is imported, so the wrapper must be in place first
    # (or replace its copy too); Popen reaps its own child.
    fork_exec = noting(_posixsubprocess.fork_exec, same, False)
    _posixsubprocess.fork_exec = _fork_exec_redirecting(fork_exec) if _native is not None else fork_exec
    sub = sys.modules.get("subprocess")
    if sub is not None and hasattr(sub, "_fork_exec"):
        sub._fork_exec = _posixsubprocess.fork_exec
    os.system = _system


def _fork_exec_redirecting(real):
    # fork_exec's arguments 9 and 11 (the same from 3.8 to 3.13) are the fds the child gets
    # as its stdout and stderr: -1 inherits the parent's, 1 and 2 are the host's own.
    def fork_exec(*args):
        args = list(args)
        out, err = _child_output.fds()
        for index, inherited in ((9, out), (11, err)):
            fd = args[index]
            args[index] = inherited if fd == -1 else out if fd == 1 else err if fd == 2 else fd
        return real(*args)

    fork_exec.__name__ = fork_exec.__qualname__ = "fork_exec"
    fork_exec.__doc__ = real.__doc__
    return fork_exec


def _spawn_redirecting(real):
    def spawn(path, argv, env, *, file_actions=None, **kwargs):
        out, err = _child_output.fds()
        # The caller's own actions come after ours, so its redirections win.
        actions = [(os.POSIX_SPAWN_DUP2, out, 1), (os.POSIX_SPAWN_DUP2, err, 2)] + list(file_actions or ())
        return real(path, argv, env, file_actions=actions, **kwargs)

    spawn.__name__ = spawn.__qualname__ = real.__name__
    spawn.__doc__ = real.__doc__
    return spawn


def _system(command):
    # os.system's C version forks where no wrapper sees it and waits in C, retrying on EINTR,
    # so the run's interrupt could not stop it in-process; this one's child is noted and its
    # wait ends on the interrupt (the child is then killed with the run).
    pid = os.posix_spawn("/bin/sh", ["sh", "-c", command], os.environ)
    return os.waitpid(pid, 0)[1]


_system.__name__ = _system.__qualname__ = "system"
_system.__doc__ = os.system.__doc__


# ---------------------------------------------------------------------------------------
# Host functions (Namespace.Register in Go): Go functions the code calls. Go sends a spec
# per function (host.go's pySpec); the runtime makes a real Python function of it, with
# the schema's signature, so that Python itself binds the arguments (its own TypeError for
# a missing or unknown one) and help() and inspect show it. The body checks each argument's
# JSON type, then hands [function id, {name: value}] to the engine's call_host hook, which
# waits, without the GIL, for Go's reply (docs/protocol.md, "Host calls").
# ---------------------------------------------------------------------------------------


class HostError(Exception):
    """A host (Go) function returned an error or panicked; the message is its text."""


HostError.__module__ = "minipy"


def _minipy_module():
    """The module `import minipy` finds in the code: the exceptions it may meet."""
    mod = types.ModuleType("minipy", "Names of minipy, the Go host running this code.")
    mod.HostError = HostError
    mod.TimeoutInterrupt = TimeoutInterrupt
    sys.modules["minipy"] = mod


def _no_host(payload, inline=False):
    return CALL_REFUSED, b"no host functions here"


# Hook: call_host(payload, inline) -> (status, reply bytes). In-process the C module's
# host_call (inline: Function.Inline, served on this thread), in a worker _Worker.call_host.
call_host = _no_host

class _NotPassed:
    __slots__ = ()

    def __repr__(self):
        return "<not passed>"


_OPT = _NotPassed()  # an optional argument that was not passed
_JSON_TYPES = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,),
    "array": (list, tuple), "object": (dict,), "null": (type(None),),
}
_PY_NAMES = {"string": "str", "integer": "int", "number": "float", "boolean": "bool", "array": "list",
             "object": "dict", "null": "None"}


def _fits(value, types_):
    """Whether value is of one of the JSON types (subclasses and numpy scalars too; bool is
    not a number here, as in JSON)."""
    if hasattr(value, "item") and type(value).__module__ == "numpy" and getattr(value, "shape", None) == ():
        value = value.item()
    for t in types_:
        if t == "integer":
            if isinstance(value, int) and not isinstance(value, bool):
                return True
        elif t == "number":
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return True
        elif isinstance(value, _JSON_TYPES.get(t, ())):
            return True
    return False


def _bad_type(qualname, name, value, types_):
    want = " or ".join(_PY_NAMES.get(t, t) for t in types_)
    return TypeError("%s() argument '%s' must be %s, not %s" % (qualname, name, want, type(value).__name__))


def _bad_value(qualname, name, value, enum):
    return ValueError("%s() argument '%s' must be one of %s, not %r" % (
        qualname, name, ", ".join(repr(v) for v in enum), value))


def _call(fid, qualname, args, inline=False):
    try:
        payload = encode([fid, args])
    except (Unconvertible, RecursionError):
        for name, value in args.items():
            try:
                encode(value)
            except (Unconvertible, RecursionError) as exc:
                raise TypeError("%s() argument '%s' cannot be passed to Go: %s is not JSON-like (str, int, "
                                "float, bool, None, list, dict, bytes)" % (qualname, name, exc)) from None
        raise
    if 0 <= max_transfer < len(payload):
        raise ValueError("%s(): %s" % (qualname, _too_large("the call with its arguments", len(payload))))
    status, data = call_host(payload, inline)
    if status == CALL_OK:
        return decode(data)
    if status == CALL_SHOW:  # minipy.WithDisplays: show them as display() would, here
        value, bundles = decode(data)
        for bundle in bundles:
            bundle = _normalize(bundle)
            if "text/plain" not in bundle:
                bundle["text/plain"] = _display_text(bundle) or "<display from %s()>" % qualname
            _emit_display(bundle)
        return value
    message = bytes(data).decode("utf-8", "replace")
    if status == CALL_BAD_ARGS:
        raise TypeError(message)
    if status == CALL_STOPPED:
        if threading.get_ident() == _main_ident:
            _on_kick(0, None)  # as the kick's handler would (it may not have run yet)
        raise TimeoutInterrupt(_STOPPED)
    raise HostError(message)


def _annotation(text):
    import typing

    try:
        return eval(text, {"Literal": typing.Literal, "Any": typing.Any, "__builtins__": builtins})
    except Exception:
        return text


class HostGroup(types.ModuleType):
    """Host functions grouped under one name (`everything.echo(...)`)."""

    def __repr__(self):
        names = sorted(k for k in vars(self) if not k.startswith("_"))
        return "<host functions %s: %s>" % (self.__name__, ", ".join(names))


def make_host_function(spec):
    """The Python function for one spec: [name, id, doc, params, returns, open, inline]; each param
    is [json name, python name ("" for names only **kwargs can pass), annotation, required,
    has default, default, json types ([]: any), enum (or None)]; open: other keyword
    arguments are passed on too (the schema's additionalProperties); inline: Function.Inline."""
    name, fid, doc, params, returns, open_, inline = spec
    short = name.rpartition(".")[2]
    # The generated code's own names all start with _minipy_, which Go never gives a parameter.
    env = {"_minipy_call": _call, "_minipy_opt": _OPT, "_minipy_fits": _fits, "_minipy_bad_type": _bad_type,
           "_minipy_bad_value": _bad_value, "_minipy_q": name, "_minipy_fid": fid, "_minipy_inline": bool(inline),
           "__builtins__": builtins}
    sig, body, annotations, extra = [], [], {}, {}
    for i, (key, pyname, ann, required, has_default, default, types_, enum) in enumerate(params):
        types_ = tuple(types_)
        enum = tuple(enum) if enum is not None else None
        if not pyname:
            extra[key] = (required, types_, enum)
            continue
        annotations[pyname] = _annotation(ann)
        t, x, e = "_minipy_t%d" % i, "_minipy_x%d" % i, "_minipy_e%d" % i
        env[t], env[e] = types_, enum
        # The exact classes that need no closer look (bool only where JSON wants a boolean).
        env[x] = frozenset(c for tt in types_ for c in _JSON_TYPES.get(tt, ()) if c is not bool or tt == "boolean")
        check = []
        if types_:
            check.append("if type(%s) not in %s and not _minipy_fits(%s, %s): raise _minipy_bad_type(_minipy_q, %r, %s, %s)"
                         % (pyname, x, pyname, t, key, pyname, t))
        if enum is not None:
            check.append("if %s not in %s: raise _minipy_bad_value(_minipy_q, %r, %s, %s)" % (pyname, e, key, pyname, e))
        check.append("_minipy_a[%r] = %s" % (key, pyname))
        if required:
            sig.append(pyname)
            body += check
            continue
        if has_default:
            env["_minipy_d%d" % i] = default
            sig.append("%s=_minipy_d%d" % (pyname, i))
            body += check  # the default is passed on like any value
            continue
        # Shown as `= None`: None means "not passed" (unless null is a value the schema takes).
        sig.append("%s=%s" % (pyname, "_minipy_opt" if "null" in types_ or not types_ else "None"))
        body.append("if %s is not %s:" % (pyname, "_minipy_opt" if "null" in types_ or not types_ else "None"))
        body += ["    " + c for c in check]
    if extra or open_:
        env["_minipy_extra"] = extra
        env["_minipy_open"] = open_
        sig.append("**_minipy_kw")
        body += [
            "for _minipy_k, _minipy_v in _minipy_kw.items():",
            "    if _minipy_k not in _minipy_extra:",
            "        if _minipy_open:",
            "            _minipy_a[_minipy_k] = _minipy_v",
            "            continue",
            "        raise TypeError('%s() got an unexpected keyword argument %r' % (_minipy_q, _minipy_k))",
            "    _minipy_r, _minipy_ts, _minipy_en = _minipy_extra[_minipy_k]",
            "    if _minipy_ts and not _minipy_fits(_minipy_v, _minipy_ts):",
            "        raise _minipy_bad_type(_minipy_q, _minipy_k, _minipy_v, _minipy_ts)",
            "    if _minipy_en is not None and _minipy_v not in _minipy_en:",
            "        raise _minipy_bad_value(_minipy_q, _minipy_k, _minipy_v, _minipy_en)",
            "    _minipy_a[_minipy_k] = _minipy_v",
            "for _minipy_k, (_minipy_r, _minipy_ts, _minipy_en) in _minipy_extra.items():",
            "    if _minipy_r and _minipy_k not in _minipy_kw:",
            "        raise TypeError('%s() missing required keyword argument: %r' % (_minipy_q, _minipy_k))",
        ]
    src = "def %s(%s):\n    _minipy_a = {}\n%s    return _minipy_call(_minipy_fid, _minipy_q, _minipy_a, _minipy_inline)\n" % (
        short, ", ".join(sig), "".join("    %s\n" % line for line in body))
    exec(compile(src, RUNTIME_FILE, "exec"), env)
    fn = env[short]
    fn.__qualname__ = name
    fn.__module__ = "minipy.host"
    fn.__doc__ = doc or None
    if returns:
        annotations["return"] = _annotation(returns)
    fn.__annotations__ = annotations
    return fn


def _op_register(ident, specs):
    space = _space(ident)
    for spec in specs:
        fn = make_host_function(spec)
        path = spec[0].split(".")
        target = space
        for part in path[:-1]:
            group = target.get(part) if isinstance(target, dict) else getattr(target, part, None)
            if not isinstance(group, HostGroup):
                group = HostGroup(part, "Host functions of %s." % part)
                if isinstance(target, dict):
                    target[part] = group
                else:
                    setattr(target, part, group)
            target = group
        if isinstance(target, dict):
            target[path[-1]] = fn
        else:
            setattr(target, path[-1], fn)


# ---------------------------------------------------------------------------------------
# Namespaces and the run itself.
# ---------------------------------------------------------------------------------------

_spaces = {}
_next_space = DEFAULT_NAMESPACE


def new_namespace(ident=None):
    """Make a namespace and return its id. The isolated engine's workers pass the id: the Go
    side numbers their namespaces, so a replacement worker can recreate one by id."""
    global _next_space
    if ident is None:
        ident = _next_space
    _next_space = max(_next_space, ident + 1)
    _spaces[ident] = {"__name__": "__main__", "__builtins__": builtins}
    return ident


def _space(ident):
    try:
        return _spaces[ident]
    except KeyError:
        raise _OpError("namespace", "namespace %d is closed or unknown" % ident) from None


class _OpError(Exception):
    def __init__(self, kind, message):
        Exception.__init__(self, message)
        self.kind = kind


_discard = _Discard()
_NONE = b"N"


_memory_streams = None


def _memory_captures(max_output, live):
    global _memory_streams
    if _memory_streams is None:
        _memory_streams = Capture(max_output, "stdout"), Capture(max_output, "stderr")
    out, err = _memory_streams
    emit = _native.emit if live and _native is not None else None
    out.reset(max_output, emit)
    err.reset(max_output, emit)
    if _child_output.pipes:
        _child_output.start()
    return out, err


# Hook: makes a run's (stdout, stderr) streams, objects with getvalue(); live: send output
# to the host as it is written (docs/protocol.md). In-process, fds 1 and 2 belong to the
# host, so output is captured in memory and sent through the C module's event queue; the
# isolated engine's worker replaces this with streams on fds 1 and 2, which it captures and
# sends itself (os.write, C and subprocess output included).
new_captures = _memory_captures


def run(gid, lid, max_output, flags, src, max_images=-1, max_image_bytes=-1):
    """Run one cell; the reply is status 0, then has_value, value (or X), repr, stdout, stderr,
    error ([type, message, traceback] or None), seconds and displays ([[{MIME type: str or
    bytes}, is the value], ...], or None when there are none), each a codec value."""
    g = _space(gid)
    l = _space(lid) if lid else g
    out, err = new_captures(max_output, bool(flags & RUN_LIVE))
    state = _state
    has_value = False
    value_bytes = _NONE
    text = ""
    error = None
    sys.stdout, sys.stderr, sys.stdin = out, err, _eof_stdin
    active = threading._active
    state.threads_before = set(active) if len(active) > 1 else None
    state.stage_raised = 0
    _displays.reset(max_images, max_image_bytes, out)
    _begin_run_processes(gid)
    started = time.perf_counter()
    try:
        try:
            state.active = True
            if type(src) is bytes:  # from dispatch; not UTF-8 -> a UnicodeDecodeError of the run
                src = src.decode("utf-8")
            if _kick_stage():  # kicked while inactive (a deadline of microseconds): stop now,
                _on_kick(0, None)  # not at the next repeat of the kick, 20 ms later
            name = register_cell(src)
            try:
                has_value, value = exec_cell(src, name, g, l)
            finally:
                if "matplotlib.pyplot" in sys.modules and not (state.stage_raised or _kick_stage()):
                    # As Jupyter's inline backend: the figures left open are shown, even
                    # when the cell raised, and closed.
                    flush_figures(value if has_value else None)
            if has_value:
                text = value_repr(value, max_output)
                value_bytes = encode_or_opaque(value)
                if _is_rich(value):
                    bundle = format_bundle(value, text=text)
                    if len(bundle) > 1:
                        _emit_display(bundle, value, result=True)
                    if _figure_class(value):
                        _close_figure(value)
            value = None
        finally:
            state.active = False
            stopped = state.stage_raised or _kick_stage()
            _clear_hard_stop()
            if state.stage_raised:
                _forget_orphaned_modules()
            _end_run_processes(gid, stopped)
    except BaseException as exc:
        has_value = False
        value_bytes = _NONE
        text = ""
        try:
            error = describe_error(exc, max_output)
        except BaseException as again:  # formatting itself failed (MemoryError, odd __str__)
            error = [type_name(type(exc)), "", "%s (and formatting its traceback failed: %r)\n" % (type_name(type(exc)), again)]
        exc = None
    seconds = time.perf_counter() - started
    sys.stdout, sys.stderr, sys.stdin = _discard, _discard, _eof_stdin
    stdout, stderr = out.getvalue(), err.getvalue()
    if _child_output.active:
        _child_output.stop()
    displays = _displays.bundles or None
    if displays:
        _displays.reset(-1, -1)
        places = _utf8_offsets(stdout, out.place([d[2] for d in displays], stdout))
        for d, at in zip(displays, places):
            d[2] = at  # Display.Offset: a byte offset into Result.Stdout
    else:
        _displays.out = None
    reply = _run_reply(has_value, value_bytes, [text, stdout, stderr], error, seconds, displays)
    if 0 <= max_transfer < len(reply):
        reply = _fit_run_reply(has_value, [text, stdout, stderr], error, seconds, displays)
    return reply


def _run_reply(has_value, value_bytes, texts, error, seconds, displays):
    buf = bytearray(b"\x00")
    buf += b"T" if has_value else b"F"
    buf += value_bytes
    for s in texts:
        buf += b"s"
        _enc_str(s, buf)
    _enc(error, buf, 0)
    buf += b"f"
    buf += _D.pack(seconds)
    _enc(displays, buf, 0)
    return bytes(buf)


def _fit_run_reply(has_value, texts, error, seconds, displays):
    """The reply of a run that is larger than max_transfer, made to fit: without the value
    (Result.Value nil, its repr kept), then without the displays (stderr says so), then with
    each text cut to its head and tail."""
    reply = _run_reply(has_value, b"X", texts, error, seconds, displays)
    if len(reply) <= max_transfer:
        return reply
    if displays:
        # Their places and captions alone first: Result.Output still shows where each was.
        stderr = texts[2]
        texts[2] = stderr + "\n[minipy: the data of the run's %d displays was left out: with its output it is more " \
            "than a worker may send the host (IsolatedConfig.MaxTransfer, %d bytes)]\n" % (len(displays), max_transfer)
        bare = [[{"text/plain": caption}, value, at, caption] for _, value, at, caption in
                ((d[0], d[1], d[2], cap_text(d[3], 1000, "caption")) for d in displays)]
        reply = _run_reply(has_value, b"X", texts, error, seconds, bare)
        if len(reply) <= max_transfer:
            return reply
        texts[2] = stderr + "\n[minipy: the run's %d displays were left out: with its output they are more than a " \
            "worker may send the host (IsolatedConfig.MaxTransfer, %d bytes)]\n" % (len(displays), max_transfer)
    reply = _run_reply(has_value, b"X", texts, error, seconds, None)
    if len(reply) <= max_transfer:
        return reply
    # Six texts at most (the repr, stdout, stderr, an error's type, message and traceback), of
    # four UTF-8 bytes a character at most, and room for the rest.
    limit = max(0, (max_transfer - 4096) // 24)
    texts = [cap_text(s, limit, what) for s, what in zip(texts, ("repr", "stdout", "stderr"))]
    if error is not None:
        error = [cap_text(e, limit, what) for e, what in zip(error, ("the type", "the message", "the traceback"))]
    return _run_reply(has_value, b"X", texts, error, seconds, None)


# A cell like the ones models send first: a statement, output, a value to show.
_WARM_SRC = "_w = [i * 2 for i in range(64)]\nprint(len(_w))\n{'last': _w[-1], 'text': str(_w[:3])}"
_WARM_SPACE = -1  # no namespace of the host's has this id (they are unsigned)


def warm_up():
    """Run a throwaway cell in a throwaway namespace and leave no trace of it (no namespace,
    no cell name, no output). A worker forked from its template, or from itself for a
    rollback snapshot, shares its pages with that process, and every page a run writes
    costs a copy-on-write fault the first time (about 2,000 in a fresh worker's first run).
    Called while the worker waits for its first request, this takes most of those faults
    before the request comes instead of during its run."""
    global _cell_counter, _cell_chars, _last_space
    if _WARM_SRC in _cells or len(_cells) >= _MAX_CELLS:
        return
    counter, chars, last = _cell_counter, _cell_chars, _last_space
    _spaces[_WARM_SPACE] = {"__name__": "__main__", "__builtins__": builtins}
    try:
        run(_WARM_SPACE, 0, 1 << 16, 0, _WARM_SRC)
    finally:
        _spaces.pop(_WARM_SPACE, None)
        _space_procs.pop(_WARM_SPACE, None)
        linecache.cache.pop(_cells.pop(_WARM_SRC, None), None)
        _cell_counter, _cell_chars, _last_space = counter, chars, last


def _op_set(ident, name, payload):
    _space(ident)[name] = payload


def _op_get(ident, name):
    space = _space(ident)
    try:
        value = space[name]
    except KeyError:
        raise _OpError("name", "name %r is not defined" % name) from None
    try:
        data = encode(value)
    except (Unconvertible, RecursionError) as exc:
        raise _OpError("unsupported", "%s (%s); repr: %s" % (name, exc, cap_text(repr(value), 200, "repr"))) from None
    if 0 <= max_transfer < len(data) + 1:
        raise _OpError("too_large", _too_large("the value of %s" % name, len(data)))
    return data


def _op_names(ident):
    return [k for k in _space(ident) if not (k.startswith("__") and k.endswith("__"))]


def _op_free(ident):
    if ident == DEFAULT_NAMESPACE:
        raise _OpError("namespace", "the default namespace cannot be closed")
    space = _spaces.pop(ident, None)
    if space is not None:
        space.clear()
    procs = _space_procs.pop(ident, None)
    if procs:
        kill_processes(procs)


_COMMON_LIBRARIES = (
    "numpy", "pandas", "scipy", "matplotlib", "sympy", "sklearn", "statsmodels", "seaborn",
    "networkx", "PIL", "requests", "bs4", "lxml", "yaml", "openpyxl", "pyarrow", "polars",
    "IPython", "dateutil", "pytz", "tabulate", "regex", "cryptography",
)
_info = None


def info():
    """[python version, executable, importable common libraries]; detected once."""
    global _info
    if _info is None:
        import importlib.util

        found = []
        for lib in _COMMON_LIBRARIES:
            try:
                if importlib.util.find_spec(lib) is not None:
                    found.append(lib)
            except (ImportError, ValueError):
                pass
        _info = ["%d.%d.%d" % sys.version_info[:3], sys.executable, found]
    return _info


_HEADER = struct.Struct("<BIIiI")
_IMAGE_LIMITS = struct.Struct("<ii")  # after _HEADER: images per run, bytes per image (-1: none)


def dispatch(req):
    """Serve one request (bytes) and return the response (bytes).

    Response: status byte 0 then the op's values, or status 1 then [kind, message]."""
    parts = dispatch_parts(req)
    return parts[0] if len(parts) == 1 and type(parts[0]) is bytes else b"".join(parts)


def dispatch_parts(req):
    """dispatch's response as buffers to write in a row (a worker's writev): a large reply
    (Save's) is not joined into one."""
    resp = _dispatch(req)
    if type(resp) is not list:
        resp = [resp]
    size = sum(map(len, resp))
    if 0 <= max_transfer < size:  # (Get, Save and runs keep under it themselves)
        resp = [b"\x01" + encode(["too_large", _too_large("the reply", size)])]
    return resp


def _dispatch(req):
    try:
        op = req[0]
        if op == OP_RUN:
            _, gid, lid, max_output, flags = _HEADER.unpack_from(req, 0)
            max_images, max_image_bytes = _IMAGE_LIMITS.unpack_from(req, _HEADER.size)
            return run(gid, lid, max_output, flags, req[_HEADER.size + _IMAGE_LIMITS.size:], max_images,
                       max_image_bytes)
        if op == OP_NEW:
            return b"\x00" + encode(new_namespace())
        args = decode(req, 1, op == OP_RESTORE) if len(req) > 1 else []
        if op == OP_FREE:
            _op_free(*args)
            return b"\x00N"
        if op == OP_SET:
            _op_set(*args)
            return b"\x00N"
        if op == OP_GET:
            return b"\x00" + _op_get(*args)
        if op == OP_NAMES:
            return b"\x00" + encode(_op_names(*args))
        if op == OP_INFO:
            return b"\x00" + encode(info())
        if op == OP_REGISTER:
            _op_register(*args)
            return b"\x00N"
        if op == OP_SAVE:
            return encode_parts(_op_save(*args), b"\x00")
        if op == OP_RESTORE:
            return b"\x00" + encode(_op_restore(*args))
        raise _OpError("internal", "unknown op %d" % op)
    except _OpError as exc:
        return b"\x01" + encode([exc.kind, str(exc)])
    except BaseException as exc:  # a bug of ours, or an interrupt that landed between runs
        return b"\x01" + encode(["internal", "%s: %s" % (type_name(type(exc)), exc)])


# ---------------------------------------------------------------------------------------
# Installation.
# ---------------------------------------------------------------------------------------


def _refuse(what, why):
    def refused(*args, **kwargs):
        raise RuntimeError("%s is not available inside minipy's in-process engine: %s" % (what, why))

    refused.__name__ = what.rsplit(".", 1)[-1]
    refused.__qualname__ = refused.__name__
    return refused


_SIGNALS_OWNED = "the host Go program owns signal handling (use Options.Timeout, or the isolated engine)"
_EXITS_HOST = "it would end the host Go program (use the isolated engine to run such code)"


def _guard_in_process(kick_signal):
    """Code in the host process must not replace the Go runtime's signal handlers, block the
    kick signal or exit the host; such calls raise a clear RuntimeError instead."""
    import _signal
    import faulthandler
    import posix

    # signal's functions call _signal's at call time, so the runtime keeps _signal's own;
    # both modules are guarded, or `import _signal` / `import posix` would get around it.
    real_sigmask = _signal.pthread_sigmask
    for fn in ("signal", "set_wakeup_fd", "setitimer", "alarm", "siginterrupt", "pthread_sigmask", "sigwait",
               "sigwaitinfo", "sigtimedwait", "pause", "raise_signal", "pthread_kill"):
        for mod in (signal, _signal):
            if hasattr(mod, fn):
                setattr(mod, fn, _refuse("signal." + fn, _SIGNALS_OWNED))
    for fn in ("enable", "register", "dump_traceback_later"):
        setattr(faulthandler, fn, _refuse("faulthandler." + fn, _SIGNALS_OWNED))
    os._exit = posix._exit = _refuse("os._exit", _EXITS_HOST)
    os.abort = posix.abort = _refuse("os.abort", _EXITS_HOST)
    real_kill, real_killpg = posix.kill, posix.killpg

    def kill(pid, sig):
        # 0 and -pgid are the host's process group, -1 every process the host may signal.
        if pid in (0, -1, os.getpid()) or pid == -os.getpgid(0):
            raise RuntimeError("os.kill of the host process is not available inside minipy's in-process engine: "
                               + _EXITS_HOST)
        return real_kill(pid, sig)

    def killpg(pgid, sig):
        if pgid in (0, os.getpgid(0)):
            raise RuntimeError("os.killpg of the host's process group is not available inside minipy's "
                               "in-process engine: " + _EXITS_HOST)
        return real_killpg(pgid, sig)

    kill.__doc__, killpg.__doc__ = real_kill.__doc__, real_killpg.__doc__
    os.kill = posix.kill = kill
    os.killpg = posix.killpg = killpg
    _block_sigpipe_in_new_threads(real_sigmask)
    _clamp_recursion_limit()


# Deep recursion through C (repr of nested objects, json, pickle) uses the host thread's
# C stack: past a limit of about 60,000 the process segfaults (measured, 8 MB stack), so
# in-process code may raise the limit only this far.
MAX_RECURSION_LIMIT = 20000


def _clamp_recursion_limit():
    real = sys.setrecursionlimit

    def setrecursionlimit(limit):
        if not isinstance(limit, int):
            return real(limit)  # the real function's TypeError
        return real(min(limit, MAX_RECURSION_LIMIT))

    setrecursionlimit.__doc__ = (real.__doc__ or "") + (
        "\n\nIn minipy's in-process engine the limit is capped at %d: deeper C recursion would "
        "overflow the host's stack." % MAX_RECURSION_LIMIT)
    sys.setrecursionlimit = setrecursionlimit


def _block_sigpipe_in_new_threads(sigmask):
    """A SIGPIPE on a thread Go did not create kills the host (Go forwards it to the default
    action), so threads that user code starts block it: a write to a closed pipe or socket
    then fails with BrokenPipeError, as it does on the interpreter's own thread."""
    import _thread

    def wrap(start):
        # Every starter takes the thread's function first and passes the rest through:
        # start_new_thread(function, args[, kwargs]) calls function(*args, **kwargs);
        # 3.13's start_joinable_thread(function, handle=None, daemon=True) calls function().
        def started(function, *args, **kwargs):
            def bootstrap(*a, **kw):
                sigmask(signal.SIG_BLOCK, (signal.SIGPIPE,))
                return function(*a, **kw)

            return start(bootstrap, *args, **kwargs)

        started.__name__ = started.__qualname__ = start.__name__
        started.__doc__ = start.__doc__
        return started

    # threading keeps its own reference to the starter it uses: _start_new_thread up to
    # 3.12, _start_joinable_thread from 3.13. Wrap whichever of them this version has.
    for mod, names in ((_thread, ("start_new_thread", "start_new", "start_joinable_thread")),
                       (threading, ("_start_new_thread", "_start_joinable_thread"))):
        for name in names:
            start = getattr(mod, name, None)
            if start is not None:
                setattr(mod, name, wrap(start))


def install(kick_signal, native, executable=""):
    """Prepare this interpreter for runs. `native` is the in-process engine's C module, or None
    in a worker process. `executable` (in-process) is the python executable of the linked
    libpython, which Go found from the library's file: embedded, CPython would guess
    sys.executable from the host program or the first python3 on PATH, and
    subprocess/multiprocessing would start another build."""
    prepare(native, executable)
    signal.signal(kick_signal, _on_kick)
    if native is not None:
        _guard_in_process(kick_signal)
        sys.stdout, sys.stderr, sys.stdin = _discard, _discard, _eof_stdin
    return dispatch


_prepared = False


def prepare(native=None, executable=""):
    """What install does that is the interpreter's, not the process's (no signal handler):
    once. A template (template.py) prepares the runtime for every worker it forks, whose
    install then only sets its kick handler: each page a worker's own preparation wrote
    would be a copy-on-write fault of each worker's start."""
    global _native, call_host, _prepared
    if _prepared:
        return
    _prepared = True
    _native = native
    _minipy_module()
    if native is not None:
        call_host = native.host_call
    if not hasattr(sys, "argv"):
        sys.argv = [""]
    if executable:
        sys.executable = sys._base_executable = executable
    _track_processes()
    threading.excepthook = _thread_excepthook
    time.sleep = _sliced_sleep
    _install_notebook()
    new_namespace()  # DEFAULT_NAMESPACE


def fill_pools():
    """Fill the free blocks of pymalloc's pools that are in use, so that a process forked from
    this one puts its new small objects in pools of its own, packed, rather than in the free
    blocks scattered over pages it shares with this process: each such page written is a
    copy-on-write fault in the fork (a template's worker wrote ~50 more pages at its start
    before). What it allocates is never freed (the free blocks' worth: a few hundred KiB).
    Twice: the first pass's own objects, freed, leave a few blocks. Where the stats do not
    say (another allocator), it does nothing."""
    import ctypes

    malloc = ctypes.pythonapi.PyObject_Malloc
    malloc.restype, malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    for _ in range(2):
        for size, free in _free_blocks():
            for _ in range(free):
                malloc(size)


def _free_blocks():
    """[(block size, free blocks in its pools in use)] from sys._debugmallocstats."""
    r, w = os.pipe()  # (the stats go to the C stderr; a few KiB, well under a pipe's buffer)
    saved = os.dup(2)
    try:
        os.dup2(w, 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
        os.close(w)
        w = -1
        stats = b""
        while True:
            chunk = os.read(r, 65536)
            if not chunk:
                break
            stats += chunk
    finally:
        for fd in (r, w, saved):
            if fd >= 0:
                os.close(fd)
    # "class size num_pools blocks_in_use avail_blocks", one line a size class
    rows = [line.split() for line in stats.decode("ascii", "replace").splitlines()]
    return [(int(f[1]), int(f[4])) for f in rows if len(f) == 5 and all(x.isdigit() for x in f)]
