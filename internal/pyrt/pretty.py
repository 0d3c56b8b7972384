
# ---------------------------------------------------------------------------------------
# The value's text as IPython shows it (text/plain): IPython's pretty printer, rewritten for
# what a run's value needs (issue 38), without IPython in the worker. pyrt.go appends this
# file to the runtime's module: its names start with _pretty, but for pretty_text.
#
# The rules are IPython 8's (IPython.lib.pretty, with the display formatter's settings:
# lines of 79 columns, 1,000 items of a sequence, then "..."). Line breaking is the
# Wadler/Oppen layout IPython uses: text goes into a buffer of pieces and breakables, each
# breakable belonging to the innermost group open when it was added; when a line would pass
# the width, the outermost group that still has breakables is broken (all its breakables
# become newlines, indented as they were when added). testdata/pretty/goldens.json holds
# IPython's own output for each rule (scripts/pretty-goldens), which test_pretty.py and
# pretty_test.go compare with.
# ---------------------------------------------------------------------------------------

import collections as _pretty_collections
import contextlib as _pretty_contextlib
import types as _pretty_pytypes

_PRETTY_WIDTH = 79
_PRETTY_MAX_SEQ = 1000  # IPython's max_seq_length: items shown per container


class _PrettyFull(BaseException):
    """The text passed its budget: pretty_text gives repr() to be cut instead. Not an
    Exception, which a _repr_pretty_'s own "except Exception" would swallow and go on."""


class _PrettyGroup:
    __slots__ = ("depth", "breakables", "want_break")

    def __init__(self, depth):
        self.depth = depth
        self.breakables = _pretty_collections.deque()
        self.want_break = False


class _PrettyText:
    __slots__ = ("parts", "width")

    def __init__(self):
        self.parts = []
        self.width = 0

    def emit(self, p, column):
        p._write("".join(self.parts))
        return column + self.width


class _PrettyBreakable:
    __slots__ = ("sep", "width", "indent", "group")

    def __init__(self, sep, indent, group):
        self.sep = sep
        self.width = len(sep)
        self.indent = indent
        self.group = group

    def emit(self, p, column):
        group = self.group
        group.breakables.popleft()
        if group.want_break:
            p._write(p.newline + " " * self.indent)
            return self.indent
        if not group.breakables:
            p._dequeue_group(group)
        p._write(self.sep)
        return column + self.width


def _pretty_safe_getattr(obj, name, default=None):
    try:
        return getattr(obj, name, default)
    except Exception:
        return default


