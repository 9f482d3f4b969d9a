"""A small HTTP/1.1 server on asyncio's streams, enough for a stage worker.

It reads requests with a Content-Length or a chunked body (bounded: a larger
body is a 413), keeps connections alive, writes whole responses with a
Content-Length and streamed ones (SSE) chunked, flushing each event, and
tells the handler when the client goes away: the handler's task is
cancelled, so that the engine request it drives can be aborted.

The standard library has no asyncio HTTP server; ``http.server`` is
threaded and cannot cancel a handler when its client disconnects.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from .errors import APIError, internal, invalid

log = logging.getLogger("omnipd_stage.http")

MAX_HEAD_BYTES = 64 << 10
IDLE_TIMEOUT_S = 120.0


class ClientGone(Exception):
    """The client closed the connection while its answer was being written."""


@dataclass
class Request:
    """One request as read from the wire."""

    method: str
    target: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes
    request_id: str = ""

    def header(self, name: str, default: str = "") -> str:
        return self.headers.get(name.lower(), default)

    def json(self) -> Any:
        """The body as JSON; a 400 when it is not JSON at all."""
        try:
            return json.loads(self.body)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise invalid(None, f"invalid JSON: {e}") from None

    def json_object(self) -> dict[str, Any]:
        body = self.json()
        if not isinstance(body, dict):
            raise invalid(None, "the request body must be a JSON object")
        return body


@dataclass
class Response:
    """A whole response."""

    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)


def json_response(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    body = json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"
    h = {"Content-Type": "application/json"}
    h.update(headers or {})
    return Response(status, body, h)


def error_response(e: APIError) -> Response:
    return json_response(e.body(), e.status, e.headers)


Handler = Callable[[Request, "Conn"], Awaitable[Response | None]]


class Conn:
    """One client connection: reads requests, writes answers."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, max_body: int) -> None:
        self._reader = reader
        self._writer = writer
        self._buf = bytearray()
        self._eof = False
        self._max_body = max_body
        self._streaming = False
        self._started = False
        self.keep_alive = True
        self.request_id = ""

    def next_request(self) -> None:
        """Forgets the last answer's state before the next request."""
        self.request_id = ""
        self._started = self._streaming = False

    # ---- reading ----

    async def _fill(self) -> bool:
        data = await self._reader.read(65536)
        if not data:
            self._eof = True
            return False
        self._buf += data
        return True

    async def _read_until(self, sep: bytes, limit: int) -> bytes | None:
        while True:
            i = self._buf.find(sep)
            if i >= 0:
                out = bytes(self._buf[:i])
                del self._buf[: i + len(sep)]
                return out
            if len(self._buf) > limit:
                raise _Refuse(APIError(431, "request head too large"))
            if self._eof or not await self._fill():
                return None

    async def _read_exact(self, n: int) -> bytes:
        while len(self._buf) < n:
            if self._eof or not await self._fill():
                raise _Refuse(invalid(None, "the request body ended early"))
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out

    async def read_request(self) -> Request | None:
        """The next request, or None when the client closed the connection."""
        head = await self._read_until(b"\r\n\r\n", MAX_HEAD_BYTES)
        if head is None:
            return None
        lines = head.decode("latin-1").split("\r\n")
        while lines and lines[0] == "":  # stray CRLF between requests
            lines.pop(0)
        try:
            method, target, version = lines[0].split(" ")
        except (ValueError, IndexError):
            raise _Refuse(invalid(None, "malformed request line")) from None
        if not version.startswith("HTTP/1."):
            raise _Refuse(APIError(505, "HTTP version not supported"))
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                raise _Refuse(invalid(None, "malformed header line"))
            key = name.strip().lower()
            value = value.strip()
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        conn_hdr = headers.get("connection", "").lower()
        self.keep_alive = ("close" not in conn_hdr) and (version != "HTTP/1.0" or "keep-alive" in conn_hdr)
        body = await self._read_body(headers)
        url = urlsplit(target)
        return Request(method=method, target=target, path=unquote(url.path), query=parse_qs(url.query),
                       headers=headers, body=body)

    async def _read_body(self, headers: dict[str, str]) -> bytes:
        length = headers.get("content-length")
        if length is not None and length.strip().isdigit() and int(length) > self._max_body:
            raise _Refuse(_too_large(self._max_body))
        if headers.get("expect", "").lower() == "100-continue":
            self._writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        if "chunked" in headers.get("transfer-encoding", "").lower():
            out = bytearray()
            while True:
                size_line = await self._read_until(b"\r\n", 1024)
                if size_line is None:
                    raise _Refuse(invalid(None, "the chunked body ended early"))
                try:
                    size = int(size_line.split(b";")[0].strip(), 16)
                except ValueError:
                    raise _Refuse(invalid(None, "malformed chunk size")) from None
                if size == 0:
                    while True:  # trailers, up to the empty line
                        trailer = await self._read_until(b"\r\n", MAX_HEAD_BYTES)
                        if not trailer:
                            return bytes(out)
                if len(out) + size > self._max_body:
                    raise _Refuse(_too_large(self._max_body))
                out += await self._read_exact(size)
                await self._read_exact(2)
        if length is None:
            return b""
        try:
            n = int(length)
        except ValueError:
            raise _Refuse(invalid(None, "malformed Content-Length")) from None
        if n < 0:
            raise _Refuse(invalid(None, "malformed Content-Length"))
        if n > self._max_body:
            raise _Refuse(_too_large(self._max_body))
        return await self._read_exact(n)

    async def wait_closed_by_client(self) -> None:
        """Returns once the client has closed its side (EOF). Data it sends
        meanwhile (a pipelined request) is kept for the next read."""
        while not self._eof:
            if len(self._buf) > MAX_HEAD_BYTES + self._max_body:
                await asyncio.Event().wait()  # stop reading; never returns
            if not await self._fill():
                return

    # ---- writing ----

    def _head(self, status: int, headers: dict[str, str]) -> bytes:
        try:
            reason = HTTPStatus(status).phrase
        except ValueError:
            reason = "Status"
        lines = [f"HTTP/1.1 {status} {reason}"]
        for k, v in headers.items():
            lines.append(f"{k}: {v}")
        if self.request_id:
            lines.append(f"X-Request-Id: {self.request_id}")
        if not self.keep_alive:
            lines.append("Connection: close")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    async def write_response(self, resp: Response) -> None:
        headers = dict(resp.headers)
        headers["Content-Length"] = str(len(resp.body))
        self._started = True
        self._writer.write(self._head(resp.status, headers) + resp.body)
        await self._drain()

    async def start_stream(self, status: int = 200, headers: dict[str, str] | None = None) -> None:
        """Starts a chunked answer (an SSE stream by default)."""
        h = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "Transfer-Encoding": "chunked"}
        h.update(headers or {})
        self._streaming = self._started = True
        self._writer.write(self._head(status, h))
        await self._drain()

    async def send(self, data: bytes) -> None:
        """Writes one piece of a streamed answer and flushes it."""
        if data:
            self._writer.write(b"%x\r\n%s\r\n" % (len(data), data))
            await self._drain()

    async def send_event(self, obj: Any) -> None:
        """Writes one SSE event, ``data: <json>``, and flushes it."""
        payload = obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
        await self.send(b"data: " + payload.encode() + b"\n\n")

    async def end_stream(self) -> None:
        self._writer.write(b"0\r\n\r\n")
        self._streaming = False
        await self._drain()

    @property
    def started(self) -> bool:
        return self._started

    @property
    def streaming(self) -> bool:
        return self._streaming

    async def _drain(self) -> None:
        if self._writer.is_closing():
            raise ClientGone()
        try:
            await self._writer.drain()
        except (ConnectionError, OSError) as e:
            raise ClientGone() from e

    def close(self) -> None:
        self._writer.close()


