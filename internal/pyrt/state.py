# ---------------------------------------------------------------------------------------
# Saving and restoring a namespace (Namespace.Save and Restore in Go; docs/state.md). The
# variables are one pickle (protocol 5) made by _SpacePickler, which pickles by value what
# the namespace's cells made, so that another process can rebuild it:
#
#   - functions and lambdas whose globals are the namespace: their code (marshal: a
#     restore needs the same Python minor version, which Go checks), closure, defaults and
#     attributes, with the namespace itself as their globals (a persistent id that the
#     restoring side resolves to its own namespace), so that a restored function sees the
#     variables that later cells bind, as the original did;
#   - classes made by its cells (no module holds them): their bases, metaclass and body;
#     their instances pickle as usual, against the rebuilt class;
#   - modules by name (imported again on restore).
#
# Everything else is plain pickle: numpy arrays, pandas frames, instances of library
# classes. A value that cannot be pickled (a generator, an open file, a socket, a lock, a
# thread) is skipped, by name, with the reason. Host functions are the host's, not data:
# their names are kept, and a restored namespace binds a stand-in under each name the host
# has not registered again, which says so when called.
#
# Libraries such as cloudpickle pickle a function by value with a fresh dict of the
# globals it uses; a function here must keep the namespace as its globals, which none does,
# and a worker's Python (a user's venv) need not have them. This file is appended to the
# runtime, whose names it uses.
# ---------------------------------------------------------------------------------------

import importlib as _importlib
import marshal as _marshal

# pickle is imported when a namespace is first saved or restored: importing it (and re,
# which it imports) costs a worker's start 15-40 ms on a small VM.
_STATE_PROTOCOL = 5
_SPACE_ID = "minipy.namespace"


def _is_host(value):
    """Whether value is a host function or a group of them (Namespace.Register)."""
    return isinstance(value, HostGroup) or (
        isinstance(value, types.FunctionType) and value.__module__ == "minipy.host")


def _made_here(cls, space):
    """Whether class (or function) cls was made by a cell of namespace space: its module is
    the namespace's name, and no module of that name holds it under its qualified name."""
    if cls.__module__ != space.get("__name__"):
        return False
    held = sys.modules.get(cls.__module__)
    for part in cls.__qualname__.split("."):
        held = getattr(held, part, None)
    return held is not cls


class _Empty:
    """The content of a closure cell that was empty when it was saved."""

    __slots__ = ()


def _new_function(code, space, name, ncells, module=None):
    """A function made again: its globals are the namespace's, or module's when it was made
    by another module's code (reprlib's wrapper around a dataclass's __repr__)."""
    globs = vars(_importlib.import_module(module)) if module else space
    return types.FunctionType(_marshal.loads(code), globs, name, None,
                              tuple(types.CellType() for _ in range(ncells)) or None)


def _set_function_state(fn, state):
    qualname, defaults, kwdefaults, doc, annotations, attrs, module, cells = state
    fn.__qualname__, fn.__defaults__, fn.__kwdefaults__, fn.__doc__ = qualname, defaults, kwdefaults, doc
    fn.__annotations__, fn.__module__ = annotations, module
    fn.__dict__.update(attrs)
    for cell, value in zip(fn.__closure__ or (), cells):
        if not isinstance(value, _Empty):
            cell.cell_contents = value
    return fn


def _new_class(meta, name, bases, skeleton):
    return types.new_class(name, bases, {"metaclass": meta}, lambda body: body.update(skeleton))


def _set_class_state(cls, attrs):
    for key, value in attrs.items():
        setattr(cls, key, value)
    return cls


def _new_enum(meta, name, bases, members, skeleton):
    # Enum's functional API, on the enum base (its mixin type first, as in the class's bases).
    kw = {"module": skeleton["__module__"], "qualname": skeleton["__qualname__"]}
    if len(bases) > 1:
        kw["type"] = bases[0]
    return bases[-1](name, list(members.items()), **kw)


