"""tandem.kernels.triton where triton is missing (imports work, launches say why), and the
interpreter switch of this folder's conftest (everything it changes is put back)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernels_triton.conftest import PACKAGE, fresh_kernels

ROOT = Path(__file__).resolve().parents[2]

WITHOUT_TRITON = """
import sys
sys.modules["triton"] = None  # import triton raises ImportError, as where it is not installed
import torch
import tandem
import tandem.kernels.triton as kt
from tandem.kernels.triton import activation, norm, paged_attention, rope_kv
assert not kt.available() and not kt.available("cpu")
try:
    norm.rms_norm(torch.ones(2, 8), torch.ones(8), 1e-6)
except RuntimeError as e:
    assert "not installed" in str(e), e
else:
    raise AssertionError("a launch without triton did not raise")
print("ok")
"""


def test_kernel_modules_import_without_triton():
    out = subprocess.run([sys.executable, "-c", WITHOUT_TRITON], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_interpreter_switch_is_put_back():
    triton = pytest.importorskip("triton")
    import triton.language as tl
    env = os.environ.get("TRITON_INTERPRET")
    knobs = getattr(triton, "knobs", None)
    knob = knobs.runtime.interpret if knobs else None
    helper = tl.zeros
    tensor_attrs = dict(vars(tl.core.tensor))
    core_attrs = dict(vars(tl.core))
    modules = {n: m for n, m in sys.modules.items() if n.startswith(PACKAGE)}
    with fresh_kernels(interpret=True) as mods:
        assert mods.support.is_interpreted(mods.norm._add_rms_norm_kernel)
        assert os.environ["TRITON_INTERPRET"] == "1" and mods.support.interpreting()
        import torch
        mods.rope_kv.rope_write_kv(  # runs a helper kernel (_normed), which patches tl.core
            torch.zeros(1, 48), torch.ones(1, 1, 16), torch.zeros(1, 1, 16),
            torch.zeros(1, dtype=torch.int32), torch.zeros(4, 1, 16), torch.zeros(4, 1, 16),
            1, 1, 16, torch.ones(16), torch.ones(16))
    assert os.environ.get("TRITON_INTERPRET") == env
    assert (knobs.runtime.interpret if knobs else None) == knob
    assert tl.zeros is helper
    assert dict(vars(tl.core.tensor)) == tensor_attrs and dict(vars(tl.core)) == core_attrs
    assert {n: m for n, m in sys.modules.items() if n.startswith(PACKAGE)} == modules
