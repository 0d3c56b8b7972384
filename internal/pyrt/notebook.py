# minipy's notebook layer: IPython's syntax (`!cmd`, `%magic`, `%%cell magic`, `obj?`)
# without IPython. pyrt.go appends this file to runtime.py: they are one module, compiled
# with the file name RUNTIME_FILE, so these frames are left out of tracebacks as well.
#
# A cell is transformed only when it is not valid Python (exec_cell tries the source as it
# is first), so valid code is never changed, and every transformed line stays on its line:
# tracebacks and linecache show the user's own text at the right line numbers.

import re as _re


class UsageError(Exception):
    """A magic was used wrongly or does not exist (IPython's UsageError)."""


UsageError.__module__ = "minipy"

# ---------------------------------------------------------------------------------------
# The transform. A small scanner follows strings, brackets and backslash continuations, so
# only lines that begin a statement are looked at: `%` inside a triple-quoted string or an
# open bracket is left alone.
# ---------------------------------------------------------------------------------------

_ASSIGN = _re.compile(r"^([A-Za-z_][\w.]*(?:\s*,\s*[A-Za-z_][\w.]*)*)\s*=\s*([!%])(.*)$", _re.S)
_HELP_END = _re.compile(r"^(%{0,2}[A-Za-z_][\w.]*(?:\(\))?)\s*(\?\??)\s*$")
_HELP_START = _re.compile(r"^(\?\??)\s*(%{0,2}[A-Za-z_][\w.]*)\s*$")
_STRING_PREFIX = _re.compile(r"(?i)(?:rb|br|fr|rf|b|r|u|f)?$")


class _Scanner:
    """Where a line of Python leaves the tokenizer: in a triple-quoted string (quote), in
    brackets (depth) or after a backslash continuation (continued)."""

    __slots__ = ("quote", "depth", "continued")

    def __init__(self):
        self.quote = None
        self.depth = 0
        self.continued = False

    def at_statement(self):
        return self.quote is None and self.depth == 0 and not self.continued

    def feed(self, line):
        """Scan line; return the index of a comment's `#` outside strings, or -1."""
        i, n = 0, len(line)
        self.continued = False
        comment = -1
        while i < n:
            if self.quote is not None:
                j = line.find(self.quote, i)
                k = line.find("\\", i)
                if k != -1 and (j == -1 or k < j):
                    i = k + 2
                    continue
                if j == -1:
                    if len(self.quote) == 1:
                        self.quote = None  # an unterminated one-line string ends with its line
                    return comment
                i = j + len(self.quote)
                self.quote = None
                continue
            c = line[i]
            if c == "#":
                return i
            if c in "\"'":
                self.quote = c * 3 if line.startswith(c * 3, i) else c
                i += len(self.quote)
                continue
            if c in "([{":
                self.depth += 1
            elif c in ")]}":
                self.depth = max(0, self.depth - 1)
            elif c == "\\" and line[i + 1:].strip() == "":
                self.continued = True
                return comment
            i += 1
        return comment


def transform_cell(src):
    """src with IPython's syntax turned into calls of the builtin __minipy__, line for line;
    None when src has none of it."""
    lines = src.splitlines(True)
    out = []
    changed = False
    scan = _Scanner()
    first = True  # no statement seen yet: a cell magic may start here
    for index, line in enumerate(lines):
        body = line.rstrip("\r\n")
        end = line[len(body):]
        stripped = body.lstrip()
        indent = body[:len(body) - len(stripped)]
        if scan.at_statement() and stripped:
            if first and stripped.startswith("%%"):
                name, _, args = stripped[2:].partition(" ")
                cell = "".join(lines[index + 1:])
                call = "__minipy__.cell_magic(%r, %r, %r, %d)" % (name, args.strip(), cell, index + 2)
                out.append(indent + call + end + "\n" * max(0, len(lines) - index - 1))
                return "".join(out)
            new = _transform_line(stripped, index + 1)
            first = False
            if new is not None:
                out.append(indent + new + end)
                changed = True
                continue
        elif stripped and not stripped.startswith("#"):
            first = False
        comment = scan.feed(body)
        if scan.at_statement() and stripped.rstrip().endswith("?"):
            code = body if comment < 0 else body[:comment]
            new = _help_line(code.strip()) if code.rstrip().endswith("?") else None
            if new is not None:
                out.append(indent + new + end)
                changed = True
                continue
        out.append(line)
    return "".join(out) if changed else None


