"""Media in a Thinker's chat: an audio clip and an image through vLLM's chat
parsing into the engine prompt, their placeholders expanded by the engine's
processor, colocated and under PD, and the errors vLLM gives for bad media."""

from __future__ import annotations

import base64
import io
import math
import os
import struct
import tempfile
import unittest
import wave
import zlib

from .support import CONSUMER, PRODUCER, Worker, decode_ocnd


def wav(seconds: float, rate: int = 16000, tone: float = 440.0) -> bytes:
    """A mono 16-bit PCM WAV of a sine tone."""
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        n = int(seconds * rate)
        w.writeframes(b"".join(struct.pack("<h", int(12000 * math.sin(2 * math.pi * tone * i / rate)))
                               for i in range(n)))
    return buf.getvalue()


def png(width: int, height: int, seed: int = 0) -> bytes:
    """An 8-bit RGB PNG whose pixels depend on seed."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + bytes((x * 7 + y * 13 + seed) % 256 for x in range(width) for _ in range(3))
                    for y in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def image_part(data: bytes, kind: str = "image/png") -> dict:
    return {"type": "image_url", "image_url": {"url": f"data:{kind};base64,{base64.b64encode(data).decode()}"}}


def audio_part(data: bytes, fmt: str = "wav") -> dict:
    return {"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode(), "format": fmt}}


def chat(parts: list[dict], max_tokens: int = 8, **extra: object) -> dict:
    return {"messages": [{"role": "system", "content": "Be brief."},
                         {"role": "user", "content": [{"type": "text", "text": "What is this?"}, *parts]}],
            "max_tokens": max_tokens, "temperature": 0, **extra}


CLIP, PICTURE = wav(0.5), png(64, 40)


class MediaTest(unittest.TestCase):
    w: Worker

    @classmethod
    def setUpClass(cls) -> None:
        cls.w = Worker(0)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.w.stop()

    def answer(self, body: dict) -> dict:
        status, out = self.w.post("/v1/chat/completions", body)
        self.assertEqual(status, 200, out)
        return out

    def test_media_expand_into_placeholders_that_count_as_prompt(self) -> None:
        text_only = self.answer(chat([]))["usage"]["prompt_tokens"]
        short = self.answer(chat([audio_part(wav(0.5))]))["usage"]["prompt_tokens"]
        longer = self.answer(chat([audio_part(wav(2.0))]))["usage"]["prompt_tokens"]
        small = self.answer(chat([image_part(png(28, 28))]))["usage"]["prompt_tokens"]
        large = self.answer(chat([image_part(png(112, 84))]))["usage"]["prompt_tokens"]
        # The processor expands each item by its size: audio by duration,
        # an image by its patches; each count replaces one pad token and
        # adds the item's start and end markers.
        self.assertGreater(short, text_only)
        self.assertGreater(longer, short)
        self.assertGreater(small, text_only)
        self.assertGreater(large, small)
        both = self.answer(chat([audio_part(wav(0.5)), image_part(png(28, 28))]))["usage"]["prompt_tokens"]
        self.assertEqual(both - text_only, (short - text_only) + (small - text_only))

    def test_the_rows_and_the_text_depend_on_the_media(self) -> None:
        def kept(body: dict, key: str) -> tuple[dict, dict]:
            out = self.answer({**body, "omnipd_conditioning": {"key": key}})
            status, _, data = self.w.request("GET", f"/v1/omnipd/conditioning/{key}")
            self.assertEqual(status, 200, data)
            return out, decode_ocnd(data)

        a, sa = kept(chat([image_part(png(64, 40, seed=1))]), "media/a")
        b, sb = kept(chat([image_part(png(64, 40, seed=2))]), "media/b")
        again, sagain = kept(chat([image_part(png(64, 40, seed=1))]), "media/a2")
        self.assertEqual(a["usage"], b["usage"])  # same size, same placeholders
        self.assertEqual(sa["prompt_token_ids"], sb["prompt_token_ids"])
        self.assertNotEqual(sa["embed"], sb["embed"])
        self.assertNotEqual(a["choices"][0]["message"]["content"], b["choices"][0]["message"]["content"])
        self.assertEqual((sa["embed"], sa["hidden"]), (sagain["embed"], sagain["hidden"]))
        self.assertEqual(a["choices"][0]["message"]["content"], again["choices"][0]["message"]["content"])
        # The stash holds the expanded prompt, as the engine computed it.
        self.assertEqual(len(sa["prompt_token_ids"]), a["usage"]["prompt_tokens"])
        self.assertEqual(sa["rows"], a["usage"]["prompt_tokens"] + a["usage"]["completion_tokens"] - 1)

    def test_streamed_chat_with_media_equals_whole(self) -> None:
        body = chat([audio_part(CLIP), image_part(PICTURE)])
        whole = self.answer(body)
        events = self.w.events("/v1/chat/completions", {**body, "stream": True,
                                                        "stream_options": {"include_usage": True}})
        self.assertEqual(events[-2]["usage"], whole["usage"])
        text = "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-2] if e["choices"])
        self.assertEqual(text, whole["choices"][0]["message"]["content"])

    def test_bad_media_is_a_400_naming_the_part(self) -> None:
        d = tempfile.mkdtemp(prefix="omnipd-media-")
        self.addCleanup(lambda: os.rmdir(d))
        cases = [
            ([image_part(b"not an image at all")], "messages[1].content[1]", "cannot identify image file"),
            ([audio_part(b"RIFF....WAVEjunk")], "messages[1].content[1]", "Invalid or unsupported audio file"),
            ([audio_part(b"\xff\xfb\x90\x00" + bytes(200), "mp3")], "messages[1].content[1]",
             "Invalid or unsupported audio file"),
            ([audio_part(CLIP), image_part(b"GIF89a")], "messages[1].content[2]", "cannot identify image file"),
            ([{"type": "image_url", "image_url": {"url": "http://example.com/cat.png"}}], "messages[1].content[1]",
             "http"),
            ([{"type": "image_url", "image_url": {"url": f"file://{d}/cat.png"}}], "messages[1].content[1]",
             "--allowed-local-media-path"),
            ([{"type": "image_url", "image_url": {"url": "ftp://example.com/cat.png"}}], "messages[1].content[1]",
             "The URL must be either a HTTP, data or file URL."),
            ([{"type": "image_url", "image_url": {"url": "data:image/png,abc"}}], "messages[1].content[1]",
             "Only base64 data URLs are supported"),
            ([{"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAA"}}], "messages[1].content[1]",
             "video"),
            ([{"type": "hologram", "hologram": {}}], "messages[1].content[1].type",
             "Unsupported chat content part type: 'hologram'"),
            ([{"type": "input_audio", "input_audio": "x"}], "messages[1].content[1].input_audio", "input_audio"),
            ([{"type": "image_url", "image_url": {"uri": "x"}}], "messages[1].content[1].image_url", "url"),
            ([image_part(PICTURE)], "mm_processor_kwargs", "mm_processor_kwargs"),
        ]
        for parts, param, words in cases:
            with self.subTest(param=param, words=words):
                body = chat(parts)
                if param == "mm_processor_kwargs":
                    body["mm_processor_kwargs"] = "yes"
                status, out = self.w.post("/v1/chat/completions", body)
                self.assertEqual(status, 400, out)
                self.assertEqual(out["error"]["param"], param, out)
                self.assertEqual(out["error"]["type"], "invalid_request_error", out)
                self.assertIn(words, out["error"]["message"])
        # Nothing was lost: the worker serves the next request.
        self.answer(chat([audio_part(CLIP), image_part(PICTURE)]))
        self.assertEqual(self.w.metric("omnipd_stage_engine_requests_running"), 0)

    def test_tokenize_refuses_media_naming_the_part(self) -> None:
        status, out = self.w.post("/tokenize", {"messages": chat([image_part(PICTURE)])["messages"]})
        self.assertEqual(status, 400, out)
        self.assertEqual(out["error"]["param"], "messages[1].content[1]")


class LocalMediaTest(unittest.TestCase):
    """--allowed-local-media-path, an engine argument of the stage as for
    vllm serve: file: URLs under it are read, others refused."""

    def test_file_urls_under_the_allowed_path(self) -> None:
        d = tempfile.mkdtemp(prefix="omnipd-media-")
        inside = os.path.join(d, "cat.png")
        with open(inside, "wb") as f:
            f.write(PICTURE)
        self.addCleanup(lambda: (os.unlink(inside), os.rmdir(d)))
        w = Worker(0, "--allowed-local-media-path", d)
        self.addCleanup(w.stop)
        status, by_file = w.post("/v1/chat/completions", chat([{"type": "image_url",
                                                                "image_url": {"url": f"file://{inside}"}}]))
        self.assertEqual(status, 200, by_file)
        status, by_data = w.post("/v1/chat/completions", chat([image_part(PICTURE)]))
        self.assertEqual(status, 200, by_data)
        self.assertEqual(by_file["choices"][0]["message"]["content"], by_data["choices"][0]["message"]["content"])
        self.assertEqual(by_file["usage"], by_data["usage"])
        status, out = w.post("/v1/chat/completions", chat([{"type": "image_url",
                                                           "image_url": {"url": "file:///etc/hostname"}}]))
        self.assertEqual((status, out["error"]["param"]), (400, "messages[1].content[1]"), out)
        self.assertIn("must be a subpath", out["error"]["message"])


class MediaDomainsTest(unittest.TestCase):
    """--allowed-media-domains, comma-separated here (vllm serve takes
    separate words): the stage's engine gets vLLM's list, and a URL from
    another host is vLLM's refusal naming the part."""

    def test_urls_from_other_hosts_are_refused(self) -> None:
        w = Worker(0, "--allowed-media-domains", "media.example,cdn.example")
        self.addCleanup(w.stop)
        loaded = w.wait_record(lambda r: r["event"] == "loaded", "the engine load")
        self.assertEqual(loaded["engine_args"]["allowed_media_domains"], ["media.example", "cdn.example"])
        status, out = w.post("/v1/chat/completions", chat([audio_part(CLIP), {
            "type": "image_url", "image_url": {"url": "https://elsewhere.example/cat.png"}}]))
        self.assertEqual((status, out["error"]["param"]), (400, "messages[1].content[2]"), out)
        self.assertIn("The URL must be from one of the allowed domains: ['media.example', 'cdn.example']. "
                      "Input URL domain: elsewhere.example", out["error"]["message"])


