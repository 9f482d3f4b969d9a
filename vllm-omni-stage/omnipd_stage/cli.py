"""The command line, mirroring ``vllm serve``, and the start-up sequence.

::

    python3 -m omnipd_stage MODEL --deploy-config PATH --stage-id N --host HOST --port PORT
        [--served-model-name NAME] [--kv-transfer-config JSON] [--conditioning-layer N]
        [--tensor-parallel-size N] [--max-model-len N] [--gpu-memory-utilization F]
        [any other engine flag: --flag value, --flag, --no-flag]

A bad flag is refused with one line on stderr and status 2; so is an
install of vllm-omni that lacks an interface the worker calls, checked
before anything is loaded (interfaces.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from typing import Any, NoReturn

from . import interfaces

PROG = "omnipd_stage"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{PROG}: error: {message}\n")


def _positive_int(name: str):
    def parse(v: str) -> int:
        try:
            n = int(v)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer, got {v!r}") from None
        if n < 1:
            raise argparse.ArgumentTypeError(f"{name} must be at least 1, got {n}")
        return n
    return parse


def _port(v: str) -> int:
    try:
        n = int(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--port must be an integer, got {v!r}") from None
    if not 0 <= n <= 65535:
        raise argparse.ArgumentTypeError(f"--port must be 0..65535, got {n}")
    return n


def _fraction(v: str) -> float:
    try:
        f = float(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--gpu-memory-utilization must be a number, got {v!r}") from None
    if not 0 < f <= 1:
        raise argparse.ArgumentTypeError(f"--gpu-memory-utilization must be in (0, 1], got {f}")
    return f


# What each kv_role makes of a Thinker, for its log line. A kv_both engine
# (NixlConnector's usual role on both halves) is a prefill or a decode per
# request, by the kv_transfer_params it is sent: the worker passes them on
# either way and never needs to know which half it is.
KV_ROLES = {"kv_producer": "prefill", "kv_consumer": "decode", "kv_both": "prefill or decode, by request"}


def _kv_config(v: str) -> dict[str, Any]:
    try:
        cfg = json.loads(v)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"--kv-transfer-config is not JSON: {e}") from None
    if not isinstance(cfg, dict):
        raise argparse.ArgumentTypeError("--kv-transfer-config must be a JSON object (vLLM's KVTransferConfig)")
    role = cfg.get("kv_role")
    if role not in KV_ROLES:
        raise argparse.ArgumentTypeError(
            f"--kv-transfer-config: kv_role {role!r}; want kv_producer (prefill), kv_consumer (decode) or kv_both")
    if not isinstance(cfg.get("kv_connector"), str) or not cfg["kv_connector"]:
        raise argparse.ArgumentTypeError("--kv-transfer-config: kv_connector must name vLLM's KV connector "
                                         "(e.g. NixlConnector)")
    return cfg


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog=f"python3 -m {PROG}", description="omnipd's vllm-omni stage worker", allow_abbrev=False)
    p.add_argument("model", help="the model (a path or a Hugging Face name), as vllm serve takes it")
    p.add_argument("--deploy-config", required=True, help="vllm-omni deploy YAML (or a stage-config YAML)")
    p.add_argument("--stage-id", required=True, type=_positive_or_zero, help="the stage of that file to serve")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=_port, default=8000)
    p.add_argument("--served-model-name", nargs="+", default=None)
    p.add_argument("--kv-transfer-config", type=_kv_config, default=None)
    p.add_argument("--conditioning-layer", type=_positive_int("--conditioning-layer"), default=None)
    p.add_argument("--tensor-parallel-size", "-tp", type=_positive_int("--tensor-parallel-size"), default=None)
    p.add_argument("--max-model-len", type=_positive_int("--max-model-len"), default=None)
    p.add_argument("--gpu-memory-utilization", type=_fraction, default=None)
    return p


def _positive_or_zero(v: str) -> int:
    try:
        n = int(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--stage-id must be an integer, got {v!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"--stage-id must be 0 or more, got {n}")
    return n


def _value(v: str) -> Any:
    """An engine flag's value as vllm serve reads it: JSON where it parses
    (numbers, true/false, objects), a string otherwise."""
    try:
        return json.loads(v)
    except json.JSONDecodeError:
        return v


def engine_flags(rest: list[str]) -> dict[str, Any]:
    """The other engine flags: ``--flag value``, ``--flag=value``, ``--flag``
    (true) and ``--no-flag`` (false), named as vllm serve names them."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(rest):
        a = rest[i]
        if not a.startswith("--") or a == "--":
            raise ValueError(f"unexpected argument {a!r}")
        name, eq, val = a[2:].partition("=")
        key = name.replace("-", "_")
        if not key:
            raise ValueError(f"unexpected argument {a!r}")
        if eq:
            out[key] = _value(val)
        elif i + 1 < len(rest) and not rest[i + 1].startswith("--"):
            out[key] = _value(rest[i + 1])
            i += 1
        elif key.startswith("no_"):
            out[key[3:]] = False
        else:
            out[key] = True
        i += 1
    # vllm serve takes the hosts as separate words (nargs="+"); one word
    # here, comma-separated, becomes the list vLLM's ModelConfig holds.
    if isinstance(out.get("allowed_media_domains"), str):
        out["allowed_media_domains"] = [h for h in out["allowed_media_domains"].split(",") if h]
    return out


def parse(argv: list[str]) -> tuple[argparse.Namespace, dict[str, Any]]:
    p = parser()
    args, rest = p.parse_known_args(argv)
    try:
        overrides = engine_flags(rest)
    except ValueError as e:
        p.error(str(e))
    for flag in ("tensor_parallel_size", "max_model_len", "gpu_memory_utilization", "kv_transfer_config"):
        v = getattr(args, flag)
        if v is not None:
            overrides[flag] = v
    return args, overrides


class _RequestIDFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = "-"
        return True


def _setup_logging() -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_RequestIDFilter())
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s request_id=%(request_id)s"))
    root = logging.getLogger("omnipd_stage")
    root.addHandler(handler)
    root.setLevel(os.environ.get("OMNIPD_STAGE_LOG_LEVEL", "INFO").upper())
    root.propagate = False


def main(argv: list[str] | None = None) -> int:
    args, overrides = parse(sys.argv[1:] if argv is None else argv)
    refusal = interfaces.check_message()
    if refusal is not None:
        print(refusal, file=sys.stderr)
        return 2
    _setup_logging()
    from .engine import THINKER, StageError, resolve_stage  # noqa: PLC0415 - after the interface check

    try:
        spec = resolve_stage(args.model, args.deploy_config, args.stage_id, overrides)
    except StageError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # vllm-omni's resolver refusing the model or the file
        print(f"{PROG}: error: --deploy-config {args.deploy_config}: {e}", file=sys.stderr)
        return 2
    refusal = interfaces.check_message(spec.model_stage)
    if refusal is not None:
        print(refusal, file=sys.stderr)
        return 2
    if spec.model_stage != THINKER:
        for flag, v in (("--kv-transfer-config", args.kv_transfer_config),
                        ("--served-model-name", args.served_model_name),
                        ("--conditioning-layer", args.conditioning_layer)):
            if v is not None:
                print(f"{PROG}: error: {flag} is for a Thinker stage; stage {args.stage_id} is the "
                      f"{spec.model_stage}", file=sys.stderr)
                return 2
    from .serve import serve  # noqa: PLC0415

    try:
        return asyncio.run(serve(args, spec))
    except KeyboardInterrupt:
        return 130


def install_signal_handlers(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):
            pass
