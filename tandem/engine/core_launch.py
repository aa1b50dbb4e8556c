"""Starting and stopping the engine core process (`python -m tandem.engine.core_process`).

The API process's `EngineCoreClient.launch` spawns it with one end of a socketpair, sends it the
configuration as the first frame, and waits for its first answer: `Ready` (it serves) or
`StartupFailed` (why not, in one line for the user). Stopping waits for it, then kills it.

The core runs with `python -P` (3.11+; by hand before): the directory
`tandem serve` was started in is not put on its `sys.path`, so a `torch/` or a stale `tandem/`
there is never imported. It is told our pid, and the kernel kills it should we die, loading
included (`process_guard.py`): `launch` must run on the main thread, which lives as long as the
server.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
from typing import Any

from tandem.engine.core_messages import FrameBuffer, Ready, StartupFailed, encode_frame

logger = logging.getLogger("tandem.engine_client")


class EngineStartupError(RuntimeError):
    """The engine core process could not start (the message is one line for the user)."""


def _safe_module_command(module: str) -> list[str]:
    """`python -P -m module`; before 3.11, which has no -P, the same by hand."""
    if sys.version_info >= (3, 11):
        return [sys.executable, "-P", "-m", module]
    return [sys.executable, "-c", "import runpy, sys; del sys.path[0]; "
            f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)"]


def spawn_core_process(config: Any, log_stats: bool) -> tuple[socket.socket, subprocess.Popen]:
    """Start the engine process and send it its configuration; returns our end of the channel
    and the process. The process inherits this environment, OpenMP's variables included."""
    ours, theirs = socket.socketpair()
    process = subprocess.Popen(
        [*_safe_module_command("tandem.engine.core_process"),
         "--fd", str(theirs.fileno()), "--parent-pid", str(os.getpid())],
        pass_fds=[theirs.fileno()])
    theirs.close()
    logger.info("engine core process %d started", process.pid)
    try:
        ours.sendall(encode_frame((config, log_stats)))
    except (BrokenPipeError, ConnectionResetError):
        ours.close()
        code = _reap(process)
        raise EngineStartupError(f"the engine core process exited with status {code} while "
                                 "starting (its log is above)") from None
    except BaseException:
        ours.close()
        stop_process(process, 5.0)
        raise
    return ours, process


def wait_ready(sock: socket.socket, process: subprocess.Popen) -> Ready:
    frames = FrameBuffer()
    while True:
        data = sock.recv(1 << 20)
        if not data:
            code = _reap(process)
            raise EngineStartupError(f"the engine core process exited with status {code} "
                                     "while starting (its log is above)")
        for message in frames.feed(data):
            if isinstance(message, StartupFailed):
                _reap(process)
                raise EngineStartupError(message.message)
            if isinstance(message, Ready):
                return message
            raise EngineStartupError(f"unexpected first message from the engine core: "
                                     f"{type(message).__name__}")


def _reap(process: subprocess.Popen, timeout: float = 10.0) -> int:
    """The exit status of a core that said it is leaving; killed if it does not leave."""
    try:
        return process.wait(timeout)
    except subprocess.TimeoutExpired:
        logger.warning("the engine core process %d did not exit %.0f s after failing to start; "
                       "killing it", process.pid, timeout)
        process.kill()
        return process.wait(5)


def stop_process(process: subprocess.Popen, timeout: float) -> None:
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        logger.warning("the engine core process %d did not stop in %.0f s; killing it",
                       process.pid, timeout)
        process.kill()
        process.wait(5)
