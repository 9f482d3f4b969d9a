"""The one place the worker touches the engine's tensors.

vllm-omni hands out torch tensors (on the GPU, in bf16 or f32); the stand-in
hands out small objects with ``.tolist()``. Everything the worker keeps or
sends is float32 little-endian bytes or Python ints, so it converts here:
with ``.detach().cpu().float().numpy().tobytes()`` when the value has them
(a torch tensor: only a GPU run exercises that path), with ``.tolist()``
otherwise. Going the other way (rows for the Talker's prompt), it builds a
torch tensor when torch is importable and a list of lists when it is not.

A value may also be a list of tensors: vllm-omni's output processor keeps
a DELTA request's multimodal tensors as a list of per-step pieces until the
request finishes (``vllm_omni/engine/output_processor.py``
``_merge_payload`` at 00994b0143ecd84cc84e27dd9c42ce569f8a9c4f); the pieces
are joined along rows.
"""

from __future__ import annotations

import struct
import sys
from array import array
from typing import Any

_LITTLE = sys.byteorder == "little"


def _is_torch(x: Any) -> bool:
    return hasattr(x, "detach") and hasattr(x, "cpu")


def _to_host(x: Any) -> Any:
    """A torch tensor as a float32 numpy array on the host; others as they are."""
    if _is_torch(x):
        return x.detach().cpu().float().numpy()
    return x


def _nested(x: Any) -> Any:
    x = _to_host(x)
    if hasattr(x, "tolist"):
        return x.tolist()
    return x


def _pieces(x: Any) -> list[Any]:
    """x as a list of row blocks: a list of tensors stays a list."""
    if isinstance(x, (list, tuple)) and x and not isinstance(x[0], (int, float, list, tuple)):
        return list(x)
    return [x]


def rows(x: Any, width_hint: int | None = None) -> tuple[int, int, bytes]:
    """A 2-D value (or a list of 2-D pieces) as (rows, width, f32le bytes)."""
    out = bytearray()
    n = 0
    width = width_hint or 0
    for piece in _pieces(x):
        host = _to_host(piece)
        if hasattr(host, "astype") and hasattr(host, "tobytes"):
            a = host.reshape(-1, host.shape[-1]) if host.ndim != 2 else host
            n += int(a.shape[0])
            width = int(a.shape[1])
            out += a.astype("<f4").tobytes()
            continue
        data = _nested(host)
        if data and not isinstance(data[0], list):
            data = [data]
        while data and data[0] and isinstance(data[0][0], list):  # [1, T, H] and the like
            data = [r for block in data for r in block]
        for r in data:
            if width and len(r) != width:
                raise ValueError(f"rows of different widths: {len(r)} after {width}")
            width = len(r)
            out += f32le(r)
            n += 1
    return n, width, bytes(out)


def vector(x: Any) -> tuple[int, bytes]:
    """One embedding vector as (width, f32le bytes): of any shape ([H],
    [1, H], [1, 1, H]), and of a value accumulated over steps ([k, 1, H] or
    a list of per-step ones) the last, since every step carries the same."""
    if isinstance(x, (list, tuple)) and x and not isinstance(x[0], (int, float, list, tuple)):
        x = x[-1]
    host = _to_host(x)
    if hasattr(host, "astype") and hasattr(host, "tobytes"):
        last = host.reshape(-1, host.shape[-1])[-1]
        return int(last.shape[0]), last.astype("<f4").tobytes()
    data = _nested(host)
    while isinstance(data, list) and data and isinstance(data[-1], list):
        data = data[-1]
    return len(data), f32le(data)


def _flatten(v: Any) -> Any:
    if isinstance(v, (list, tuple)):
        for item in v:
            yield from _flatten(item)
    else:
        yield v


def f32le(values: Any) -> bytes:
    a = array("f", values)
    if not _LITTLE:
        a.byteswap()
    return a.tobytes()


def floats(b: bytes) -> list[float]:
    a = array("f")
    a.frombytes(b)
    if not _LITTLE:
        a.byteswap()
    return a.tolist()


def int_rows(x: Any) -> list[list[int]]:
    """A 2-D integer value (or a list of 2-D pieces) as lists of ints."""
    out: list[list[int]] = []
    for piece in _pieces(x):
        host = piece.detach().cpu() if _is_torch(piece) else piece
        data = host.tolist() if hasattr(host, "tolist") else host
        if data and not isinstance(data[0], list):
            data = [data]
        out.extend([int(v) for v in r] for r in data)
    return out


def samples(x: Any) -> bytes:
    """An audio value ([1, N], [N], or a list of pieces) as f32le bytes."""
    out = bytearray()
    for piece in _pieces(x):
        host = _to_host(piece)
        if hasattr(host, "astype") and hasattr(host, "tobytes"):
            out += host.reshape(-1).astype("<f4").tobytes()
        else:
            out += f32le(list(_flatten(_nested(host))))
    return bytes(out)


def engine_rows(b: bytes, n: int, width: int) -> Any:
    """f32le rows as the engine takes them: a float32 torch tensor [n, width]
    when torch is importable (the real engine), else a list of lists."""
    try:
        import torch  # noqa: PLC0415 - only a real engine's process has it
    except ImportError:
        vals = floats(b)
        return [vals[i * width:(i + 1) * width] for i in range(n)]
    t = torch.frombuffer(bytearray(b), dtype=torch.float32) if b else torch.zeros(0, dtype=torch.float32)
    if not _LITTLE:
        t = t.byteswap()
    return t.reshape(n, width)


def engine_vector(b: bytes) -> Any:
    """An f32le vector as the engine takes it: a [1, H] tensor, or a list."""
    try:
        import torch  # noqa: PLC0415
    except ImportError:
        return [floats(b)]
    return torch.frombuffer(bytearray(b), dtype=torch.float32).reshape(1, -1)


def pack_u32(*values: int) -> bytes:
    return struct.pack("<%dI" % len(values), *values)


def pack_i32(values: list[int]) -> bytes:
    return struct.pack("<%di" % len(values), *values)