class _PrettyPrinter:
    """The printer a _repr_pretty_(self, p, cycle) method gets: IPython's
    RepresentationPrinter API (text, breakable, break_, begin_group, end_group, group, indent,
    pretty; indentation, max_width, max_seq_length, newline, output_width, verbose)."""

    def __init__(self, budget=-1, max_width=_PRETTY_WIDTH, max_seq_length=_PRETTY_MAX_SEQ, newline="\n"):
        self.max_width = max_width
        self.max_seq_length = max_seq_length
        self.newline = newline
        self.verbose = False
        self.output_width = 0  # the column the written output has reached
        self.buffer_width = 0
        self.buffer = _pretty_collections.deque()
        self.indentation = 0
        self.stack = []  # ids of the objects being printed, outermost first (cycles)
        self._parts = []
        self._budget = budget
        self._size = 0
        root = _PrettyGroup(0)
        self.group_stack = [root]
        self._levels = [[root]]  # the open groups by depth, which a long line breaks

    # -- output ---------------------------------------------------------------------------

    def _write(self, s):
        self._parts.append(s)

    def _count(self, n):
        self._size += n
        if 0 <= self._budget < self._size:
            raise _PrettyFull

    def getvalue(self):
        self.flush()
        return "".join(self._parts)

    # -- the groups a long line breaks --------------------------------------------------------

    def _enqueue_group(self, group):
        while len(self._levels) <= group.depth:
            self._levels.append([])
        self._levels[group.depth].append(group)

    def _dequeue_group(self, group):
        try:
            self._levels[group.depth].remove(group)
        except ValueError:
            pass

    def _outermost_group(self):
        """The group to break next: of the outermost depth with a group that has breakables,
        the last such group. Groups of a depth without breakables are marked broken and
        forgotten on the way (a breakable added to them later is a newline)."""
        for level in self._levels:
            for i, group in enumerate(reversed(level)):
                if group.breakables:
                    # IPython removes the entry at index i counted from the front, not the
                    # group it returns; done the same, so that lines break where IPython's do.
                    del level[i]
                    group.want_break = True
                    return group
            for group in level:
                group.want_break = True
            del level[:]
        return None

    def _break_group(self, group):
        """Write out the buffer up to the group's last breakable (now newlines), and the text
        that follows it."""
        buf = self.buffer
        while group.breakables:
            item = buf.popleft()
            self.output_width = item.emit(self, self.output_width)
            self.buffer_width -= item.width
        while buf and type(buf[0]) is _PrettyText:
            item = buf.popleft()
            self.output_width = item.emit(self, self.output_width)
            self.buffer_width -= item.width

    def _fit(self):
        while self.max_width < self.output_width + self.buffer_width:
            group = self._outermost_group()
            if group is None:
                return
            self._break_group(group)

    def _newline(self):
        self.flush()
        self._write(self.newline + " " * self.indentation)
        self._count(len(self.newline) + self.indentation)
        self.output_width = self.indentation
        self.buffer_width = 0

    # -- the API of _repr_pretty_ ---------------------------------------------------------

    def text(self, obj):
        """Literal text."""
        width = len(obj)
        self._count(width)
        buf = self.buffer
        if buf:
            last = buf[-1]
            if type(last) is not _PrettyText:
                last = _PrettyText()
                buf.append(last)
            last.parts.append(obj)
            last.width += width
            self.buffer_width += width
            self._fit()
        else:
            self._write(obj)
            self.output_width += width

    def breakable(self, sep=" "):
        """sep, or a newline at the current indentation if the group is broken."""
        group = self.group_stack[-1]
        if group.want_break:
            self._newline()
            return
        item = _PrettyBreakable(sep, self.indentation, group)
        group.breakables.append(item)
        self.buffer.append(item)
        self.buffer_width += item.width
        self._count(item.width)
        self._fit()

    def break_(self):
        """A newline, always (the outermost breakable group breaks first)."""
        group = self._outermost_group()
        if group is not None:
            self._break_group(group)
        self._newline()

    def begin_group(self, indent=0, open=""):
        if open:
            self.text(open)
        group = _PrettyGroup(self.group_stack[-1].depth + 1)
        self.group_stack.append(group)
        self._enqueue_group(group)
        self.indentation += indent

    def end_group(self, dedent=0, close=""):
        self.indentation -= dedent
        group = self.group_stack.pop()
        if not group.breakables:
            self._dequeue_group(group)
        if close:
            self.text(close)

    @_pretty_contextlib.contextmanager
    def group(self, indent=0, open="", close=""):
        self.begin_group(indent, open)
        try:
            yield
        finally:
            self.end_group(indent, close)

    @_pretty_contextlib.contextmanager
    def indent(self, indent):
        self.indentation += indent
        try:
            yield
        finally:
            self.indentation -= indent

    def flush(self):
        # IPython adds each piece's end column to output_width (not sets it): a
        # _repr_pretty_ that calls p.flush() sees, and breaks by, the same inflated column.
        for item in self.buffer:
            self.output_width += item.emit(self, self.output_width)
        self.buffer.clear()
        self.buffer_width = 0

    def _enumerate(self, seq):
        """enumerate(seq), ending with ", ..." after max_seq_length items."""
        limit = self.max_seq_length
        for i, x in enumerate(seq):
            if limit and i >= limit:
                self.text(",")
                self.breakable()
                self.text("...")
                return
            yield i, x

    def pretty(self, obj):
        """Print obj by the first rule that matches: the singletons' repr, then for each
        class of its MRO a printer of the class's own, by type or by name, a
        _repr_pretty_ or a __repr__ the class defines; else the default <module.Class at 0x...>."""
        ident = id(obj)
        cycle = ident in self.stack
        self.stack.append(ident)
        self.begin_group()
        try:
            if obj is None or obj is True or obj is False or obj is Ellipsis or obj is NotImplemented:
                return _pretty_repr(obj, self, cycle)
            cls = _pretty_safe_getattr(obj, "__class__") or type(obj)
            for c in _pretty_mro(cls):
                printer = _pretty_types.get(c)
                if printer is None:
                    key = (_pretty_safe_getattr(c, "__module__"), _pretty_safe_getattr(c, "__name__"))
                    try:
                        printer = _pretty_by_name.get(key)
                    except TypeError:  # a name that cannot be hashed
                        printer = None
                if printer is not None:
                    return printer(obj, self, cycle)
                attrs = c.__dict__
                if "_repr_pretty_" in attrs:
                    method = c._repr_pretty_
                    if callable(method):
                        return method(obj, self, cycle)
                if c is not object and callable(attrs.get("__repr__")):
                    return _pretty_repr(obj, self, cycle)
            return _pretty_default(obj, self, cycle)
        finally:
            self.end_group()
            self.stack.pop()


def _pretty_mro(cls):
    mro = _pretty_safe_getattr(cls, "__mro__")
    return mro if isinstance(mro, tuple) else (cls,)


# -- printers -----------------------------------------------------------------------------

