"""Starting and stopping real `tandem serve` processes for the end-to-end tests."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import httpx

REPO_ROOT = Path(__file__).resolve().parents[2]
API_KEY = "sk-test-key"
EOS_PROMPT = "Hello, my name is"
STARTUP_TIMEOUT_S = 180.0
STARTUP_TIMES: dict[str, float] = {}  # flags -> seconds from launch to a healthy /health


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class ServerProcess:
    url: str
    proc: subprocess.Popen
    startup_s: float
    log_path: Path
    model: str  # the first served model name
    model_dir: str

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def serve_command(*args: str, console_script: bool = False) -> list[str]:
    """`python -m tandem serve ...`, or the `tandem` script that pip installed beside python."""
    if console_script:
        return [str(Path(sys.executable).with_name("tandem")), "serve", *args]
    return [sys.executable, "-m", "tandem", "serve", *args]


def start_server(model: str, extra: list[str], log_path: Path,
                 env: Optional[dict[str, str]] = None, cwd: Optional[Path] = None,
                 console_script: bool = False) -> ServerProcess:
    port = free_port()
    cmd = serve_command(model, "--host", "127.0.0.1", "--port", str(port), "--max-model-len",
                        "256", "--uvicorn-log-level", "warning", "--disable-log-stats", *extra,
                        console_script=console_script)
    start = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                cwd=str(cwd or REPO_ROOT),
                                env={**os.environ, **(env or {})}, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{log_path.read_text()}")
        try:
            if httpx.get(url + "/health", timeout=1.0).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() - start > STARTUP_TIMEOUT_S:
            stop_server(proc)
            raise RuntimeError(f"server not healthy in {STARTUP_TIMEOUT_S}s:\n"
                               f"{log_path.read_text()}")
        time.sleep(0.1)
    startup = time.monotonic() - start
    STARTUP_TIMES[" ".join(extra)] = startup
    names = extra[extra.index("--served-model-name") + 1] if "--served-model-name" in extra \
        else extra[extra.index("--served_model_name") + 1]
    return ServerProcess(url, proc, startup, log_path, names, model)


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def client_for(srv: ServerProcess, api_key: str = "EMPTY", **kwargs: Any) -> Any:
    from openai import OpenAI
    return OpenAI(api_key=api_key, base_url=srv.base_url, max_retries=0, **kwargs)


def engine_pid(srv: ServerProcess) -> int:
    """The pid of the server's engine core process (from its start-up log line)."""
    found = re.findall(r"engine core process (\d+) started", srv.log())
    assert len(found) == 1, srv.log()
    return int(found[0])


def signal_core_mid_stream(srv: ServerProcess, sig: int) -> tuple[dict, str, float, float]:
    """A long stream (n = 4, 240 tokens each); once it generates, `sig` to the engine core, then
    the rest of the stream is read. Returns the stream's error event, the rest of the stream, the
    moment of the signal (time.monotonic) and the seconds from it to the stream's end."""
    with httpx.stream("POST", srv.url + "/v1/completions", timeout=30, json={
            "prompt": "Hello", "max_tokens": 240, "n": 4, "ignore_eos": True,
            "stream": True}) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")  # generating now
        os.kill(engine_pid(srv), sig)
        t0 = time.monotonic()
        rest = "\n".join(lines)
        answered = time.monotonic() - t0
    error = json.loads(next(line for line in rest.splitlines()
                            if line.startswith('data: {"error"'))[6:])["error"]
    return error, rest, t0, answered