class _Refuse(Exception):
    """A request that cannot be read: answered, then the connection closes."""

    def __init__(self, err: APIError) -> None:
        super().__init__(err.message)
        self.err = err


def _too_large(limit: int) -> APIError:
    return APIError(413, f"request body exceeds the limit of {limit} bytes", code="request_too_large")


class HTTPServer:
    """Serves one handler (the worker's dispatcher) on a listening socket."""

    def __init__(self, handler: Handler, max_body: int) -> None:
        self._handler = handler
        self._max_body = max_body
        self._conns: set[asyncio.Task[None]] = set()

    async def start(self, host: str, port: int) -> asyncio.Server:
        return await asyncio.start_server(self._serve_conn, host, port, limit=1 << 20)

    async def _serve_conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._conns.add(task)
        conn = Conn(reader, writer, self._max_body)
        try:
            while True:
                conn.next_request()
                try:
                    req = await asyncio.wait_for(conn.read_request(), IDLE_TIMEOUT_S)
                except _Refuse as r:
                    conn.keep_alive = False
                    await conn.write_response(error_response(r.err))
                    return
                except (asyncio.TimeoutError, ConnectionError, ClientGone):
                    return
                if req is None:
                    return
                rid = req.header("x-request-id")
                req.request_id = rid if rid and len(rid) <= 256 else uuid.uuid4().hex
                conn.request_id = req.request_id
                if not await self._run(req, conn) or not conn.keep_alive:
                    return
        finally:
            conn.close()
            if task is not None:
                self._conns.discard(task)

    async def _run(self, req: Request, conn: Conn) -> bool:
        """Runs the handler for req; False when the connection must close."""
        work = asyncio.ensure_future(self._answer(req, conn))
        watch = asyncio.ensure_future(conn.wait_closed_by_client())
        try:
            done, _ = await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
            if work not in done:
                # The client went away before its answer was done: cancel the
                # handler, which aborts whatever it started in the engine.
                log.info("client went away", extra={"request_id": req.request_id})
                work.cancel()
                try:
                    await work
                except (asyncio.CancelledError, Exception):
                    pass
                return False
            return work.result()
        finally:
            watch.cancel()
            try:
                await watch
            except (asyncio.CancelledError, Exception):
                pass

    async def _answer(self, req: Request, conn: Conn) -> bool:
        try:
            resp = await self._handler(req, conn)
        except ClientGone:
            return False
        except APIError as e:
            if conn.started:
                log.error("request failed after its answer began: %s", e.message, extra={"request_id": req.request_id})
                return False
            resp = error_response(e)
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug: answered as a 500, logged with its cause
            log.exception("handler failed", extra={"request_id": req.request_id})
            if conn.started:
                return False
            resp = error_response(internal("internal error"))
        try:
            if resp is not None:
                await conn.write_response(resp)
            elif conn.streaming:
                await conn.end_stream()
        except ClientGone:
            return False
        return True

    async def close(self) -> None:
        for t in list(self._conns):
            t.cancel()
