"""Unit tests of what a worker keeps under max_transfer (IsolatedConfig.MaxTransfer): the
host kills a worker whose frame is larger, so a run's reply is made to fit, and Get's,
Save's and host calls' refuse. They run on their own: python3 -m unittest discover -s
internal/pyrt/tests (go test ./internal/pyrt runs them too)."""

import unittest

from source import load

_rt = load(("runtime.py",))
LIMIT = 1 << 20


class FitRunReply(unittest.TestCase):
    def setUp(self):
        _rt["max_transfer"] = LIMIT
        self.addCleanup(_rt.__setitem__, "max_transfer", -1)

    def reply(self, texts, error=None, displays=None):
        buf = _rt["_fit_run_reply"](True, texts, error, 0.5, displays)
        self.assertLessEqual(len(buf), LIMIT)
        self.assertEqual(buf[:2], b"\x00T")
        self.assertEqual(buf[2:3], b"X", "the value is left out")
        pos, fields = 3, []
        for _ in range(6):
            v, pos = _rt["_dec"](buf, pos)
            fields.append(v)
        self.assertEqual(pos, len(buf))
        return fields

    def test_value_left_out_first(self):
        shown = [[{"text/plain": "d"}, False, 3, "d"]]
        repr_, stdout, stderr, error, seconds, displays = self.reply(["r", "out", "err"], displays=shown)
        self.assertEqual((repr_, stdout, stderr, error, seconds), ("r", "out", "err", None, 0.5))
        self.assertEqual(displays, shown)

    def test_displays_then_texts(self):
        big = [[{"image/png": bytes(LIMIT)}, False, 1, "[image 1: PNG 9x9, 1 MB]"]]
        repr_, stdout, stderr, error, _, displays = self.reply(["r", "out", ""], displays=big)
        self.assertEqual(displays, [[{"text/plain": "[image 1: PNG 9x9, 1 MB]"}, False, 1, "[image 1: PNG 9x9, 1 MB]"]],
                         "the data left out, the places and captions kept")
        self.assertIn("the data of the run's 1 displays was left out", stderr)
        self.assertEqual(stdout, "out")

        many = [[{"image/png": bytes(100)}, False, 1, "x" * 5000]] * (LIMIT // 1000)
        repr_, stdout, stderr, error, _, displays = self.reply(["r", "out", ""], displays=many)
        self.assertIsNone(displays, "captions too many to fit: no displays at all")
        self.assertIn("the run's %d displays were left out" % len(many), stderr)
        self.assertNotIn("the data of", stderr)
        self.assertEqual(stdout, "out")

        huge = "é" * LIMIT  # two bytes a character
        repr_, stdout, stderr, error, _, _ = self.reply([huge, huge, huge], error=["ValueError", huge, huge])
        for text in (repr_, stdout, stderr, error[1], error[2]):
            self.assertIn("characters of", text)
            self.assertTrue(text.startswith("é") and text.endswith("é"), "head and tail kept")
        self.assertEqual(error[0], "ValueError")
        _, _, _, error, _, _ = self.reply(["", "", ""], error=[huge, huge, huge])  # a class named so
        self.assertIn("characters of the type omitted", error[0])


class Refusals(unittest.TestCase):
    def setUp(self):
        _rt["max_transfer"] = LIMIT
        self.addCleanup(_rt.__setitem__, "max_transfer", -1)
        self.ident = _rt["new_namespace"]()
        self.addCleanup(_rt["_spaces"].pop, self.ident, None)

    def test_get(self):
        space = _rt["_space"](self.ident)
        space["small"], space["big"] = bytes(100), bytes(LIMIT)
        self.assertEqual(_rt["_op_get"](self.ident, "small"), _rt["encode"](bytes(100)))
        with self.assertRaises(_rt["_OpError"]) as cm:
            _rt["_op_get"](self.ident, "big")
        self.assertEqual(cm.exception.kind, "too_large")
        self.assertIn("the value of big is %d bytes" % (LIMIT + 5), str(cm.exception))

    def test_any_reply(self):
        space = _rt["_space"](self.ident)
        for i in range(LIMIT // 8):
            space["n%07d" % i] = 0
        resp = _rt["dispatch"](bytes((_rt["OP_NAMES"],)) + _rt["encode"]([self.ident]))
        self.assertEqual(resp[:1], b"\x01")
        kind, message = _rt["decode"](resp[1:])
        self.assertEqual(kind, "too_large")

    def test_host_call(self):
        calls = []
        _rt["call_host"] = lambda payload, inline: calls.append(payload) or (_rt["CALL_OK"], _rt["encode"](1))
        self.addCleanup(_rt.__setitem__, "call_host", _rt["_no_host"])
        self.assertEqual(_rt["_call"](3, "f", {"a": bytes(10)}), 1)
        with self.assertRaises(ValueError) as cm:
            _rt["_call"](3, "f", {"a": bytes(LIMIT)})
        self.assertIn("IsolatedConfig.MaxTransfer", str(cm.exception))
        self.assertEqual(len(calls), 1)


if __name__ == "__main__":
    unittest.main()
