"""Unit tests of runtime.py's host functions: make_host_function renders a spec (what Go's
host_signature.go sends) as a real Python function, with the schema's signature, whose body
checks the arguments and hands them to the call_host hook. They run on their own:
python3 -m unittest discover -s internal/pyrt/tests (go test ./internal/pyrt runs them
too). The runtime is loaded with tests/prelude.py, the constants Go would give it (pinned
by TestPreludeFile)."""

import inspect
import typing
import unittest

from source import load

_rt = load(("runtime.py",))


def param(name, types_, pyname=None, ann=None, required=False, default=None, has_default=False, enum=None):
    """A spec's parameter: [json name, python name, annotation, required, has default,
    default, json types, enum]."""
    if pyname is None:
        pyname = name
    if ann is None:
        ann = {"integer": "int", "string": "str", "number": "float", "boolean": "bool"}.get(types_[0], "Any") if types_ else "Any"
    return [name, pyname, ann, required, has_default, default, types_, enum]


class HostFunction(unittest.TestCase):
    def setUp(self):
        self.calls = []
        self.answer = (_rt["CALL_OK"], _rt["encode"](42))

        self.inline = []

        def call_host(payload, inline):
            self.calls.append(_rt["decode"](payload))
            self.inline.append(inline)
            return self.answer

        _rt["call_host"] = call_host
        self.addCleanup(_rt.__setitem__, "call_host", _rt["_no_host"])

    def make(self, params, name="add", doc="Add two numbers.", returns="int", open_=False, fid=3, inline=False):
        return _rt["make_host_function"]([name, fid, doc, params, returns, open_, inline])

    def test_inline_is_passed_to_the_hook(self):
        self.make([])()
        self.make([], inline=True)()
        self.assertEqual(self.inline, [False, True])

    def test_signature_docs_and_names(self):
        fn = self.make([param("a", ["integer"], required=True), param("b", ["integer"], default=1, has_default=True)])
        self.assertEqual(str(inspect.signature(fn)), "(a: int, b: int = 1) -> int")
        self.assertEqual(fn.__doc__, "Add two numbers.")
        self.assertEqual(fn.__qualname__, "add")
        self.assertEqual(fn.__module__, "minipy.host")
        grouped = self.make([], name="math.add")
        self.assertEqual((grouped.__name__, grouped.__qualname__), ("add", "math.add"))

    def test_call_passes_json_names_and_defaults(self):
        fn = self.make([param("a", ["integer"], required=True), param("b", ["integer"], default=1, has_default=True)])
        self.assertEqual(fn(2), 42)
        self.assertEqual(fn(a=2, b=5), 42)
        self.assertEqual(self.calls, [[3, {"a": 2, "b": 1}], [3, {"a": 2, "b": 5}]])

    def test_python_binds_the_arguments(self):
        fn = self.make([param("a", ["integer"], required=True)])
        with self.assertRaisesRegex(TypeError, "missing 1 required positional argument: 'a'"):
            fn()
        with self.assertRaisesRegex(TypeError, "unexpected keyword argument 'z'"):
            fn(1, z=2)
        self.assertEqual(self.calls, [])

    def test_json_types_are_checked(self):
        fn = self.make([param("a", ["integer"], required=True), param("x", ["number"], default=0.5, has_default=True)])
        with self.assertRaisesRegex(TypeError, r"^add\(\) argument 'a' must be int, not str$"):
            fn("1")
        with self.assertRaisesRegex(TypeError, "argument 'a' must be int, not bool"):
            fn(True)  # bool is no number, as in JSON
        with self.assertRaisesRegex(TypeError, "argument 'x' must be float, not str"):
            fn(1, "2")
        self.assertEqual(fn(1, 2), 42)  # an int is a number
        self.assertEqual(self.calls, [[3, {"a": 1, "x": 2}]])

    def test_enum(self):
        fn = self.make([param("unit", ["string"], ann="Literal['c', 'f']", required=True, enum=["c", "f"])])
        self.assertEqual(fn.__annotations__["unit"], typing.Literal["c", "f"])
        with self.assertRaisesRegex(ValueError, r"argument 'unit' must be one of 'c', 'f', not 'k'"):
            fn("k")
        fn("f")
        self.assertEqual(self.calls, [[3, {"unit": "f"}]])

    def test_optional_without_default_is_left_out(self):
        fn = self.make([param("a", ["integer"], required=True), param("unit", ["string"])])
        self.assertEqual(str(inspect.signature(fn)), "(a: int, unit: str = None) -> int")
        fn(1)
        fn(1, unit="c")
        self.assertEqual(self.calls, [[3, {"a": 1}], [3, {"a": 1, "unit": "c"}]])

    def test_optional_that_may_be_null(self):
        fn = self.make([param("v", ["string", "null"])])
        fn()
        fn(None)
        self.assertEqual(self.calls, [[3, {}], [3, {"v": None}]])

    def test_names_only_keywords_can_pass(self):
        fn = self.make([param("class", ["string"], pyname="", required=True), param("n", ["integer"])])
        self.assertEqual(str(inspect.signature(fn)), "(n: int = None, **_minipy_kw) -> int")
        fn(**{"class": "x"})
        with self.assertRaisesRegex(TypeError, "missing required keyword argument: 'class'"):
            fn()
        with self.assertRaisesRegex(TypeError, "argument 'class' must be str, not int"):
            fn(**{"class": 1})
        with self.assertRaisesRegex(TypeError, "unexpected keyword argument 'other'"):
            fn(**{"class": "x", "other": 1})
        self.assertEqual(self.calls, [[3, {"class": "x"}]])

    def test_open_schema_passes_other_keywords_on(self):
        fn = self.make([param("a", ["integer"], required=True)], open_=True)
        fn(1, extra=[1, 2])
        self.assertEqual(self.calls, [[3, {"a": 1, "extra": [1, 2]}]])

    def test_host_errors(self):
        fn = self.make([])
        self.answer = (_rt["CALL_ERROR"], b"the database is down")
        with self.assertRaisesRegex(_rt["HostError"], "the database is down"):
            fn()
        self.answer = (_rt["CALL_BAD_ARGS"], b"add() argument 'a': too big")
        with self.assertRaisesRegex(TypeError, "too big"):
            fn()
        self.answer = (_rt["CALL_REFUSED"], b"no host functions here")
        with self.assertRaises(_rt["HostError"]):
            fn()

    def test_values_go_cannot_take(self):
        fn = self.make([param("v", [])], open_=False)
        with self.assertRaisesRegex(TypeError, "argument 'v' cannot be passed to Go"):
            fn(object())
        self.assertEqual(self.calls, [])


if __name__ == "__main__":
    unittest.main()