def _pretty_repr(obj, p, cycle):
    """repr(obj), its lines kept (each further one at the current indentation)."""
    with p.group():
        for i, line in enumerate(repr(obj).splitlines()):
            if i:
                p.break_()
            p.text(line)


def _pretty_default(obj, p, cycle):
    cls = _pretty_safe_getattr(obj, "__class__") or type(obj)
    if _pretty_safe_getattr(cls, "__repr__") is not object.__repr__:
        return _pretty_repr(obj, p, cycle)
    p.begin_group(1, "<")
    p.pretty(cls)
    p.text(" at 0x%x" % id(obj))
    if cycle:
        p.text(" ...")
    p.end_group(1, ">")


def _pretty_sequence(open, close):
    def printer(obj, p, cycle):
        if cycle:
            return p.text(open + "..." + close)
        p.begin_group(len(open), open)
        for i, x in p._enumerate(obj):
            if i:
                p.text(",")
                p.breakable()
            p.pretty(x)
        if len(obj) == 1 and isinstance(obj, tuple):
            p.text(",")
        p.end_group(len(open), close)
    return printer


def _pretty_sorted(items):
    """Sorted if the items compare, else by their str(), else as they come."""
    items = list(items)
    for key in (None, str):
        try:
            return sorted(items, key=key)
        except Exception:
            pass
    return items


def _pretty_set(open, close):
    def printer(obj, p, cycle):
        if cycle:
            return p.text(open + "..." + close)
        if not len(obj):
            return p.text(type(obj).__name__ + "()")
        p.begin_group(len(open), open)
        # Sorted, unless there are so many that only the first max_seq_length are shown.
        items = obj if p.max_seq_length and len(obj) >= p.max_seq_length else _pretty_sorted(obj)
        for i, x in p._enumerate(items):
            if i:
                p.text(",")
                p.breakable()
            p.pretty(x)
        p.end_group(len(open), close)
    return printer


def _pretty_dict(open, close):
    def printer(obj, p, cycle):
        if cycle:
            return p.text("{...}")
        p.begin_group(len(open), open)
        for i, key in p._enumerate(obj.keys()):
            if i:
                p.text(",")
                p.breakable()
            p.pretty(key)
            p.text(": ")
            p.pretty(obj[key])
        p.end_group(len(open), close)
    return printer


class _PrettyRaw:
    """Text printed as it is (p.pretty(_PrettyRaw(s)) is p.text(s), in a group of its own)."""

    def __init__(self, text):
        self.text = text

    def _repr_pretty_(self, p, cycle):
        p.text(self.text)


class _PrettyCall:
    """name(arg, ..., key=value, ...), broken like a container."""

    def __init__(self, name, args=(), kwargs=None):
        self.name, self.args, self.kwargs = name, args, kwargs or {}

    def _repr_pretty_(self, p, cycle):
        prefix = self.name + "("
        with p.group(len(prefix), prefix, ")"):
            items = [(None, a) for a in self.args] + list(self.kwargs.items())
            for i, (name, value) in enumerate(items):
                if i:
                    p.text(",")
                    p.breakable()
                if name is None:
                    p.pretty(value)
                else:
                    with p.group(len(name) + 1, name + "="):
                        p.pretty(value)


def _pretty_call_of(obj, p, cycle, *args, **kwargs):
    name = obj.__class__.__name__
    if cycle:
        return p.pretty(_PrettyCall(name, (_PrettyRaw("..."),)))
    p.pretty(_PrettyCall(name, args, kwargs))


def _pretty_type(obj, p, cycle):
    # A metaclass's own __repr__ wins; type's gives module.qualname (builtins left out).
    if [c for c in _pretty_mro(type(obj)) if "__repr__" in vars(c)][:1] != [type]:
        return _pretty_repr(obj, p, cycle)
    module = _pretty_safe_getattr(obj, "__module__")
    try:
        name = obj.__qualname__
        if not isinstance(name, str):
            raise TypeError
    except Exception:
        name = obj.__name__
        if not isinstance(name, str):
            name = "<unknown type>"
    p.text(name if module in (None, "__builtin__", "builtins", "exceptions") else module + "." + name)


def _pretty_function(obj, p, cycle):
    import inspect

    name = _pretty_safe_getattr(obj, "__qualname__", obj.__name__)
    module = obj.__module__
    if module and module not in ("__builtin__", "builtins", "exceptions"):
        name = module + "." + name
    try:
        name += str(inspect.signature(obj))
    except (ValueError, TypeError):  # no signature (many builtins)
        pass
    p.text("<function %s>" % name)


def _pretty_exception(obj, p, cycle):
    cls = obj.__class__
    name = getattr(cls, "__qualname__", cls.__name__)
    if cls.__module__ not in ("exceptions", "builtins"):
        name = "%s.%s" % (cls.__module__, name)
    p.pretty(_PrettyCall(name, tuple(getattr(obj, "args", ()))))


