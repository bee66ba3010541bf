"""mica on Ray Serve: N replicas of a model, each a ``mica.Model`` (the Python package)
with its own continuously batching engine, behind an OpenAI-compatible ingress.

- ``MicaReplica``: one model per replica. Its methods take a ``MicaRequest`` (the OpenAI
  request body) and answer with ``Model.create_chat_completion`` /
  ``create_completion``; ``system_fingerprint`` names the replica that answered.
- Routing: ``PrefixAffinityRouter`` (prefix_router.py) sends requests that share a prompt
  prefix to the same replica, so its prefix cache hits (``usage.prompt_tokens_details.
  cached_tokens`` says how many prompt tokens were reused).
- Autoscaling: each replica reports mica's queue depth (requests waiting for a slot in its
  engine) and running sequences through ``record_autoscaling_stats``; ``queue_depth_policy``
  adds a replica while the average queue depth is above a target and removes one when
  nothing waits and the running sequences would fit on one replica fewer. Ray applies
  ``min_replicas`` / ``max_replicas`` and the up/down-scale delays around it.
- ``OpenAIIngress``: FastAPI routes ``/v1/chat/completions``, ``/v1/completions`` (both with
  ``stream``), ``/v1/models``, ``/health``.

Run it (with ``deploy/ray`` on ``PYTHONPATH``):

    serve run mica_serve:build_app model=/models/model.gguf replicas=2 threads=4

or from Python: ``serve.run(build_app({"model": ..., "replicas": 2}))``. See
docs/deploy.md.
"""


import asyncio
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Dict, List, Optional, Tuple

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from ray import serve
from ray.serve.config import AutoscalingConfig, AutoscalingPolicy, RequestRouterConfig
from ray.serve.handle import DeploymentHandle

import mica

# The OpenAI request fields the replicas pass on to mica; anything else is refused with a
# 400 naming it, rather than ignored.
CHAT_FIELDS = {
    "max_tokens", "max_completion_tokens", "temperature", "top_p", "min_p", "top_k", "stop",
    "seed", "repeat_penalty", "presence_penalty", "frequency_penalty", "logit_bias",
    "logprobs", "top_logprobs", "n", "stream", "stream_options", "response_format",
    "tools", "tool_choice", "model", "messages", "user",
}
COMPLETION_FIELDS = {
    "max_tokens", "temperature", "top_p", "min_p", "top_k", "stop", "seed", "repeat_penalty",
    "presence_penalty", "frequency_penalty", "logit_bias", "logprobs", "echo", "n",
    "stream", "stream_options", "model", "prompt", "user",
}


@dataclass
class MicaRequest:
    """An OpenAI request body on its way to a replica; the router reads its text."""

    kind: str  # "chat" or "completion"
    body: Dict[str, Any] = field(default_factory=dict)

    def routing_text(self) -> str:
        """The prompt as text, messages joined in order (what the prefix router hashes)."""
        if self.kind == "completion":
            p = self.body.get("prompt", "")
            return p if isinstance(p, str) else " ".join(map(str, p))
        parts = []
        for m in self.body.get("messages", []):
            c = m.get("content") or ""
            if isinstance(c, list):
                c = "".join(x.get("text", "") for x in c if isinstance(x, dict))
            parts.append(f"{m.get('role', '')}:{c}\n")
        return "".join(parts)


def _kwargs(body: Dict[str, Any], allowed: set) -> Dict[str, Any]:
    unknown = set(body) - allowed
    if unknown:
        raise mica.InvalidParameter(f"unsupported field(s): {', '.join(sorted(unknown))}")
    kw = {k: v for k, v in body.items() if k not in ("messages", "prompt", "user")}
    if "max_completion_tokens" in kw:
        kw["max_tokens"] = kw.pop("max_completion_tokens")
    if kw.get("logit_bias"):
        kw["logit_bias"] = {int(k): float(v) for k, v in kw["logit_bias"].items()}
    return kw


