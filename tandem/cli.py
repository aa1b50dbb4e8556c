"""The `tandem` command: `tandem serve MODEL [flags]` (vLLM's flags) and `tandem --version`.

Heavy imports (torch, FastAPI) happen only once a command needs them, so `--help`, `--version`
and argument errors answer at once.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
from typing import Optional, Sequence

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


def _setup_logging() -> None:
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


# The engine's OpenMP threads (torch's pool, which our kernels share) otherwise spin for a while
# after each parallel region, on the cores the event loop and the engine thread need. On 2 cores
# /health and /metrics then took up to 180 ms to answer while 16 streams ran (under 100 ms with
# passive waits), and serving SmolLM2 produced 1.04-1.48x the tokens/s with passive waits, at 1
# and at 16 streams (three runs each, docs/performance.md). libgomp reads this when torch loads, so
# it is set before; a value the user set is kept.
SERVE_OMP_WAIT_POLICY = "PASSIVE"


def serve(argv: Sequence[str], launch_time: float) -> None:
    os.environ.setdefault("OMP_WAIT_POLICY", SERVE_OMP_WAIT_POLICY)
    if any(a in ("-h", "--help") for a in argv):
        make_serve_parser().print_help()
        return
    try:
        args = parse_serve_args(argv)
    except ArgumentError as e:
        print_error_and_exit(str(e), 2)
    _setup_logging()
    from tandem.entrypoints.openai.serve_flags import log_notes
    log_notes(args.compat_notes)
    from tandem.config import EngineConfig
    from tandem.distributed.node import run_worker_node
    from tandem.engine.async_engine import AsyncLLMEngine
    from tandem.engine.llm_engine import LLMEngine
    from tandem.entrypoints.chat_utils import load_chat_template
    from tandem.entrypoints.openai.api_server import run_server
    try:
        chat_template = load_chat_template(args.chat_template)
        kwargs = engine_kwargs(args)
        config = EngineConfig.create(disable_log_stats=args.disable_log_stats, **kwargs)
        if config.parallel_config.node_rank > 0:  # workers only: node 0 serves
            sys.exit(run_worker_node(config))
        sock = bind_socket(args.host, args.port)  # before the weights load: fail fast
        engine = AsyncLLMEngine(LLMEngine(config), log_stats=not args.disable_log_stats)
    except STARTUP_ERRORS as e:
        print_error_and_exit(one_line(e), 1)
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
