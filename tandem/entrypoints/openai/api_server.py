"""The FastAPI application of `tandem serve`: routes, wiring of the serving classes, /metrics, and
running it under uvicorn.

/metrics renders the engine's last published snapshot in a worker thread of its own, so it answers
at once however busy the engine is and never queues behind a burst's tokenization and template
work in asyncio's shared pool. On SIGTERM (or Ctrl-C) the server stops admitting (503), lets
requests in flight finish for up to --shutdown-timeout seconds, aborts the rest (freeing their KV
blocks), stops the engine and exits 0; if the engine loop ever dies, it exits with status 1.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Awaitable, Optional, Sequence

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from tandem.engine.engine_client import EngineClient
from tandem.entrypoints.openai.args import tandem_version
from tandem.entrypoints.openai.errors import OpenAIError, install_error_handlers
from tandem.entrypoints.openai.middleware import APIKeyMiddleware, RequestCounterMiddleware
from tandem.entrypoints.openai.protocol import (ChatCompletionRequest, CompletionRequest,
                                                DetokenizeRequest, TokenizeRequest)
from tandem.entrypoints.openai.serving_chat import OpenAIServingChat
from tandem.entrypoints.openai.serving_completion import OpenAIServingCompletion
from tandem.entrypoints.openai.serving_engine import ServingOptions
from tandem.entrypoints.openai.serving_tokenization import OpenAIServingTokenization
from tandem.entrypoints.openai.web_page import add_page_routes
from tandem.metrics import Metric, to_prometheus, with_vllm_names

logger = logging.getLogger("tandem.server")


async def _wait_for_disconnect(raw_request: Request) -> None:
    while True:
        message = await raw_request.receive()
        if message["type"] == "http.disconnect":
            return


async def with_cancellation(raw_request: Request, work: Awaitable[Any]) -> Any:
    """Run a non-streaming handler, cancelling it (and so aborting its engine requests) when the
    client goes away; otherwise an abandoned request would hold the engine to the end."""
    handler = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(raw_request))
    done, pending = await asyncio.wait({handler, watcher}, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    if handler in done:
        return handler.result()
    return Response(status_code=499)  # nobody is there to read it


async def require_json(raw_request: Request) -> None:
    content_type = raw_request.headers.get("content-type")
    if content_type and not content_type.split(";")[0].strip().lower().endswith("json"):
        raise OpenAIError("Unsupported Media Type: Only 'application/json' is allowed", 415)


def model_card(name: str, root: str, max_model_len: int, created: int) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": created, "owned_by": "tandem",
            "root": root, "parent": None, "max_model_len": max_model_len, "permission": []}


def render_metrics(metrics: Sequence[Any], model_name: str) -> str:
    """Prometheus text with one TYPE line per metric family (labelled series share a name)."""
    seen: set[str] = set()
    lines: list[str] = []
    for line in to_prometheus(with_vllm_names(list(metrics)), model_name).splitlines():
        if line.startswith("# TYPE"):
            if line in seen:
                continue
            seen.add(line)
        lines.append(line)
    return "\n".join(lines) + "\n"


def build_app(engine: EngineClient, served_model_names: Sequence[str],
              chat_template: Optional[str] = None, api_keys: Optional[Sequence[str]] = None,
              model_root: Optional[str] = None, launch_time: Optional[float] = None,
              trust_request_chat_template: bool = False,
              options: Optional[ServingOptions] = None) -> Any:
    """The ASGI app: the FastAPI app wrapped in our middleware (each wrapper's `.app` is the
    next one in)."""
    names = list(served_model_names)
    completion = OpenAIServingCompletion(engine, names, chat_template,
                                         trust_request_chat_template, options)
    chat = OpenAIServingChat(engine, names, chat_template, trust_request_chat_template, options)
    tokenization = OpenAIServingTokenization(engine, names, chat_template)
    created = int(time.time())
    root = model_root or names[0]
    metrics_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tandem-metrics")

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await engine.start()
        if launch_time is not None:
            logger.info("tandem serve ready in %.1f s (model %s)",
                        time.perf_counter() - launch_time, names[0])
        yield
        engine.shutdown()
        metrics_thread.shutdown(wait=False)

    app = FastAPI(title="tandem", version=tandem_version(), lifespan=lifespan)
    install_error_handlers(app)
    add_page_routes(app)  # the page at / and its assets under /static/
    json_only = [Depends(require_json)]

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200 if engine.is_running and engine.accepting else 503)

    @app.get("/ping")
    async def ping() -> Response:
        return await health()

    @app.get("/version")
    async def version() -> dict[str, str]:
        return {"version": tandem_version()}

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        return {"object": "list",
                "data": [model_card(n, root, engine.max_model_len, created) for n in names]}

    @app.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str) -> dict[str, Any]:
        if model_id not in names:
            raise OpenAIError(f"The model `{model_id}` does not exist.", 404, param="model")
        return model_card(model_id, root, engine.max_model_len, created)

    @app.post("/v1/completions", dependencies=json_only)
    async def create_completion(request: CompletionRequest, raw_request: Request) -> Any:
        if request.stream:
            return await completion.create(request)
        return await with_cancellation(raw_request, completion.create(request))

    @app.post("/v1/chat/completions", dependencies=json_only)
    async def create_chat_completion(request: ChatCompletionRequest,
                                     raw_request: Request) -> Any:
        if request.stream:
            return await chat.create(request)
        return await with_cancellation(raw_request, chat.create(request))

    @app.post("/tokenize", dependencies=json_only)
    async def tokenize(request: TokenizeRequest) -> JSONResponse:
        return JSONResponse(await tokenization.tokenize(request))

    @app.post("/detokenize", dependencies=json_only)
    async def detokenize(request: DetokenizeRequest) -> JSONResponse:
        return JSONResponse(tokenization.detokenize(request))

    @app.get("/tokenizer_info")
    async def tokenizer_info() -> JSONResponse:
        return JSONResponse(tokenization.tokenizer_info())

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        collected: list[Any] = list(engine.metrics_snapshot())
        collected.append(Metric("tandem:server_requests_in_flight", engine.num_in_flight,
                                kind="gauge"))
        for (path, status), count in sorted(counter.counts.items()):
            collected.append(Metric("tandem:http_requests", count,
                                    {"path": path, "status": str(status)}))
        text = await asyncio.get_running_loop().run_in_executor(
            metrics_thread, render_metrics, collected, names[0])
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    # The metrics route reads `counter` when called, so it may be built after the routes.
    known = [route.path for route in app.routes if hasattr(route, "path")]
    counter = RequestCounterMiddleware(APIKeyMiddleware(app, api_keys or []), known)
    app.state.request_counter = counter
    return counter


def _make_server(config: Any, engine: EngineClient) -> Any:
    """uvicorn's server, told to stop admitting the moment a shutdown signal arrives. A shutdown
    asked for is a clean exit (status 0), so the signal is not re-raised afterwards as uvicorn
    would; a second Ctrl-C still forces the exit."""
    import signal

    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            engine.accepting = False
            if self.should_exit and sig == signal.SIGINT:
                self.force_exit = True
            self.should_exit = True

    return Server(config)


def run_server(args: argparse.Namespace, engine: EngineClient, chat_template: Optional[str],
               launch_time: float, sock: Any = None) -> None:
    import uvicorn

    options = ServingOptions(response_role=args.response_role,
                             return_tokens_as_token_ids=args.return_tokens_as_token_ids,
                             log_requests=args.enable_log_requests,
                             enable_auto_tool_choice=args.enable_auto_tool_choice,
                             tool_call_parser=args.tool_call_parser,
                             reasoning_parser=args.reasoning_parser)
    app = build_app(engine, args.served_model_name, chat_template, args.api_key,
                    model_root=args.model, launch_time=launch_time,
                    trust_request_chat_template=args.trust_request_chat_template,
                    options=options)
    config = uvicorn.Config(app, host=args.host or "0.0.0.0", port=args.port,
                            log_level=args.uvicorn_log_level,
                            access_log=not args.disable_uvicorn_access_log,
                            timeout_graceful_shutdown=args.shutdown_timeout)
    server = _make_server(config, engine)
    died: list[bool] = []

    def on_dead() -> None:  # from the engine thread or the channel; uvicorn polls should_exit
        died.append(True)
        engine.accepting = False
        server.should_exit = True

    engine.on_dead = on_dead
    # What start-up built (torch, transformers, the models: some 330k objects) lives as long as the
    # server. Frozen, it is no longer walked by each full collection, which otherwise held the GIL,
    # and so every stream and /health, for ~200 ms in the middle of a burst on a 2-core machine.
    gc.collect()
    gc.freeze()
    server.run(sockets=[sock] if sock is not None else None)
    if died:
        logger.critical("tandem serve stopped: the engine loop died")
        sys.exit(1)
