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
            kill_processes([(p.pid, proc_start(p.pid), False)])
        for f in (p.stdin, p.stdout, p.stderr):
            if f is not None and not f.closed:
                f.close()
        _refresh_package_site()


def _refresh_package_site():
    """In a sandboxed worker, after a command that may have installed packages (!pip,
    %pip): the namespace's package site (worker.py, _package_site) is on sys.path from the
    start, but until pip makes it, the path importer remembers it as missing; and what pip
    installed may bring .pth files."""
    site_dir = os.environ.get("MINIPY_PACKAGE_SITE")
    if site_dir and os.path.isdir(site_dir):
        import importlib
        import site

        importlib.invalidate_caches()
        site.addsitedir(site_dir)


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
    the displays' bundles; show() (or calling it) writes them out again."""

    def __init__(self, stdout, stderr, outputs):
        self.stdout, self.stderr, self.outputs = stdout, stderr, outputs

    def __str__(self):
        return self.stdout

    def show(self):
        sys.stdout.write(self.stdout)
        sys.stderr.write(self.stderr)
        for bundle in self.outputs:
            _emit_display(dict(bundle))

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
    if "--no-display" not in flags:
        _display_sinks.append(outputs)
    try:
        _run_part(cell, frame, lineno)
    finally:
        sys.stdout, sys.stderr = saved
        if "--no-display" not in flags:
            _display_sinks.remove(outputs)
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


class _DisplayFormatter:
    """IPython's display_formatter, as far as minipy has one: formatters maps a MIME type to
    a callable that takes an object and returns its data of that type, or None (IPython's
    own formatters are such callables). Every display and every run's value goes through
    them, for the types its own _repr_*_ methods did not give (IsolatedConfig.Startup is
    where a deployment registers its own, as IPython's startup files do)."""

    __slots__ = ("formatters",)

    def __init__(self):
        self.formatters = {}


_Shell.display_formatter = _DisplayFormatter()
__minipy__ = _Shell()
builtins.__minipy__ = __minipy__


# ---------------------------------------------------------------------------------------
# Rich output: display(), IPython's display protocol, figures and images. A display is a
# bundle {MIME type: str or bytes}; the run's reply carries them (Result.Displays), and
# its text form goes to stdout where it happened, as a terminal IPython prints it, so the
# model's text keeps the order: an image shows as "[image N: PNG 640x480, 23 KB]".
# ---------------------------------------------------------------------------------------

_MIME_METHODS = (
    ("image/png", "_repr_png_"), ("image/jpeg", "_repr_jpeg_"), ("image/svg+xml", "_repr_svg_"),
    ("text/html", "_repr_html_"), ("text/markdown", "_repr_markdown_"), ("text/latex", "_repr_latex_"),
    ("application/json", "_repr_json_"), ("application/javascript", "_repr_javascript_"),
    ("application/pdf", "_repr_pdf_"),
)
_BINARY_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp", "application/pdf")
_PLAIN_TYPES = frozenset((int, float, complex, str, bytes, bytearray, bool, list, tuple, dict, set, frozenset,
                          type(None), range))
_rich_types = {}  # type -> whether its objects may have more than text/plain
_display_sinks = []  # %%capture's lists of bundles, innermost last


class _Displays:
    """The displays of the run in progress and its image limits (from Go's run request)."""

    __slots__ = ("bundles", "images", "max_images", "max_image_bytes", "out")

    def __init__(self):
        self.reset(-1, -1)

    def reset(self, max_images, max_image_bytes, out=None):
        # [bundle, is the run's value, its place in stdout (out.mark's, then a character
        # index into the run's stdout), the text the model reads there]
        self.bundles = []
        self.images = 0
        self.max_images = max_images
        self.max_image_bytes = max_image_bytes
        self.out = out  # the run's stdout capture, where displays are placed


_displays = _Displays()


def _is_rich(obj):
    if _Shell.display_formatter.formatters:
        return True  # (whether one gives more than text: format_bundle says)
    t = type(obj)
    if t in _PLAIN_TYPES:
        return False
    rich = _rich_types.get(t)
    if rich is None:
        rich = (any(hasattr(t, m) for _, m in _MIME_METHODS) or hasattr(t, "_repr_mimebundle_")
                or _figure_class(obj) or _pil_class(obj))
        if len(_rich_types) > 4096:
            _rich_types.clear()
        _rich_types[t] = rich
    return rich


def _figure_class(obj):
    mod = sys.modules.get("matplotlib.figure")
    return mod is not None and isinstance(obj, mod.Figure)