def _transform_line(stripped, lineno):
    """The replacement of one statement line, or None when it is not IPython syntax."""
    if stripped.startswith("!!"):
        return "__minipy__.getoutput(%r)" % stripped[2:].strip()
    if stripped.startswith("!"):
        return "__minipy__.system(%r)" % stripped[1:].strip()
    if stripped.startswith("%"):
        if stripped.startswith("%%"):
            return "__minipy__.cell_magic_misplaced(%r)" % stripped[2:].split(" ", 1)[0]
        name, _, args = stripped[1:].partition(" ")
        if name.endswith("?"):
            return _help_line(stripped)
        return "__minipy__.line_magic(%r, %r, %d)" % (name, args.strip(), lineno)
    if stripped.startswith("?"):
        return _help_line(stripped)
    m = _ASSIGN.match(stripped)
    if m:
        target, kind, rest = m.groups()
        if kind == "!":
            return "%s = __minipy__.getoutput(%r)" % (target, rest.lstrip("!").strip())
        name, _, args = rest.partition(" ")
        if name and not name.startswith("%"):
            return "%s = __minipy__.line_magic(%r, %r, %d)" % (target, name, args.strip(), lineno)
    return None


def _help_line(text):
    m = _HELP_END.match(text)
    if m:
        what, marks = m.groups()
    else:
        m = _HELP_START.match(text)
        if not m:
            return None
        marks, what = m.groups()
    if what.endswith("()"):
        what = what[:-2]
    return "__minipy__.pinfo(%r, %d)" % (what, len(marks))


# ---------------------------------------------------------------------------------------
# `{expr}` and `$name` in shell commands and magic arguments, as IPython expands them: in
# the caller's namespace; `$$` is a literal `$`; what cannot be evaluated stays as written
# (so `$HOME` reaches the shell), and nothing inside single quotes is expanded
# (`awk '{print $1}'`).
# ---------------------------------------------------------------------------------------

_DOLLAR = _re.compile(r"\$\$|\$([A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)*)|\{([^{}']*)\}")


def _expand(text, frame):
    if "$" not in text and "{" not in text:
        return text
    g, l = frame.f_globals, frame.f_locals

    def one(m):
        if m.group(0) == "$$":
            return "$"
        expr = m.group(1) or m.group(2)
        if not expr or not expr.strip():
            return m.group(0)
        try:
            return str(eval(expr, g, l))
        except Exception:
            return m.group(0)

    parts = _re.split(r"('[^']*')", text)
    return "".join(p if p.startswith("'") and p.endswith("'") and len(p) > 1 else _DOLLAR.sub(one, p)
                   for p in parts)


# ---------------------------------------------------------------------------------------
# Child processes whose output the run shows: `!cmd`, %pip, %%bash. Their stdout and stderr
# are read through pipes and written to sys.stdout/sys.stderr as they come, so the text is
# the same on both engines, in order with print, live, and capped like any output.
# ---------------------------------------------------------------------------------------


