"""Helpers for the worker's tests: start ``python3 -m omnipd_stage`` as a
real subprocess on a free loopback port with the stand-in first on
PYTHONPATH, talk HTTP to it, stop it.

No sleeps as synchronisation: a worker is ready when ``/health`` answers
200, polled under a generous bound that only a hang reaches.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
STAGE_DIR = os.path.dirname(HERE)
REPO = os.path.dirname(STAGE_DIR)
STANDIN = os.path.join(STAGE_DIR, "standin")
FIXTURE = os.path.join(REPO, "deploy", "testdata", "fixtures", "vllm-omni", "qwen3_omni_moe.yaml")
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
SECRET = "test-secret"
BOUND_S = 120.0  # only a hang reaches it

sys.path.insert(0, STANDIN)
sys.path.insert(0, STAGE_DIR)

from vllm_omni import _toy  # noqa: E402  the stand-in's toy, to compute expected rows

toy = _toy


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMNIPD_STANDIN_")}
    env["PYTHONPATH"] = os.pathsep.join([STANDIN, STAGE_DIR])
    env["PYTHONWARNINGS"] = "error"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.pop("VLLM_API_KEY", None)
    env.update(extra or {})
    return env


def run_cli(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Runs the worker to completion (for start-up refusals)."""
    return subprocess.run([PYTHON, "-W", "error", "-m", "omnipd_stage", *args], env=worker_env(env),
                          capture_output=True, text=True, timeout=BOUND_S)


class Worker:
    """One worker process."""

    def __init__(self, stage_id: int, *args: str, secret: str | None = SECRET, env: dict[str, str] | None = None,
                 wait: bool = True) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.secret = secret
        self.dir = tempfile.mkdtemp(prefix="omnipd-stage-test-")
        self.record = os.path.join(self.dir, "record.jsonl")
        self.hold = os.path.join(self.dir, "hold")
        self.fail = os.path.join(self.dir, "fail")
        extra = {"OMNIPD_STANDIN_RECORD": self.record, "OMNIPD_STANDIN_HOLD": self.hold,
                 "OMNIPD_STANDIN_FAIL": self.fail}
        if secret:
            extra["VLLM_API_KEY"] = secret
        extra.update(env or {})
        self.log = open(os.path.join(self.dir, "stderr.log"), "w+")
        self.proc = subprocess.Popen(
            [PYTHON, "-W", "error", "-m", "omnipd_stage", "standin-model", "--deploy-config", FIXTURE,
             "--stage-id", str(stage_id), "--host", "127.0.0.1", "--port", str(self.port), *args],
            env=worker_env(extra), stdout=self.log, stderr=subprocess.STDOUT)
        if wait:
            self.wait_health(200)

    def wait_health(self, want: int) -> None:
        deadline = time.monotonic() + BOUND_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"worker exited with {self.proc.returncode}: {self.stderr()}")
            try:
                status, _, _ = self.request("GET", "/health", auth=False, timeout=5)
                if status == want:
                    return
            except OSError:
                pass
            time.sleep(0.02)  # polling a condition, bounded above
        raise AssertionError(f"/health never answered {want}: {self.stderr()}")

    def stderr(self) -> str:
        self.log.flush()
        with open(self.log.name) as f:
            return f.read()

    def headers(self, auth: bool = True, extra: dict[str, str] | None = None) -> dict[str, str]:
        h = {"Content-Type": "application/json"}
        if auth and self.secret:
            h["Authorization"] = f"Bearer {self.secret}"
        h.update(extra or {})
        return h

    def request(self, method: str, path: str, body: Any = None, auth: bool = True,
                headers: dict[str, str] | None = None, timeout: float = BOUND_S) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
            conn.request(method, path, body=data, headers=self.headers(auth, headers))
            resp = conn.getresponse()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        finally:
            conn.close()

    def post(self, path: str, body: Any, **kw: Any) -> tuple[int, Any]:
        status, _, data = self.request("POST", path, body, **kw)
        return status, json.loads(data) if data else None

    def events(self, path: str, body: Any, headers: dict[str, str] | None = None) -> list[Any]:
        """An SSE answer's events, decoded; ``[DONE]`` as the string."""
        status, hdrs, data = self.request("POST", path, body, headers=headers)
        if status != 200:
            raise AssertionError(f"{path}: HTTP {status}: {data!r}")
        if not hdrs.get("content-type", "").startswith("text/event-stream"):
            raise AssertionError(f"{path}: not an event stream: {hdrs}")
        out: list[Any] = []
        for block in data.decode().split("\n\n"):
            if not block.strip():
                continue
            assert block.startswith("data: "), block
            payload = block[len("data: "):]
            out.append(payload if payload == "[DONE]" else json.loads(payload))
        return out

    def records(self) -> list[dict[str, Any]]:
        if not os.path.exists(self.record):
            return []
        with open(self.record) as f:
            return [json.loads(line) for line in f if line.strip()]

    def wait_record(self, pred: Any, what: str) -> dict[str, Any]:
        deadline = time.monotonic() + BOUND_S
        while time.monotonic() < deadline:
            for r in self.records():
                if pred(r):
                    return r
            time.sleep(0.02)
        raise AssertionError(f"the stand-in never recorded {what}: {self.records()}")

    def metric(self, name: str) -> float:
        _, _, data = self.request("GET", "/metrics", auth=False)
        total = 0.0
        for line in data.decode().splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=BOUND_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


