"""Child processes that never outlive their parent: the engine core process of `tandem serve`
and the tensor-parallel workers.

`die_with_parent` asks the Linux kernel for SIGKILL when the parent dies (PR_SET_PDEATHSIG), then
checks that the parent is still the one that started us: had it died before the request, the
kernel would never send the signal. (The signal follows the parent *thread* that forked us, so a
parent must start such children from a thread that lives as long as they should: the main one.)

`exit_when_channel_closes` covers the time a child spends loading, before it reads its channel:
should its parent close the channel (start-up given up), the child exits instead of loading on.
"""

from __future__ import annotations

import ctypes
import logging
import os
import select
import signal
import socket
import threading
from typing import Optional

logger = logging.getLogger("tandem.process")

_PR_SET_PDEATHSIG = 1


def die_with_parent(expected_parent: Optional[int] = None) -> None:
    """Linux: the kernel kills this process when its parent dies (no orphans after a crash, a
    `kill -9` or a SIGTERM of the parent). Exits at once if the parent is already gone."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return  # not Linux: the channel's end-of-file still stops the child once it serves
    if expected_parent is not None and os.getppid() != expected_parent:
        logger.warning("the parent process %d is gone; exiting", expected_parent)
        os._exit(0)


def exit_when_channel_closes(sock: socket.socket, done: threading.Event,
                             poll_s: float = 0.2) -> threading.Thread:
    """Until `done` is set, a thread watches `sock`: end-of-file, or any message (the parent
    sends nothing but a shutdown before the child says it is ready), exits the process."""

    def watch() -> None:
        while not done.is_set():
            try:
                readable, _, _ = select.select([sock], [], [], poll_s)
            except (OSError, ValueError):
                return  # the socket was closed here: the child is leaving anyway
            if readable and not done.is_set():
                logger.warning("the API process closed the engine channel while this process "
                               "was loading; exiting")
                os._exit(0)

    thread = threading.Thread(target=watch, name="tandem-channel-watch", daemon=True)
    thread.start()
    return thread