class MediaPDTest(unittest.TestCase):
    """A prefill and a decode worker given the same chat with media answer
    what a colocated worker answers, and their rows merge into its rows."""

    def test_pd_equals_colocated(self) -> None:
        colocated, prefill, decode = Worker(0), Worker(0, "--kv-transfer-config", PRODUCER), \
            Worker(0, "--kv-transfer-config", CONSUMER)
        for w in (colocated, prefill, decode):
            self.addCleanup(w.stop)
        for n, sampling in enumerate(({"temperature": 0}, {"temperature": 0.8, "seed": 5})):
            with self.subTest(sampling=sampling):
                body = {**chat([audio_part(CLIP), image_part(PICTURE)]), **sampling}
                status, want = colocated.post("/v1/chat/completions",
                                              {**body, "omnipd_conditioning": {"key": f"c{n}"}})
                self.assertEqual(status, 200, want)
                status, pre = prefill.post("/v1/chat/completions", {
                    **body, "max_tokens": 1, "ignore_eos": True, "kv_transfer_params": {"do_remote_decode": True},
                    "omnipd_conditioning": {"key": f"p{n}"}})
                self.assertEqual(status, 200, pre)
                status, got = decode.post("/v1/chat/completions", {
                    **body, "kv_transfer_params": pre["kv_transfer_params"],
                    "omnipd_conditioning": {"key": f"d{n}"}})
                self.assertEqual(status, 200, got)
                self.assertEqual(got["choices"][0]["message"]["content"], want["choices"][0]["message"]["content"])
                p = want["usage"]["prompt_tokens"]
                self.assertEqual(pre["usage"]["prompt_tokens"], p)
                self.assertEqual(got["usage"]["prompt_tokens"], p)
                self.assertEqual(got["usage"]["completion_tokens"], want["usage"]["completion_tokens"])
                self.assertEqual(got["usage"]["prompt_tokens_details"], {"cached_tokens": p - 1})
                rows = {}
                for name, w, key in (("c", colocated, f"c{n}"), ("p", prefill, f"p{n}"), ("d", decode, f"d{n}")):
                    status, _, data = w.request("GET", f"/v1/omnipd/conditioning/{key}")
                    self.assertEqual(status, 200, data)
                    rows[name] = decode_ocnd(data)
                self.assertEqual(rows["p"]["rows"], p)
                self.assertEqual(rows["p"]["prompt_token_ids"], rows["c"]["prompt_token_ids"])
                self.assertEqual(rows["p"]["embed"] + rows["d"]["embed"][1:], rows["c"]["embed"])
                self.assertEqual(rows["p"]["hidden"] + rows["d"]["hidden"][1:], rows["c"]["hidden"])
                self.assertEqual(rows["d"]["token_ids"], rows["c"]["token_ids"])


if __name__ == "__main__":
    unittest.main()
