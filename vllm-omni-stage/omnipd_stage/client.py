"""The Talker's HTTP/1.1 client for the Thinker workers' conditioning stash.

``GET /v1/omnipd/conditioning/{key}`` (whole, or ``?from=N`` streamed) and
``DELETE``, with the deployment secret, on plain HTTP: the stash moves
worker to worker, never through the orchestrator. Answers with a
Content-Length or chunked (Go's net/http chunks a large body) are read.
"""

from __future__ import annotations

import asyncio
from urllib.parse import quote, urlsplit

from .stash import Stash, decode

PATH = "/v1/omnipd/conditioning/"
TIMEOUT_S = 60.0  # a read waits up to the Thinker's bounded wait (10 s) before it is answered


class FetchError(Exception):
    """A stash could not be had; status is the HTTP status to answer with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


async def _request(method: str, base: str, target: str, secret: str) -> tuple[int, dict[str, str], bytes]:
    u = urlsplit(base)
    if u.scheme != "http" or not u.hostname:
        raise FetchError(400, f"conditioning url {base!r}: want http://host:port")
    port = u.port or 80
    reader, writer = await asyncio.open_connection(u.hostname, port)
    try:
        head = [f"{method} {u.path.rstrip('/')}{target} HTTP/1.1", f"Host: {u.netloc}", "Connection: close",
                "Content-Length: 0"]
        if secret:
            head.append(f"Authorization: Bearer {secret}")
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))
        await writer.drain()
        status_line = await reader.readline()
        parts = status_line.decode("latin-1").split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
            raise FetchError(502, f"{base}: not an HTTP answer: {status_line[:80]!r}")
        status = int(parts[1])
        headers: dict[str, str] = {}
        while True:
            line = await reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            k, _, v = line.decode("latin-1").partition(":")
            headers[k.strip().lower()] = v.strip()
        if "chunked" in headers.get("transfer-encoding", "").lower():
            body = bytearray()
            while True:
                size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    break
                body += await reader.readexactly(size)
                await reader.readexactly(2)
            return status, headers, bytes(body)
        if "content-length" in headers:
            return status, headers, await reader.readexactly(int(headers["content-length"]))
        return status, headers, await reader.read()
    finally:
        writer.close()


async def call(method: str, base: str, key: str, secret: str, start: int | None = None
               ) -> tuple[int, dict[str, str], bytes]:
    target = PATH + quote(key, safe="")
    if start is not None:
        target += f"?from={start}"
    try:
        return await asyncio.wait_for(_request(method, base, target, secret), TIMEOUT_S)
    except FetchError:
        raise
    except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError) as e:
        raise FetchError(502, f"conditioning {key!r} from {base}: {type(e).__name__}: {e}") from None


def _refusal(status: int, body: bytes, key: str, base: str) -> FetchError:
    text = body.decode("utf-8", errors="replace").strip()[:300]
    if status == 404:
        return FetchError(404, f"conditioning {key!r} from {base}: no such stash (never kept, already fetched, "
                               f"released or expired): {text}")
    if status == 401:
        return FetchError(502, f"conditioning {key!r} from {base}: the Thinker refused the deployment secret")
    return FetchError(502, f"conditioning {key!r} from {base}: HTTP {status}: {text}")


async def take(base: str, key: str, secret: str) -> Stash:
    """The whole stash (the Thinker frees it as it answers)."""
    status, _, body = await call("GET", base, key, secret)
    if status != 200:
        raise _refusal(status, body, key, base)
    try:
        return decode(body)
    except ValueError as e:
        raise FetchError(502, f"conditioning {key!r} from {base}: {e}") from None


async def read_from(base: str, key: str, secret: str, start: int) -> tuple[Stash, bool, bool]:
    """Rows from start on: (rows, done, waited), as the stash answers them."""
    status, headers, body = await call("GET", base, key, secret, start)
    if status != 200:
        raise _refusal(status, body, key, base)
    try:
        st = decode(body)
    except ValueError as e:
        raise FetchError(502, f"conditioning {key!r} from {base}: {e}") from None
    return st, headers.get("omnipd-conditioning-done") == "true", headers.get("omnipd-conditioning-waited") == "true"


async def release(base: str, key: str, secret: str) -> None:
    """Frees a stash that will not be read to its end; a 404 is fine."""
    status, _, body = await call("DELETE", base, key, secret)
    if status not in (204, 404):
        raise _refusal(status, body, key, base)
