"""Loads the runtime as pyrt.Source makes it, for the unit tests: runtime.py with the
constants of prelude.py (what Go would put on its constants line; pinned by
TestPreludeFile), then the files appended to it, as one module."""

import os

_HERE = os.path.dirname(os.path.abspath(__file__))
_CONSTANTS_LINE = "# @constants: pyrt.go puts the constants shared with Go on this line\n"
WHOLE = ("runtime.py", "notebook.py", "pretty.py", "proctree.py", "state.py")  # pyrt.Source's order
# state.py registers its module (_minipy_state) in sys.modules, which its pickles name: only
# test_state.py loads it, or the runtime of another test would take that name from it.
RUN = WHOLE[:4]


def load(names=RUN):
    """The module namespace of runtime.py followed by the other files of names."""
    with open(os.path.join(_HERE, "prelude.py")) as f:
        prelude = f.read().splitlines()[-1]
    ns = {"__name__": "minipy_runtime"}
    for name in names:
        path = os.path.join(_HERE, "..", name)
        with open(path) as f:
            src = f.read()
        if name == "runtime.py":
            assert src.count(_CONSTANTS_LINE) == 1
            src = src.replace(_CONSTANTS_LINE, prelude + "\n")
        exec(compile(src, path, "exec"), ns)
    return ns