def _stream_process(argv, shell=False, merge=False, stdin=None, echo=True):
    """Run argv; copy its output to sys.stdout (and stderr to sys.stderr unless merge) while
    it runs; return (exit status, the text). A stop of the run ends the wait; the child is
    then killed with the run's other processes."""
    import selectors
    import subprocess

    p = subprocess.Popen(argv, shell=shell, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT if merge else subprocess.PIPE)
    collected = []
    try:
        sel = selectors.DefaultSelector()
        decoders = {}
        for f, target in ((p.stdout, "stdout"), (p.stderr, "stderr")):
            if f is not None:
                os.set_blocking(f.fileno(), False)
                sel.register(f.fileno(), selectors.EVENT_READ, target)
                decoders[f.fileno()] = _incremental_decoder()
        pending = memoryview(stdin.encode("utf-8", "surrogateescape")) if stdin is not None else None
        if pending is not None:
            os.set_blocking(p.stdin.fileno(), False)
            sel.register(p.stdin.fileno(), selectors.EVENT_WRITE, None)
        while sel.get_map():
            for key, _ in sel.select():
                fd = key.fd
                if key.data is None:  # the child's stdin
                    try:
                        pending = pending[os.write(fd, pending[:65536]):]
                    except BrokenPipeError:
                        pending = pending[:0]
                    if not pending:
                        sel.unregister(fd)
                        p.stdin.close()
                    continue
                try:
                    data = os.read(fd, 65536)
                except BlockingIOError:
                    continue
                text = decoders[fd].decode(data, final=not data)
                if text:
                    collected.append(text) if key.data == "stdout" else None
                    if echo:
                        stream = sys.stdout if key.data == "stdout" else sys.stderr
                        stream.write(text)
                if not data:
                    sel.unregister(fd)
        sel.close()
        return p.wait(), "".join(collected)
    finally:
        if p.poll() is None:  # stopped: the shell and whatever it started go
            kill_processes([(p.pid, _proc_start(p.pid), False)])
        for f in (p.stdin, p.stdout, p.stderr):
            if f is not None and not f.closed:
                f.close()


def _incremental_decoder():
    import codecs

    return codecs.getincrementaldecoder("utf-8")("replace")


class SList(list):
    """The lines of a command's output (`x = !cmd`), a list as IPython's SList is; .s, .n
    and .l give them joined by spaces, by newlines, and as a plain list."""

    @property
    def s(self):
        return " ".join(self)

    @property
    def n(self):
        return "\n".join(self)

    @property
    def l(self):
        return list(self)

    spstr, nlstr, list = s, n, l


# ---------------------------------------------------------------------------------------
# Magics. Each takes (args, frame, lineno) (line magics) or (args, cell, frame, lineno)
# (cell magics, lineno being the cell body's first line).
# ---------------------------------------------------------------------------------------

_line_magics = {}
_cell_magics = {}
_ALIASES = ("cat", "cp", "ls", "mkdir", "mv", "rm", "rmdir")  # IPython's default shell aliases


def _magic(*names, cell=False):
    def register(fn):
        for name in names:
            (_cell_magics if cell else _line_magics)[name] = fn
        return fn

    return register


# The magics an error lists; the rest are IPython's other names for them.
_LISTED = ("cd", "env", "load_ext", "ls", "matplotlib", "pinfo", "pip", "pwd", "sx", "time", "timeit", "who", "whos")


def _supported():
    return "line magics: %s; cell magics: %s" % (
        ", ".join("%" + n for n in _LISTED), ", ".join("%%" + n for n in sorted(_cell_magics)))


def _compile_part(src, frame, lineno, mode):
    """Compile src (part of the cell at lineno) as the cell's own code: same file name, same
    line numbers, so tracebacks show the user's lines."""
    return compile("\n" * (lineno - 1) + src, frame.f_code.co_filename, mode, _COMPILE_FLAGS, True)


def _run_part(src, frame, lineno):
    """Run src like a cell in the caller's namespace; return (has_value, value)."""
    return exec_cell("\n" * (lineno - 1) + src, frame.f_code.co_filename, frame.f_globals, frame.f_locals)