def queue_depth_policy(ctx: Any, target_queue_depth: float = 2.0,
                       max_running_per_replica: int = 8) -> Tuple[int, Dict[str, Any]]:
    """Ray Serve autoscaling policy on mica's queue depth (``mica_queue_depth``, requests
    waiting in a replica's engine) and running sequences (``mica_running``), as the
    replicas report them. Up: one replica per ``target_queue_depth`` of average queue depth
    above the target. Down: by one when nothing waits anywhere and the running sequences
    fit in one replica fewer at ``max_running_per_replica`` each."""
    current = ctx.current_num_replicas
    metrics = ctx.aggregated_metrics or {}
    queue = list((metrics.get("mica_queue_depth") or {}).values())
    running = list((metrics.get("mica_running") or {}).values())
    if current == 0 or not queue:
        return max(current, 1), ctx.policy_state
    avg_queue = sum(queue) / len(queue)
    if avg_queue > target_queue_depth:
        extra = math.ceil((avg_queue - target_queue_depth) / target_queue_depth)
        return current + max(extra, 1), ctx.policy_state
    if sum(queue) == 0 and current > 1 and sum(running) <= (current - 1) * max_running_per_replica:
        return current - 1, ctx.policy_state
    return current, ctx.policy_state


@serve.deployment(
    ray_actor_options={"num_cpus": 1},
    max_ongoing_requests=32,
    request_router_config=RequestRouterConfig(
        request_router_class="prefix_router:PrefixAffinityRouter",
        request_router_kwargs={"prefix_chars": 256, "imbalance": 8},
    ),
)
class MicaReplica:
    """One replica: a ``mica.Model`` and its engine."""

    def __init__(self, model: str, threads: Optional[int] = None, n_ctx: Optional[int] = None,
                 kv_mem: Optional[int] = None, name: Optional[str] = None) -> None:
        self.model = mica.Model(model, n_threads=threads, n_ctx=n_ctx, kv_mem=kv_mem, name=name)
        ctx = serve.get_replica_context()
        self.replica = ctx.replica_id.unique_id if ctx is not None else f"pid{os.getpid()}"

    def record_autoscaling_stats(self) -> Dict[str, float]:
        m = self.model.metrics()
        return {"mica_queue_depth": float(m.get("waiting", 0)),
                "mica_running": float(m.get("running", 0))}

    def _tag(self, d: Dict[str, Any]) -> Dict[str, Any]:
        d["system_fingerprint"] = f"mica-{self.replica}"
        return d

    def _call(self, req: MicaRequest, stream: bool):
        if req.kind == "chat":
            kw = _kwargs(req.body, CHAT_FIELDS)
            kw["stream"] = stream
            return self.model.create_chat_completion(req.body.get("messages", []), **kw)
        kw = _kwargs(req.body, COMPLETION_FIELDS)
        kw["stream"] = stream
        return self.model.create_completion(req.body.get("prompt", ""), **kw)

    async def complete(self, req: MicaRequest) -> Dict[str, Any]:
        # mica computes on its own threads; waiting for it here would block the replica's
        # event loop, so the call waits in a worker thread.
        return self._tag(await asyncio.to_thread(self._call, req, False))

    async def stream(self, req: MicaRequest) -> AsyncIterator[Dict[str, Any]]:
        chunks = await asyncio.to_thread(self._call, req, True)
        try:
            while True:
                chunk = await asyncio.to_thread(next, chunks, None)
                if chunk is None:
                    return
                yield self._tag(chunk)
        finally:
            # A client that went away cancels the request in mica's engine.
            chunks.close()

    def metrics(self) -> Dict[str, Any]:
        return {"replica": self.replica, **self.model.metrics()}

    def model_name(self) -> str:
        return self.model.name


app = FastAPI(title="mica on Ray Serve")


def _error(status: int, message: str, kind: str, param: Optional[str] = None) -> JSONResponse:
    return JSONResponse(status_code=status,
                        content={"error": {"message": message, "type": kind, "param": param,
                                           "code": None}})


