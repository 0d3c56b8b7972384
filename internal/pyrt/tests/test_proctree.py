"""Unit tests of proctree.py, minipy's one way to kill a tree of processes, on real
processes. They run on their own, in a second: python3 -m unittest discover -s
internal/pyrt/tests (go test ./internal/pyrt runs them too)."""

import os
import signal
import subprocess
import sys
import time
import unittest

from test_notebook import _load

_pt = _load("proctree.py", os=os, signal=signal)


def _alive(pid):
    st = _pt["proc_stat"](pid)
    if st is None:
        return False
    with open("/proc/%d/stat" % pid) as f:
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


class KillTree(unittest.TestCase):
    def spawn_tree(self):
        """A child that starts a grandchild in a session of its own, and prints its pid."""
        p = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time\n"
                              "g = subprocess.Popen(['sleep', '60'], start_new_session=True)\n"
                              "print(g.pid, flush=True)\ntime.sleep(60)"], stdout=subprocess.PIPE)
        self.addCleanup(p.stdout.close)
        self.addCleanup(p.wait)
        self.addCleanup(lambda: p.poll() is None and p.kill())
        grandchild = int(p.stdout.readline())
        self.addCleanup(lambda: _alive(grandchild) and os.kill(grandchild, signal.SIGKILL))
        return p, grandchild

    def test_kills_the_root_and_its_descendants(self):
        p, grandchild = self.spawn_tree()
        killed = _pt["kill_tree"]([(p.pid, _pt["proc_start"](p.pid))])
        self.assertEqual(killed, {p.pid, grandchild})
        self.assertEqual(p.wait(timeout=5), -signal.SIGKILL)
        deadline = time.monotonic() + 5
        while _alive(grandchild) and time.monotonic() < deadline:
            time.sleep(0.01)
        self.assertFalse(_alive(grandchild))

    def test_spares_what_it_is_told_to(self):
        p, grandchild = self.spawn_tree()
        killed = _pt["kill_tree"]([p.pid], spare={grandchild})
        self.assertEqual(killed, {p.pid})
        self.assertTrue(_alive(grandchild))

    def test_a_root_that_started_at_another_time_is_left_alone(self):
        p, grandchild = self.spawn_tree()
        # The pid's start time is not the noted one: another process has the pid now.
        self.assertEqual(_pt["kill_tree"]([(p.pid, _pt["proc_start"](p.pid) - 1)]), set())
        self.assertIsNone(p.poll())

    def test_children_by_parent(self):
        p, _ = self.spawn_tree()
        kids = dict(_pt["children_by_parent"]().get(os.getpid(), ()))
        self.assertEqual(kids.get(p.pid), _pt["proc_start"](p.pid))


if __name__ == "__main__":
    unittest.main()
