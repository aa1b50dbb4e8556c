"""The `tandem` command: `tandem serve MODEL [flags]` (vLLM's flags) and `tandem --version`.

Heavy imports (torch, FastAPI) happen only once a command needs them, so `--help`, `--version`
and argument errors answer at once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
import time
from typing import Any, Iterator, Optional, Sequence

from tandem.entrypoints.openai.args import (ArgumentError, engine_kwargs, make_serve_parser,
                                            one_line, parse_serve_args, print_error_and_exit,
                                            tandem_version)

COMMANDS = {"serve": "start the OpenAI-compatible server: tandem serve MODEL [--port 8000 ...]",
            "bench": "benchmarks: tandem bench {latency,throughput,serve,spec} --help"}

# Errors a user's configuration can cause at start-up: answered in one line, not a traceback.
STARTUP_ERRORS = (ValueError, TypeError, OSError, NotImplementedError, KeyError)


def _usage() -> str:
    lines = ["usage: tandem [--version] COMMAND [ARGS]", "", "commands:"]
    lines += [f"  {name:8s} {text}" for name, text in COMMANDS.items()]
    lines += ["", "Run `tandem COMMAND --help` for a command's flags."]
    return "\n".join(lines)


def setup_logging() -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s [%(name)s] %(message)s",
                                           "%H:%M:%S"))
    root = logging.getLogger("tandem")
    root.addHandler(handler)
    root.setLevel(logging.INFO)


def bind_socket(host: Optional[str], port: int) -> socket.socket:
    """The listening socket, bound now so a port in use is reported before models load.

    Made with proto=IPPROTO_TCP, not 0: asyncio turns Nagle's algorithm off (TCP_NODELAY) only on
    connections whose socket says it is TCP, and an accepted socket inherits the listener's proto.
    Left on, Nagle held every response body behind its headers until the client's delayed ACK,
    40 ms on Linux, on each keep-alive request after the first. TCP_NODELAY is also set here,
    which Linux passes on to accepted connections."""
    family = socket.AF_INET6 if host and ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host or "0.0.0.0", port))
    except OSError as e:
        sock.close()
        raise OSError(f"cannot listen on {host or '0.0.0.0'}:{port}: {e.strerror}; is another "
                      "server running? Choose another port with --port.") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


# OpenMP: `tandem serve` sets nothing. While the engine stepped in the event loop's process it set
# OMP_WAIT_POLICY=PASSIVE, so that spinning OpenMP threads would not starve the loop. The engine
# core has a process of its own now (engine/core_process.py) and the API process runs no OpenMP,
# so the engine's threads (torch's pool, which our kernels share) wait as libgomp does by default:
# spin a while after each parallel region, then sleep. Measured on an AMD EPYC (family 25 model
# 17, 2 cores) serving SmolLM2-135M (docs/performance.md), against the default: PASSIVE gave
# 0.68-0.76x the single-stream rate and 0.78-0.97x at 16 streams; a shorter spin
# (GOMP_SPINCOUNT=20000) 0.91x and 0.97x; threads pinned to cores (OMP_PROC_BIND=close,
# OMP_PLACES=cores) 0.76x and 0.73x; ACTIVE 1.02x and 1.05x while serving, but an idle server
# then spins a core forever (an offline engine run beside it fell to 0.3x its rate). What the
# user sets reaches the engine process unchanged.


@contextlib.contextmanager
def _signals_stop_loading() -> Iterator[list[int]]:
    """While the engine core loads, SIGTERM stops start-up as Ctrl-C does (the core is told and
    waited for, instead of this process vanishing); uvicorn installs its handlers afterwards.
    The signals caught are listed too, should a library swallow the KeyboardInterrupt."""
    caught: list[int] = []

    def interrupt(signum: int, frame: Any) -> None:
        caught.append(signum)
        raise KeyboardInterrupt()

    previous = {s: signal.signal(s, interrupt) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield caught
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def serve(argv: Sequence[str], launch_time: float) -> None:
    if any(a in ("-h", "--help") for a in argv):
        make_serve_parser().print_help()
        return
    try:
        args = parse_serve_args(argv)
    except ArgumentError as e:
        print_error_and_exit(str(e), 2)
    setup_logging()
    from tandem.entrypoints.openai.serve_flags import log_notes
    log_notes(args.compat_notes)
    from tandem.config import EngineConfig
    from tandem.distributed.node import run_worker_node
    from tandem.engine.core_client import EngineCoreClient
    from tandem.engine.core_launch import EngineStartupError
    from tandem.entrypoints.chat_utils import load_chat_template
    from tandem.entrypoints.openai.api_server import run_server
    from tandem.entrypoints.openai.reasoning_parsers import make_reasoning_parser
    from tandem.loader.generation_config import sampling_defaults
    from tandem.loader.tokenizer import load_tokenizer
    from tandem.sample.grammar import GrammarCompiler
    try:
        chat_template = load_chat_template(args.chat_template)
        kwargs = engine_kwargs(args)
        config = EngineConfig.create(disable_log_stats=args.disable_log_stats, **kwargs)
        if config.parallel_config.node_rank > 0:  # workers only: node 0 serves
            sys.exit(run_worker_node(config))
        sock = bind_socket(args.host, args.port)  # before the weights load: fail fast
        mc = config.model_config

        def load_frontend() -> tuple[Any, dict, Any]:  # this process's part of the model
            tokenizer = load_tokenizer(mc)
            make_reasoning_parser(args.reasoning_parser, tokenizer)  # the tags are in the vocab
            return (tokenizer, sampling_defaults(mc.model_dir, config.generation_config),
                    GrammarCompiler(tokenizer, mc.vocab_size))

        with _signals_stop_loading() as caught:
            engine = EngineCoreClient.launch(config, not args.disable_log_stats, load_frontend,
                                             args.engine_iteration_timeout_s,
                                             args.stream_stall_timeout_s)
        if caught:  # the KeyboardInterrupt was swallowed on the way: stop all the same
            engine.shutdown()
            raise KeyboardInterrupt()
    except (EngineStartupError, *STARTUP_ERRORS) as e:
        print_error_and_exit(one_line(e), 1)
    except KeyboardInterrupt:  # SIGINT or SIGTERM while loading: the core was stopped
        print("tandem serve: error: stopped while loading", file=sys.stderr, flush=True)
        os._exit(130)  # no wait for what loading left running (threads, atexit hooks)
    run_server(args, engine, chat_template, launch_time, sock)


def main(argv: Optional[Sequence[str]] = None) -> None:
    launch_time = time.perf_counter()
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return
    if argv[0] in ("-V", "--version", "version"):
        print(f"tandem {tandem_version()}")
        return
    if argv[0] == "serve":
        serve(argv[1:], launch_time)
        return
    if argv[0] == "bench":
        from tandem.bench.cli import main as bench
        bench(argv[1:])
        return
    print(f"tandem: error: unknown command {argv[0]!r}\n\n{_usage()}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
    main()
