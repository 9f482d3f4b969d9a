"""A Thinker stage worker over HTTP: vLLM's endpoints, errors, the secret,
the conditioning stash (batch and streamed) and PD."""

from __future__ import annotations

import http.client
import json
import os
import socket
import unittest

from .support import CONSUMER, PRODUCER, SECRET, Worker, decode_ocnd, read_stream, toy

CHAT = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi"}],
        "max_tokens": 6, "temperature": 0}


def expected_rows(ids: list[int]) -> tuple[list[list[float]], list[list[float]]]:
    """The toy Thinker's rows for positions 0..len(ids)-1."""
    states = toy.prefix_states(ids)
    return [toy.embedding(t) for t in ids], [toy.hidden(s, toy.ACCEPT_HIDDEN_LAYER) for s in states]


class ThinkerTest(unittest.TestCase):
    w: Worker

    @classmethod
    def setUpClass(cls) -> None:
        cls.w = Worker(0)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.w.stop()

    def tokenize(self, body: dict) -> list[int]:
        status, out = self.w.post("/tokenize", body)
        self.assertEqual(status, 200, out)
        return out["tokens"]

    # ---- the OpenAI endpoints ----

    def test_completions_whole_and_streamed_agree(self) -> None:
        body = {"prompt": "Hello there", "max_tokens": 8, "temperature": 0}
        status, whole = self.w.post("/v1/completions", body)
        self.assertEqual(status, 200, whole)
        self.assertEqual(whole["object"], "text_completion")
        self.assertEqual(whole["usage"]["prompt_tokens"], len("Hello there"))
        self.assertEqual(whole["usage"]["completion_tokens"], 8)
        self.assertEqual(whole["usage"]["prompt_tokens_details"], {"cached_tokens": 0})
        self.assertEqual(whole["choices"][0]["finish_reason"], "length")
        self.assertIn("kv_transfer_params", whole)
        events = self.w.events("/v1/completions", {**body, "stream": True, "stream_options": {"include_usage": True}})
        self.assertEqual(events[-1], "[DONE]")
        usage = events[-2]
        self.assertEqual(usage["choices"], [])
        self.assertEqual(usage["usage"], whole["usage"])
        text = "".join(e["choices"][0]["text"] for e in events[:-2])
        self.assertEqual(text, whole["choices"][0]["text"])
        self.assertEqual(events[-3]["choices"][0]["finish_reason"], "length")

    def test_token_prompt_and_return_token_ids(self) -> None:
        ids = self.tokenize({"prompt": "abc"})
        self.assertEqual(ids, [97, 98, 99])
        s1, a = self.w.post("/v1/completions", {"prompt": ids, "max_tokens": 4, "return_token_ids": True})
        s2, b = self.w.post("/v1/completions", {"prompt": "abc", "max_tokens": 4, "return_token_ids": True})
        self.assertEqual((s1, s2), (200, 200), (a, b))
        self.assertEqual(a["choices"][0]["token_ids"], b["choices"][0]["token_ids"])
        self.assertEqual(len(a["choices"][0]["token_ids"]), 4)

    def test_chat_whole_and_streamed(self) -> None:
        status, whole = self.w.post("/v1/chat/completions", CHAT)
        self.assertEqual(status, 200, whole)
        msg = whole["choices"][0]["message"]
        self.assertEqual(msg["role"], "assistant")
        self.assertEqual(whole["usage"]["prompt_tokens"], len(self.tokenize({"messages": CHAT["messages"]})))
        events = self.w.events("/v1/chat/completions", {**CHAT, "stream": True})
        self.assertEqual(events[0]["choices"][0]["delta"]["role"], "assistant")
        self.assertEqual(events[-1], "[DONE]")
        self.assertEqual(events[-2]["choices"][0]["finish_reason"], whole["choices"][0]["finish_reason"])
        self.assertEqual("".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1]), msg["content"])
        self.assertTrue(all(e["object"] == "chat.completion.chunk" for e in events[:-1]))

    def test_stop_string_ends_the_answer(self) -> None:
        _, free = self.w.post("/v1/completions", {"prompt": "stop test", "max_tokens": 12})
        text = free["choices"][0]["text"]
        stop = text[3:5]
        _, cut = self.w.post("/v1/completions", {"prompt": "stop test", "max_tokens": 12, "stop": [stop]})
        self.assertEqual(cut["choices"][0]["text"], text[:text.find(stop)])
        self.assertEqual(cut["choices"][0]["finish_reason"], "stop")
        self.assertEqual(cut["choices"][0]["stop_reason"], stop)

    def test_seeded_sampling_repeats(self) -> None:
        body = {"prompt": "seeded", "max_tokens": 10, "temperature": 0.8, "seed": 7}
        _, a = self.w.post("/v1/completions", body)
        _, b = self.w.post("/v1/completions", body)
        self.assertEqual(a["choices"][0]["text"], b["choices"][0]["text"])

    def test_models_tokenize_detokenize(self) -> None:
        status, models = self.w.request("GET", "/v1/models")[0], json.loads(self.w.request("GET", "/v1/models")[2])
        self.assertEqual(status, 200)
        card = models["data"][0]
        self.assertEqual((card["id"], card["root"], card["parent"], card["max_model_len"]),
                         ("standin-model", "standin-model", None, 4096))
        status, out = self.w.post("/detokenize", {"tokens": [toy.IM_START, toy.USER, 104, 105]})
        self.assertEqual((status, out), (200, {"prompt": "<|im_start|>userhi"}))
        status, out = self.w.post("/detokenize", {"tokens": [1, 300]})
        self.assertEqual(status, 400)
        self.assertEqual(out["error"]["param"], "tokens")
        self.assertEqual(out["error"]["message"], "Token id 300 is out of vocabulary")
        status, out = self.w.post("/detokenize", {"tokens": [1, "x"]})
        self.assertEqual((status, out["error"]["param"]), (400, "tokens[1]"))

    # ---- errors, the secret, the HTTP layer ----

    def test_bad_input_is_a_400_naming_the_parameter(self) -> None:
        cases = [
            ("/v1/completions", {"prompt": "x", "temperature": -1}, "temperature"),
            ("/v1/completions", {"prompt": "x", "max_tokens": 0}, "max_tokens"),
            ("/v1/completions", {"prompt": "x", "top_p": 0}, "top_p"),
            ("/v1/completions", {"prompt": "x", "seed": "a"}, "seed"),
            ("/v1/completions", {"prompt": "x", "stop": [1]}, "stop"),
            ("/v1/completions", {"max_tokens": 3}, "prompt"),
            ("/v1/completions", {"prompt": ["a", "b"]}, "prompt"),
            ("/v1/completions", {"prompt": [1, 999]}, "prompt"),
            ("/v1/completions", {"prompt": "x", "n": 2}, "n"),
            ("/v1/completions", {"prompt": "x", "logprobs": 2}, "logprobs"),
            ("/v1/completions", {"prompt": "x", "kv_transfer_params": [1]}, "kv_transfer_params"),
            ("/v1/completions", {"prompt": "x", "omnipd_conditioning": {"layer": 24}}, "omnipd_conditioning"),
            ("/v1/completions", {"prompt": "x", "omnipd_conditioning": {"key": "k", "layer": 3}},
             "omnipd_conditioning"),
            ("/v1/completions", {"prompt": "x", "max_tokens": 5000}, "prompt"),
            ("/v1/chat/completions", {"messages": []}, "messages"),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]}, "messages[0].content[0]"),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]},
             "tools"),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "stream": False,
                                      "stream_options": {"include_usage": True}}, "stream_options"),
        ]
        for path, body, param in cases:
            with self.subTest(body=body):
                status, out = self.w.post(path, body)
                self.assertEqual(status, 400, out)
                self.assertEqual(set(out["error"]), {"message", "type", "param", "code"})
                self.assertEqual(out["error"]["param"], param)
                self.assertEqual(out["error"]["type"], "invalid_request_error")
        status, out = self.w.post("/v1/completions", {"prompt": "x", "max_tokens": 5000})
        self.assertEqual(out["error"]["code"], "context_length_exceeded")
        status, _, data = self.w.request("POST", "/v1/completions", b"{not json")
        self.assertEqual(status, 400, data)

    def test_unknown_model_path_and_method(self) -> None:
        status, out = self.w.post("/v1/completions", {"model": "other", "prompt": "x"})
        self.assertEqual((status, out["error"]["code"], out["error"]["param"]), (404, "model_not_found", "model"))
        status, _, data = self.w.request("GET", "/v1/nope")
        self.assertEqual(status, 404)
        self.assertEqual(json.loads(data)["error"]["message"], "Invalid URL (GET /v1/nope)")
        status, hdrs, _ = self.w.request("GET", "/v1/completions")
        self.assertEqual((status, hdrs.get("allow")), (405, "POST"))

    def test_secret_is_required_except_for_health_and_metrics(self) -> None:
        for method, path in (("POST", "/v1/completions"), ("POST", "/v1/chat/completions"), ("GET", "/v1/models"),
                             ("POST", "/tokenize"), ("POST", "/detokenize"),
                             ("GET", "/v1/omnipd/conditioning/k"), ("DELETE", "/v1/omnipd/conditioning/k")):
            with self.subTest(path=path):
                status, hdrs, data = self.w.request(method, path, b'{"prompt":"x"}', auth=False)
                self.assertEqual(status, 401, data)
                self.assertEqual(json.loads(data)["error"]["code"], "invalid_api_key")
                self.assertEqual(hdrs.get("www-authenticate"), "Bearer")
                status, _, _ = self.w.request(method, path, b'{"prompt":"x"}', auth=False,
                                              headers={"Authorization": "Bearer wrong"})
                self.assertEqual(status, 401)
        self.assertEqual(self.w.request("GET", "/health", auth=False)[0], 200)
        status, _, data = self.w.request("GET", "/metrics", auth=False)
        self.assertEqual(status, 200)
        self.assertIn(b"omnipd_conditioning_stashes", data)
        self.assertIn(b'omnipd_stage_requests_total{stage="thinker"', data)

    def test_request_id_header_is_echoed(self) -> None:
        status, hdrs, _ = self.w.request("POST", "/v1/completions", {"prompt": "x", "max_tokens": 1},
                                         headers={"X-Request-Id": "abc-123"})
        self.assertEqual((status, hdrs.get("x-request-id")), (200, "abc-123"))

    def test_keep_alive_and_chunked_bodies(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.w.port, timeout=60)
        try:
            for _ in range(2):
                body = iter([b'{"prompt": "chun', b'ked", "max_tokens": 2}'])
                conn.request("POST", "/v1/completions", body=body, headers=self.w.headers(),
                             encode_chunked=True)
                resp = conn.getresponse()
                out = json.loads(resp.read())
                self.assertEqual(resp.status, 200, out)
                self.assertEqual(out["usage"]["prompt_tokens"], len("chunked"))
        finally:
            conn.close()

    def test_errors_on_a_kept_alive_connection(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.w.port, timeout=60)
        try:
            for body, auth, want in ((b'{"prompt": "x", "max_tokens": 1}', True, 200), (b"{bad", True, 400),
                                     (b'{"prompt": "x", "max_tokens": 1}', False, 401), (b"{}", True, 400),
                                     (b'{"prompt": "x", "max_tokens": 1}', True, 200)):
                conn.request("POST", "/v1/completions", body=body, headers=self.w.headers(auth))
                resp = conn.getresponse()
                out = json.loads(resp.read())
                self.assertEqual(resp.status, want, out)
        finally:
            conn.close()

    def test_oversized_body_is_a_413(self) -> None:
        with socket.create_connection(("127.0.0.1", self.w.port), timeout=60) as s:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + SECRET.encode() +
                      b"\r\nContent-Length: 999999999\r\n\r\n")
            head = s.recv(65536).decode()
        self.assertTrue(head.startswith("HTTP/1.1 413"), head)
        self.assertIn("request_too_large", head)

    # ---- the conditioning stash ----

    def test_batch_stash_rows_are_the_models_and_read_once(self) -> None:
        body = {**CHAT, "max_tokens": 5, "omnipd_conditioning": {"key": "batch-1", "layer": 24}}
        status, out = self.w.post("/v1/chat/completions", body)
        self.assertEqual(status, 200, out)
        prompt = self.tokenize({"messages": CHAT["messages"]})
        gen_ids = self._tokens(CHAT, 5)
        self.assertEqual(out["omnipd_conditioning"], {"key": "batch-1", "rows": len(prompt) + 5 - 1})
        status, hdrs, data = self.w.request("GET", "/v1/omnipd/conditioning/batch-1")
        self.assertEqual(status, 200)
        self.assertEqual(hdrs["content-type"], "application/octet-stream")
        st = decode_ocnd(data)
        seq = prompt + gen_ids
        emb, hid = expected_rows(seq[:-1])
        self.assertEqual((st["embed"], st["hidden"]), (emb, hid))
        self.assertEqual(st["tts"], tuple(toy.embedding(t) for t in (toy.TTS_PAD, toy.TTS_BOS, toy.TTS_EOS)))
        self.assertEqual((st["token_ids"], st["prompt_token_ids"]), (seq, prompt))
        self.assertEqual(self.w.request("GET", "/v1/omnipd/conditioning/batch-1")[0], 404)
        self.assertEqual(self.w.request("DELETE", "/v1/omnipd/conditioning/batch-1")[0], 404)

    def test_delete_frees_and_a_release_can_overtake_the_stash(self) -> None:
        body = {"prompt": "free me", "max_tokens": 2, "omnipd_conditioning": {"key": "del-1"}}
        self.assertEqual(self.w.post("/v1/completions", body)[0], 200)
        self.assertEqual(self.w.request("DELETE", "/v1/omnipd/conditioning/del-1")[0], 204)
        self.assertEqual(self.w.request("GET", "/v1/omnipd/conditioning/del-1")[0], 404)
        # Released before it was kept: the stash that comes is discarded.
        self.assertEqual(self.w.request("DELETE", "/v1/omnipd/conditioning/early-1")[0], 404)
        status, out = self.w.post("/v1/completions", {**body, "omnipd_conditioning": {"key": "early-1"}})
        self.assertEqual(status, 200)
        self.assertNotIn("omnipd_conditioning", out)
        self.assertEqual(self.w.request("GET", "/v1/omnipd/conditioning/early-1")[0], 404)

    def test_streamed_stash_reads_the_batch_rows_in_order(self) -> None:
        body = {**CHAT, "max_tokens": 7}
        self.w.post("/v1/chat/completions", {**body, "omnipd_conditioning": {"key": "b-2"}})
        _, _, batch = self.w.request("GET", "/v1/omnipd/conditioning/b-2")
        status, out = self.w.post("/v1/chat/completions", {**body, "omnipd_conditioning": {"key": "s-2", "stream": True}})
        self.assertEqual(status, 200, out)
        bodies, rows = read_stream(self.w, "s-2")
        whole = decode_ocnd(batch)
        self.assertEqual((rows["embed"], rows["hidden"]), (whole["embed"], whole["hidden"]))
        self.assertEqual(rows["last"]["token_ids"], whole["token_ids"])
        self.assertEqual(rows["last"]["tts"], whole["tts"])
        self.assertEqual(self.w.request("GET", "/v1/omnipd/conditioning/s-2?from=0")[0], 404)
        self.assertEqual(self.w.metric("omnipd_conditioning_stashes"), 0)

    def test_streamed_reads_while_the_thinker_decodes(self) -> None:
        key = "live-1"
        open(self.w.hold, "w").close()
        try:
            s = _stream(self.w, "/v1/completions", {"prompt": "grow", "max_tokens": 4, "stream": True,
                                                    "omnipd_conditioning": {"key": key, "stream": True}})
            # The engine holds the request after its first step: the stash
            # has the prompt's rows and is still open.
            status, hdrs, data = self.w.request("GET", f"/v1/omnipd/conditioning/{key}?from=0")
            self.assertEqual(status, 200)
            self.assertEqual(decode_ocnd(data)["rows"], len("grow"))
            self.assertEqual(hdrs["omnipd-conditioning-done"], "false")
            self.assertEqual(self.w.request("GET", f"/v1/omnipd/conditioning/{key}")[0], 404)  # growing
        finally:
            os.unlink(self.w.hold)
        _, rest = read_stream(self.w, key, start=len("grow"))
        self.assertEqual(len(rest["embed"]), 4 - 1)
        s.close()

    def test_engine_failure_mid_answer(self) -> None:
        open(self.w.fail, "w").close()
        try:
            events = self.w.events("/v1/completions", {"prompt": "fail", "max_tokens": 5, "stream": True,
                                                       "omnipd_conditioning": {"key": "failed-1", "stream": True}})
            self.assertEqual(events[-1], "[DONE]")
            self.assertEqual(events[-2]["error"]["type"], "server_error")
            self.assertIn("stand-in engine failed", events[-2]["error"]["message"])
            status, _, data = self.w.request("GET", "/v1/omnipd/conditioning/failed-1?from=0")
            self.assertEqual(status, 502, data)
            self.assertEqual(self.w.request("GET", "/v1/omnipd/conditioning/failed-1?from=0")[0], 404)
            status, out = self.w.post("/v1/completions", {"prompt": "fail", "max_tokens": 5})
            self.assertEqual(status, 500, out)
            self.assertEqual(out["error"]["type"], "server_error")
        finally:
            os.unlink(self.w.fail)
        self.assertEqual(self.w.request("GET", "/health", auth=False)[0], 200)

    def test_from_must_be_an_offset(self) -> None:
        status, _, data = self.w.request("GET", "/v1/omnipd/conditioning/x?from=-1")
        self.assertEqual(status, 400, data)

    def _tokens(self, chat: dict, n: int) -> list[int]:
        _, out = self.w.post("/v1/chat/completions", {**chat, "max_tokens": n, "return_token_ids": True})
        return out["choices"][0]["token_ids"]


