"""The Thinker worker's conditioning stash, and its OCND v1 wire form.

A Thinker request that asks for ``omnipd_conditioning`` keeps, under a key,
the rows it computed (layer-0 embeddings and the accept_hidden_layer hidden
states, one row per position), the three TTS embeddings, the full token ids
and the prompt's, until the Talker fetches them (``GET``, which frees the
stash), releases them (``DELETE``) or the TTL runs out. A streamed stash
(async chunk) is opened before the engine starts the request, grows as each
step's rows arrive and is closed (or failed) when the request ends; readers
ask for rows from an offset and wait, a bounded time, while there are none.
The semantics follow omnipd's Go store (stageconn) and docs/stage-api.md.

The store belongs to the event loop: no locks, no threads.
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .tensors import pack_i32, pack_u32

MAGIC = b"OCND"
VERSION = 1
DEFAULT_TTL_S = 60.0
DEFAULT_READ_WAIT_S = 10.0
MAX_KEY_LEN = 256


@dataclass
class Stash:
    """One request's conditioning as one Thinker worker computed it. Rows
    are f32le bytes, row after row."""

    embed_width: int = 0
    hidden_width: int = 0
    rows: int = 0
    embed: bytearray = field(default_factory=bytearray)
    hidden: bytearray = field(default_factory=bytearray)
    tts_width: int = 0
    tts: bytes = b""  # pad, bos, eos: 3 * tts_width f32le values
    token_ids: list[int] = field(default_factory=list)
    prompt_token_ids: list[int] = field(default_factory=list)

    def add_rows(self, n: int, embed_width: int, embed: bytes, hidden_width: int, hidden: bytes) -> None:
        if n == 0:
            return
        if self.rows and (embed_width != self.embed_width or hidden_width != self.hidden_width):
            raise ValueError(f"rows of width {embed_width}/{hidden_width} after {self.embed_width}/{self.hidden_width}")
        if len(embed) != 4 * n * embed_width or len(hidden) != 4 * n * hidden_width:
            raise ValueError(f"{n} rows do not match {len(embed)} embed and {len(hidden)} hidden bytes")
        self.embed_width, self.hidden_width = embed_width, hidden_width
        self.embed += embed
        self.hidden += hidden
        self.rows += n


def encode(st: Stash, start: int = 0) -> bytes:
    """The OCND v1 body of st's rows from row start on (docs/stage-api.md):
    magic, version, six u32 counts, the embed rows, the hidden rows, the
    three TTS vectors, the token ids and the prompt ids, all little-endian."""
    start = min(start, st.rows)
    n = st.rows - start
    ew, hw = (st.embed_width, st.hidden_width) if n else (0, 0)
    if len(st.tts) != 12 * st.tts_width:
        raise ValueError("the three TTS embeddings differ in width")
    return b"".join((
        MAGIC, bytes([VERSION]),
        pack_u32(n, ew, hw, st.tts_width, len(st.token_ids), len(st.prompt_token_ids)),
        bytes(st.embed[4 * start * st.embed_width:]), bytes(st.hidden[4 * start * st.hidden_width:]),
        st.tts, pack_i32(st.token_ids), pack_i32(st.prompt_token_ids),
    ))


def decode(data: bytes) -> Stash:
    """Reads an OCND v1 body, refusing one whose length does not match."""
    if len(data) < 29 or data[:4] != MAGIC or data[4] != VERSION:
        raise ValueError("not a conditioning stash")
    rows, ew, hw, tts, ntok, nprompt = struct.unpack_from("<6I", data, 5)
    total = rows * ew + rows * hw + 3 * tts + ntok + nprompt
    if len(data) - 29 != 4 * total:
        raise ValueError(f"stash of {len(data)} bytes does not match its header")
    off = 29
    st = Stash(embed_width=ew, hidden_width=hw, rows=rows, tts_width=tts)
    st.embed = bytearray(data[off:off + 4 * rows * ew])
    off += 4 * rows * ew
    st.hidden = bytearray(data[off:off + 4 * rows * hw])
    off += 4 * rows * hw
    st.tts = data[off:off + 12 * tts]
    off += 12 * tts
    st.token_ids = list(struct.unpack_from("<%di" % ntok, data, off))
    off += 4 * ntok
    st.prompt_token_ids = list(struct.unpack_from("<%di" % nprompt, data, off))
    return st


class NotFound(Exception):
    """No such stash: never kept, already read, released or expired."""


class Exists(Exception):
    """The key is already stashed."""


class Failed(Exception):
    """The stash's writer (the Thinker request) failed."""


