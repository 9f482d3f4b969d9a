"""The stand-in's deterministic toy Qwen3-Omni, tokenizer, tensors and YAML.

Not part of vllm-omni: the engine behind the stand-in modules, tiny so that
tests are fast, with the real stages' output shapes.

* Thinker: a byte-level tokenizer with Qwen's chat markers and roles as
  single tokens, vocabulary 300; the row of position i (layer-0 embedding
  and every layer's hidden state, width 8) depends only on tokens 0..i;
  the next token is a function of the prefix (greedy) or of the prefix, the
  seed and the step.
* Media: a PNG's size from its header, a WAV's frames and rate (the
  standard library's wave), a digest of the bytes; the processor expands an
  item's one pad into a count that grows with its size, and a placeholder
  position's row is a function of the digest, so another image changes the
  rows after it and the text.
* Talker: frames of 16 codebook ids (0..2047); the frame of step k is a
  function of the prompt's rows, the reply rows up to k, the seed and the
  step (``TalkerRun``: whole or fed a row at a time, the same frames); stop
  code 2150.
* Code2Wav: 1920 samples per frame, causal with a receptive field of two
  frames, so decoding in chunks with left context equals decoding whole.

Test hooks (environment): OMNIPD_STANDIN_RECORD (a file: one JSON line per
engine event), OMNIPD_STANDIN_HOLD (a file: while it exists, every request
waits after its first output), OMNIPD_STANDIN_FAIL (a file: while it
exists, every request fails after its first output), OMNIPD_STANDIN_LOAD_GATE (a file: loading
waits until it exists), OMNIPD_STANDIN_DROP (``module.attr``: the stand-in
lacks that interface).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import struct
import time
import wave
from typing import Any

MASK = (1 << 64) - 1

VOCAB_SIZE = 300
WIDTH = 8
NUM_LAYERS = 48
ACCEPT_HIDDEN_LAYER = 24
ENDOFTEXT, IM_START, IM_END = 256, 257, 258
SYSTEM, USER, ASSISTANT = 259, 260, 261
TTS_PAD, TTS_BOS, TTS_EOS = 266, 267, 268
AUDIO_START, AUDIO_END, AUDIO_PAD, IMAGE_PAD = 262, 263, 264, 265
VISION_START, VISION_END = 269, 270
CODEBOOKS = 16
CODEBOOK_SIZE = 2048
CODEC_STOP = 2150
SAMPLES_PER_FRAME = 1920
SAMPLE_RATE = 24000

SPECIALS = {
    ENDOFTEXT: "<|endoftext|>", IM_START: "<|im_start|>", IM_END: "<|im_end|>",
    AUDIO_START: "<|audio_start|>", AUDIO_END: "<|audio_end|>", AUDIO_PAD: "<|audio_pad|>",
    IMAGE_PAD: "<|image_pad|>", VISION_START: "<|vision_start|>", VISION_END: "<|vision_end|>",
    TTS_PAD: "<tts_pad>", TTS_BOS: "<tts_text_bos>", TTS_EOS: "<tts_text_eod>",
}
# How a media item appears in a rendered chat before the processor expands
# its one pad: Qwen3-Omni's placeholders (vLLM's get_placeholder_str of the
# Qwen Omni thinkers).
PLACEHOLDERS = {"audio": "<|audio_start|><|audio_pad|><|audio_end|>",
                "image": "<|vision_start|><|image_pad|><|vision_end|>"}
PADS = {"audio": AUDIO_PAD, "image": IMAGE_PAD}
WORDS = {SYSTEM: "system", USER: "user", ASSISTANT: "assistant"}


def mix(x: int) -> int:
    """splitmix64's finaliser."""
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def unit(x: int) -> float:
    """A value in [-1, 1) exactly representable in float32."""
    return ((mix(x) % 2048) - 1024) / 1024.0


# ---- tensors ----