def _pil_class(obj):
    mod = sys.modules.get("PIL.Image")
    return mod is not None and isinstance(obj, mod.Image)


def _note(text):
    sys.stderr.write("minipy: %s\n" % text)


def format_bundle(obj, include=None, exclude=None, text=None):
    """IPython's display protocol: obj's {MIME type: data}, text/plain always included."""
    data = {}
    if _figure_class(obj):
        png = _figure_png(obj)
        if png is not None:
            data["image/png"] = png
    elif _pil_class(obj):
        data["image/png"] = _pil_png(obj)
    elif not isinstance(obj, type) and getattr(obj, "_ipython_canary_method_should_not_exist_", None) is None:
        method = getattr(obj, "_repr_mimebundle_", None)
        if callable(method):
            try:
                got = method(include=include, exclude=exclude)
                if isinstance(got, tuple):
                    got = got[0]
                if isinstance(got, dict):
                    data.update(got)
            except Exception as exc:
                _note("%s._repr_mimebundle_ failed: %s: %s" % (type(obj).__name__, type_name(type(exc)), exc))
        for mime, name in _MIME_METHODS:
            if mime in data:
                continue
            method = getattr(obj, name, None)
            if not callable(method):
                continue
            try:
                got = method()
            except NotImplementedError:
                continue
            except Exception as exc:
                _note("%s.%s failed: %s: %s" % (type(obj).__name__, name, type_name(type(exc)), exc))
                continue
            if isinstance(got, tuple):
                got = got[0]
            if got is not None:
                data[mime] = got
    _registered_formats(obj, data)
    if "text/plain" not in data:
        data["text/plain"] = text if text is not None else value_repr(obj, 64 << 10)
    return _normalize(data, include, exclude)


def _registered_formats(obj, data):
    """Adds to data what the registered formatters (__minipy__.display_formatter) give obj,
    for the MIME types it has not."""
    for mime, fmt in tuple(_Shell.display_formatter.formatters.items()):
        if mime in data or not callable(fmt):
            continue
        try:
            got = fmt(obj)
        except Exception as exc:
            _note("the %s formatter failed on %s: %s: %s" % (mime, type(obj).__name__, type_name(type(exc)), exc))
            continue
        if isinstance(got, tuple):
            got = got[0]
        if got is not None:
            data[mime] = got


def _normalize(data, include=None, exclude=None):
    import base64
    import json

    out = {}
    for mime, value in data.items():
        if not isinstance(mime, str) or (include and mime not in include and mime != "text/plain") or (
                exclude and mime in exclude):
            continue
        if mime in _BINARY_TYPES:
            if isinstance(value, str):  # IPython allows base64 text for binary types
                try:
                    value = base64.b64decode(value)
                except ValueError:
                    continue
            if not isinstance(value, (bytes, bytearray, memoryview)):
                continue
            value = bytes(value)
        elif mime == "application/json" or mime.endswith("+json"):
            if not isinstance(value, str):
                try:
                    value = json.dumps(value)
                except (TypeError, ValueError):
                    continue
        elif isinstance(value, (bytes, bytearray)):
            value = bytes(value).decode("utf-8", "replace")
        elif not isinstance(value, str):
            value = str(value)
        out[mime] = value
    return out


def _image_size(data):
    """(width, height) from a PNG, GIF or JPEG header, or None."""
    if data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) >= 24:
        return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    if data[:6] in (b"GIF87a", b"GIF89a") and len(data) >= 10:
        return int.from_bytes(data[6:8], "little"), int.from_bytes(data[8:10], "little")
    if data[:2] == b"\xff\xd8":
        i = 2
        while i + 9 < len(data):
            if data[i] != 0xFF:
                return None
            marker = data[i + 1]
            if marker in (0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF):
                return int.from_bytes(data[i + 7:i + 9], "big"), int.from_bytes(data[i + 5:i + 7], "big")
            i += 2 + int.from_bytes(data[i + 2:i + 4], "big")
    return None


