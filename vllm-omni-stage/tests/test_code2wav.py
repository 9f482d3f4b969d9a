"""A Code2Wav stage worker over HTTP: the wire layout, context trimming,
chunked decoding equal to whole, bad input."""

from __future__ import annotations

import base64
import struct
import unittest

from .support import Worker, toy


def frames_of(n: int, salt: int = 0) -> list[list[int]]:
    return [[toy.mix(salt * 1000 + t * 16 + q) % 2048 for q in range(16)] for t in range(n)]


def wire(frames: list[list[int]]) -> list[int]:
    """Frames [T,16] flattened codebook-major."""
    return [frames[t][q] for q in range(16) for t in range(len(frames))]


def samples(out: dict) -> list[float]:
    raw = base64.b64decode(out["samples_f32le"])
    return list(struct.unpack("<%df" % (len(raw) // 4), raw))


class Code2WavTest(unittest.TestCase):
    w: Worker

    @classmethod
    def setUpClass(cls) -> None:
        cls.w = Worker(2)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.w.stop()

    def decode(self, frames: list[list[int]], context: int = 0) -> list[float]:
        status, out = self.w.post("/v1/omnipd/code2wav", {"codes": wire(frames), "num_frames": len(frames),
                                                          "context_frames": context})
        self.assertEqual(status, 200, out)
        self.assertEqual(out["num_samples"], 1920 * (len(frames) - context))
        return samples(out)

    def test_samples_are_the_models_in_codebook_major_layout(self) -> None:
        fr = frames_of(3)
        want = []
        for t, f in enumerate(fr):
            want += toy.frame_samples(f, fr[t - 1] if t else None)
        self.assertEqual(self.decode(fr), want)

    def test_chunked_with_left_context_equals_whole(self) -> None:
        fr = frames_of(60, salt=1)
        whole = self.decode(fr)
        # omnipd's chunking: 4 frames first with no context, then 25 new frames
        # with up to 25 of context, the remainder last.
        got: list[float] = []
        start, size = 0, 4
        while start < len(fr):
            end = min(start + size, len(fr))
            ctx = min(start, 25)
            got += self.decode(fr[start - ctx:end], ctx)
            start, size = end, 25
        self.assertEqual(got, whole)

    def test_context_only_trims(self) -> None:
        fr = frames_of(5, salt=2)
        self.assertEqual(self.decode(fr, 2), self.decode(fr)[2 * 1920:])
        self.assertEqual(self.decode(fr, 5), [])

    def test_bad_input_is_a_400_naming_the_field(self) -> None:
        good = wire(frames_of(2))
        cases = [
            ({"codes": good[:-1], "num_frames": 2}, "codes"),
            ({"codes": good[:-1] + [2048], "num_frames": 2}, "codes"),
            ({"codes": good[:-1] + [-1], "num_frames": 2}, "codes"),
            ({"codes": good[:-1] + ["x"], "num_frames": 2}, "codes"),
            ({"codes": good, "num_frames": 2, "context_frames": 3}, "context_frames"),
            ({"codes": good, "num_frames": 2, "context_frames": -1}, "context_frames"),
            ({"codes": good, "num_frames": "2"}, "num_frames"),
            ({"codes": "x", "num_frames": 2}, "codes"),
        ]
        for body, param in cases:
            with self.subTest(body={k: v for k, v in body.items() if k != "codes"}, param=param):
                status, out = self.w.post("/v1/omnipd/code2wav", body)
                self.assertEqual(status, 400, out)
                self.assertEqual(out["error"]["param"], param)
        self.assertEqual(self.w.request("GET", "/health", auth=False)[0], 200)

    def test_secret_and_models(self) -> None:
        status, _, _ = self.w.request("POST", "/v1/omnipd/code2wav", b"{}", auth=False)
        self.assertEqual(status, 401)
        status, out = self.w.request("GET", "/v1/models")[:2], None
        self.assertEqual(status[0], 200)
        self.assertEqual(self.w.request("POST", "/v1/completions", b"{}")[0], 404)


if __name__ == "__main__":
    unittest.main()
