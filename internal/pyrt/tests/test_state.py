"""Unit tests of state.py: a namespace's variables saved (_op_save) and restored
(_op_restore) into another namespace, in this process, as a worker of the same Python
would. They run on their own: python3 -m unittest discover -s internal/pyrt/tests."""

import os
import sys
import unittest

from source import load

_rt = load(("runtime.py", "state.py"))
_VERSION = "%d.%d" % sys.version_info[:2]


def space_with(code):
    ident = _rt["new_namespace"]()
    exec(compile(code, "<cell-1>", "exec"), _rt["_spaces"][ident])
    return ident


def round_trip(code, into=None):
    """The namespace made by code, saved and restored into a fresh namespace (or into)."""
    blob, saved, skipped, hosts, version = _rt["_op_save"](space_with(code))
    blob = b"".join(blob)  # (Chunks: the pickle as written)
    target = into if into is not None else _rt["new_namespace"]()
    restored = _rt["_op_restore"](target, blob, hosts, version)
    return _rt["_spaces"][target], saved, skipped, restored


class SaveRestore(unittest.TestCase):
    def test_view_reader(self):
        # The unpickler's file over a restore's memoryview: reads, lines and readinto as a
        # BytesIO gives them, whichever protocol wrote the pickle.
        import io
        import pickle

        data = b"ab\ncd" + b"x" * 10000 + b"\nend"
        r, b = _rt["_ViewReader"](memoryview(data)), io.BytesIO(data)
        self.assertEqual(r.readline(), b.readline())
        self.assertEqual(r.read(3), b.read(3))
        into, binto = bytearray(7), bytearray(7)
        self.assertEqual(r.readinto(into), b.readinto(binto))
        self.assertEqual(into, binto)
        self.assertEqual(r.readline(), b.readline())
        self.assertEqual(r.read(), b.read())
        self.assertEqual((r.read(5), r.readline()), (b"", b""))
        value = {"s": "x" * 70000, "b": bytes(200000), "ba": bytearray(b"y" * 100000), "l": [1.5, None, "z"]}
        for proto in range(pickle.HIGHEST_PROTOCOL + 1):
            blob = memoryview(pickle.dumps(value, protocol=proto))
            self.assertEqual(pickle.Unpickler(_rt["_ViewReader"](blob)).load(), value, proto)

    def test_reply_in_parts(self):
        # A save's reply, encoded in parts for a writev, is encode's bytes, and the pickle's
        # pieces are in it as the pickler wrote them, not copies.
        reply = _rt["_op_save"](space_with("big = bytes(range(256)) * 4096\nsmall = [1, 'x']\n"))
        chunks = reply[0]
        self.assertIs(type(chunks), _rt["Chunks"])
        self.assertEqual(chunks.size, sum(map(len, chunks)))
        parts = _rt["encode_parts"](reply, b"\x00")
        self.assertEqual(b"".join(parts), b"\x00" + _rt["encode"](reply))
        self.assertTrue(any(p is c for p in parts for c in chunks if len(c) >= 1 << 20), "the large piece is not copied")
        self.assertEqual(_rt["encode_parts"]([b"ab", 1], b"\x00"), [bytearray(b"\x00" + _rt["encode"]([b"ab", 1]))])

    def test_data(self):
        space, saved, skipped, restored = round_trip("a = 1\nb = [a, 'x', {'k': (1.5, None)}]\nc = b\n")
        self.assertEqual((space["a"], space["b"]), (1, [1, "x", {"k": (1.5, None)}]))
        self.assertIs(space["b"], space["c"], "values shared between names stay shared")
        self.assertEqual((saved, skipped, restored), (["a", "b", "c"], [], ["a", "b", "c"]))

    def test_functions_see_the_namespace(self):
        space, *_ = round_trip(
            "base = 10\n"
            "def add(x, y=1, *, z=0):\n    'Adds.'\n    return base + x + y + z\n"
            "square = lambda v: v * v\n"
            "def fact(n):\n    return 1 if n < 2 else n * fact(n - 1)\n")
        self.assertEqual(space["add"](1), 12)
        self.assertEqual(space["add"].__doc__, "Adds.")
        self.assertEqual(space["add"].__kwdefaults__, {"z": 0})
        self.assertIs(space["add"].__globals__, space)
        space["base"] = 100  # a later cell rebinds it: the restored function sees it
        self.assertEqual(space["add"](1), 102)
        self.assertEqual(space["square"](7), 49)
        self.assertEqual(space["fact"](5), 120)

    def test_closures(self):
        space, *_ = round_trip(
            "def counter():\n    n = 0\n    def inc():\n        nonlocal n\n        n += 1\n        return n\n"
            "    return inc\n"
            "c = counter()\nc()\n"
            "def outer():\n    def rec(k):\n        return 0 if k == 0 else 1 + rec(k - 1)\n    return rec\n"
            "r = outer()\n")
        self.assertEqual(space["c"](), 2, "the closure's state came along")
        self.assertEqual(space["r"](4), 4, "a recursive closure refers to itself")

    def test_classes_and_instances(self):
        space, saved, skipped, _ = round_trip(
            "class Point:\n    'A point.'\n    scale = 2\n"
            "    def __init__(self, x):\n        self.x = x\n"
            "    def double(self):\n        return Point(self.x * self.scale)\n"
            "    @property\n    def neg(self):\n        return -self.x\n"
            "    @staticmethod\n    def zero():\n        return Point(0)\n"
            "    @classmethod\n    def one(cls):\n        return cls(1)\n"
            "class Point3(Point):\n    __slots__ = ('z',)\n"
            "p = Point(3)\nq = Point3(4)\nq.z = 5\n")
        self.assertEqual(skipped, [])
        Point, p, q = space["Point"], space["p"], space["q"]
        self.assertIs(type(p), Point)
        self.assertIsInstance(q, Point)
        self.assertEqual((p.x, p.neg, p.double().x, Point.zero().x, Point.one().x, Point.__doc__), (3, -3, 6, 0, 1, "A point."))
        self.assertEqual((q.x, q.z), (4, 5))
        self.assertEqual(Point.__qualname__, "Point")

    def test_dataclasses_and_enums(self):
        space, saved, skipped, _ = round_trip(
            "import dataclasses, enum\n"
            "@dataclasses.dataclass\nclass Item:\n    name: str\n    n: int = 1\n"
            "class Color(enum.Enum):\n    RED = 1\n    BLUE = 2\n    def warm(self):\n        return self is Color.RED\n"
            "class Size(enum.IntEnum):\n    S = 1\n    L = 3\n"
            "it = Item('a')\nfav = Color.RED\nsz = Size.L\n")
        self.assertEqual(skipped, [])
        it = space["it"]
        self.assertEqual(space["dataclasses"].asdict(it), {"name": "a", "n": 1})
        self.assertEqual(it, space["Item"]("a"))
        self.assertIs(space["fav"], space["Color"].RED)
        self.assertTrue(space["fav"].warm())
        self.assertEqual(space["sz"] + 1, 4)
        self.assertEqual(list(space["Color"]), [space["Color"].RED, space["Color"].BLUE])

    def test_modules_by_name(self):
        space, *_ = round_trip("import json, os.path as osp\nfrom collections import OrderedDict as OD\n")
        self.assertIs(space["json"], sys.modules["json"])
        self.assertIs(space["osp"], sys.modules["os.path"])
        self.assertIs(space["OD"], sys.modules["collections"].OrderedDict)

    def test_what_cannot_be_saved_is_skipped(self):
        space, saved, skipped, restored = round_trip(
            "import threading\ng = (i for i in range(3))\nf = open(%r)\nlock = threading.Lock()\nkeep = 1\n"
            "both = [keep, lock]\n" % os.devnull)
        self.assertEqual([name for name, _ in skipped], ["g", "f", "lock", "both"])
        self.assertIn("generator", dict(skipped)["g"])
        self.assertEqual(saved, ["threading", "keep"])
        self.assertEqual(restored, ["threading", "keep"])
        space_f = [v for v in _rt["_spaces"].values() if "f" in v]
        for v in space_f:
            v["f"].close()

    def test_restore_replaces_but_keeps_host_functions(self):
        target = space_with("old = 1\nkept = 2\n")
        spec = ["lookup", 1, "", [], "", False, False]
        _rt["_op_register"](target, [spec])
        _rt["_op_register"](target, [["db.get", 2, "", [], "", False, False]])
        source = space_with("new = 3\n")
        _rt["_op_register"](source, [spec, ["gone", 3, "", [], "", False, False]])
        blob, saved, skipped, hosts, version = _rt["_op_save"](source)
        self.assertEqual((saved, hosts), (["new"], ["lookup", "gone"]))
        _rt["_op_restore"](target, b"".join(blob), hosts, version)
        space = _rt["_spaces"][target]
        self.assertNotIn("old", space)
        self.assertEqual(space["new"], 3)
        self.assertEqual(space["lookup"].__qualname__, "lookup", "the registered host function stays")
        self.assertIn("db", space)
        with self.assertRaisesRegex(_rt["HostError"], "host function gone is not registered"):
            space["gone"]()

    def test_bad_input_changes_nothing(self):
        target = space_with("x = 1\n")
        blob, _, _, hosts, version = _rt["_op_save"](space_with("y = 2\n"))
        blob = b"".join(blob)
        for bad_blob, bad_version in ((blob[:-5], version), (b"", version), (blob, "2.7")):
            with self.assertRaises(_rt["_OpError"]):
                _rt["_op_restore"](target, bad_blob, hosts, bad_version)
        self.assertEqual([k for k in _rt["_spaces"][target] if not k.startswith("__")], ["x"])
        self.assertEqual(version, _VERSION)


if __name__ == "__main__":
    unittest.main()
