"""The engine core process of `tandem serve`: the step loop (scheduler, model, sampler, drafting,
and the tensor-parallel workers it starts) with nothing else sharing its interpreter.

Started by `EngineCoreClient.launch` as `python -P -m tandem.engine.core_process --fd N
--parent-pid P`, where N is its end of a socketpair (`-P`: the working directory is not on
`sys.path`, so a `torch/` or a stale `tandem/` there is never imported). The kernel kills it when
the API process dies (`process_guard.py`), loading included. The first frame it reads is its
configuration; it answers `Ready` once the models are loaded (or `StartupFailed`, in one line,
and exits 1); should the API process close the channel meanwhile, it exits. Then, in each turn of
the loop, it takes the commands that arrived (all of them when idle; at most `_COMMANDS_PER_STEP`
between two steps, so a burst of admissions never stalls generation), runs one step, and sends
one `EngineCoreOutputs` with everything the turn produced (nothing, when every output was held
back: requests answered only when finished, or within the stream interval); when nothing else
went for `HEARTBEAT_S`, busy or idle, it sends an empty one, so the API process can tell a quiet
core from a stopped or hung one. Frames leave through an outbox (`core_channel.py`) that never
waits for the API process to read, up to a bound.

It ignores SIGINT and SIGTERM: a Ctrl-C in a terminal reaches the whole process group, and the
API process must be the one to decide (it drains the requests in flight first, which needs this
process). It exits when told (`Shutdown`), when the API process goes away (its end of the
channel closes), or with status 1 when it cannot go on (a worker died, the loop broke), after
saying why on the channel.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import select
import signal
import socket
import sys
import threading
import time
from collections import deque
from typing import Any, Optional

from tandem.distributed.errors import WorkerDiedError
from tandem.engine.core_channel import RECV_BYTES, ChannelClosed, Outbox, read_config
from tandem.engine.core_messages import (AbortRequests, AddRequest, AddResult, ClientMessage,
                                         EngineCoreOutputs, FrameBuffer, Ready, Shutdown,
                                         StartupFailed, UtilityCall, UtilityResult,
                                         encode_frame)
from tandem.engine.core_watchdog import HEARTBEAT_S
from tandem.engine.output_deltas import DeltaEncoder, OutputDelta
from tandem.engine.process_guard import die_with_parent, exit_when_channel_closes
from tandem.engine.engine_metrics import stats_line
from tandem.engine.grammar_admission import GrammarAdmission

logger = logging.getLogger("tandem.engine_core")

_IDLE_WAIT_S = 0.1        # how long an idle loop waits for a command before checking its workers
_COMMANDS_PER_STEP = 64   # commands taken between two steps while generating
# A metrics snapshot at least this often while generating (and with the step after a request
# comes, goes or finishes). One (25 objects, 3.7 KB) took the API process about 150 us of CPU to
# unpickle at one stream, where a token's delta took 50: at 50 ms it was a tenth of the API's
# cost a token. Scrapers poll every few seconds.
_METRICS_INTERVAL_S = 0.5
_GRAMMAR_POLL_S = 0.005   # how often an idle loop looks for a grammar compiled in the background


class _ShutdownRequested(Exception):
    pass


class EngineCore:
    """The loop over one engine and one connected socket (blocking). Tests run it in a thread
    over a socketpair, with any engine that has LLMEngine's interface."""

    def __init__(self, engine: Any, sock: socket.socket, log_stats: bool = False,
                 log_interval_s: float = 10.0) -> None:
        self.engine = engine
        self.sock = sock
        self.sock.setblocking(True)
        self._frames = FrameBuffer()
        self._outbox = Outbox(sock)  # frames go without waiting for the API process to read
        self._inbox: deque[ClientMessage] = deque()
        self._encoder = DeltaEncoder()
        self._live: set[str] = set()  # requests added and neither finished nor aborted
        self._log_stats = log_stats
        self._log_interval_s = log_interval_s
        self._last_metrics = 0.0
        self._last_sent = time.monotonic()
        self._grammar_wait = GrammarAdmission(getattr(engine, "grammars", None))
        if hasattr(engine, "output_builder"):  # deltas straight from the engine's requests
            engine.output_builder = self._encoder.encode_group

    # ---- the channel -------------------------------------------------------------------------

    def send(self, message: Any) -> None:
        self._outbox.put(encode_frame(message))
        self._last_sent = time.monotonic()

    def _read(self, timeout: Optional[float]) -> None:
        """Move whatever arrived (waiting up to `timeout` for the first bytes) into the inbox;
        send more of the outbox if the socket takes it."""
        pending = [self.sock] if self._outbox.pending else []
        ready, writable, _ = select.select([self.sock], pending, [], timeout)
        if writable:
            self._outbox.flush()
        while ready:
            try:
                data = self.sock.recv(RECV_BYTES, socket.MSG_DONTWAIT)
            except BlockingIOError:
                break
            except ConnectionResetError:
                raise ChannelClosed() from None
            if not data:
                raise ChannelClosed()
            self._inbox.extend(self._frames.feed(data))
            if len(data) < RECV_BYTES:
                break

    # ---- commands ----------------------------------------------------------------------------

    def _add(self, msg: AddRequest, out: EngineCoreOutputs,
             error: Optional[BaseException] = None) -> None:
        try:
            if error is not None:
                raise error
            if msg.request_id in self._live or msg.request_id in self._grammar_wait:
                raise ValueError(f"duplicate request id {msg.request_id!r}")
            self.engine.add_request(msg.request_id, msg.prompt, msg.params,
                                    final_only=msg.final_only)
        except Exception as e:  # ValueError for bad input; anything else still goes back
            out.added.append(AddResult(msg.request_id, type(e).__name__, str(e)))
            return
        self._live.add(msg.request_id)
        out.added.append(AddResult(msg.request_id))

    def _handle(self, msg: ClientMessage, out: EngineCoreOutputs) -> None:
        if isinstance(msg, AddRequest):
            if self._grammar_wait.needs_wait(msg) and msg.request_id not in self._grammar_wait:
                self._grammar_wait.submit(msg)  # admitted by _loop once its grammar is ready
            else:
                self._add(msg, out)
        elif isinstance(msg, AbortRequests):
            for request_id in msg.request_ids:
                if self._grammar_wait.abort(request_id):
                    continue  # it never reached the engine
                if request_id in self._live:
                    self._live.discard(request_id)
                    self._encoder.forget(request_id)
                    try:
                        self.engine.abort_request(request_id)
                    except Exception:
                        logger.exception("abort_request(%s) failed", request_id)
        elif isinstance(msg, UtilityCall):
            try:
                out.utility.append(UtilityResult(msg.call_id,
                                                 getattr(self.engine, msg.method)()))
            except Exception as e:
                out.utility.append(UtilityResult(msg.call_id, error=f"{type(e).__name__}: {e}"))
        elif isinstance(msg, Shutdown):
            raise _ShutdownRequested()
        else:
            logger.error("unknown message on the engine channel: %r", type(msg).__name__)

    # ---- the loop ----------------------------------------------------------------------------

    def run(self) -> int:
        """Serve until told to stop (0), until the API process leaves (0), or until the engine
        cannot go on (1, after telling the API process why)."""
        try:
            self._loop()
        except _ShutdownRequested:
            self._shutdown_engine()
            self._drain()
            return 0
        except ChannelClosed:
            self._shutdown_engine()
            return 0
        except BaseException as e:  # noqa: BLE001 - the loop is gone; say so, then exit 1
            logger.critical("the engine loop died", exc_info=True)
            self._shutdown_engine()
            try:
                self.send(EngineCoreOutputs(dead=f"{type(e).__name__}: {e}"))
            except (ChannelClosed, OSError):
                pass  # the API process is gone too; it has nobody to tell
            self._drain()
            return 1
        return 0

    def _drain(self) -> None:
        """What the outbox holds, to an API process that still reads (a few seconds at most)."""
        try:
            self._outbox.drain(timeout=5.0)
        except (ChannelClosed, OSError):
            pass

    def _shutdown_engine(self) -> None:
        self._grammar_wait.shutdown()
        stop = getattr(self.engine, "shutdown", None)
        if stop is not None:
            try:
                stop()  # the tensor-parallel workers
            except Exception:  # noqa: BLE001 - leaving anyway; leave no worker behind
                logger.exception("shutting down the engine failed")

    def _loop(self) -> None:
        last_log = time.monotonic()
        while True:
            failure = getattr(self.engine, "failure", None)
            if failure:  # a tensor-parallel worker died: the engine cannot go on
                raise WorkerDiedError(failure)
            busy = bool(self._live) and self.engine.has_unfinished_requests()
            if not self._inbox or not busy:
                idle_wait = _GRAMMAR_POLL_S if self._grammar_wait else _IDLE_WAIT_S
                self._read(0.0 if busy or self._inbox else idle_wait)
            out = EngineCoreOutputs()
            handled = 0
            for msg, error in self._grammar_wait.ready():
                self._add(msg, out, error)
                handled += 1
            while self._inbox and (not busy or handled < _COMMANDS_PER_STEP):
                self._handle(self._inbox.popleft(), out)
                handled += 1
            if not self.engine.has_unfinished_requests():
                if handled:  # the state may have changed (an abort): publish it
                    out.metrics = self._metrics()
                if out or time.monotonic() - self._last_sent >= HEARTBEAT_S:
                    self.send(out)  # an empty one is the idle heartbeat
                continue
            finished = self._step(out.outputs)
            now = time.monotonic()
            # a request admitted, aborted or finished changes what a scraper sees: published
            # with the step that shows it; otherwise every _METRICS_INTERVAL_S
            if finished or handled or now - self._last_metrics >= _METRICS_INTERVAL_S \
                    or not self.engine.has_unfinished_requests():
                out.metrics = self._metrics()
            if out or now - self._last_sent >= HEARTBEAT_S:  # nothing to say: a frame saved
                self.send(out)
            if self._log_stats and now - last_log > self._log_interval_s:
                last_log = now
                logger.info(stats_line(out.metrics or self._metrics(), len(self._live)))

    def _step(self, deltas: list[OutputDelta]) -> bool:
        """One engine step into `deltas`; True when a request finished (or failed)."""
        finished = False
        try:
            outputs = self.engine.step()
        except WorkerDiedError:
            raise
        except Exception as e:  # the loop must outlive any one bad step: fail what was in it
            logger.exception("engine step failed; failing %d request(s)", len(self._live))
            for request_id in sorted(self._live):
                deltas.append(OutputDelta(request_id, True, f"{type(e).__name__}: {e}", 0, None,
                                          0, None, []))
                self._encoder.forget(request_id)
                try:
                    self.engine.abort_request(request_id)
                except Exception:
                    logger.exception("abort_request(%s) failed after a step error", request_id)
            self._live.clear()
            return True
        for o in outputs:
            if o.request_id not in self._live:
                self._encoder.forget(o.request_id)
                continue  # not ours (any more)
            deltas.append(o if isinstance(o, OutputDelta) else self._encoder.encode(o))
            if o.finished:
                self._live.discard(o.request_id)
                finished = True
        return finished

    def _metrics(self) -> list:
        self._last_metrics = time.monotonic()
        try:
            return list(self.engine.get_metrics())
        except Exception:
            logger.exception("get_metrics failed")
            return []


