"""Unit tests of how the runtime notes a run's children (runtime.py's _note_child and
_start_of): a child's start time is not read at the fork but bounded by the clock ticks
before and after it, and checked against /proc when the child is to be killed. They run on
their own: python3 -m unittest discover -s internal/pyrt/tests."""

import subprocess
import unittest

from source import load


class StartOfTest(unittest.TestCase):
    def setUp(self):
        self.rt = load()
        lo = self.rt["_ticks"]()
        self.child = subprocess.Popen(["sleep", "30"])
        self.born = (lo - 1, self.rt["_ticks"]() + 1)  # as the fork wrappers note it
        self.addCleanup(self.child.wait)
        self.addCleanup(self.child.kill)

    def test_the_ticks_around_a_fork_bound_its_start_time(self):
        start = self.rt["proc_start"](self.child.pid)
        self.assertIsNotNone(start)
        self.assertTrue(self.born[0] <= start <= self.born[1], (self.born, start))
        self.assertEqual(self.rt["_start_of"]((self.child.pid, self.born, False)), start)

    def test_a_process_that_started_at_another_time_is_not_the_child(self):
        # (what a pid taken by another process after the child was reaped looks like)
        lo, hi = self.born
        for born in ((hi + 1, hi + 100), (lo - 100, lo - 1)):
            self.assertIsNone(self.rt["_start_of"]((self.child.pid, born, False)), born)
        start = self.rt["proc_start"](self.child.pid)
        self.assertEqual(self.rt["_start_of"]((self.child.pid, start, False)), start)
        self.assertIsNone(self.rt["_start_of"]((self.child.pid, start + 1, False)))

    def test_an_ended_child_is_none(self):
        self.child.kill()
        self.child.wait()
        self.assertIsNone(self.rt["_start_of"]((self.child.pid, self.born, False)))

    def test_kill_processes_kills_a_noted_child(self):
        self.rt["kill_processes"]([(self.child.pid, self.born, False)])
        self.assertEqual(self.child.wait(timeout=10), -9)

    def test_kill_processes_spares_a_pid_that_is_another_process_now(self):
        lo, hi = self.born
        self.rt["kill_processes"]([(self.child.pid, (hi + 1, hi + 100), False)])
        self.assertIsNone(self.child.poll())


if __name__ == "__main__":
    unittest.main()