def _size_text(n):
    if n >= 1 << 20:
        return "%.1f MB" % (n / (1 << 20))
    return "%d KB" % max(1, (n + 512) // 1024)


def _image_type(bundle):
    for mime in IMAGE_TYPES:
        if mime in bundle:
            return mime
    return None


def _fit_image(bundle, mime, source):
    """Apply the run's limits to bundle's image; return the text the model reads for it."""
    d = _displays
    data = bundle[mime]
    kind = mime.split("/")[1].upper()
    if 0 <= d.max_images <= d.images:
        del bundle[mime]
        return "[image not shown: a run shows at most %d image%s]" % (d.max_images, "" if d.max_images == 1 else "s")
    limit = d.max_image_bytes
    if 0 <= limit < len(data):
        smaller = _shrink(source, limit, len(data)) if source is not None else None
        if smaller is None:
            del bundle[mime]
            return "[image not shown: its %s of %s is over the limit of %s per image]" % (
                kind, _size_text(len(data)), _size_text(limit))
        data = bundle[mime] = smaller
        mime = "image/png"
        kind = "PNG"
    d.images += 1
    size = _image_size(data)
    dims = " %dx%d" % size if size else ""
    return "[image %d: %s%s, %s]" % (d.images, kind, dims, _size_text(len(data)))


def _shrink(source, limit, size):
    """A PNG of source (a figure or a PIL image, size bytes as first rendered) at most limit
    bytes, or None. The bytes shrink more slowly than the pixels (lines and text stay
    sharp), so each try scales by the root of the ratio still to go, with some margin."""
    scale = 1.0
    for _ in range(5):
        scale *= min(0.9, 0.9 * (limit / size) ** 0.5)
        if _figure_class(source):
            png = _figure_png(source, scale)
        else:
            img = source.copy()
            img.thumbnail((max(1, int(source.width * scale)), max(1, int(source.height * scale))))
            png = _pil_png(img)
        if png is None:
            return None
        if len(png) <= limit:
            return png
        size = len(png)
    return None


def _display_text(bundle):
    """The text form of a display without an image: text/plain, unless that is only an
    object's default repr and the bundle has a readable form."""
    text = bundle.get("text/plain", "")
    if not text or _re.match(r"^<[\w.]+( object)?( at 0x[0-9a-f]+)?>$", text):  # repr()'s default, IPython's
        for mime in ("text/markdown", "text/latex", "application/json", "text/html", "image/svg+xml"):
            if mime in bundle:
                return bundle[mime]
    return text


def _emit_display(bundle, source=None, result=False):
    """Record bundle as a display of the run, with its place in the run's stdout and the text
    the model reads there (Display.Caption): an image's "[image N: ...]", else its text form.
    Jupyter keeps displays out of the output stream, and so does Result.Stdout; the text goes
    to the live output alone, where a terminal would show it. The run's value has its repr
    for text: its caption is an image's marker alone, shown under the repr."""
    if _display_sinks:
        _display_sinks[-1].append(bundle)
        return
    mime = _image_type(bundle)
    text = _fit_image(bundle, mime, source) if mime else _display_text(bundle)
    out = _displays.out
    at = -1
    if result:
        text = text if mime else ""
    elif out is not None:
        at = out.mark(text if text.endswith("\n") else text + "\n")
    _displays.bundles.append([bundle, result, at, text])


def display(*objs, include=None, exclude=None, metadata=None, transient=None, display_id=None, raw=False,
            clear=False, **kwargs):
    """Show objects as a notebook does: each becomes a display of the run (its richest forms
    by IPython's display protocol: PNG, HTML, Markdown, ...), and its text form (for an
    image, "[image N: PNG WxH, S KB]") is printed where the call happened."""
    for obj in objs:
        if raw and isinstance(obj, dict):
            _emit_display(_normalize(dict(obj), include, exclude))
        else:
            source = obj if _figure_class(obj) or _pil_class(obj) else None
            _emit_display(format_bundle(obj, include, exclude), source)
            if source is not None and _figure_class(obj):
                _close_figure(obj)
    if display_id is not None:
        return DisplayHandle(display_id)
    return None


class DisplayHandle:
    """What display(..., display_id=...) returns; update() shows the object again."""

    def __init__(self, display_id=None):
        self.display_id = display_id

    def display(self, obj, **kwargs):
        display(obj, **kwargs)

    def update(self, obj, **kwargs):
        display(obj, **kwargs)


def update_display(obj, *, display_id=None, **kwargs):
    display(obj, **kwargs)


def clear_output(wait=False):
    """Accepted: a run's output is kept whole."""


# ---------------------------------------------------------------------------------------
# matplotlib: the inline backend. Figures render with Agg (no window can open); plt.show()
# and every figure still open when the run ends become PNG displays and are closed, as
# Jupyter's inline backend does. The backend is chosen when matplotlib is imported.
# ---------------------------------------------------------------------------------------

_BACKEND = "module://minipy_inline"


def _figure_png(fig, scale=1.0):
    """fig as PNG bytes (tight bounding box, as Jupyter), or None for an empty figure."""
    if not fig.axes and not fig.lines and not fig.texts and not fig.images and not fig.patches:
        return None
    buf = io.BytesIO()
    fig.canvas.print_figure(buf, format="png", bbox_inches="tight", dpi=fig.dpi * scale,
                            facecolor=fig.get_facecolor(), edgecolor=fig.get_edgecolor())
    return buf.getvalue()


def _pil_png(img):
    buf = io.BytesIO()
    if img.mode not in ("1", "L", "LA", "I", "I;16", "P", "RGB", "RGBA"):
        img = img.convert("RGBA" if "A" in img.mode else "RGB")
    img.save(buf, format="PNG")
    return buf.getvalue()


def _close_figure(fig):
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is not None:
        pyplot.close(fig)


def _show(*args, **kwargs):
    """plt.show(): every open figure becomes a display, then is closed."""
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is None:
        return
    from matplotlib._pylab_helpers import Gcf

    for manager in list(Gcf.get_all_fig_managers()):
        fig = manager.canvas.figure
        display(fig)


def flush_figures(skip=None):
    """At the end of a run: the figures still open become displays (skip, the run's value,
    is shown as that), then all are closed."""
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is None:
        return
    from matplotlib._pylab_helpers import Gcf

    try:
        for manager in list(Gcf.get_all_fig_managers()):
            fig = manager.canvas.figure
            if fig is not skip:
                display(fig)
    except Exception as exc:  # never hides the cell's own error
        _note("showing the open figures failed: %s: %s" % (type_name(type(exc)), exc))
    finally:
        pyplot.close("all")


def _inline_backend():
    mod = types.ModuleType("minipy_inline", "minipy's matplotlib backend: Agg, figures shown as PNG displays.")
    from matplotlib.backend_bases import FigureManagerBase
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    mod.FigureCanvas = FigureCanvasAgg
    mod.FigureManager = FigureManagerBase
    mod.show = _show

    def new_figure_manager(num, *args, FigureClass=None, **kwargs):
        from matplotlib.figure import Figure

        fig = (FigureClass or Figure)(*args, **kwargs)
        return new_figure_manager_given_figure(num, fig)

    def new_figure_manager_given_figure(num, figure):
        return FigureManagerBase(FigureCanvasAgg(figure), num)

    mod.new_figure_manager = new_figure_manager
    mod.new_figure_manager_given_figure = new_figure_manager_given_figure
    return mod


_NON_INTERACTIVE = ("agg", "cairo", "pdf", "pgf", "ps", "svg", "template")


def _after_matplotlib(mpl):
    """Once matplotlib is imported: use the inline backend, and keep it (matplotlib.use of
    a GUI backend would open windows; it is refused with a note)."""
    os.environ.setdefault("MPLBACKEND", "Agg")  # child Pythons render without a display too
    mpl.rcParams["backend"] = _BACKEND
    real_use = mpl.use

    def use(backend, *args, **kwargs):
        name = str(backend).lower()
        if name in _NON_INTERACTIVE or name.startswith("module://minipy"):
            return real_use(backend, *args, **kwargs) if name != "agg" else None
        _note("matplotlib.use(%r) ignored: figures come back as images here" % backend)

    use.__doc__ = real_use.__doc__
    mpl.use = use


# ---------------------------------------------------------------------------------------
# Imports that minipy adjusts: a finder that runs a hook after a module's own code (matplotlib
# above, IPython.display below) and provides modules that are not installed (the backend,
# and IPython.display's names when IPython is missing).
# ---------------------------------------------------------------------------------------


class _PostImport:
    """A meta path finder in front: for the hooked names it finds the module with the other
    finders and runs the hook once the module has loaded."""

    def __init__(self, hooks):
        self.hooks = hooks
        self.busy = set()

    def find_spec(self, name, path=None, target=None):
        hook = self.hooks.get(name)
        if hook is None or name in self.busy:
            return None
        import importlib.util

        self.busy.add(name)
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        finally:
            self.busy.discard(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader

        def exec_module(module):
            loader.exec_module(module)
            hook(module)

        spec.loader = _HookedLoader(loader, exec_module)
        return spec


class _HookedLoader:
    def __init__(self, loader, exec_module):
        self._loader = loader
        self.exec_module = exec_module

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def __getattr__(self, name):
        return getattr(self._loader, name)


class _Provided:
    """A meta path finder at the end: modules minipy makes when nothing else provides them."""

    def __init__(self, makers):
        self.makers = makers

    def find_spec(self, name, path=None, target=None):
        if name not in self.makers:
            return None
        import importlib.machinery

        return importlib.machinery.ModuleSpec(name, self, is_package=name in ("IPython", "IPython.core"))

    def create_module(self, spec):
        return self.makers[spec.name]()

    def exec_module(self, module):
        pass


def _after_ipython_display(mod):
    # Outside an IPython shell, IPython's own display() prints text only: use minipy's.
    mod.display = display
    mod.clear_output = clear_output
    mod.update_display = update_display


def _package(name, doc):
    mod = types.ModuleType(name, doc)
    mod.__path__ = []
    return mod


def _ipython_stand_in():
    mod = _package("IPython", "minipy's stand-in for IPython (not installed here): display and its objects.")
    mod.get_ipython = lambda: None
    mod.display = display
    return mod


class _DisplayObject:
    """IPython.display's objects, for when IPython is not installed: data (or a url or
    file name to read it from) shown as one MIME type."""

    _mime = "text/plain"

    def __init__(self, data=None, url=None, filename=None, metadata=None, **kwargs):
        if data is not None and isinstance(data, str) and filename is None and url is None and len(data) < 4096 \
                and self._mime in _BINARY_TYPES and os.path.exists(data):
            filename, data = data, None
        if filename is not None:
            with open(filename, "rb" if self._mime in _BINARY_TYPES else "r") as f:
                data = f.read()
        if url is not None and data is None:
            raise ValueError("minipy's %s cannot fetch a url; pass data or a file name" % type(self).__name__)
        self.data, self.url, self.filename, self.metadata = data, url, filename, metadata

    def _repr_mimebundle_(self, include=None, exclude=None):
        return {self._mime: self.data, "text/plain": self._text()}

    def _text(self):
        return "<%s.%s object>" % (type(self).__module__, type(self).__name__)

    def __repr__(self):
        return self._text()


def _display_classes():
    def make(name, mime, text=None):
        cls = type(name, (_DisplayObject,), {"_mime": mime, "__module__": "IPython.core.display"})
        if text is not None:
            cls._text = text
        return cls

    def image_init(self, data=None, url=None, filename=None, format=None, embed=None, width=None, height=None,
                   **kwargs):
        if isinstance(data, (bytes, bytearray)) and format is None:
            format = "jpeg" if bytes(data[:2]) == b"\xff\xd8" else "gif" if bytes(data[:3]) == b"GIF" else "png"
        name = filename or (data if isinstance(data, str) else "") or url or ""
        if format is None:
            format = "jpeg" if name.lower().endswith((".jpg", ".jpeg")) else "gif" if name.lower().endswith(".gif") \
                else "png"
        self._mime = "image/" + ("jpeg" if format in ("jpg", "jpeg") else format)
        self.width, self.height = width, height
        _DisplayObject.__init__(self, data, url, filename)

    classes = {
        "HTML": make("HTML", "text/html"),
        "Markdown": make("Markdown", "text/markdown", lambda self: str(self.data)),
        "Latex": make("Latex", "text/latex", lambda self: str(self.data)),
        "Math": make("Math", "text/latex", lambda self: str(self.data)),
        "SVG": make("SVG", "image/svg+xml"),
        "JSON": make("JSON", "application/json"),
        "Javascript": make("Javascript", "application/javascript"),
        "Pretty": make("Pretty", "text/plain", lambda self: str(self.data)),
        "Image": make("Image", "image/png"),
    }
    classes["Image"].__init__ = image_init
    classes["Math"]._repr_mimebundle_ = lambda self, include=None, exclude=None: {
        "text/latex": "$\\displaystyle %s$" % str(self.data).strip("$"), "text/plain": str(self.data)}
    return classes


def _ipython_display_stand_in():
    mod = types.ModuleType("IPython.display", "minipy's stand-in for IPython.display.")
    mod.__dict__.update(_display_classes())
    mod.display = display
    mod.clear_output = clear_output
    mod.update_display = update_display
    mod.DisplayHandle = DisplayHandle
    mod.DisplayObject = _DisplayObject
    return mod


def _install_notebook():
    builtins.display = display
    sys.meta_path.insert(0, _PostImport({"matplotlib": _after_matplotlib, "IPython.display": _after_ipython_display,
                                         "IPython.core.display_functions": _after_ipython_display}))
    sys.meta_path.append(_Provided({
        "minipy_inline": _inline_backend,
        "IPython": _ipython_stand_in,
        "IPython.core": lambda: _package("IPython.core", "minipy's stand-in for IPython.core."),
        "IPython.display": _ipython_display_stand_in,
        "IPython.core.display": _ipython_display_stand_in,
    }))
