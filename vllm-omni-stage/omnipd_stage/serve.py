"""Running the worker: the HTTP server first (``/health`` answers 503), then
the engine, then ready (200) until SIGTERM or SIGINT.

The engine is built in a thread: vllm-omni's ``AsyncOmni`` constructor
loads the model and starts the engine processes synchronously, and the
event loop must keep answering ``/health`` meanwhile.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

from .app import Worker
from .cli import KV_ROLES, PROG, install_signal_handlers
from .engine import THINKER, StageSpec, build_engine, model_facts
from .httpserver import HTTPServer

log = logging.getLogger("omnipd_stage")

# Bounds a request body: the largest a Code2Wav or Thinker leg sends is
# far below it (omnipd's reference workers take 64 MiB for Code2Wav).
MAX_BODY_BYTES = 64 << 20


async def serve(args: argparse.Namespace, spec: StageSpec) -> int:
    served = (args.served_model_name or [args.model])[0]
    kv = args.kv_transfer_config
    role = KV_ROLES[kv["kv_role"]] if kv else ("full" if spec.model_stage == THINKER else spec.model_stage)
    w = Worker(spec, args.model, served, os.environ.get("VLLM_API_KEY", ""), role, args.conditioning_layer)
    http = HTTPServer(w.dispatch, MAX_BODY_BYTES)
    try:
        server = await http.start(args.host, args.port)
    except OSError as e:
        print(f"{PROG}: error: cannot listen on {args.host}:{args.port}: {e}", file=sys.stderr)
        return 1
    stop = asyncio.Event()
    install_signal_handlers(stop)
    log.info("stage %d (%s, %s) listening on %s:%d; loading the engine", args.stage_id, spec.model_stage, role,
             args.host, args.port)
    loader = asyncio.ensure_future(asyncio.get_running_loop().run_in_executor(None, build_engine, args.model, spec))
    stopper = asyncio.ensure_future(stop.wait())
    await asyncio.wait({loader, stopper}, return_when=asyncio.FIRST_COMPLETED)
    status = 0
    if loader.done():
        try:
            w.engine = loader.result()
            status = await _ready(w, args)
        except Exception as e:  # the engine could not load: say why, and stop
            log.error("the engine failed to load: %s", e)
            print(f"{PROG}: error: the engine failed to load: {e}", file=sys.stderr)
            status = 1
        if status == 0:
            w.ready = True
            log.info("ready: serving %s", served)
            await stopper
    stopper.cancel()
    server.close()
    await http.close()
    await server.wait_closed()
    if w.engine is not None and hasattr(w.engine, "shutdown"):
        try:
            done = w.engine.shutdown()
            if asyncio.iscoroutine(done):
                await done
        except Exception as e:
            log.warning("engine shutdown: %s", e)
    return status


async def _ready(w: Worker, args: argparse.Namespace) -> int:
    """Reads the loaded model's facts; a non-zero status refuses to serve."""
    if w.spec.model_stage != THINKER:
        w.facts = model_facts(w.engine)
        return 0
    w.tokenizer = await w.engine.get_tokenizer()
    w.facts = model_facts(w.engine)
    accept = w.facts.accept_hidden_layer
    if args.conditioning_layer is not None and accept is not None and args.conditioning_layer != accept:
        print(f"{PROG}: error: --conditioning-layer {args.conditioning_layer}, but the model's Talker reads layer "
              f"{accept} (talker_config.accept_hidden_layer), the only hidden layer the Thinker captures",
              file=sys.stderr)
        return 2
    if w.conditioning_layer is None:
        w.conditioning_layer = accept
    if not w.facts.max_model_len:
        print(f"{PROG}: error: the engine reports no max_model_len", file=sys.stderr)
        return 1
    return 0
