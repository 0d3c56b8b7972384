"""Unit tests of notebook.py's pure part: the transformer from IPython's syntax to Python
(transform_cell). They run on their own, in a second: python3 -m unittest discover -s
internal/pyrt/tests (go test ./internal/pyrt runs them too)."""

import builtins
import os
import unittest

_HERE = os.path.dirname(os.path.abspath(__file__))


def _load(name, **names):
    """The module namespace of ../NAME, executed with names (what the runtime, which the file
    is appended to, would give it)."""
    ns = dict(names, __name__="minipy_" + name.replace(".py", ""))
    path = os.path.join(_HERE, "..", name)
    with open(path) as f:
        exec(compile(f.read(), path, "exec"), ns)
    return ns


_nb = _load("notebook.py", builtins=builtins)
transform = _nb["transform_cell"]


class TransformCell(unittest.TestCase):
    def test_valid_python_is_left_alone(self):
        for src in ("x = 1", "print('!not a command')", "a = b % c", "d = {'?': 1}", "s = '''\n!ls\n%time\n'''\n"):
            self.assertIsNone(transform(src), src)

    def test_shell_lines(self):
        self.assertEqual(transform("!ls -l\nx = 1\n"), "__minipy__.system('ls -l')\nx = 1\n")
        self.assertEqual(transform("!!date"), "__minipy__.getoutput('date')")
        self.assertEqual(transform("files = !ls *.csv\n"), "files = __minipy__.getoutput('ls *.csv')\n")

    def test_line_magics_keep_their_line_number(self):
        self.assertEqual(transform("x = 1\n%cd /tmp\n"), "x = 1\n__minipy__.line_magic('cd', '/tmp', 2)\n")
        self.assertEqual(transform("t = %timeit -n1 f()\n"), "t = __minipy__.line_magic('timeit', '-n1 f()', 1)\n")

    def test_cell_magic_takes_the_rest_and_keeps_the_line_count(self):
        src = "%%bash\necho hi\necho there\n"
        out = transform(src)
        self.assertEqual(out, "__minipy__.cell_magic('bash', '', 'echo hi\\necho there\\n', 2)\n\n\n")
        self.assertEqual(out.count("\n"), src.count("\n"))

    def test_cell_magic_elsewhere_is_misplaced(self):
        self.assertEqual(transform("x = 1\n%%bash\n"), "x = 1\n__minipy__.cell_magic_misplaced('bash')\n")

    def test_help(self):
        self.assertEqual(transform("len?\n"), "__minipy__.pinfo('len', 1)\n")
        self.assertIn("pinfo", transform("?len"))

    def test_indented_lines_stay_indented(self):
        self.assertEqual(transform("if x:\n    !echo a\n"), "if x:\n    __minipy__.system('echo a')\n")

    def test_lines_inside_strings_and_brackets_are_not_statements(self):
        self.assertIsNone(transform('s = """\n!not a command\n"""\n'))
        self.assertIsNone(transform("f(1,\n  !x)\n") and None)  # (invalid either way: left to Python)


if __name__ == "__main__":
    unittest.main()
