"""Errors of the distributed runtime."""


class WorkerDiedError(RuntimeError):
    """A tensor-parallel worker is gone, or a forward failed part-way so that the ranks are out
    of step; either way the engine cannot go on."""
