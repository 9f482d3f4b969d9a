"""The worker: one engine, its HTTP routes, the secret check, health and
metrics.

``/health`` answers 503 while the engine loads (the HTTP server is up before
the model is) and 200 once it is ready. With ``VLLM_API_KEY`` set, every
route but ``/health`` and ``/metrics`` requires ``Authorization: Bearer
<secret>`` and answers 401 before doing anything (docs/stage-api.md). vllm
serve's ``--api-key`` checks the same header, though only under ``/v1``; this
worker also guards ``/tokenize``, ``/detokenize`` and the conditioning, as
omnipd's reference workers do.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from .engine import CODE2WAV, TALKER, THINKER, ModelFacts, StageSpec
from .errors import APIError, invalid, not_found, unauthorized, unavailable
from .httpserver import Conn, Request, Response, error_response, json_response
from .metrics import Metrics
from .stash import Failed, Growing, NotFound, PastEnd, Store, encode

log = logging.getLogger("omnipd_stage")

CONDITIONING_PATH = "/v1/omnipd/conditioning/"
DONE_HEADER = "Omnipd-Conditioning-Done"
WAITED_HEADER = "Omnipd-Conditioning-Waited"


class Worker:
    """Everything one stage worker holds. The event loop owns it."""

    def __init__(self, spec: StageSpec, model: str, served_name: str, secret: str, role: str,
                 conditioning_layer: int | None) -> None:
        self.spec = spec
        self.model = model
        self.served_name = served_name
        self.secret = secret
        self.role = role
        self.conditioning_layer = conditioning_layer
        self.engine: Any = None
        self.tokenizer: Any = None
        self.facts = ModelFacts(max_model_len=0, vocab_size=0, accept_hidden_layer=None, num_layers=None,
                                tts_token_ids=None)
        self.ready = False
        self.load_error: str | None = None
        self.created = int(time.time())
        self.running = 0
        self.stash = Store()
        self.metrics = Metrics(spec.model_stage, served_name)
        self.metrics.watch_stashes(lambda: len(self.stash), lambda: self.stash.waiting)
        self.metrics.watch_running(lambda: self.running)
        self._routes: dict[str, dict[str, Any]] = {}
        self._build_routes()

    def _build_routes(self) -> None:
        from .code2wav import Code2Wav  # noqa: PLC0415 - each stage imports only its own
        from .talker import Talker  # noqa: PLC0415
        from .thinker import Thinker  # noqa: PLC0415

        ms = self.spec.model_stage
        if ms == THINKER:
            t = Thinker(self)
            self._routes = {
                "/v1/completions": {"POST": t.completions},
                "/v1/chat/completions": {"POST": t.chat},
                "/tokenize": {"POST": t.tokenize},
                "/detokenize": {"POST": t.detokenize},
            }
        elif ms == TALKER:
            self._routes = {"/v1/omnipd/talker": {"POST": Talker(self).generate}}
        elif ms == CODE2WAV:
            self._routes = {"/v1/omnipd/code2wav": {"POST": Code2Wav(self).decode}}
        # Every stage answers vLLM's model list: it is the readiness probe
        # plans point at a stage (it needs the secret, /health does not).
        self._routes["/v1/models"] = {"GET": self.models}

    async def models(self, req: Request, conn: Conn) -> Response:
        """vLLM's model list, one ``ModelCard`` (vllm/entrypoints/openai/
        engine/protocol.py): the served name as id and root, no parent, the
        context length and vLLM's one permission."""
        now = int(time.time())
        name = self.served_name
        card = {"id": name, "object": "model", "created": self.created, "owned_by": "vllm", "root": name,
                "parent": None, "max_model_len": self.facts.max_model_len,
                "permission": [{"id": f"modelperm-{uuid.uuid4().hex}", "object": "model_permission",
                                "created": now, "allow_create_engine": False, "allow_sampling": True,
                                "allow_logprobs": True, "allow_search_indices": False, "allow_view": True,
                                "allow_fine_tuning": False, "organization": "*", "group": None,
                                "is_blocking": False}]}
        return json_response({"object": "list", "data": [card]})

    async def abort(self, request_id: str) -> None:
        """Frees an unfinished request in the engine, counted on /metrics."""
        self.metrics.record_abort()
        try:
            await asyncio.shield(self.engine.abort(request_id))
        except Exception as e:  # the request may have ended meanwhile
            log.warning("engine abort failed: %s", e, extra={"request_id": request_id})
        log.info("aborted the engine request", extra={"request_id": request_id})

    async def outputs(self, prompt: Any, sampling_params: Any, request_id: str) -> AsyncIterator[Any]:
        """The engine's outputs for one request, until the finished one. A
        request left unfinished (the consumer stopped early, failed or was
        cancelled) is aborted in the engine."""
        gen = self.engine.generate(prompt, sampling_params, request_id)
        finished = False
        self.running += 1
        try:
            try:
                async for out in gen:
                    err = getattr(out, "error", None)
                    if err:
                        status = getattr(out, "error_status_code", None) or 500
                        raise APIError(status, str(err),
                                       type_="invalid_request_error" if status < 500 else "server_error")
                    finished = bool(out.finished)
                    yield out
                    if finished:
                        return
            except (APIError, ValueError, TypeError):
                raise  # the caller decides whether the engine refused the request (a 400)
            except Exception as e:  # the engine failed: a 500 whose cause the log keeps
                if any(c.__name__ == "VLLMClientError" for c in type(e).__mro__):
                    raise  # vLLM 0.29+'s refusal of the request (VLLMValidationError and its kin)
                log.error("the engine failed: %r", e, extra={"request_id": request_id})
                raise APIError(500, f"the engine failed: {type(e).__name__}: {e}", type_="server_error") from e
        finally:
            self.running -= 1
            if not finished:
                await self.abort(request_id)
            await gen.aclose()

    # ---- dispatch ----

    async def dispatch(self, req: Request, conn: Conn) -> Response | None:
        path = req.path
        endpoint = path if not path.startswith(CONDITIONING_PATH) else CONDITIONING_PATH + "{key}"
        status = 200
        try:
            resp = await self._dispatch(req, conn, path)
            if resp is not None:
                status = resp.status
            return resp
        except APIError as e:
            status = e.status
            if e.status >= 500:
                log.error("request failed: %s", e.message, extra={"request_id": req.request_id})
            else:
                log.info("request refused: %s", e.message, extra={"request_id": req.request_id})
            raise
        except asyncio.CancelledError:
            status = 499  # nginx's "client closed request"
            raise
        except Exception:
            status = 500
            raise
        finally:
            known = endpoint in self._routes or endpoint in ("/health", "/metrics", CONDITIONING_PATH + "{key}")
            self.metrics.record_request(endpoint if known else "other", status)

    async def _dispatch(self, req: Request, conn: Conn, path: str) -> Response | None:
        if path == "/health":
            if req.method not in ("GET", "HEAD"):
                raise _method_not_allowed("GET")
            if self.ready:
                return Response(200)
            return error_response(unavailable(self.load_error or "the engine is loading"))
        if path == "/metrics":
            if req.method != "GET":
                raise _method_not_allowed("GET")
            return Response(200, self.metrics.render().encode(), {"Content-Type": "text/plain; version=0.0.4"})
        if self.secret and not _has_bearer(req, self.secret):
            log.warning("refused a request without the deployment secret", extra={"request_id": req.request_id})
            raise unauthorized()
        if path.startswith(CONDITIONING_PATH) and self.spec.model_stage == THINKER:
            return await self._conditioning(req, path[len(CONDITIONING_PATH):])
        methods = self._routes.get(path)
        if methods is None:
            raise APIError(404, f"Invalid URL ({req.method} {path})")
        handler = methods.get(req.method)
        if handler is None:
            raise _method_not_allowed(", ".join(sorted(methods)))
        if not self.ready:
            raise unavailable(self.load_error or "the engine is loading")
        return await handler(req, conn)

    async def _conditioning(self, req: Request, key: str) -> Response:
        if not key:
            raise not_found("no stash key in the path")
        if req.method == "GET":
            if "from" in req.query:
                return await self._read_from(req, key)
            try:
                st = self.stash.take(key)
            except (NotFound, Growing) as e:
                raise not_found(str(e)) from None
            return Response(200, encode(st), {"Content-Type": "application/octet-stream"})
        if req.method == "DELETE":
            if not self.stash.drop(key):
                raise not_found(f"no stash {key!r}")
            return Response(204)
        raise _method_not_allowed("DELETE, GET")

    async def _read_from(self, req: Request, key: str) -> Response:
        raw = req.query.get("from", [""])[0]
        try:
            start = int(raw)
            if start < 0:
                raise ValueError
        except ValueError:
            raise invalid("from", "from must be a row offset (a non-negative integer)") from None
        try:
            st, done, waited = await self.stash.read(key, start)
        except NotFound as e:
            raise not_found(str(e)) from None
        except Failed as e:
            raise APIError(502, str(e), type_="upstream_error") from None
        except PastEnd as e:
            raise invalid("from", str(e)) from None
        return Response(200, encode(st), {"Content-Type": "application/octet-stream",
                                          DONE_HEADER: "true" if done else "false",
                                          WAITED_HEADER: "true" if waited else "false"})


def _method_not_allowed(allow: str) -> APIError:
    return APIError(405, "method not allowed", code="method_not_allowed", headers={"Allow": allow})


def _has_bearer(req: Request, secret: str) -> bool:
    got = req.header("authorization")
    return hmac.compare_digest(got.encode(), f"Bearer {secret}".encode())
