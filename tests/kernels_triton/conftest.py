"""tandem.kernels.triton under Triton's interpreter, on the CPU (no GPU needed).

How triton reads TRITON_INTERPRET: `triton.jit` looks at it (through `triton.knobs.runtime`,
which reads the environment on each access unless the knob was set) when it decorates a function,
and turns it into an interpreted function or a compiled kernel for good. That happens for our
kernels when their module is imported, and for triton's own helpers (`tl.zeros`, `tl.sum`,
`tl.max`, ... are `@jit` functions of `triton.language.standard`) when triton is imported.

Setting the variable when this file is imported would leak: collection imports it before any test
runs, so every other folder's tests (and the servers they start) would run with it, and a triton
first imported then would keep interpreted helpers for the whole session, breaking any compiled
kernel on a CUDA machine. So nothing is set globally: `fresh_kernels` imports the kernel modules
anew with the knob switched for the block only (`triton.knobs.runtime.scope()`, which also puts
the environment variable back), swaps triton's own `@jit` helpers for interpreted twins while
the block lasts when triton was imported compiled, hands the module objects to the tests, and on
exit restores triton.language as it found it (the interpreter patches its builtins as kernels
run and leaves some patched), and whatever copies of the modules `sys.modules` held before.
Kernels call those helpers as functions (`tl.sum(x, 1)`, not `x.sum(1)`: tensor methods keep
the compiled ones). test_triton_compile.py compiles every kernel after the interpreted tests,
in the same process, which would fail if anything leaked.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import types
from typing import Iterator

import pytest

PACKAGE = "tandem.kernels.triton"
MODULES = ("support", "norm", "activation", "rope_kv", "paged_attention")


def _ours(name: str) -> bool:
    return name == PACKAGE or name.startswith(PACKAGE + ".")


def _language_objects() -> list[object]:
    """triton.language's modules and the classes they define: what the interpreter patches."""
    found: dict[int, object] = {}
    for name, mod in list(sys.modules.items()):
        if mod is None or not (name == "triton.language" or name.startswith("triton.language.")):
            continue
        found[id(mod)] = mod
        for value in vars(mod).values():
            if isinstance(value, type) and value.__module__.startswith("triton.language"):
                found[id(value)] = value
    return list(found.values())


@contextlib.contextmanager
def interpreted_triton_language(swap: bool = True) -> Iterator[None]:
    """triton.language as a process whose triton was imported with TRITON_INTERPRET=1 sees it,
    while the block lasts: with `swap`, its own @jit helpers swapped for interpreted twins (not
    needed where triton was imported that way). On exit every attribute of its modules and
    classes is put back (the interpreter patches them while a kernel runs and leaves some
    patched after a helper call), and the interpreter's cache of rewritten functions forgets
    what the block added."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction
    saved = [(obj, dict(vars(obj))) for obj in _language_objects()]
    cache = getattr(InterpretedFunction, "rewritten_fn", {})  # not in every triton version
    rewritten = set(cache)
    twins: dict[int, InterpretedFunction] = {}
    for obj, attrs in saved:
        for attr, value in attrs.items():
            if swap and isinstance(value, JITFunction):
                if id(value) not in twins:
                    twins[id(value)] = InterpretedFunction(value.fn)
                setattr(obj, attr, twins[id(value)])
    try:
        yield
    finally:
        missing = object()
        for obj, attrs in saved:
            for attr in [a for a in vars(obj) if a not in attrs]:
                delattr(obj, attr)
            for attr, value in attrs.items():
                if vars(obj).get(attr, missing) is not value:
                    setattr(obj, attr, value)
        for fn in [fn for fn in cache if fn not in rewritten]:
            del cache[fn]


def triton_compiles() -> bool:
    """Whether triton's own helpers are compiled ones (false where this process imported triton
    with TRITON_INTERPRET=1): the compile checks need them."""
    import triton.language as tl
    from triton.runtime.jit import JITFunction
    return isinstance(tl.zeros, JITFunction)


@contextlib.contextmanager
def interpreter_switch(triton: types.ModuleType, interpret: bool) -> Iterator[None]:
    """TRITON_INTERPRET as asked while the block lasts: through triton.knobs (triton >= 3.4,
    which also put the environment variable back), else the variable itself."""
    if hasattr(triton, "knobs"):
        with triton.knobs.runtime.scope():
            triton.knobs.runtime.interpret = interpret
            yield
        return
    before = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1" if interpret else "0"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = before


@contextlib.contextmanager
def fresh_kernels(interpret: bool) -> Iterator[types.SimpleNamespace]:
    """The kernel modules imported anew, their kernels interpreted (or compiled) per the flag."""
    triton = pytest.importorskip("triton")
    import tandem.kernels as parent
    saved = {name: mod for name, mod in sys.modules.items() if _ours(name)}
    missing = object()
    saved_attr = parent.__dict__.get("triton", missing)
    for name in saved:
        del sys.modules[name]
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(interpreter_switch(triton, interpret))
            if interpret:  # twins only where triton's helpers are compiled ones
                stack.enter_context(interpreted_triton_language(swap=triton_compiles()))
            mods = types.SimpleNamespace(**{m: importlib.import_module(f"{PACKAGE}.{m}")
                                            for m in MODULES})
            if interpret:  # a dot's rows each their own, as on a GPU (support.py says why)
                mods.support.interpret_dots_by_rows()
            yield mods
    finally:
        for name in [name for name in sys.modules if _ours(name)]:
            del sys.modules[name]
        sys.modules.update(saved)
        if saved_attr is missing:
            parent.__dict__.pop("triton", None)
        else:
            parent.triton = saved_attr


@pytest.fixture(scope="module")
def tk() -> Iterator[types.SimpleNamespace]:
    """The kernel modules with interpreted kernels: tk.norm, tk.paged_attention, ..."""
    with fresh_kernels(interpret=True) as mods:
        yield mods
