"""A Talker engine that takes its rows while it runs (``--async-chunk``):
the worker feeds each reply row into the running engine request through
vllm-omni's chunk connector, and streams frames while the Thinker still
decodes.

The Thinker worker here holds a request after its third output
(OMNIPD_STANDIN_HOLD_AFTER=3) while its hold file exists: its stash then has
the prompt's rows and two reply rows, enough for the Talker's first frame.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
import unittest
from typing import Any

from .support import BOUND_S, CONSUMER, FIXTURE, PRODUCER, SECRET, Worker, free_port, run_cli

CHAT = {"messages": [{"role": "system", "content": "Talk."}, {"role": "user", "content": "Tell me a story"}],
        "max_tokens": 6}
LONG = {**CHAT, "max_tokens": 40, "ignore_eos": True}


class TalkerStreamTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.full = Worker(0, env={"OMNIPD_STANDIN_HOLD_AFTER": "3"})
        cls.prefill = Worker(0, "--kv-transfer-config", PRODUCER)
        cls.decode = Worker(0, "--kv-transfer-config", CONSUMER)
        cls.fed = Worker(1, "--async-chunk")
        cls.whole = Worker(1)
        cls.n = 0

    @classmethod
    def tearDownClass(cls) -> None:
        for w in (cls.full, cls.prefill, cls.decode, cls.fed, cls.whole):
            w.stop()

    def key(self, what: str) -> str:
        type(self).n += 1
        return f"{self.id().rsplit('.', 1)[-1]}/{what}/{self.n}"

    def colocated(self, chat: dict[str, Any] = CHAT, stream: bool = False) -> list[dict[str, str]]:
        k = self.key("thinker")
        status, out = self.full.post("/v1/chat/completions", {**chat, "omnipd_conditioning": {"key": k, "stream": stream}})
        self.assertEqual(status, 200, out)
        return [{"url": self.full.url, "key": k}]

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

    def talk(self, talker: Worker, handles: list[dict[str, str]], **kw: Any) -> list[list[int]]:
        body = {"conditioning": handles, "temperature": 0.9, "top_k": 50, "seed": 42, "max_frames": 4096, **kw}
        events = talker.events("/v1/omnipd/talker", body)
        self.assertEqual(events[-1], "[DONE]", events)
        self.assertEqual(events[-2], {"done": True, "frames": len(events) - 2})
        return [e["frame"] for e in events[:-2]]

    def assertStashesGone(self) -> None:
        for w in (self.full, self.prefill, self.decode):
            _wait(lambda w=w: w.metric("omnipd_conditioning_stashes") == 0, f"{w.url}'s stashes freed")

    def assertFedCleanly(self, rid: str) -> None:
        """The fed Talker's engine request ended and no chunk is left unread."""
        _wait(lambda: any(r["event"] == "released" and r["request_id"] == rid for r in self.fed.records()),
              f"the Talker's engine request {rid} released")
        _wait(lambda: any(r["event"] == "connector_cleanup" and r["request_id"].startswith(rid + "-")
                          and r["segments"] == 0 for r in self.fed.records()),
              f"the chunks of {rid} cleaned up")

    def test_fed_frames_equal_whole_frames(self) -> None:
        before = len([r for r in self.fed.records() if r["event"] == "add" and r.get("chunked")])
        for kw in ({}, {"temperature": 0.0}):
            with self.subTest(**kw):
                want = self.talk(self.whole, self.colocated(), **kw)
                self.assertTrue(want)
                self.assertEqual(self.talk(self.fed, self.colocated(stream=True), async_chunk=True, **kw), want)
                self.assertEqual(self.talk(self.fed, self.pd(stream=True), async_chunk=True, **kw), want)
                self.assertEqual(self.talk(self.fed, self.colocated(), **kw), want)
                self.assertEqual(self.talk(self.fed, self.pd(), **kw), want)
        adds = [r for r in self.fed.records() if r["event"] == "add" and r.get("chunked")]
        self.assertEqual(len(adds) - before, 8, "every fed request ran on chunks")
        self.assertStashesGone()

    def test_a_frame_streams_while_the_thinker_is_held(self) -> None:
        want = self.talk(self.whole, self.colocated(LONG))
        self.assertGreater(len(want), 2)
        k = self.key("held")
        thinker_rid = self.key("rid").replace("/", "-")
        open(self.full.hold, "w").close()
        thinker = talker = None
        try:
            thinker = _send(self.full, "/v1/chat/completions",
                            {**LONG, "stream": True, "omnipd_conditioning": {"key": k, "stream": True}}, thinker_rid)
            _recv_until(thinker, b"data:")
            talker = _send(self.fed, "/v1/omnipd/talker", {"conditioning": [{"url": self.full.url, "key": k}],
                                                            "async_chunk": True, "temperature": 0.9, "top_k": 50,
                                                            "seed": 42})
            got = _recv_until(talker, b'{"frame"')
            # The frame came while the Thinker is still mid-answer.
            self.assertFalse([r for r in self.full.records()
                              if r["event"] == "finish" and r["request_id"] == thinker_rid])
            self.assertEqual(self.full.metric("omnipd_conditioning_stashes"), 1)
            os.unlink(self.full.hold)
            got = _recv_until(talker, b"[DONE]", got)
        finally:
            if os.path.exists(self.full.hold):
                os.unlink(self.full.hold)
            for s in (thinker, talker):
                if s is not None:
                    s.close()
        events = _events(got)
        self.assertEqual(events[-1], "[DONE]")
        self.assertEqual(events[-2], {"done": True, "frames": len(events) - 2})
        self.assertEqual([e["frame"] for e in events[:-2]], want)
        self.assertStashesGone()

    def test_client_gone_aborts_the_engine_request_and_releases_the_stash(self) -> None:
        k = self.key("held")
        rid = self.key("talker").replace("/", "-")
        aborts = self.fed.metric("omnipd_stage_engine_aborts_total")
        open(self.full.hold, "w").close()
        thinker = talker = None
        try:
            thinker = _send(self.full, "/v1/chat/completions",
                            {**LONG, "stream": True, "omnipd_conditioning": {"key": k, "stream": True}})
            _recv_until(thinker, b"data:")
            talker = _send(self.fed, "/v1/omnipd/talker", {"conditioning": [{"url": self.full.url, "key": k}],
                                                            "async_chunk": True, "seed": 3}, rid)
            _recv_until(talker, b'{"frame"')
            deletes = _deletes_of(self.full)
            talker.close()
            _wait(lambda: self.fed.metric("omnipd_stage_engine_aborts_total") == aborts + 1, "the engine abort")
            self.assertFedCleanly(rid)
            # Released by the Talker (a DELETE answered 204), not left to the TTL.
            _wait(lambda: _deletes_of(self.full) == deletes + 1, "the Talker's DELETE")
            self.assertEqual(self.full.metric("omnipd_conditioning_stashes"), 0)
        finally:
            if os.path.exists(self.full.hold):
                os.unlink(self.full.hold)
            for s in (thinker, talker):
                if s is not None:
                    s.close()

    def test_a_thinker_failing_mid_answer_ends_the_stream_with_an_error(self) -> None:
        k = self.key("held")
        rid = self.key("talker").replace("/", "-")
        aborts = self.fed.metric("omnipd_stage_engine_aborts_total")
        open(self.full.hold, "w").close()
        thinker = talker = None
        try:
            thinker = _send(self.full, "/v1/chat/completions",
                            {**LONG, "stream": True, "omnipd_conditioning": {"key": k, "stream": True}})
            _recv_until(thinker, b"data:")
            talker = _send(self.fed, "/v1/omnipd/talker", {"conditioning": [{"url": self.full.url, "key": k}],
                                                            "async_chunk": True, "seed": 3}, rid)
            got = _recv_until(talker, b'{"frame"')
            open(self.full.fail, "w").close()
            os.unlink(self.full.hold)
            got = _recv_until(talker, b"[DONE]", got)
        finally:
            for f in (self.full.hold, self.full.fail):
                if os.path.exists(f):
                    os.unlink(f)
            for s in (thinker, talker):
                if s is not None:
                    s.close()
        events = _events(got)
        self.assertEqual(events[-1], "[DONE]")
        self.assertIn("error", events[-2], events)
        self.assertIn("mid-answer", events[-2]["error"])
        self.assertTrue(events[:-2] and all("frame" in e for e in events[:-2]), events)
        _wait(lambda: self.fed.metric("omnipd_stage_engine_aborts_total") == aborts + 1, "the engine abort")
        self.assertFedCleanly(rid)
        self.assertStashesGone()