class Growing(Exception):
    """A whole fetch of a stash still growing; read it from an offset."""


class PastEnd(Exception):
    """An offset past the rows of a closed stash."""


@dataclass
class _Entry:
    stash: Stash
    expires: float
    open: bool = False
    error: str | None = None
    grown: asyncio.Event = field(default_factory=asyncio.Event)

    def wake(self) -> None:
        self.grown.set()
        self.grown = asyncio.Event()


class Store:
    """Stashes by key, with the TTL and the tombstones of docs/stage-api.md."""

    def __init__(self, ttl_s: float = DEFAULT_TTL_S, read_wait_s: float = DEFAULT_READ_WAIT_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl = ttl_s
        self.read_wait_s = read_wait_s
        self._clock = clock
        self._entries: dict[str, _Entry] = {}
        # Keys released before they were stashed, and keys whose stash ended
        # (read to its end, taken, dropped, expired), kept until the TTL.
        self._released: dict[str, float] = {}
        self._ended: dict[str, float] = {}
        self._stashed = asyncio.Event()
        self._timer: asyncio.TimerHandle | None = None
        self.waiting = 0  # reads held open for rows (or a stash) not there yet

    def __len__(self) -> int:
        self._sweep()
        return len(self._entries)

    # ---- writers ----

    def put(self, key: str, st: Stash) -> bool:
        """Keeps st under key; False when the key was released first (the
        stash is discarded)."""
        return self._put(key, st, opened=False)

    def open(self, key: str, head: Stash) -> bool:
        """Opens a stash that grows; False when the key was released first."""
        return self._put(key, head, opened=True)

    def _put(self, key: str, st: Stash, opened: bool) -> bool:
        if not key or len(key) > MAX_KEY_LEN:
            raise ValueError(f"invalid key {key!r}: want 1..{MAX_KEY_LEN} characters")
        self._sweep()
        if key in self._entries:
            raise Exists(f"key {key!r} already stashed")
        if self._released.pop(key, None) is not None:
            self._ended[key] = self._clock() + self._ttl
            self._wake_stashed()
            return False
        self._ended.pop(key, None)
        self._entries[key] = _Entry(stash=st, expires=self._clock() + self._ttl, open=opened)
        self._arm()
        self._wake_stashed()
        return True

    def append(self, key: str, n: int, embed_width: int, embed: bytes, hidden_width: int, hidden: bytes,
               tokens: list[int]) -> bool:
        """Adds rows to an open stash; False when it is gone (released or
        expired: nobody will read more, so the writer stops)."""
        e = self._open_entry(key)
        if e is None:
            return False
        e.stash.add_rows(n, embed_width, embed, hidden_width, hidden)
        e.stash.token_ids.extend(tokens)
        e.expires = self._clock() + self._ttl
        e.wake()
        return True

    def close(self, key: str) -> None:
        self._end(key, None)

    def fail(self, key: str, cause: str) -> None:
        self._end(key, cause or "unknown cause")

    def _end(self, key: str, cause: str | None) -> None:
        e = self._open_entry(key)
        if e is None:
            return
        e.open, e.error = False, cause
        e.expires = self._clock() + self._ttl
        e.wake()

    def _open_entry(self, key: str) -> _Entry | None:
        self._sweep()
        e = self._entries.get(key)
        return e if e is not None and e.open else None

    # ---- readers ----

    def take(self, key: str) -> Stash:
        """The whole stash, freed as it is returned."""
        self._sweep()
        e = self._entries.get(key)
        if e is None:
            raise NotFound(f"no stash {key!r} (never stashed, already fetched, released or expired)")
        if e.open or e.error is not None:
            raise Growing(f"stash {key!r} is still growing (or failed); read it from an offset")
        self._remove(key)
        return e.stash

    def drop(self, key: str) -> bool:
        """Frees the stash; False when there was none, in which case a stash
        put under key before the TTL runs out is discarded."""
        self._sweep()
        if key in self._entries:
            self._remove(key)
            return True
        self._released[key] = self._clock() + self._ttl
        self._arm()
        return False

    async def read(self, key: str, start: int, wait_s: float | None = None) -> tuple[Stash, bool, bool]:
        """Rows of key from row start on: (stash view, done, waited). Waits
        while the stash has nothing at start (or does not exist yet), up to
        wait_s; then answers with an empty stash, not done."""
        if start < 0:
            raise ValueError(f"negative offset {start}")
        deadline = self._clock() + (self.read_wait_s if wait_s is None else wait_s)
        waited = False
        while True:
            self._sweep()
            e = self._entries.get(key)
            if e is None:
                if key in self._released or key in self._ended:
                    raise NotFound(f"no stash {key!r} (read to its end, taken, released or expired)")
                event = self._stashed
            else:
                if e.error is not None:
                    self._remove(key)
                    raise Failed(f"the Thinker request of {key!r} failed: {e.error}")
                n = e.stash.rows
                if start > n and not e.open:
                    raise PastEnd(f"offset {start} is past the {n} rows of {key!r}")
                if start < n or not e.open:
                    done = not e.open
                    if done:
                        self._remove(key)
                    else:
                        e.expires = self._clock() + self._ttl
                    return _view(e.stash, start), done, waited
                event = e.grown
            waited = True
            remaining = deadline - self._clock()
            if remaining <= 0:
                return Stash(), False, waited
            self.waiting += 1
            try:
                await asyncio.wait_for(event.wait(), remaining)
            except asyncio.TimeoutError:
                return Stash(), False, waited
            finally:
                self.waiting -= 1

    # ---- housekeeping ----

    def _remove(self, key: str) -> None:
        e = self._entries.pop(key, None)
        if e is not None:
            e.wake()
            self._ended[key] = self._clock() + self._ttl
            self._arm()

    def _wake_stashed(self) -> None:
        self._stashed.set()
        self._stashed = asyncio.Event()

    def _sweep(self) -> None:
        now = self._clock()
        for k in [k for k, e in self._entries.items() if now > e.expires]:
            self._remove(k)
        for tombs in (self._released, self._ended):
            for k in [k for k, until in tombs.items() if now > until]:
                del tombs[k]

    def _arm(self) -> None:
        """Schedules a sweep so that an unfetched stash is freed at its TTL
        even when no other call comes to the store."""
        if self._timer is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._timer = loop.call_later(self._ttl + 0.05, self._sweep_later)

    def _sweep_later(self) -> None:
        self._timer = None
        self._sweep()
        if self._entries or self._released or self._ended:
            self._arm()


def _view(st: Stash, start: int) -> Stash:
    """The rows of st from start on, with its TTS embeddings and ids."""
    start = min(start, st.rows)
    return Stash(embed_width=st.embed_width, hidden_width=st.hidden_width, rows=st.rows - start,
                 embed=bytearray(st.embed[4 * start * st.embed_width:]),
                 hidden=bytearray(st.hidden[4 * start * st.hidden_width:]),
                 tts_width=st.tts_width, tts=st.tts, token_ids=list(st.token_ids),
                 prompt_token_ids=list(st.prompt_token_ids))