def _mapping_proxy(d):
    return types.MappingProxyType(d)  # (its class has no name pickle can find)


# What the class body made that type() makes again, or that cannot be set afterwards.
_CLASS_MADE = ("__dict__", "__weakref__", "__module__", "__qualname__", "__slots__", "__doc__")

# Where a class keeps its annotations: a plain dict until 3.13; from 3.14 (PEP 649/749) a
# function that closes over the class's own dict, and a cache of what it returned, neither
# of which can be saved by value. A class saves the plain dict they evaluate to instead
# (_plain_annotations), set again as __annotations__ on restore.
_ANNOTATIONS = ("__annotations__", "__annotate__", "__annotate_func__", "__annotations_cache__")


def _plain_annotations(cls):
    """cls's own annotations as a plain dict; names that do not resolve (a forward
    reference) are kept as annotationlib's forward references where it exists (3.14+)."""
    try:
        return dict(cls.__annotations__)
    except Exception:
        try:
            import annotationlib

            return dict(annotationlib.get_annotations(cls, format=annotationlib.Format.FORWARDREF))
        except Exception:
            return {}


_picklers = None
_pickle = None  # the pickle module, once _state_picklers has imported it


class _SpacePicklerBase:
    """The pickler of a namespace's values, less its base class: _state_picklers makes it a
    pickle.Pickler when pickle is first needed."""

    def __init__(self, file, space):
        _pickle.Pickler.__init__(self, file, protocol=_STATE_PROTOCOL)
        self.space = space
        self.held = {}  # type -> {id: name} of the instances its module holds

    def persistent_id(self, obj):
        return _SPACE_ID if obj is self.space else None

    def reducer_override(self, obj):
        if type(obj) is types.FunctionType:
            # (Functions that a cell's code made elsewhere, such as a dataclass's __init__,
            # whose globals are the __main__ module's, get the namespace as theirs.)
            if obj.__globals__ is self.space or _made_here(obj, self.space):
                return self._function(obj)
            return NotImplemented
        if isinstance(obj, types.ModuleType):
            if _is_host(obj):
                raise _pickle.PicklingError("host functions are the host's")
            if sys.modules.get(obj.__name__) is not obj:
                raise _pickle.PicklingError("module %s cannot be imported by its name" % obj.__name__)
            return _importlib.import_module, (obj.__name__,)
        if isinstance(obj, type) and _made_here(obj, self.space):
            return self._class(obj)
        if type(obj) is property:
            return property, (obj.fget, obj.fset, obj.fdel, obj.__doc__)
        if type(obj) in (classmethod, staticmethod):
            return type(obj), (obj.__func__,)
        if type(obj) is types.MappingProxyType:
            return _mapping_proxy, (dict(obj),)
        return self._held(obj)

    def _held(self, obj):
        """A module's own object (dataclasses.MISSING, a logger, an enum member) by
        reference: code compares such objects by identity."""
        t = type(obj)
        if isinstance(obj, (type, types.BuiltinFunctionType)) or t.__module__ == "builtins":
            return NotImplemented  # (pickle saves classes and built-in functions by name already)
        held = self.held.get(t)
        if held is None:
            held = {}
            mod = sys.modules.get(getattr(t, "__module__", None) or "")
            if mod is not None and t.__module__ != self.space.get("__name__"):
                held = {id(v): k for k, v in list(vars(mod).items()) if type(v) is t}
            self.held[t] = held
        name = held.get(id(obj))
        if name is None:
            return NotImplemented
        return getattr, (sys.modules[t.__module__], name)

    def _function(self, fn):
        code = fn.__code__
        cells = []
        for cell in fn.__closure__ or ():
            try:
                cells.append(cell.cell_contents)
            except ValueError:
                cells.append(_Empty())
        state = (fn.__qualname__, fn.__defaults__, fn.__kwdefaults__, fn.__doc__, fn.__annotations__,
                 fn.__dict__, fn.__module__, cells)
        # Globals of a module that is not the namespace's (a wrapper that functools.wraps
        # gave the namespace's __module__: reprlib.recursive_repr's) are that module's.
        globs, module = fn.__globals__, None
        name = globs.get("__name__")
        if globs is not self.space and name != self.space.get("__name__") and \
                getattr(sys.modules.get(name), "__dict__", None) is globs:
            module = name
        args = (_marshal.dumps(code), self.space, fn.__name__, len(code.co_freevars))
        # The state comes after the function is made and memoized: a recursive closure, or a
        # default that refers to the function, finds it.
        return (_new_function, args + ((module,) if module else ()), state, None, None, _set_function_state)

    def _class(self, cls):
        import enum

        own = vars(cls)
        attrs = {k: v for k, v in own.items() if k not in _CLASS_MADE + _ANNOTATIONS}
        if any(k in own for k in _ANNOTATIONS):
            attrs["__annotations__"] = _plain_annotations(cls)
        skeleton = {"__module__": cls.__module__, "__qualname__": cls.__qualname__}
        if "__doc__" in vars(cls):
            skeleton["__doc__"] = cls.__doc__
        slots = vars(cls).get("__slots__")
        if slots is not None:
            skeleton["__slots__"] = slots
            for name in [slots] if isinstance(slots, str) else slots:
                attrs.pop(name, None)  # the member descriptors: made again from __slots__
        if isinstance(cls, enum.EnumMeta):
            members = {name: member.value for name, member in cls.__members__.items()}
            attrs = {k: v for k, v in attrs.items()
                     if k not in members and not k.startswith("_") and not isinstance(v, cls)}
            return (_new_enum, (type(cls), cls.__name__, cls.__bases__, members, skeleton), attrs,
                    None, None, _set_class_state)
        return (_new_class, (type(cls), cls.__name__, cls.__bases__, skeleton), attrs, None, None,
                _set_class_state)