# ---- the process --------------------------------------------------------------------------------

def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tandem.engine.core_process")
    parser.add_argument("--fd", type=int, required=True, help="this end of the socketpair")
    parser.add_argument("--parent-pid", type=int, default=None,
                        help="the API process: this one dies with it")
    args = parser.parse_args(argv)
    die_with_parent(args.parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sock = socket.socket(fileno=args.fd)
    from tandem.cli import STARTUP_ERRORS, setup_logging
    from tandem.entrypoints.openai.args import one_line
    setup_logging()
    try:
        config, log_stats = read_config(sock)
    except ChannelClosed:
        return 0
    logger.info("engine core process %d: loading", os.getpid())
    loaded = threading.Event()
    exit_when_channel_closes(sock, loaded)
    try:
        from tandem.engine.llm_engine import LLMEngine
        engine = LLMEngine(config)
    except STARTUP_ERRORS as e:
        sock.sendall(encode_frame(StartupFailed(one_line(e))))
        return 1
    except Exception as e:  # noqa: BLE001 - a bug, but still one line for the user, and the trace
        logger.exception("the engine core failed to start")
        sock.sendall(encode_frame(StartupFailed(f"{type(e).__name__}: {one_line(e)}")))
        return 1
    finally:
        loaded.set()  # from here on, the loop reads the channel
    core = EngineCore(engine, sock, log_stats=log_stats)
    # The start-up heap (torch, transformers, the models) lives as long as the process; frozen,
    # the collector's full passes no longer walk it in the middle of a step.
    gc.collect()
    gc.freeze()
    try:
        core.send(Ready(engine.num_blocks, core._metrics()))
    except ChannelClosed:
        core._shutdown_engine()
        return 0
    return core.run()


if __name__ == "__main__":
    sys.exit(main())