class Tensor:
    """A tiny tensor: nested lists with shape, slicing and ``tolist``."""

    def __init__(self, data: list[Any]) -> None:
        self._data = data

    @property
    def shape(self) -> tuple[int, ...]:
        shape = []
        d: Any = self._data
        while isinstance(d, list):
            shape.append(len(d))
            d = d[0] if d else None
        return tuple(shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __len__(self) -> int:
        return len(self._data)

    def __getitem__(self, i: Any) -> Any:
        v = self._data[i]
        return Tensor(v) if isinstance(v, list) else v

    def tolist(self) -> list[Any]:
        return json.loads(json.dumps(self._data))

    def __repr__(self) -> str:
        return f"Tensor(shape={self.shape})"


def as_lists(x: Any) -> Any:
    """A Tensor, a list of Tensors or nested lists as nested lists of rows."""
    if isinstance(x, Tensor):
        return x.tolist()
    if isinstance(x, list) and x and isinstance(x[0], Tensor):
        out: list[Any] = []
        for t in x:
            out.extend(t.tolist())
        return out
    if hasattr(x, "tolist"):
        return x.tolist()
    return x


# ---- tokenizer ----

class Tokenizer:
    """Byte-level tokens 0..255, then Qwen's markers and roles."""

    def __init__(self) -> None:
        self._names = {**SPECIALS, **WORDS}
        self._by_text = sorted(((t, i) for i, t in self._names.items()), key=lambda p: -len(p[0]))
        self.eos_token_id = IM_END
        self.vocab_size = VOCAB_SIZE

    def __len__(self) -> int:
        return VOCAB_SIZE

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        out: list[int] = []
        i = 0
        while i < len(text):
            for t, tid in self._by_text:
                if text.startswith(t, i):
                    out.append(tid)
                    i += len(t)
                    break
            else:
                out.extend(text[i].encode())
                i += 1
        return out

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        buf = bytearray()
        parts: list[str] = []
        for t in ids:
            if t < 256:
                buf.append(t)
                continue
            if buf:
                parts.append(buf.decode("utf-8", errors="replace"))
                buf = bytearray()
            name = self._names.get(t)
            if name is None or (skip_special_tokens and t in SPECIALS):
                continue
            parts.append(name)
        if buf:
            parts.append(buf.decode("utf-8", errors="replace"))
        return "".join(parts)

    def apply_chat_template(self, conversation: list[dict[str, Any]], tokenize: bool = False,
                            add_generation_prompt: bool = False, **kwargs: Any) -> Any:
        """Qwen's template: a turn's content is a string, or parts in
        vLLM's "openai" content format — text parts as their text, media
        parts ({"type": "audio"}, {"type": "image"}) as their placeholder."""
        def content(c: Any) -> str:
            if not isinstance(c, list):
                return c or ""
            return "".join(p.get("text") or "" if p.get("type") == "text" else PLACEHOLDERS[p["type"]] for p in c)

        text = "".join(f"<|im_start|>{m['role']}\n{content(m.get('content'))}<|im_end|>\n" for m in conversation)
        if add_generation_prompt:
            text += "<|im_start|>assistant\n"
        return self.encode(text, add_special_tokens=False) if tokenize else text


# ---- the Thinker ----

def embedding(token: int) -> list[float]:
    return [unit(token * 64 + j) for j in range(WIDTH)]


def prefix_states(ids: list[int], media: list[int] | None = None) -> list[int]:
    """The state after each position: a function of tokens 0..i and, at a
    placeholder position, of the media row there (media[i], 0 elsewhere)."""
    s = 0x5EED
    out = []
    for i, t in enumerate(ids):
        s = mix(s ^ (t + 0x1000) ^ (media[i] if media else 0))
        out.append(s)
    return out


def media_embedding(feature: int) -> list[float]:
    """The row an encoder gives a placeholder position: a function of the
    item's content and the position within it."""
    return [unit(feature ^ (j * 0x9E3779B1)) for j in range(WIDTH)]


# ---- media, as the stand-in's media connector decodes them ----

class MediaItem:
    """One decoded item: its modality, its size and a digest of its bytes
    (a real connector hands out a PIL image or an (ndarray, rate) pair)."""

    def __init__(self, modality: str, digest: int, *, width: int = 0, height: int = 0, frames: int = 0,
                 rate: int = 0) -> None:
        self.modality, self.digest = modality, digest
        self.width, self.height, self.frames, self.rate = width, height, frames, rate

    def tokens(self) -> int:
        """The placeholders the processor expands the item's pad into: an
        audio clip by its duration (the toy's 12.5 per second, at least
        one), an image by its 28x28 patches (14-pixel patches merged 2x2)."""
        if self.modality == "audio":
            return max(1, -(-self.frames * 25 // (2 * self.rate)))
        return max(1, -(-self.width // 28)) * max(1, -(-self.height // 28))

    def features(self) -> list[int]:
        return [mix(self.digest ^ mix(k + 1)) for k in range(self.tokens())]

    def __repr__(self) -> str:
        return f"MediaItem({self.modality}, {self.digest:016x})"


def digest(data: bytes) -> int:
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "little")


def decode_image(data: bytes) -> MediaItem:
    """A PNG's size from its IHDR chunk; no pixel is decoded. Anything else
    is refused as PIL refuses what it cannot open."""
    if len(data) < 24 or data[:8] != b"\x89PNG\r\n\x1a\n" or data[12:16] != b"IHDR":
        raise ValueError("cannot identify image file <_io.BytesIO object>")
    width, height = struct.unpack(">II", data[16:24])
    if not width or not height:
        raise ValueError("cannot identify image file <_io.BytesIO object>")
    return MediaItem("image", digest(data), width=width, height=height)


def decode_audio(data: bytes) -> MediaItem:
    """A WAV's frames and rate (the standard library's wave); anything
    else, MP3 included, is vLLM's undecodable audio."""
    try:
        with wave.open(io.BytesIO(data)) as w:
            frames, rate = w.getnframes(), w.getframerate()
            w.readframes(frames)
    except (wave.Error, EOFError, struct.error, ValueError):
        raise ValueError("Invalid or unsupported audio file.") from None
    if not frames or not rate:
        raise ValueError("Invalid or unsupported audio file.")
    return MediaItem("audio", digest(data), frames=frames, rate=rate)


def hidden(state: int, layer: int) -> list[float]:
    return [unit(state ^ (layer * 0x9E37 + j * 0x85EB)) for j in range(WIDTH)]


def next_token(state: int, temperature: float, seed: int | None, step: int) -> int:
    if temperature > 0:
        r = mix(state ^ mix((seed if seed is not None else int.from_bytes(os.urandom(8), "little")) + step))
    else:
        r = mix(state ^ 0xABC)
    if r % 61 == 0:
        return IM_END
    return 32 + (r >> 8) % 95


# ---- the Talker ----

TALKER_TAIL = 2  # tts_pad inputs after which the toy stops speaking (the learned end of speech)


def _fold(s: int, block: list[list[float]]) -> int:
    for r in block:
        for v in r:
            s = mix(s ^ struct.unpack("<I", struct.pack("<f", v))[0])
    return s


def talker_prompt_state(rows: list[list[float]], hidden_rows: list[list[float]], tts: list[list[float]],
                        prompt_ids: list[int], prompt_len: int) -> int:
    """The Talker's state after its prompt: a function of the rows the
    prompt reads (the Thinker prompt's P rows and the first reply row, when
    there is one), the TTS embeddings, the Thinker's prompt ids and the
    Talker prompt's length."""
    s = mix(prompt_len)
    for block in (rows, hidden_rows, tts):
        s = _fold(s, block)
    for t in prompt_ids:
        s = mix(s ^ (t + 7))
    return s


def talker_code(state: int, step: int, salt: int) -> int:
    """Codebook 0 of the frame sampled at step (salt 0 is greedy), or the
    stop code, which the toy samples rarely before step 2 never."""
    if step >= 2 and mix(state ^ salt ^ 0x5709) % 37 == 0:
        return CODEC_STOP
    return mix(state ^ mix(salt + step)) % CODEBOOK_SIZE


def residual_codes(state: int, code0: int, step: int) -> list[int]:
    return [code0] + [mix(state ^ (code0 * 31 + step * 131 + q)) % CODEBOOK_SIZE for q in range(1, CODEBOOKS)]


class TalkerRun:
    """The toy Talker's decode, step by step, in the order Qwen3-Omni's
    Talker reads its inputs (and omnipd's reference Talker,
    reference/engine/talker/feed.go): the prompt once the Thinker prompt's rows and
    the first reply row are in; then each step's input is the frame just
    sampled plus one text row: the next reply row while there is one, then
    tts_eos once no row follows, then tts_pad. The frame of step k needs
    reply rows up to k only, so a feed that grows gives the frames of the
    finished conditioning."""

    def __init__(self, temperature: float, seed: int | None) -> None:
        if temperature <= 0:
            self.salt = 0
        else:
            self.salt = seed if seed is not None else int.from_bytes(os.urandom(8), "little")
        self.state = 0
        self.step = 0
        self.eos_fed = False
        self.pads = 0
        self.tts: list[list[float]] = []

    def start(self, rows: list[list[float]], hidden_rows: list[list[float]], tts: list[list[float]],
              prompt_ids: list[int], prompt_len: int) -> None:
        self.tts = tts
        self.state = talker_prompt_state(rows, hidden_rows, tts, prompt_ids, prompt_len)

    def code(self) -> int:
        """Codebook 0 of this step's frame, or the stop code."""
        if self.pads > TALKER_TAIL:
            return CODEC_STOP
        return talker_code(self.state, self.step, self.salt)

    def frame(self, code0: int) -> list[int]:
        return residual_codes(self.state, code0, self.step)

    def advance(self, code0: int, text_row: list[float] | None) -> None:
        """The next step's input: this step's code and a reply row, or None
        when no reply row follows (tts_eos the first time, tts_pad after)."""
        if text_row is None:
            text_row = self.tts[0] if self.eos_fed else self.tts[2]  # pad, bos, eos
            if self.eos_fed:
                self.pads += 1
            self.eos_fed = True
        self.state = _fold(mix(self.state ^ (code0 + 11)), [text_row])
        self.step += 1

def talker_frames(rows: list[list[float]], hidden_rows: list[list[float]], tts: list[list[float]],
                  prompt_ids: list[int], prompt_len: int, temperature: float, seed: int | None) -> list[list[int]]:
    """The frames the toy Talker speaks for the whole conditioning (rows:
    the Thinker prompt's rows, then one per reply token but the last), up
    to the stop code."""
    p = len(prompt_ids)
    run = TalkerRun(temperature, seed)
    run.start(rows[:p + 1], hidden_rows[:p + 1], tts, prompt_ids, prompt_len)
    out: list[list[int]] = []
    while True:
        c = run.code()
        if c == CODEC_STOP:
            return out
        out.append(run.frame(c))
        i = p + len(out)
        run.advance(c, rows[i] if i < len(rows) else None)


# ---- Code2Wav ----

def frame_samples(frame: list[int], prev: list[int] | None) -> list[float]:
    """1920 samples of one frame, a function of it and the frame before."""
    s = mix(sum(c * (q + 1) for q, c in enumerate(frame)) ^ (0 if prev is None else mix(sum(prev) + 1)))
    out = []
    for _ in range(SAMPLES_PER_FRAME):
        s = (s * 6364136223846793005 + 1442695040888963407) & MASK
        out.append(((s >> 40) % 4096 - 2048) / 4096.0)
    return out


# ---- YAML (the subset deploy configs use) ----

def _scalar(v: str) -> Any:
    v = v.strip()
    if v in ("", "~", "null", "Null", "NULL"):
        return None
    if v in ("true", "True", "TRUE"):
        return True
    if v in ("false", "False", "FALSE"):
        return False
    if len(v) >= 2 and v[0] == v[-1] and v[0] in "\"'":
        return v[1:-1]
    if v.startswith(("[", "{")):
        return json.loads(re.sub(r"([{,]\s*)([A-Za-z_][\w.-]*)\s*:", r'\1"\2":', v))
    for conv in (int, float):
        try:
            return conv(v)
        except ValueError:
            pass
    return v


def _strip_comment(line: str) -> str:
    quote = None
    for i, c in enumerate(line):
        if quote:
            if c == quote:
                quote = None
        elif c in "\"'":
            quote = c
        elif c == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[:i].rstrip()
    return line.rstrip()


def load_yaml(text: str) -> Any:
    """Block mappings, block sequences, flow scalars and comments: enough for
    vllm-omni deploy configs. JSON is read as JSON."""
    if text.lstrip().startswith("{"):
        return json.loads(text)
    lines = []
    for raw in text.splitlines():
        s = _strip_comment(raw)
        if s.strip():
            lines.append((len(s) - len(s.lstrip(" ")), s.strip()))
    value, i = _block(lines, 0, lines[0][0] if lines else 0)
    return value


def _block(lines: list[tuple[int, str]], i: int, indent: int) -> tuple[Any, int]:
    if i < len(lines) and lines[i][1].startswith("- "):
        out: list[Any] = []
        while i < len(lines) and lines[i][0] == indent and lines[i][1].startswith("- "):
            item = lines[i][1][2:]
            if ":" in item and not item.startswith(("'", '"', "[", "{")):
                sub = [(indent + 2, item)]
                j = i + 1
                while j < len(lines) and lines[j][0] > indent:
                    sub.append(lines[j])
                    j += 1
                v, _ = _block(sub, 0, indent + 2)
                out.append(v)
                i = j
            else:
                out.append(_scalar(item))
                i += 1
        return out, i
    out_map: dict[str, Any] = {}
    while i < len(lines) and lines[i][0] == indent:
        key, _, rest = lines[i][1].partition(":")
        key = key.strip().strip("\"'")
        i += 1
        if rest.strip():
            out_map[key] = _scalar(rest)
        elif i < len(lines) and lines[i][0] > indent:
            out_map[key], i = _block(lines, i, lines[i][0])
        elif i < len(lines) and lines[i][0] == indent and lines[i][1].startswith("- "):
            out_map[key], i = _block(lines, i, indent)
        else:
            out_map[key] = None
    return out_map, i


# ---- hooks ----

def record(event: str, **fields: Any) -> None:
    path = os.environ.get("OMNIPD_STANDIN_RECORD")
    if not path:
        return
    line = json.dumps({"event": event, "time": time.time(), **fields}, default=str)
    with open(path, "a") as f:
        f.write(line + "\n")


def held() -> bool:
    path = os.environ.get("OMNIPD_STANDIN_HOLD")
    return bool(path) and os.path.exists(path)


def failing() -> bool:
    """OMNIPD_STANDIN_FAIL: while that file exists, requests fail after
    their first output."""
    path = os.environ.get("OMNIPD_STANDIN_FAIL")
    return bool(path) and os.path.exists(path)


def wait_load_gate() -> None:
    path = os.environ.get("OMNIPD_STANDIN_LOAD_GATE")
    if not path:
        return
    deadline = time.monotonic() + 300
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise RuntimeError(f"stand-in load gate {path} never opened")
        time.sleep(0.02)


def drop_interfaces(globs: dict[str, Any], module: str) -> None:
    """The OMNIPD_STANDIN_DROP hook: removes ``module.name`` or
    ``module.Class.method`` from the module whose globals are globs."""
    target = os.environ.get("OMNIPD_STANDIN_DROP", "")
    if not target.startswith(module + "."):
        return
    name, _, method = target[len(module) + 1:].partition(".")
    if method and name in globs and hasattr(globs[name], method):
        delattr(globs[name], method)
    elif not method:
        globs.pop(name, None)