class _SpaceUnpicklerBase:
    """The unpickler of a namespace's values, less its base class (pickle.Unpickler)."""

    def __init__(self, file, space):
        _pickle.Unpickler.__init__(self, file)
        self.space = space

    def persistent_load(self, pid):
        if pid == _SPACE_ID:
            return self.space
        raise _pickle.UnpicklingError("unknown persistent id %r" % (pid,))


def _state_picklers():
    """pickle, and the pickler and unpickler of a namespace, made on first use: importing
    pickle (and re) would cost every worker's start 15-40 ms."""
    global _picklers, _pickle
    if _picklers is None:
        import pickle

        _pickle = pickle

        class _SpacePickler(_SpacePicklerBase, pickle.Pickler):
            pass

        class _SpaceUnpickler(_SpaceUnpicklerBase, pickle.Unpickler):
            pass

        _picklers = (pickle, _SpacePickler, _SpaceUnpickler)
    return _picklers


class _Sink:
    """A file that keeps nothing (a trial pickle)."""

    def write(self, b):
        return len(b)


def _why(exc):
    text = str(exc) or type_name(type(exc))
    return cap_text(text.splitlines()[0] if text else text, 300, "reason")


def _op_save(ident):
    """[pickle of {name: value}, saved names, [[skipped name, why], ...], host function names,
    "major.minor"] for namespace ident."""
    _, _SpacePickler, _ = _state_picklers()
    space = _space(ident)
    names = [k for k in space if not (k.startswith("__") and k.endswith("__"))]
    hosts = [k for k in names if _is_host(space[k])]
    data = {k: space[k] for k in names if k not in hosts}
    skipped = []
    buf = Chunks()  # (not a BytesIO: growing it copies the pickle again and again)
    try:
        _SpacePickler(buf, space).dump(data)
    except Exception:
        # Find the values that cannot be saved, one at a time, and save the rest together
        # (together, so that values shared between names stay shared).
        for k in list(data):
            try:
                _SpacePickler(_Sink(), space).dump(data[k])
            except (Exception, RecursionError) as exc:
                skipped.append([k, _why(exc)])
                del data[k]
        buf = Chunks()
        try:
            _SpacePickler(buf, space).dump(data)
        except (Exception, RecursionError) as exc:
            raise _OpError("state", "the namespace cannot be saved: %s" % _why(exc)) from None
    if 0 <= max_transfer < buf.size + 4096:  # and the names
        raise _OpError("too_large", _too_large("the namespace's saved variables", buf.size))
    return [buf, list(data), skipped, hosts, "%d.%d" % sys.version_info[:2]]


