"""Unit tests of pretty.py, the value's text as IPython shows it: each case of
testdata/pretty/goldens.json (IPython's own output, scripts/pretty-goldens) must come out the
same. They run on their own, in a second: python3 -m unittest discover -s
internal/pyrt/tests (go test ./internal/pyrt runs them too)."""

import json
import os
import re
import time
import unittest

_HERE = os.path.dirname(os.path.abspath(__file__))
_GOLDENS = os.path.join(_HERE, "..", "..", "..", "testdata", "pretty", "goldens.json")


def _load():
    ns = {"__name__": "minipy_pretty"}
    path = os.path.join(_HERE, "..", "pretty.py")
    with open(path) as f:
        exec(compile(f.read(), path, "exec"), ns)
    return ns


_pp = _load()
pretty_text = _pp["pretty_text"]


def _mask(text):
    return re.sub(r"0x[0-9a-fA-F]+", "0xADDR", text)


class Goldens(unittest.TestCase):
    def test_every_case_as_ipython(self):
        with open(_GOLDENS) as f:
            doc = json.load(f)
        self.assertGreater(len(doc["cases"]), 80)
        for case in doc["cases"]:
            with self.subTest(case["name"]):
                ns = {"__name__": "__main__"}
                exec(compile(case["setup"], "<setup>", "exec"), ns)
                value = eval(compile(case["expr"], "<expr>", "eval"), ns)
                self.assertEqual(_mask(pretty_text(value)), case["text"])


class Limits(unittest.TestCase):
    def test_huge_value_stops_early(self):
        value = [list(range(1000)) for _ in range(1000)]  # a million items shown, in full
        started = time.perf_counter()
        text = pretty_text(value, 1000)
        self.assertLess(time.perf_counter() - started, 2.0)
        self.assertEqual(text, repr(value), "past its budget, repr() to be cut by the caller")
        self.assertTrue(pretty_text(value[:2], 100_000).startswith("[[0,\n  1,\n"))

    def test_million_ints(self):
        value = list(range(10**6))
        started = time.perf_counter()
        text = pretty_text(value, 1000)
        self.assertLess(time.perf_counter() - started, 1.0)
        self.assertGreaterEqual(len(text), 1000)
        self.assertTrue(text.startswith("[0,\n 1,\n 2,\n"), text[:40])
        self.assertTrue(text.endswith(" 999,\n ...]"), "1,000 items, then ... (within the budget)")
        self.assertEqual(text, pretty_text(value))

    def test_budget_not_swallowed(self):
        class Stubborn:
            def _repr_pretty_(self, p, cycle):
                for _ in range(10_000):
                    try:
                        p.text("x" * 1000)
                    except Exception:
                        pass

            def __repr__(self):
                return "Stubborn()"

        self.assertEqual(pretty_text(Stubborn(), 100), "Stubborn()")

    def test_deep_nesting(self):
        value = []
        for _ in range(600):
            value = [value]
        self.assertEqual(pretty_text(value), repr(value), "past the recursion limit: repr()")

    def test_errors_of_the_code_propagate(self):
        class Bad:
            def __repr__(self):
                raise ValueError("no repr")

        class BadPretty:
            def _repr_pretty_(self, p, cycle):
                raise KeyError("no pretty")

        with self.assertRaises(ValueError):
            pretty_text([Bad()])
        with self.assertRaises(KeyError):
            pretty_text(BadPretty())

    def test_a_class_attribute_that_lies(self):
        class Liar:
            @property
            def __class__(self):
                raise RuntimeError("no class")

        self.assertRegex(pretty_text(Liar()), r"^<minipy_pretty\.Limits\.test_a_class_attribute_that_lies\.<locals>\.Liar at 0x[0-9a-f]+>$|^<.*Liar at 0x[0-9a-f]+>$")

    def test_cycle_flag(self):
        seen = []

        class Node:
            def __init__(self):
                self.kids = [self]

            def _repr_pretty_(self, p, cycle):
                seen.append(cycle)
                if cycle:
                    p.text("Node(...)")
                else:
                    with p.group(5, "Node(", ")"):
                        p.pretty(self.kids)

        self.assertEqual(pretty_text(Node()), "Node([Node(...)])")
        self.assertEqual(seen, [False, True])


if __name__ == "__main__":
    unittest.main()
