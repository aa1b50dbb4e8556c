"""Fixtures for the browser tests of the page at `/`: two real `tandem serve` processes on tiny
models (one with a draft, one without a draft but with an API key), started side by side, and
headless Chromium driven by Playwright.

The browser is Debian's chromium (`apt-get install -y chromium`), not one Playwright downloads:
the machines that run these tests reach package registries only. Without chromium or the
`playwright` package the tests skip, saying how to install them.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator

import pytest

from entrypoints.server_helpers import API_KEY, ServerProcess, start_server, stop_server
from tiny_models import build_tiny_model
from web.browser_helpers import CHROMIUM_ARGS, SCREENSHOTS, WebServers, chromium_path

# One intra-op thread per server: tiny models gain nothing from more, and on a small shared
# machine the servers, the browser and the test would otherwise fight over the cores.
THREADS = {"OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("browser tests need the playwright package: .venv/bin/pip install playwright "
                    "(no `playwright install`: they use Debian's chromium)")
    executable = chromium_path()
    if executable is None:
        pytest.skip("browser tests need chromium: apt-get install -y chromium "
                    "(scripts/setup.sh does this where it runs as root)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture(scope="session")
def web_servers(browser: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebServers]:
    """Depends on `browser` so that a machine without one skips before paying for servers.

    The models are tests/conftest.py's `tiny_dirs["llama"]` and `["llama_other"]` (same
    builder, same seeds), built here alone rather than with the three other architectures
    tiny_dirs builds. The draft drafts probabilistically: with near-uniform random models
    that accepts about 40 % of drafts at temperature 1, so every kind of mark shows."""
    root = tmp_path_factory.mktemp("web-models")
    target = build_tiny_model(root / "llama", "llama")
    draft = build_tiny_model(root / "llama_other", "llama", seed=123)
    logs = tmp_path_factory.mktemp("web-logs")
    spec = json.dumps({"model": str(draft), "num_speculative_tokens": 3, "adaptive": False,
                       "draft_sample_method": "probabilistic"})
    # max_position_embeddings of the tiny models is 512: room for a long stream to stop.
    common = ["--max-model-len", "512"]
    with ThreadPoolExecutor(2) as pool:  # start-up is mostly imports: overlap the two
        futures = [pool.submit(start_server, str(target),
                               ["--served-model-name", "tiny-web", *common,
                                "--speculative-config", spec], logs / "spec.log", THREADS),
                   pool.submit(start_server, str(target),
                               ["--served-model-name", "tiny-plain", *common,
                                "--api-key", API_KEY], logs / "plain.log", THREADS)]
    servers: list[ServerProcess] = []
    failures: list[Exception] = []
    for future in futures:
        try:
            servers.append(future.result())
        except Exception as e:  # still stop the one that started
            failures.append(e)
    if failures:
        stop_all(servers)
        raise failures[0]
    yield WebServers(*servers)
    stop_all(servers)


def stop_all(servers: list[ServerProcess]) -> None:
    """Graceful shutdowns (SIGINT, wait) side by side: each takes a second or two."""
    with ThreadPoolExecutor(max(1, len(servers))) as pool:
        list(pool.map(lambda srv: stop_server(srv.proc), servers))


@pytest.fixture
def page(browser: Any, web_servers: WebServers) -> Iterator[Any]:
    """A fresh browser context (empty localStorage) per test. Every request the page makes is
    recorded: the page must load nothing from outside the server."""
    context = browser.new_context(viewport={"width": 1300, "height": 860})
    pg = context.new_page()
    pg.requests = []  # type: ignore[attr-defined]
    pg.errors = []  # type: ignore[attr-defined]
    pg.on("request", lambda r: pg.requests.append(r.url))
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))
    yield pg
    context.close()


@pytest.fixture(scope="session")
def screenshot_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("web-screenshots")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for path in SCREENSHOTS:
        terminalreporter.write_line(f"page screenshot: {path}")