def _stream(w: Worker, path: str, body: dict, request_id: str = "") -> socket.socket:
    """Sends a streamed request on a raw socket and returns it once the
    first event has arrived."""
    s = socket.create_connection(("127.0.0.1", w.port), timeout=60)
    data = json.dumps(body).encode()
    rid = f"X-Request-Id: {request_id}\r\n".encode() if request_id else b""
    s.sendall(b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\n" + rid + b"Authorization: Bearer " +
              SECRET.encode() + b"\r\nContent-Length: %d\r\n\r\n%s" % (len(data), data))
    got = b""
    while b"data:" not in got:
        chunk = s.recv(65536)
        if not chunk:
            raise AssertionError(f"the worker closed the stream: {got!r}")
        got += chunk
    return s


class CancelTest(unittest.TestCase):
    def test_client_gone_aborts_the_engine_request(self) -> None:
        w = Worker(0)
        try:
            open(w.hold, "w").close()
            s = _stream(w, "/v1/completions", {"prompt": "cancel me", "max_tokens": 50, "stream": True}, "gone-1")
            s.close()
            released = w.wait_record(lambda r: r["event"] == "released" and r["request_id"] == "gone-1",
                                     "the request released")
            self.assertNotEqual(released["reason"], "finished")
            self.assertEqual(released["running"], 0)
            self.assertGreaterEqual(w.metric("omnipd_stage_engine_aborts_total"), 1)
            w.wait_record(lambda r: r["event"] == "abort" and r["request_id"] == "gone-1", "the worker's abort")
        finally:
            w.stop()


