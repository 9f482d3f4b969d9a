"""The conditioning store and its OCND v1 body, without a server: the bytes
against docs/stage-api.md's table built by hand, and the TTL and
tombstones on an injected clock."""

from __future__ import annotations

import asyncio
import struct
import unittest

from omnipd_stage.stash import NotFound, Stash, Store, decode, encode


def stash() -> Stash:
    st = Stash(tts_width=2, tts=struct.pack("<6f", 1, 2, 3, 4, 5, 6), token_ids=[7, 8, 9], prompt_token_ids=[7, 8])
    st.add_rows(2, 2, struct.pack("<4f", 0.5, -0.5, 1.5, -1.5), 3, struct.pack("<6f", 1, 2, 3, 4, 5, 6))
    return st


class OCNDTest(unittest.TestCase):
    def test_bytes_follow_the_documented_table(self) -> None:
        want = (b"OCND" + b"\x01"                            # magic, version
                + struct.pack("<6I", 2, 2, 3, 2, 3, 2)       # rows, embed w, hidden w, tts w, ids, prompt ids
                + struct.pack("<4f", 0.5, -0.5, 1.5, -1.5)    # embeddings, row after row
                + struct.pack("<6f", 1, 2, 3, 4, 5, 6)        # hidden states
                + struct.pack("<6f", 1, 2, 3, 4, 5, 6)        # tts pad, bos, eos
                + struct.pack("<3i", 7, 8, 9) + struct.pack("<2i", 7, 8))
        self.assertEqual(encode(stash()), want)
        self.assertEqual(encode(stash(), 1)[5:29], struct.pack("<6I", 1, 2, 3, 2, 3, 2))
        self.assertEqual(encode(stash(), 2)[5:29], struct.pack("<6I", 0, 0, 0, 2, 3, 2))

    def test_decode_refuses_a_body_that_does_not_match_its_header(self) -> None:
        body = encode(stash())
        self.assertEqual(encode(decode(body)), body)
        for bad in (body[:-1], body + b"\0\0\0\0", b"OCNX" + body[4:], body[:4] + b"\x02" + body[5:]):
            with self.assertRaises(ValueError):
                decode(bad)


class StoreTest(unittest.TestCase):
    def setUp(self) -> None:
        self.now = 0.0
        self.loop = asyncio.new_event_loop()
        self.addCleanup(self.loop.close)

    def store(self) -> Store:
        return Store(ttl_s=60, read_wait_s=0, clock=lambda: self.now)

    def test_ttl_frees_and_tombstones_answer_at_once(self) -> None:
        async def run() -> None:
            s = self.store()
            self.assertTrue(s.put("a", stash()))
            self.assertEqual(len(s), 1)
            self.now = 61
            self.assertEqual(len(s), 0)
            with self.assertRaises(NotFound):
                s.take("a")
            with self.assertRaises(NotFound):  # expired: a tombstone, no wait
                await s.read("a", 0, wait_s=120)
            self.now = 200
            st, done, waited = await s.read("a", 0)  # the tombstone is gone too: waited, nothing
            self.assertEqual((st.rows, done, waited), (0, False, True))

        self.loop.run_until_complete(run())

    def test_release_before_the_stash_discards_it(self) -> None:
        s = self.store()
        self.assertFalse(s.drop("b"))
        self.assertFalse(s.put("b", stash()))
        self.assertEqual(len(s), 0)

    def test_reads_wake_as_rows_arrive(self) -> None:
        async def run() -> None:
            s = Store(ttl_s=60, read_wait_s=3600, clock=lambda: self.now)
            self.assertTrue(s.open("c", Stash(prompt_token_ids=[1], token_ids=[1])))
            reader = asyncio.ensure_future(s.read("c", 0))
            await asyncio.sleep(0)
            self.assertFalse(reader.done())
            self.assertEqual(s.waiting, 1)
            self.assertTrue(s.append("c", 1, 1, struct.pack("<f", 1), 1, struct.pack("<f", 2), [5]))
            st, done, waited = await reader
            self.assertEqual((st.rows, done, waited, st.token_ids), (1, False, True, [1, 5]))
            s.close("c")
            st, done, _ = await s.read("c", 1)
            self.assertEqual((st.rows, done), (0, True))
            with self.assertRaises(NotFound):
                await s.read("c", 0)

        self.loop.run_until_complete(run())


if __name__ == "__main__":
    unittest.main()