PRODUCER = '{"kv_connector":"NixlConnector","kv_role":"kv_producer"}'
CONSUMER = '{"kv_connector":"NixlConnector","kv_role":"kv_consumer"}'


def decode_ocnd(data: bytes) -> dict[str, Any]:
    """OCND v1 as docs/stage-api.md's table lays it out."""
    assert data[:4] == b"OCND" and data[4] == 1, data[:5]
    rows, ew, hw, tts, ntok, nprompt = struct.unpack_from("<6I", data, 5)
    off = 29

    def floats(n: int) -> list[float]:
        nonlocal off
        v = list(struct.unpack_from("<%df" % n, data, off))
        off += 4 * n
        return v

    def ints(n: int) -> list[int]:
        nonlocal off
        v = list(struct.unpack_from("<%di" % n, data, off))
        off += 4 * n
        return v

    embed = floats(rows * ew)
    hidden = floats(rows * hw)
    pad, bos, eos = floats(tts), floats(tts), floats(tts)
    out = {"rows": rows, "embed_width": ew, "hidden_width": hw, "tts_width": tts,
           "embed": [embed[i * ew:(i + 1) * ew] for i in range(rows)],
           "hidden": [hidden[i * hw:(i + 1) * hw] for i in range(rows)],
           "tts": (pad, bos, eos), "token_ids": ints(ntok), "prompt_token_ids": ints(nprompt)}
    assert off == len(data), f"{len(data) - off} bytes after the last field"
    return out


def read_stream(worker: Worker, key: str, start: int = 0) -> tuple[list[bytes], dict[str, Any]]:
    """Reads a growing stash from start to its end with ?from=N, as the
    Talker does: the bodies and the rows put together."""
    bodies: list[bytes] = []
    rows: dict[str, Any] = {"embed": [], "hidden": []}
    n = start
    deadline = time.monotonic() + BOUND_S
    while time.monotonic() < deadline:
        status, hdrs, data = worker.request("GET", f"/v1/omnipd/conditioning/{key}?from={n}")
        if status != 200:
            raise AssertionError(f"?from={n}: HTTP {status}: {data!r}")
        bodies.append(data)
        st = decode_ocnd(data)
        rows["embed"] += st["embed"]
        rows["hidden"] += st["hidden"]
        n += st["rows"]
        if st["rows"]:
            rows["last"] = st
        if hdrs.get("omnipd-conditioning-done") == "true":
            rows["last"] = st
            return bodies, rows
    raise AssertionError("the stash never ended")