class TalkerFeedStartupTest(unittest.TestCase):
    def test_a_vllm_omni_without_the_chunk_connector_is_refused_at_start_up(self) -> None:
        res = run_cli(["standin-model", "--deploy-config", FIXTURE, "--stage-id", "1", "--host", "127.0.0.1",
                       "--port", str(free_port()), "--async-chunk"],
                      env={"OMNIPD_STANDIN_DROP": "vllm_omni.distributed.omni_connectors.OmniConnectorFactory"})
        self.assertEqual(res.returncode, 2, res.stderr)
        self.assertIn("lacks vllm_omni.distributed.omni_connectors.OmniConnectorFactory.create_connector",
                      res.stderr)


def _wait(cond: Any, what: str) -> None:
    deadline = time.monotonic() + BOUND_S
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"never: {what}")
        time.sleep(0.02)  # polling a condition, bounded above


def _deletes_of(w: Worker) -> float:
    _, _, data = w.request("GET", "/metrics", auth=False)
    return sum(float(line.rsplit(" ", 1)[1]) for line in data.decode().splitlines()
               if line.startswith("omnipd_stage_requests_total{") and 'status="204"' in line)


def _send(w: Worker, path: str, body: dict[str, Any], request_id: str | None = None) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", w.port), timeout=BOUND_S)
    data = json.dumps(body).encode()
    rid = b"X-Request-Id: " + request_id.encode() + b"\r\n" if request_id else b""
    s.sendall(b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + SECRET.encode() +
              b"\r\n" + rid + b"Content-Length: %d\r\n\r\n%s" % (len(data), data))
    return s


def _recv_until(s: socket.socket, marker: bytes, got: bytes = b"") -> bytes:
    """What s sent, up to and past marker (got: what it sent before)."""
    while marker not in got:
        chunk = s.recv(65536)
        if not chunk:
            raise AssertionError(f"closed before {marker!r}: {got!r}")
        got += chunk
    return got


def _events(raw: bytes) -> list[Any]:
    """The SSE events in a raw HTTP answer."""
    out: list[Any] = []
    for m in re.finditer(rb"data: (.*?)\r?\n\r?\n", raw):
        payload = m.group(1).decode()
        out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


if __name__ == "__main__":
    unittest.main()
