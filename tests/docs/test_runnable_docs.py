"""Docs that run: every code block in README.md and docs/*.md marked as runnable is executed here,
on the bundled models, so a doc example that breaks fails the suite.

The mark is the fenced block's info string, after the language (GitHub highlights by the first
word and ignores the rest, so the marks do not show):

    ```python run       an offline example: run as a Python script in a subprocess
    ```bash serve       a `tandem serve ...` command: started on a free port on 127.0.0.1
    ```python client    run against the last `serve` block above it in the same file, with
    ```bash client      `localhost:8000` pointed at that server

Blocks with the same text run once (the README's examples are repeated in the manual), and one
server is started per distinct `serve` command, shared by every client block of every file
(and stopped when this module's tests end).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

import httpx
import pytest

from entrypoints.server_helpers import free_port, stop_server

ROOT = Path(__file__).resolve().parents[2]
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```(\w+)[ \t]+(run|serve|client)[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)
KINDS = {("python", "run"), ("bash", "serve"), ("python", "client"), ("bash", "client")}
SHOWN_ADDRESS = "localhost:8000"  # what client blocks show; replaced by the test server's
SERVER_START_TIMEOUT_S = 300.0
RUN_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Block:
    where: str                    # README.md:12
    lang: str                     # python, bash
    kind: str                     # run, serve, client
    code: str
    server: Optional[str] = None  # a client's serve command


def parse_blocks(text: str, name: str) -> list[Block]:
    blocks, serve = [], None
    for m in BLOCK.finditer(text):
        lang, kind, code = m.group(1), m.group(2), m.group(3)
        where = f"{name}:{text.count(chr(10), 0, m.start()) + 1}"
        if (lang, kind) not in KINDS:
            raise ValueError(f"{where}: ```{lang} {kind} is not a runnable kind; use one of "
                             f"{sorted(' '.join(k) for k in KINDS)}")
        if kind == "serve":
            serve = code
        if kind == "client" and serve is None:
            raise ValueError(f"{where}: a client block needs a ```bash serve block above it")
        blocks.append(Block(where, lang, kind, code, serve if kind == "client" else None))
    return blocks


def all_blocks() -> list[Block]:
    seen: set[tuple[str, str, str, Optional[str]]] = set()
    out = []
    for path in DOC_FILES:
        for b in parse_blocks(path.read_text(), path.relative_to(ROOT).as_posix()):
            key = (b.lang, b.kind, b.code, b.server)
            if b.kind != "serve" and key not in seen:
                seen.add(key)
                out.append(b)
    return out


def serve_argv(command: str, port: int) -> list[str]:
    """The block's `tandem serve ...` as this interpreter's, bound to 127.0.0.1:port."""
    argv = shlex.split(command.replace("\\\n", " "))
    if argv[:2] != ["tandem", "serve"]:
        raise ValueError(f"a serve block must be one `tandem serve ...` command, got {argv[:2]}")
    rest, i = [], 2
    while i < len(argv):
        if argv[i] in ("--host", "--port"):
            i += 2
            continue
        rest.append(argv[i])
        i += 1
    return [sys.executable, "-m", "tandem", "serve", *rest, "--host", "127.0.0.1",
            "--port", str(port)]


def doc_env() -> dict[str, str]:
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
            "PYTHONPATH": str(ROOT) + (os.pathsep + path if path else "")}


class DocServers:
    """One `tandem serve` per distinct serve command, started on first use."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.running: dict[str, tuple[subprocess.Popen, int, Path]] = {}

    def port_for(self, command: str) -> int:
        if command not in self.running:
            port = free_port()
            log = self.logs / f"server-{len(self.running)}.log"
            with open(log, "w") as out:
                proc = subprocess.Popen(serve_argv(command, port), stdout=out,
                                        stderr=subprocess.STDOUT, cwd=str(ROOT), env=doc_env(),
                                        start_new_session=True)
            self.running[command] = (proc, port, log)
            self._wait_healthy(proc, port, log)
        proc, port, log = self.running[command]
        assert proc.poll() is None, f"the doc server exited:\n{log.read_text()[-4000:]}"
        return port

    @staticmethod
    def _wait_healthy(proc: subprocess.Popen, port: int, log: Path) -> None:
        start = time.monotonic()
        while time.monotonic() - start < SERVER_START_TIMEOUT_S:
            if proc.poll() is not None:
                raise AssertionError(f"the doc server exited with {proc.returncode}:\n"
                                     f"{log.read_text()[-4000:]}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"the doc server was not healthy in {SERVER_START_TIMEOUT_S} s:\n"
                             f"{log.read_text()[-4000:]}")

    def stop(self) -> None:
        for proc, _, _ in self.running.values():
            stop_server(proc)


@pytest.fixture(scope="module")
def doc_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DocServers]:
    # Module scope: every client block is in this module, and the servers must be gone before
    # other tests count this process's children (tests/distributed).
    servers = DocServers(tmp_path_factory.mktemp("doc-servers"))
    yield servers
    servers.stop()


def run_block(block: Block, tmp_path: Path, code: str) -> None:
    if block.lang == "python":
        script = tmp_path / "block.py"
        script.write_text(code)
        argv = [sys.executable, str(script)]
    else:
        argv = ["bash", "-euo", "pipefail", "-c", code]
    done = subprocess.run(argv, cwd=str(ROOT), env=doc_env(), capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0, (
        f"{block.where}: the example exited with {done.returncode}\n--- stdout\n"
        f"{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-6000:]}")
    assert done.stdout.strip(), f"{block.where}: the example printed nothing"


@pytest.mark.slow
@pytest.mark.parametrize("block", all_blocks(), ids=lambda b: f"{b.where}-{b.lang}-{b.kind}")
def test_doc_block_runs(block: Block, doc_servers: DocServers, tmp_path: Path) -> None:
    code = block.code
    if block.kind == "client":
        assert SHOWN_ADDRESS in code, f"{block.where}: a client block talks to {SHOWN_ADDRESS}"
        port = doc_servers.port_for(block.server)
        code = code.replace(SHOWN_ADDRESS, f"127.0.0.1:{port}")
    run_block(block, tmp_path, code)


def test_readme_has_each_kind_of_runnable_example():
    kinds = {(b.lang, b.kind) for b in parse_blocks((ROOT / "README.md").read_text(), "README")}
    assert {("python", "run"), ("bash", "serve"), ("python", "client")} <= kinds


def test_blocks_are_parsed_with_their_server():
    text = ("```python run\nprint(1)\n```\n\n```python\nnot run\n```\n"
            "```bash serve\ntandem serve M --port 8000 \\\n  --host 0.0.0.0 --seed 1\n```\n"
            "```bash client\ncurl localhost:8000\n```\n")
    blocks = parse_blocks(text, "x.md")
    assert [(b.lang, b.kind, b.where) for b in blocks] == [
        ("python", "run", "x.md:1"), ("bash", "serve", "x.md:8"), ("bash", "client", "x.md:12")]
    assert blocks[2].server == blocks[1].code
    assert serve_argv(blocks[1].code, 1234)[3:] == ["serve", "M", "--seed", "1", "--host",
                                                    "127.0.0.1", "--port", "1234"]
    with pytest.raises(ValueError, match="needs a ```bash serve block"):
        parse_blocks("```python client\nx\n```\n", "y.md")
    with pytest.raises(ValueError, match="not a runnable kind"):
        parse_blocks("```bash run\nx\n```\n", "y.md")