def _pretty_super(obj, p, cycle):
    p.begin_group(8, "<super: ")
    p.pretty(obj.__thisclass__)
    p.text(",")
    p.breakable()
    p.pretty(obj.__self__)
    p.end_group(8, ">")


class _PrettyReFlags:
    def __init__(self, value):
        self.value = value

    def _repr_pretty_(self, p, cycle):
        import re

        names = [n for n in ("TEMPLATE", "IGNORECASE", "LOCALE", "MULTILINE", "DOTALL", "UNICODE", "VERBOSE", "DEBUG")
                 if self.value & getattr(re, n, 0)]
        p.text("|".join("re." + n for n in names))


def _pretty_pattern(obj, p, cycle):
    text = repr(obj.pattern)
    prefix = "r"
    if text[:1] in "uU":
        text, prefix = text[1:], "ur"
    args = (_PrettyRaw(prefix + text.replace("\\\\", "\\")),)
    if obj.flags:
        args += (_PrettyReFlags(obj.flags),)
    p.pretty(_PrettyCall("re.compile", args))


def _pretty_namespace(obj, p, cycle):
    if cycle:
        return p.pretty(_PrettyCall("namespace", (_PrettyRaw("..."),)))
    p.pretty(_PrettyCall("namespace", (), obj.__dict__))


def _pretty_types_table():
    import datetime
    import os
    import re

    table = {
        int: _pretty_repr,
        float: _pretty_repr,
        str: _pretty_repr,
        bytes: _pretty_repr,
        range: _pretty_repr,
        slice: _pretty_repr,
        tuple: _pretty_sequence("(", ")"),
        list: _pretty_sequence("[", "]"),
        dict: _pretty_dict("{", "}"),
        set: _pretty_set("{", "}"),
        frozenset: _pretty_set("frozenset({", "})"),
        _pretty_pytypes.MappingProxyType: _pretty_dict("mappingproxy({", "})"),
        super: _pretty_super,
        type(re.compile("")): _pretty_pattern,
        type: _pretty_type,
        _pretty_pytypes.FunctionType: _pretty_function,
        _pretty_pytypes.BuiltinFunctionType: _pretty_function,
        _pretty_pytypes.MethodType: _pretty_repr,
        _pretty_pytypes.SimpleNamespace: _pretty_namespace,
        datetime.datetime: _pretty_repr,
        datetime.timedelta: _pretty_repr,
        BaseException: _pretty_exception,
    }
    if type(os.environ) is not dict:
        table[type(os.environ)] = _pretty_dict("environ{", "}")
    return table


_pretty_types = _pretty_types_table()

# Printers of classes found by (module, name), which need not be imported to be known.
_pretty_by_name = {
    ("collections", "defaultdict"):
        lambda obj, p, cycle: _pretty_call_of(obj, p, cycle, obj.default_factory, dict(obj)),
    ("collections", "OrderedDict"):
        lambda obj, p, cycle: _pretty_call_of(obj, p, cycle, *([list(obj.items())] if len(obj) else [])),
    ("collections", "deque"):
        lambda obj, p, cycle: _pretty_call_of(obj, p, cycle, list(obj), **(
            {"maxlen": obj.maxlen} if obj.maxlen is not None else {})),
    ("collections", "Counter"):
        lambda obj, p, cycle: _pretty_call_of(obj, p, cycle, *([dict(obj)] if len(obj) else [])),
    ("collections", "UserList"): lambda obj, p, cycle: _pretty_call_of(obj, p, cycle, obj.data),
}


# Types whose text is their repr() in IPython's rules, and which hold no other object. A
# list, tuple or dict of them that fits on a line is its repr() too: the printer, some
# microseconds a value, would only make the same text (most values a run ends with).
_pretty_atoms = frozenset((int, float, complex, str, bytes, bool, type(None)))


def pretty_text(obj, limit=-1):
    """obj as IPython shows it (text/plain). A text past 4 * limit + 4096 characters (limit
    >= 0) is not made whole: repr(obj) is given instead, for the caller to cut to its head
    and tail, as it is a value nested too deep for the printer's recursion."""
    cls = type(obj)
    if cls in _pretty_atoms:
        return repr(obj)
    if (cls is list or cls is tuple or cls is dict) and len(obj) <= 40:
        atoms = _pretty_atoms
        items = obj.items() if cls is dict else ((x, None) for x in obj)
        if all(type(k) in atoms and type(v) in atoms for k, v in items):
            text = repr(obj)
            if len(text) <= _PRETTY_WIDTH:
                return text
    p = _PrettyPrinter(budget=4 * limit + 4096 if limit >= 0 else -1)
    try:
        p.pretty(obj)
        return p.getvalue()
    except (_PrettyFull, RecursionError):
        return repr(obj)
