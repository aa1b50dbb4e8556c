"""Keeping one request's failure that request's alone.

A batch step that raises is redone request by request; only the requests whose part raises are
failed (through `fail`), the others' results are kept. Redoing is safe: writing a request's KV
again writes the same values, and keyed randomness (sample/random.py) gives the same tokens.

Failing a sequence fails its user request, every sequence of it (n > 1). So the redo skips
sequences already finished: their blocks are free, and running them would write KV into blocks
that are no longer theirs (and report an IndexError instead of the request's own error).
"""

from __future__ import annotations

from typing import Callable

from tandem.core.request import Request
from tandem.core.sched_output import SchedulerOutput
from tandem.distributed.errors import WorkerDiedError
from tandem.spec_decode.model_free import Proposer
from tandem.worker.model_runner import ModelRunner, RunnerOutput

Fail = Callable[[Request, BaseException], None]


def execute_isolated(runner: ModelRunner, sched: SchedulerOutput, fail: Fail) -> RunnerOutput:
    try:
        return runner.execute(sched)
    except WorkerDiedError:
        raise  # the engine's failure, not a request's
    except Exception as error:  # noqa: BLE001 - narrowed below to the requests that raise
        if len(sched.scheduled) == 1:
            fail(sched.scheduled[0].request, error)
            return RunnerOutput()
    merged = RunnerOutput()
    for s in sched.scheduled:
        if s.request.status.finished:
            continue  # a sibling's failure finished it and freed its blocks (n > 1)
        try:
            part = runner.execute(SchedulerOutput(scheduled=[s]))
        except WorkerDiedError:
            raise
        except Exception as error:  # noqa: BLE001
            fail(s.request, error)
            continue
        merged.sampled.update(part.sampled)
        merged.logprobs.update(part.logprobs)
        merged.prompt_logprobs.update(part.prompt_logprobs)
    return merged


def propose_isolated(proposer: Proposer, reqs: list[Request], fail: Fail) -> int:
    """Draft for `reqs`; returns the draft positions computed."""
    try:
        return proposer.propose(reqs)
    except WorkerDiedError:
        raise
    except Exception:  # noqa: BLE001 - narrowed below
        done = 0
        for req in list(reqs):
            if req.status.finished:
                continue  # as above: finished with a failed sibling
            try:
                done += proposer.propose([req])
            except WorkerDiedError:
                raise
            except Exception as error:  # noqa: BLE001
                fail(req, error)
        return done