@serve.deployment(ray_actor_options={"num_cpus": 0.25}, max_ongoing_requests=256)
@serve.ingress(app)
class OpenAIIngress:
    """The OpenAI-compatible front: validates little, forwards to ``MicaReplica``."""

    def __init__(self, replica: DeploymentHandle, name: str) -> None:
        self.replica = replica
        self.name = name

    async def _forward(self, kind: str, request: Request):
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "the body is not JSON", "invalid_request_error")
        if not isinstance(body, dict):
            return _error(400, "the body must be a JSON object", "invalid_request_error")
        model = body.get("model")
        if model not in (None, self.name):
            return _error(404, f"model {model!r} not found; this deployment serves "
                               f"{self.name!r}", "invalid_request_error", "model")
        req = MicaRequest(kind, body)
        try:
            if body.get("stream"):
                gen = self.replica.options(stream=True).stream.remote(req)
                first = await gen.__anext__()  # errors (bad parameters) before the 200

                async def sse() -> AsyncIterator[bytes]:
                    import json

                    yield f"data: {json.dumps(first)}\n\n".encode()
                    async for chunk in gen:
                        yield f"data: {json.dumps(chunk)}\n\n".encode()
                    yield b"data: [DONE]\n\n"

                return StreamingResponse(sse(), media_type="text/event-stream")
            return JSONResponse(await self.replica.complete.remote(req))
        except mica.InvalidParameter as e:
            return _error(400, str(e), "invalid_request_error", getattr(e, "param", None))
        except mica.PromptTooLong as e:
            return _error(400, str(e), "invalid_request_error", "messages")
        except mica.QueueFull as e:
            return _error(429, str(e), "rate_limit_error")
        except StopAsyncIteration:
            return _error(500, "the replica ended the stream before any chunk", "server_error")

    @app.post("/v1/chat/completions")
    async def chat(self, request: Request):
        return await self._forward("chat", request)

    @app.post("/v1/completions")
    async def completions(self, request: Request):
        return await self._forward("completion", request)

    @app.get("/v1/models")
    async def models(self):
        return {"object": "list", "data": [{"id": self.name, "object": "model",
                                            "created": int(time.time()), "owned_by": "mica"}]}

    @app.get("/health")
    async def health(self):
        return {"status": "ok"}


def build_app(args: Dict[str, Any]):
    """The application: ``model`` (path or store name), ``replicas`` (a fixed count) or
    ``min_replicas``/``max_replicas`` (autoscaled on queue depth), ``threads`` per replica,
    ``n_ctx``, ``kv_mem`` (bytes), ``name`` (the API's model name), ``target_queue_depth``."""
    model = args["model"]
    name = args.get("name") or os.path.splitext(os.path.basename(str(model)))[0]
    threads = int(args["threads"]) if args.get("threads") else None
    opts: Dict[str, Any] = {}
    if "replicas" in args:
        opts["num_replicas"] = int(args["replicas"])
    else:
        opts["autoscaling_config"] = AutoscalingConfig(
            min_replicas=int(args.get("min_replicas", 1)),
            max_replicas=int(args.get("max_replicas", 4)),
            upscale_delay_s=float(args.get("upscale_delay_s", 10)),
            downscale_delay_s=float(args.get("downscale_delay_s", 120)),
            policy=AutoscalingPolicy(
                policy_function=queue_depth_policy,
                policy_kwargs={"target_queue_depth": float(args.get("target_queue_depth", 2))},
            ),
        )
    if threads:
        opts["ray_actor_options"] = {"num_cpus": threads}
    replica = MicaReplica.options(**opts).bind(
        str(model), threads=threads,
        n_ctx=int(args["n_ctx"]) if args.get("n_ctx") else None,
        kv_mem=int(args["kv_mem"]) if args.get("kv_mem") else None, name=name)
    return OpenAIIngress.bind(replica, name)
