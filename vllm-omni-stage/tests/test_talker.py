"""A Talker stage worker over HTTP: it fetches the Thinker workers' stashes
itself, merges a PD pair, builds vllm-omni's Talker prompt and streams
codec frames."""

from __future__ import annotations

import json
import socket
import threading
import time
import unittest
from types import SimpleNamespace
from typing import Any

from .support import BOUND_S, CONSUMER, PRODUCER, SECRET, Worker, decode_ocnd, toy

CHAT = {"messages": [{"role": "system", "content": "Talk."}, {"role": "user", "content": "Tell me a story"}],
        "max_tokens": 6}


class TalkerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.full = Worker(0)
        cls.prefill = Worker(0, "--kv-transfer-config", PRODUCER)
        cls.decode = Worker(0, "--kv-transfer-config", CONSUMER)
        cls.talker = Worker(1)
        cls.n = 0

    @classmethod
    def tearDownClass(cls) -> None:
        for w in (cls.full, cls.prefill, cls.decode, cls.talker):
            w.stop()

    def key(self, what: str) -> str:
        type(self).n += 1
        return f"{self.id().rsplit('.', 1)[-1]}/{what}/{self.n}"

    def colocated(self, stream: bool = False) -> dict[str, str]:
        k = self.key("thinker")
        status, out = self.full.post("/v1/chat/completions", {**CHAT, "omnipd_conditioning": {"key": k, "stream": stream}})
        self.assertEqual(status, 200, out)
        return {"url": self.full.url, "key": k}

    def pd(self, stream: bool = False) -> list[dict[str, str]]:
        kp, kd = self.key("prefill"), self.key("decode")
        status, pre = self.prefill.post("/v1/chat/completions", {
            **CHAT, "max_tokens": 1, "ignore_eos": True, "kv_transfer_params": {"do_remote_decode": True},
            "omnipd_conditioning": {"key": kp, "stream": stream}})
        self.assertEqual(status, 200, pre)
        status, dec = self.decode.post("/v1/chat/completions", {
            **CHAT, "kv_transfer_params": pre["kv_transfer_params"], "omnipd_conditioning": {"key": kd, "stream": stream}})
        self.assertEqual(status, 200, dec)
        return [{"url": self.prefill.url, "key": kp}, {"url": self.decode.url, "key": kd}]

    def talk(self, handles: list[dict[str, str]], **kw: Any) -> list[list[int]]:
        body = {"conditioning": handles, "temperature": 0.9, "top_k": 50, "seed": 42, "max_frames": 4096, **kw}
        events = self.talker.events("/v1/omnipd/talker", body)
        self.assertEqual(events[-1], "[DONE]")
        self.assertEqual(events[-2], {"done": True, "frames": len(events) - 2})
        frames = [e["frame"] for e in events[:-2]]
        for f in frames:
            self.assertEqual(len(f), 16)
            self.assertTrue(all(0 <= c < 2048 for c in f), f)
        return frames

    def _deletes(self) -> float:
        return _deletes_of(self.full)

    def assertStashesGone(self) -> None:
        for w in (self.full, self.prefill, self.decode):
            self.assertEqual(w.metric("omnipd_conditioning_stashes"), 0, w.url)

    def test_frames_are_the_models_for_vllm_omnis_talker_prompt(self) -> None:
        h = self.colocated()
        k2 = self.key("copy")
        self.full.post("/v1/chat/completions", {**CHAT, "omnipd_conditioning": {"key": k2}})
        st = decode_ocnd(self.full.request("GET", f"/v1/omnipd/conditioning/{k2}")[2])
        frames = self.talk([h])
        # What the toy Talker makes of thinker2talker's prompt for these rows:
        # Σ user turn lengths + 9 prompt positions.
        from vllm_omni.model_executor.stage_input_processors.qwen3_omni import thinker2talker
        p = len(st["prompt_token_ids"])
        src = SimpleNamespace(prompt_token_ids=st["prompt_token_ids"], request_id="x", outputs=[SimpleNamespace(
            cumulative_token_ids=st["token_ids"][p:],
            multimodal_output={"hidden_states": {"layers": {0: st["embed"], 24: st["hidden"]}},
                               "embed": {"tts_pad": [st["tts"][0]], "tts_bos": [st["tts"][1]],
                                         "tts_eos": [st["tts"][2]]}})])
        (prompt,) = thinker2talker([src])
        user_turn = st["prompt_token_ids"].index(toy.IM_START, 1)
        self.assertEqual(len(prompt["prompt_token_ids"]),
                         st["prompt_token_ids"].index(toy.IM_START, user_turn + 1) - user_turn + 9)
        info = prompt["additional_information"]
        want = toy.talker_frames(info["embed"]["prefill"], info["hidden_states"]["output"],
                                 [info["embed"][r][-1] for r in ("tts_pad", "tts_bos", "tts_eos")],
                                 info["ids"]["prompt"], len(prompt["prompt_token_ids"]), 0.9, 42)
        self.assertTrue(want)
        self.assertEqual(frames, want)
        self.assertStashesGone()

    def test_pd_pair_equals_colocated(self) -> None:
        for kw in ({}, {"temperature": 0.0}):
            with self.subTest(**kw):
                colo = self.talk([self.colocated()], **kw)
                self.assertEqual(self.talk(self.pd(), **kw), colo)
                self.assertTrue(colo)
        self.assertStashesGone()

    def test_async_chunk_equals_batch(self) -> None:
        colo = self.talk([self.colocated()])
        self.assertEqual(self.talk([self.colocated(stream=True)], async_chunk=True), colo)
        self.assertEqual(self.talk(self.pd(stream=True), async_chunk=True), colo)
        self.assertStashesGone()

    def test_async_chunk_talker_started_before_the_thinker(self) -> None:
        colo = self.talk([self.colocated()])
        kp, kd = self.key("prefill"), self.key("decode")
        handles = [{"url": self.prefill.url, "key": kp}, {"url": self.decode.url, "key": kd}]
        got: dict[str, Any] = {}
        t = threading.Thread(target=lambda: got.update(frames=self.talk(handles, async_chunk=True)))
        t.start()
        # The Talker's first read reaches the prefill before its leg does.
        deadline = time.monotonic() + BOUND_S
        while self.prefill.metric("omnipd_conditioning_reads_waiting") < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        self.assertEqual(self.prefill.metric("omnipd_conditioning_reads_waiting"), 1)
        status, pre = self.prefill.post("/v1/chat/completions", {
            **CHAT, "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True},
            "omnipd_conditioning": {"key": kp, "stream": True}})
        self.assertEqual(status, 200)
        self.decode.post("/v1/chat/completions", {**CHAT, "kv_transfer_params": pre["kv_transfer_params"],
                                                  "omnipd_conditioning": {"key": kd, "stream": True}})
        t.join(BOUND_S)
        self.assertEqual(got.get("frames"), colo)
        self.assertStashesGone()

    def test_max_frames_gives_the_first_frames(self) -> None:
        colo = self.talk([self.colocated()])
        self.assertGreater(len(colo), 2)
        self.assertEqual(self.talk([self.colocated()], max_frames=2), colo[:2])
        self.assertStashesGone()

    def test_missing_stash_is_a_404_before_the_stream(self) -> None:
        for handles in ([{"url": self.full.url, "key": "never-kept"}],
                        [self.colocated()] * 2):
            with self.subTest(handles=handles):
                if handles[0]["key"] != "never-kept":
                    self.full.request("GET", f"/v1/omnipd/conditioning/{handles[0]['key']}")  # taken
                status, out = self.talker.post("/v1/omnipd/talker", {"conditioning": handles, "seed": 1})
                self.assertEqual(status, 404, out)
                self.assertEqual(out["error"]["code"], "conditioning_unavailable")
        self.assertStashesGone()

    def test_bad_input_is_a_400_naming_the_field(self) -> None:
        h = {"url": self.full.url, "key": "k"}
        for body, param in (({"conditioning": []}, "conditioning"), ({"conditioning": [h, h, h]}, "conditioning"),
                            ({}, "conditioning"), ({"conditioning": [{"url": "ftp://x", "key": "k"}]},
                                                   "conditioning[0]"),
                            ({"conditioning": [h], "temperature": -1}, "temperature"),
                            ({"conditioning": [h], "max_frames": -3}, "max_frames"),
                            ({"conditioning": [h], "seed": "s"}, "seed")):
            with self.subTest(body=body):
                status, out = self.talker.post("/v1/omnipd/talker", body)
                self.assertEqual(status, 400, out)
                self.assertEqual(out["error"]["param"], param)

    def test_engine_failure_after_the_stream_began_is_an_error_event(self) -> None:
        h = self.colocated()
        open(self.talker.fail, "w").close()
        try:
            events = self.talker.events("/v1/omnipd/talker", {"conditioning": [h], "seed": 5})
        finally:
            import os
            os.unlink(self.talker.fail)
        self.assertEqual(events[-1], "[DONE]")
        self.assertIn("stand-in engine failed", events[-2]["error"])
        self.assertTrue(all("frame" in e for e in events[:-2]))
        self.assertStashesGone()

    def test_client_gone_releases_the_unread_stash(self) -> None:
        k = self.key("held")
        open(self.full.hold, "w").close()
        thinker = _send(self.full, "/v1/chat/completions",
                        {**CHAT, "max_tokens": 40, "stream": True, "omnipd_conditioning": {"key": k, "stream": True}})
        try:
            _recv_until(thinker, b"data:")
            self.assertEqual(self.full.metric("omnipd_conditioning_stashes"), 1)
            rows = self.talker.metric("omnipd_talker_conditioning_rows_total")
            talker = _send(self.talker, "/v1/omnipd/talker", {"conditioning": [{"url": self.full.url, "key": k}],
                                                              "async_chunk": True, "seed": 3})
            # The Talker has read the prompt's rows and waits for more.
            deadline = time.monotonic() + BOUND_S
            while self.talker.metric("omnipd_talker_conditioning_rows_total") == rows and \
                    time.monotonic() < deadline:
                time.sleep(0.02)
            self.assertEqual(self.full.metric("omnipd_conditioning_reads_waiting"), 1)
            released = self._deletes()
            talker.close()
            # Released by the Talker (a DELETE answered 204), not left to the TTL.
            while self._deletes() == released and time.monotonic() < deadline:
                time.sleep(0.02)
            self.assertEqual(self._deletes(), released + 1)
            self.assertEqual(self.full.metric("omnipd_conditioning_stashes"), 0)
        finally:
            import os
            os.unlink(self.full.hold)
            thinker.close()


def _deletes_of(w: Worker) -> float:
    _, _, data = w.request("GET", "/metrics", auth=False)
    return sum(float(line.rsplit(" ", 1)[1]) for line in data.decode().splitlines()
               if line.startswith("omnipd_stage_requests_total{") and 'status="204"' in line)


def _send(w: Worker, path: str, body: dict) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", w.port), timeout=BOUND_S)
    data = json.dumps(body).encode()
    s.sendall(b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + SECRET.encode() +
              b"\r\nContent-Length: %d\r\n\r\n%s" % (len(data), data))
    return s


def _recv_until(s: socket.socket, marker: bytes) -> bytes:
    got = b""
    while marker not in got:
        chunk = s.recv(65536)
        if not chunk:
            raise AssertionError(f"closed before {marker!r}: {got!r}")
        got += chunk
    return got


if __name__ == "__main__":
    unittest.main()
