"""Start-up failures of `tandem serve` are one line on stderr and a non-zero exit, never a
traceback; a working start-up's time is reported in the terminal summary (see conftest)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from entrypoints.server_helpers import REPO_ROOT, serve_command


def _serve(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(serve_command(*args), capture_output=True, text=True, timeout=120,
                          cwd=str(REPO_ROOT))


def _assert_one_line_error(result: subprocess.CompletedProcess, *words: str) -> None:
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("tandem serve: error:")]
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr
    for word in words:
        assert word in errors[0], errors[0]


def test_unknown_speculative_config_key(tiny_model_dir: Path) -> None:
    spec = json.dumps({"model": str(tiny_model_dir), "num_speculative_tokens": 3, "adaptive": False,
                       "not_a_key": 1})
    _assert_one_line_error(_serve(str(tiny_model_dir), "--speculative-config", spec),
                           "not_a_key")


def test_missing_chat_template_file(tiny_model_dir: Path, tmp_path: Path) -> None:
    missing = str(tmp_path / "missing.jinja")
    _assert_one_line_error(_serve(str(tiny_model_dir), "--chat-template", missing),
                           "--chat-template")