class PDTest(unittest.TestCase):
    """A prefill worker and a decode worker given the prefill's
    kv_transfer_params answer as a colocated worker does."""

    @classmethod
    def setUpClass(cls) -> None:
        cls.full = Worker(0)
        cls.prefill = Worker(0, "--kv-transfer-config", PRODUCER)
        cls.decode = Worker(0, "--kv-transfer-config", CONSUMER)

    @classmethod
    def tearDownClass(cls) -> None:
        for w in (cls.full, cls.prefill, cls.decode):
            w.stop()

    def _pd(self, body: dict, stream_rows: bool) -> tuple[dict, dict, bytes, bytes]:
        cond = {"stream": True} if stream_rows else {}
        status, pre = self.prefill.post("/v1/chat/completions", {
            **body, "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False},
            "omnipd_conditioning": {"key": "pd/p", **cond}})
        self.assertEqual(status, 200, pre)
        kv = pre["kv_transfer_params"]
        status, dec = self.decode.post("/v1/chat/completions", {
            **body, "kv_transfer_params": kv, "omnipd_conditioning": {"key": "pd/d", **cond}})
        self.assertEqual(status, 200, dec)
        if stream_rows:
            p = b"".join(read_stream(self.prefill, "pd/p")[0])
            d = b"".join(read_stream(self.decode, "pd/d")[0])
            return pre, dec, p, d
        return pre, dec, self.prefill.request("GET", "/v1/omnipd/conditioning/pd/p")[2], \
            self.decode.request("GET", "/v1/omnipd/conditioning/pd/d")[2]

    def test_prefill_returns_nixl_params_and_decode_imports(self) -> None:
        body = {**CHAT, "max_tokens": 6}
        status, full = self.full.post("/v1/chat/completions", body)
        self.assertEqual(status, 200)
        pre, dec, _, _ = self._pd(body, False)
        kv = pre["kv_transfer_params"]
        self.assertEqual({"do_remote_prefill", "do_remote_decode", "remote_block_ids", "remote_engine_id",
                          "remote_host", "remote_port"} - set(kv), set())
        self.assertTrue(kv["do_remote_prefill"])
        self.assertFalse(kv["do_remote_decode"])
        self.assertEqual(dec["choices"][0]["message"]["content"], full["choices"][0]["message"]["content"])
        p = full["usage"]["prompt_tokens"]
        self.assertEqual(dec["usage"]["prompt_tokens_details"]["cached_tokens"], p - 1)
        self.assertEqual(full["usage"]["prompt_tokens_details"]["cached_tokens"], 0)
        self.assertIsNone(dec["kv_transfer_params"])
        added = self.decode.wait_record(lambda r: r["event"] == "add" and r["kv_transfer_params"], "the decode's add")
        self.assertEqual(added["kv_transfer_params"]["remote_engine_id"], kv["remote_engine_id"])

    def test_merged_pd_rows_equal_colocated_rows(self) -> None:
        for stream_rows in (False, True):
            with self.subTest(streamed=stream_rows):
                body = {**CHAT, "max_tokens": 5}
                self.full.post("/v1/chat/completions", {**body, "omnipd_conditioning": {"key": "colo"}})
                colo = decode_ocnd(self.full.request("GET", "/v1/omnipd/conditioning/colo")[2])
                _, _, p_raw, d_raw = self._pd(body, stream_rows)
                if stream_rows:
                    pre = _join(p_raw)
                    dec = _join(d_raw)
                else:
                    pre, dec = decode_ocnd(p_raw), decode_ocnd(d_raw)
                n = len(pre["prompt_token_ids"])
                self.assertEqual(len(pre["embed"]), n)
                self.assertEqual(pre["embed"][:n] + dec["embed"][1:], colo["embed"])
                self.assertEqual(pre["hidden"][:n] + dec["hidden"][1:], colo["hidden"])
                self.assertEqual(dec["embed"][0], pre["embed"][n - 1])  # the recomputed last prompt position
                self.assertEqual(dec["token_ids"], colo["token_ids"])


def _join(raw: bytes) -> dict:
    """The OCND bodies of a streamed read, concatenated, as one stash."""
    out: dict = {"embed": [], "hidden": []}
    i = 0
    while i < len(raw):
        import struct
        rows, ew, hw, tts, ntok, nprompt = struct.unpack_from("<6I", raw, i + 5)
        size = 29 + 4 * (rows * ew + rows * hw + 3 * tts + ntok + nprompt)
        st = decode_ocnd(raw[i:i + size])
        out["embed"] += st["embed"]
        out["hidden"] += st["hidden"]
        if st["rows"] or "token_ids" not in out:
            out["token_ids"], out["prompt_token_ids"] = st["token_ids"], st["prompt_token_ids"]
        i += size
    return out


if __name__ == "__main__":
    unittest.main()
