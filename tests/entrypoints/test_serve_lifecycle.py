"""`tandem serve` in trouble, over real processes: an engine core that stops (`kill -STOP`) is
found by the watchdog (503s, then exit 1); the core dies with the API process (`kill -9`, or a
SIGTERM while it loads); and a `torch/` or `tandem/` in the working directory is never imported
by the core."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from entrypoints.reliability_helpers import post
from entrypoints.server_helpers import (engine_pid, serve_command, signal_core_mid_stream,
                                        start_server, stop_server)


def _gone(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(") ")[-1].startswith("Z"):
                    return True  # a zombie: dead, waiting for its parent to reap it
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def test_a_stopped_core_means_503_within_the_limit_then_exit_1(tiny_model_dir: Path,
                                                               tmp_path: Path) -> None:
    limit = 3.0
    srv = start_server(str(tiny_model_dir), ["--served-model-name", "tiny",
                                             "--engine-iteration-timeout-s", str(limit)],
                       tmp_path / "log")
    core = engine_pid(srv)
    try:
        error, _, _, answered = signal_core_mid_stream(srv, signal.SIGSTOP)
        assert error["code"] == 503 and "sent nothing" in error["message"], error
        assert answered < limit + 5, answered
        try:
            health = httpx.get(srv.url + "/health", timeout=5).status_code
        except httpx.HTTPError:
            health = "exited"
        assert health in (503, "exited")
        assert srv.proc.wait(20) == 1
        assert _gone(core, 5), "the stopped core was left behind"
        assert "stopped or hung" in srv.log()
    finally:
        try:
            os.kill(core, signal.SIGKILL)
        except ProcessLookupError:
            pass
        stop_server(srv.proc)


def test_the_core_imports_nothing_from_the_working_directory_and_dies_with_the_api(
        tiny_model_dir: Path, tmp_path: Path) -> None:
    marker = tmp_path / "imported"
    for name in ("torch", "tandem"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(
            f"open({str(marker)!r}, 'a').write({name!r} + '\\n')\n"
            f"raise ImportError('the {name} of the working directory was imported')\n")
    srv = start_server(str(tiny_model_dir), ["--served-model-name", "tiny"], tmp_path / "log",
                       cwd=tmp_path, console_script=True)
    try:
        body = {"model": "tiny", "prompt": "Hello", "max_tokens": 4}
        assert post(srv.url, "/v1/completions", body).status_code == 200
        assert not marker.exists(), marker.read_text()
        core = engine_pid(srv)
        srv.proc.kill()  # kill -9 of the API process: no drain, no goodbye
        srv.proc.wait(5)
        assert _gone(core, 5), "the engine core outlived the API process"
    finally:
        stop_server(srv.proc)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_the_core_loads_leaves_no_process(tiny_model_dir: Path, tmp_path: Path,
                                                         sig: int) -> None:
    log_path = tmp_path / "log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(serve_command(str(tiny_model_dir), "--port", "0"), stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not (found := re.findall(r"engine core process (\d+) started",
                                       log_path.read_text(errors="replace"))):
            assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.01)
        core = int(found[0])
        proc.send_signal(sig)  # the core is importing torch or loading weights now
        assert proc.wait(30) == 130  # the core is given 5 s, then killed
        assert _gone(core, 5), "the engine core outlived the API process"
        log = log_path.read_text()
        assert "Traceback" not in log and "tandem serve: error: stopped while loading" in log, log
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