def _missing_host(name):
    def missing(*args, **kwargs):
        raise HostError("host function %s is not registered in this namespace: it was saved with the "
                        "namespace, and the host registers host functions again after a restore" % name)

    missing.__name__ = missing.__qualname__ = name.rpartition(".")[2]
    missing.__module__ = "minipy.host"  # a host function still, for the next save
    return missing


class _ViewReader:
    """A file over bytes or a memoryview of them, for the unpickler: each read is the one
    copy of what it reads (an io.BytesIO would copy a memoryview whole first)."""

    def __init__(self, data):
        self.view, self.pos = memoryview(data).cast("B"), 0

    def read(self, n=-1):
        end = len(self.view) if n is None or n < 0 else min(self.pos + n, len(self.view))
        b = bytes(self.view[self.pos:end])
        self.pos = end
        return b

    def readinto(self, buf):
        out = memoryview(buf).cast("B")
        n = min(len(out), len(self.view) - self.pos)
        out[:n] = self.view[self.pos:self.pos + n]
        self.pos += n
        return n

    def readline(self):
        end = self.pos
        while end < len(self.view):
            window = bytes(self.view[end:end + 4096])
            i = window.find(b"\n")
            if i >= 0:
                end += i + 1
                break
            end += len(window)
        return self.read(end - self.pos)


def _op_restore(ident, blob, hosts, version):
    """Replace namespace ident's variables with those of blob (a pickle _op_save made; Go has
    checked its tag): nothing changes unless it all loads. Host functions the host has
    registered stay; the others saved get a stand-in. Returns the names restored. With blob
    None, only checks that this Python can load what version saved (before Go writes the
    saved files)."""
    space = _space(ident)
    here = "%d.%d" % sys.version_info[:2]
    if version != here:
        raise _OpError("state", "the namespace was saved by Python %s; this one runs Python %s" % (version, here))
    if blob is None:
        return []
    _, _, _SpaceUnpickler = _state_picklers()
    import importlib

    importlib.invalidate_caches()  # (the host may have just written the files a module is in)
    try:
        loaded = _SpaceUnpickler(_ViewReader(blob), space).load()
    except Exception as exc:
        raise _OpError("state", "the saved variables cannot be loaded here: %s: %s" % (
            type_name(type(exc)), _why(exc))) from None
    if not isinstance(loaded, dict):
        raise _OpError("state", "the saved variables are not a namespace")
    for k in [k for k in space if not (k.startswith("__") and k.endswith("__")) and not _is_host(space[k])]:
        del space[k]
    space.update(loaded)
    for name in hosts:
        if name not in space:
            space[name] = _missing_host(name)
    return list(loaded)


def _export_state_helpers():
    """A saved namespace refers to the functions that rebuild its values by module and
    name: they live in a module of their own, which the restoring side's runtime makes the
    same way."""
    mod = types.ModuleType("_minipy_state", "What minipy's saved namespaces are rebuilt with.")
    for obj in (_new_function, _set_function_state, _new_class, _set_class_state, _new_enum, _Empty,
                _mapping_proxy):
        obj.__module__ = mod.__name__
        setattr(mod, obj.__name__, obj)
    sys.modules[mod.__name__] = mod


_export_state_helpers()
