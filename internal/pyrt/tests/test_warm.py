"""Unit test of runtime.py's warm_up, which a worker calls before its first request: it runs
a throwaway cell and must leave no trace a later run could see. Run on its own:
python3 -m unittest discover -s internal/pyrt/tests."""

import linecache
import sys
import unittest

from source import load


class WarmUpTest(unittest.TestCase):
    def setUp(self):
        self.rt = load()
        self.streams = sys.stdout, sys.stderr, sys.stdin
        self.addCleanup(self.restore_streams)

    def restore_streams(self):
        sys.stdout, sys.stderr, sys.stdin = self.streams

    def state(self):
        rt = self.rt
        return (dict(rt["_spaces"]), rt["_cell_counter"], rt["_cell_chars"], dict(rt["_cells"]),
                rt["_last_space"], dict(rt["_space_procs"]), set(linecache.cache))

    def test_runs_a_cell_and_leaves_no_trace(self):
        rt = self.rt
        ident = rt["new_namespace"]()
        replies = []
        real_run = rt["run"]

        def recording_run(*args):
            replies.append(real_run(*args))
            return replies[-1]

        rt["run"] = recording_run
        before = self.state()
        rt["warm_up"]()
        self.assertEqual(len(replies), 1)
        self.assertEqual(replies[0][:2], b"\x00T")  # ran, and had a value (no error)
        self.assertEqual(self.state(), before)
        # The next cell is the first one the runtime names.
        reply = real_run(ident, 0, 1 << 16, 0, "1/0")
        self.assertIn(b"<cell-1>", reply)
        self.assertEqual(rt["_spaces"][ident].keys(), {"__name__", "__builtins__"})

    def test_not_again_while_its_cell_is_known(self):
        rt = self.rt
        rt["_cells"][rt["_WARM_SRC"]] = "<cell-9>"
        calls = []
        rt["run"] = lambda *args: calls.append(args)
        rt["warm_up"]()
        self.assertEqual(calls, [])


if __name__ == "__main__":
    unittest.main()



class FillPoolsTest(unittest.TestCase):
    """runtime.py's fill_pools, which a template calls last before it forks workers: what a
    worker allocates then goes to pools of its own, packed, not to free blocks scattered
    over pages it shares with the template."""

    def test_new_objects_are_packed(self):
        rt = load()
        kept = [bytes(15) for _ in range(3000)]  # 48-byte blocks (33 bytes of header)
        del kept[::2]  # free blocks all over the pools in use
        rt["fill_pools"]()
        new = [bytes(15) for _ in range(100)]
        steps = [id(b) - id(a) for a, b in zip(new, new[1:])]
        self.assertLessEqual(sum(step != 48 for step in steps), 2, steps)  # (one pool's end, maybe)