def _format_time(seconds):
    """IPython's _format_time: three significant digits in s, ms, us or ns."""
    if seconds >= 60.0:
        parts = []
        for suffix, length in (("d", 86400), ("h", 3600), ("min", 60), ("s", 1)):
            value = int(seconds / length)
            if value > 0:
                seconds = seconds % length
                parts.append("%s%s" % (value, suffix))
        return " ".join(parts)
    units = ("s", "ms", "\xb5s", "ns")
    order = min(-int(__import__("math").floor(__import__("math").log10(seconds)) // 3), 3) if seconds > 0 else 3
    return "%.*g %s" % (3, seconds * 1000 ** order, units[order])


def _cpu_times():
    import resource

    # In-process the process is the host's: count the interpreter's thread only.
    who = resource.RUSAGE_THREAD if _native is not None else resource.RUSAGE_SELF
    r = resource.getrusage(who)
    return r.ru_utime, r.ru_stime


def _timed(run):
    t0, (u0, s0) = time.perf_counter(), _cpu_times()
    try:
        return run()
    finally:
        wall, (u1, s1) = time.perf_counter() - t0, _cpu_times()
        user, system = u1 - u0, s1 - s0
        print("CPU times: user %s, sys: %s, total: %s\nWall time: %s" % (
            _format_time(user), _format_time(system), _format_time(user + system), _format_time(wall)))


@_magic("time")
def _m_time(args, frame, lineno):
    if not args.strip():
        raise UsageError("%time needs a statement to time, such as %time sum(range(10**6))")
    has, value = _timed(lambda: _run_part(args, frame, lineno))
    return value if has else None


@_magic("time", cell=True)
def _c_time(args, cell, frame, lineno):
    has, value = _timed(lambda: _run_part(cell, frame, lineno))
    return value if has else None


class TimeitResult:
    """What %timeit -o returns (IPython's TimeitResult): loops, repeat, all_runs (seconds per
    run of `loops` loops), best, worst, average and stdev (seconds per loop)."""

    def __init__(self, loops, repeat, all_runs):
        self.loops, self.repeat, self.all_runs = loops, repeat, all_runs
        self.timings = [t / loops for t in all_runs]
        self.best, self.worst = min(self.timings), max(self.timings)
        self.average = sum(self.timings) / len(self.timings)
        self.stdev = (sum((t - self.average) ** 2 for t in self.timings) / len(self.timings)) ** 0.5

    def __str__(self):
        return "%s \xb1 %s per loop (mean \xb1 std. dev. of %d run%s, %s loop%s each)" % (
            _format_time(self.average), _format_time(self.stdev), self.repeat, "" if self.repeat == 1 else "s",
            "{:,}".format(self.loops), "" if self.loops == 1 else "s")

    def __repr__(self):
        return "<TimeitResult : %s>" % self


def _timeit(args, stmt, frame, lineno):
    import getopt
    import timeit

    try:
        opts, rest = getopt.getopt(args.split(), "n:r:oq")
    except getopt.GetoptError as exc:
        raise UsageError("%%timeit: %s (options: -n LOOPS, -r REPEAT, -o, -q)" % exc) from None
    opts = dict(opts)
    setup = " ".join(rest) if stmt is not None else "pass"
    if stmt is None:
        stmt = " ".join(rest)
    if not stmt.strip():
        raise UsageError("%timeit needs a statement to time, such as %timeit sum(range(1000))")
    try:
        number = int(opts.get("-n", 0))
        repeat = int(opts.get("-r", 7))
    except ValueError:
        raise UsageError("%timeit: -n and -r take whole numbers") from None
    ns = dict(frame.f_globals)
    if frame.f_locals is not frame.f_globals:
        ns.update(frame.f_locals)
    # Compile first, so a syntax error in the statement names the user's line.
    _compile_part(stmt, frame, lineno, "exec")
    timer = timeit.Timer(stmt, setup, globals=ns)
    if number <= 0:
        number = 1
        for index in range(10):  # IPython's rule: the first power of ten taking >= 0.2 s
            number = 10 ** index
            if timer.timeit(number) >= 0.2:
                break
    result = TimeitResult(number, max(1, repeat), timer.repeat(max(1, repeat), number))
    if "-q" not in opts:
        print(result)
    return result if "-o" in opts else None


@_magic("timeit")
def _m_timeit(args, frame, lineno):
    return _timeit(args, None, frame, lineno)


@_magic("timeit", cell=True)
def _c_timeit(args, cell, frame, lineno):
    return _timeit(args, cell, frame, lineno)


_PIP_NETWORK = ("Failed to establish a new connection", "Temporary failure in name resolution",
                "Network is unreachable", "No matching distribution found", "Could not fetch URL",
                "Name or service not known", "Connection refused", "ProxyError")


@_magic("pip")
def _m_pip(args, frame, lineno):
    import importlib
    import shlex

    argv = [sys.executable, "-m", "pip"] + shlex.split(_expand(args, frame))
    status, text = _stream_process(argv, merge=True)
    if status == 0:
        importlib.invalidate_caches()
        if argv[3:4] == ["install"]:
            print("Note: newly installed packages can be imported now; a package imported before "
                  "this install keeps its old version until the interpreter restarts.")
        return None
    if "No module named pip" in text:
        print("minipy: pip is not installed for %s, so %%pip cannot install packages here. Use the "
              "packages that are already installed, or ask the host to add them." % sys.executable)
    elif any(s in text for s in _PIP_NETWORK):
        print("minipy: pip could not reach the package index: this environment may have no network "
              "access. Use the packages that are already installed.")
    else:
        print("minipy: pip exited with status %d." % status)
    return None


@_magic("conda", "mamba")
def _m_conda(args, frame, lineno):
    raise UsageError("conda is not available here; use %pip, or the packages that are already installed")


_dir_history = []


@_magic("cd")
def _m_cd(args, frame, lineno):
    args = _expand(args, frame).strip()
    quiet = False
    if args.startswith("-q"):
        quiet, args = True, args[2:].strip()
    if args == "-":
        if not _dir_history:
            raise UsageError("%cd -: there is no previous directory")
        target = _dir_history[-1]
    else:
        target = os.path.expanduser(args or "~")
        if len(target) > 1 and target[0] == target[-1] and target[0] in "\"'":
            target = target[1:-1]
    before = os.getcwd()
    os.chdir(target)
    _dir_history.append(before)
    del _dir_history[:-100]
    if not quiet:
        print(os.getcwd())
    return None


@_magic("pwd")
def _m_pwd(args, frame, lineno):
    return os.getcwd()


@_magic("env", "set_env")
def _m_env(args, frame, lineno):
    args = args.strip()
    if not args:
        return dict(os.environ)
    if "=" in args or " " in args:
        sep = "=" if "=" in args.split(" ", 1)[0] else " "
        name, _, value = args.partition(sep)
        name, value = name.strip(), _expand(value.strip(), frame)
        if not name:
            raise UsageError("%env: a variable name comes first: %env NAME=value")
        os.environ[name] = value
        print("env: %s=%s" % (name, value))
        return None
    try:
        return os.environ[args]
    except KeyError:
        raise UsageError("environment does not have key: %s" % args) from None


def _user_names(frame, types_=None):
    space = frame.f_locals
    names = []
    for name, value in space.items():
        if name.startswith("_") or isinstance(value, HostGroup) or getattr(value, "__module__", None) == "minipy.host":
            continue
        if types_ and type(value).__name__ not in types_:
            continue
        names.append(name)
    return sorted(names)


@_magic("who", "who_ls")
def _m_who(args, frame, lineno):
    names = _user_names(frame, args.split())
    if not names:
        print("Interactive namespace is empty.")
        return None
    print("\t".join(names))
    return None


@_magic("whos")
def _m_whos(args, frame, lineno):
    names = _user_names(frame, args.split())
    if not names:
        print("Interactive namespace is empty.")
        return None
    space = frame.f_locals
    rows = []
    for name in names:
        value = space[name]
        kind = type(value).__name__
        shape = getattr(value, "shape", None)
        if isinstance(shape, tuple) and hasattr(value, "dtype"):
            info = "%s: %s elements, type `%s`, %s bytes" % (
                "x".join(str(d) for d in shape), getattr(value, "size", "?"), value.dtype, getattr(value, "nbytes", "?"))
        elif isinstance(value, types.ModuleType):
            info = "<module '%s'>" % value.__name__
        else:
            try:
                info = repr(value)
            except Exception as exc:
                info = "<repr failed: %s>" % type(exc).__name__
            info = info.replace("\n", " ")
            if len(info) > 50:
                info = info[:25] + "<...>" + info[-20:]
        rows.append((name, kind, info))
    w1 = max(8, max(len(r[0]) for r in rows)) + 3
    w2 = max(4, max(len(r[1]) for r in rows)) + 3
    lines = ["Variable".ljust(w1) + "Type".ljust(w2) + "Data/Info", "-" * (w1 + w2 + 9)]
    lines += [r[0].ljust(w1) + r[1].ljust(w2) + r[2] for r in rows]
    print("\n".join(lines))
    return None


@_magic("matplotlib")
def _m_matplotlib(args, frame, lineno):
    gui = args.strip().split(" ")[0] if args.strip() else "inline"
    if gui not in ("", "inline", "agg", "Agg"):
        print("minipy: figures always come back as images here (the inline backend); %%matplotlib %s "
              "would need a display, so it is ignored." % gui)
    return None


@_magic("load_ext", "reload_ext")
def _m_load_ext(args, frame, lineno):
    for name in args.split():
        if name != "autoreload":
            raise UsageError("%%load_ext %s: extensions are not supported here (only autoreload is "
                             "accepted, as a no-op)" % name)
    return None


@_magic("autoreload", "aimport")
def _m_autoreload(args, frame, lineno):
    return None  # accepted: every run already sees the files as they are when imported


@_magic("pinfo", "pinfo2")
def _m_pinfo(args, frame, lineno):
    return _Shell.pinfo(__minipy__, args.strip(), 2 if args.startswith("?") else 1, frame)


@_magic("sx", "system")
def _m_sx(args, frame, lineno):
    return _getoutput(_expand(args, frame))


for _alias in _ALIASES:
    _line_magics[_alias] = (lambda name: lambda args, frame, lineno: _shell_system(
        ("%s %s" % (name, _expand(args, frame))).strip(), frame))(_alias)


def _script(shell):
    def run(args, cell, frame, lineno):
        if args.strip():
            raise UsageError("%%%%%s takes no options here" % shell.rsplit("/", 1)[-1])
        status, _ = _stream_process([shell], stdin=cell)
        if status:
            print("minipy: %s exited with status %d" % (shell.rsplit("/", 1)[-1], status), file=sys.stderr)
        return None

    return run


_cell_magics["bash"] = _script("/bin/bash")
_cell_magics["sh"] = _script("/bin/sh")


@_magic("script", cell=True)
def _c_script(args, cell, frame, lineno):
    import shlex

    argv = shlex.split(_expand(args, frame))
    if not argv:
        raise UsageError("%%script needs a program, such as %%script python3")
    status, _ = _stream_process(argv, stdin=cell)
    if status:
        print("minipy: %s exited with status %d" % (argv[0], status), file=sys.stderr)
    return None


@_magic("writefile", cell=True)
def _c_writefile(args, cell, frame, lineno):
    import shlex

    parts = shlex.split(_expand(args, frame))
    append = False
    while parts and parts[0] in ("-a", "--append"):
        append, parts = True, parts[1:]
    if len(parts) != 1:
        raise UsageError("%%writefile needs one file name: %%writefile [-a] FILE")
    path = os.path.expanduser(parts[0])
    exists = os.path.exists(path)
    print("%s %s" % ("Appending to" if append else "Overwriting" if exists else "Writing", parts[0]))
    with open(path, "a" if append else "w", encoding="utf-8") as f:
        f.write(cell)
    return None


class CapturedIO:
    """What %%capture keeps (IPython's CapturedIO): .stdout and .stderr as text and .outputs,
    the displays; show() (or calling it) writes them out again."""

    def __init__(self, stdout, stderr, outputs):
        self.stdout, self.stderr, self.outputs = stdout, stderr, outputs

    def __str__(self):
        return self.stdout

    def show(self):
        sys.stdout.write(self.stdout)
        sys.stderr.write(self.stderr)

    __call__ = show


@_magic("capture", cell=True)
def _c_capture(args, cell, frame, lineno):
    flags = args.split()
    names = [a for a in flags if not a.startswith("-")]
    out, err = io.StringIO(), io.StringIO()
    saved = sys.stdout, sys.stderr
    outputs = []
    if "--no-stdout" not in flags:
        sys.stdout = out
    if "--no-stderr" not in flags:
        sys.stderr = err
    try:
        _run_part(cell, frame, lineno)
    finally:
        sys.stdout, sys.stderr = saved
    captured = CapturedIO(out.getvalue(), err.getvalue(), outputs)
    if names:
        frame.f_locals[names[0]] = captured
        if frame.f_locals is not frame.f_globals:
            frame.f_globals[names[0]] = captured
    return None


def _shell_system(cmd, frame):
    status, _ = _stream_process(cmd, shell=True, merge=True)
    frame.f_globals["_exit_code"] = status
    return None


def _getoutput(cmd):
    status, text = _stream_process(cmd, shell=True, merge=True, echo=False)
    return SList(text.splitlines())


# ---------------------------------------------------------------------------------------
# Help: obj? and obj??
# ---------------------------------------------------------------------------------------


def _pinfo_text(obj, name, detail):
    import inspect

    lines = []
    if detail > 1:
        try:
            src = inspect.getsource(obj)
        except (TypeError, OSError):
            src = None
        if src:
            lines.append("Source:\n" + src.rstrip("\n"))
    if not lines:
        try:
            sig = str(inspect.signature(obj))
        except (TypeError, ValueError):
            sig = None
        if sig is not None and callable(obj):
            lines.append("Signature: %s%s" % (name.rsplit(".", 1)[-1], sig))
        if not (callable(obj) or isinstance(obj, types.ModuleType)):
            text = value_repr(obj, 2000)
            lines.append("String form:" + ("\n" if "\n" in text else " ") + text)
        doc = inspect.getdoc(obj)
        if doc and not (not callable(obj) and type(obj).__doc__ == doc and not isinstance(obj, types.ModuleType)):
            lines.append("Docstring:" + ("\n" if "\n" in doc else " ") + doc)
        elif not doc:
            lines.append("Docstring: <no docstring>")
    try:
        path = inspect.getfile(obj if isinstance(obj, (type, types.ModuleType)) or callable(obj) else type(obj))
    except (TypeError, OSError):
        path = None
    if path and not path.startswith("<"):
        lines.append("File:      %s" % path)
    lines.append("Type:      %s" % type(obj).__name__)
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------
# __minipy__: the builtin the transformed lines call.
# ---------------------------------------------------------------------------------------


class _Shell:
    """minipy's stand-in for IPython's shell; the code IPython syntax becomes calls it."""

    def line_magic(self, name, args, lineno=1):
        fn = _line_magics.get(name)
        if fn is None:
            if name in _cell_magics:
                raise UsageError("%%%s is a cell magic: write %%%%%s on the first line of the cell" % (name, name))
            raise UsageError("Line magic function `%%%s` not found (minipy supports %s)" % (name, _supported()))
        return fn(args, sys._getframe(1), lineno)

    def cell_magic(self, name, args, cell, lineno):
        fn = _cell_magics.get(name)
        if fn is None:
            hint = " (%%%s is a line magic: write it with one %%)" % name if name in _line_magics else ""
            raise UsageError("Cell magic `%%%%%s` not found%s (minipy supports %s)" % (name, hint, _supported()))
        return fn(args, cell, sys._getframe(1), lineno)

    def cell_magic_misplaced(self, name):
        raise UsageError("%%%%%s must be on the first line of the cell: a cell magic applies to the whole cell" % name)

    def system(self, cmd):
        frame = sys._getframe(1)
        return _shell_system(_expand(cmd, frame), frame)

    def getoutput(self, cmd):
        return _getoutput(_expand(cmd, sys._getframe(1)))

    def pinfo(self, what, detail, frame=None):
        frame = frame or sys._getframe(1)
        if what.startswith("%"):
            name = what.lstrip("%")
            fn = (_cell_magics if what.startswith("%%") else _line_magics).get(name)
            print(("%s: minipy's %%%s magic" % (what, name)) if fn else "Object `%s` not found." % what)
            return None
        try:
            obj = eval(what, frame.f_globals, frame.f_locals)
        except Exception:
            print("Object `%s` not found." % what)
            return None
        print(_pinfo_text(obj, what, detail))
        return None


__minipy__ = _Shell()
builtins.__minipy__ = __minipy__
