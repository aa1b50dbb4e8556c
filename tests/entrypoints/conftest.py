"""Fixtures for the server tests: tiny model directories, an in-process server over a fake engine
(fast plumbing tests), and real `tandem serve` subprocesses on free loopback ports (one per
configuration per session, since each start loads torch and a model)."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest

from entrypoints.reliability_helpers import REL_BLOCKS, TINY_BLOCK_BYTES
from entrypoints.server_helpers import (API_KEY, EOS_PROMPT, STARTUP_TIMES, ServerProcess,
                                        client_for, free_port, start_server, stop_server)
from tiny_models import build_tiny_model, build_tli_draft


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama"), arch="llama", seed=0)


@pytest.fixture(scope="session")
def tiny_base_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model whose tokenizer has no chat template (like the bundled Gemma base model).

    A random model almost never emits EOS, so the config also lists, as a second EOS id, the
    token that greedy decoding of EOS_PROMPT reaches third (found with transformers here); the
    server must then stop there with finish_reason "stop", as it would on a real EOS."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = build_tiny_model(tmp_path_factory.mktemp("tiny-base"), arch="llama", seed=1,
                           tokenizer="sentencepiece")
    tok = AutoTokenizer.from_pretrained(str(out))
    model = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    ids = torch.tensor([tok(EOS_PROMPT).input_ids])
    with torch.no_grad():
        generated = model.generate(ids, max_new_tokens=3, do_sample=False)[0, ids.shape[1]:]
    for name in ("config.json", "generation_config.json"):
        path = out / name
        if path.exists():
            cfg = json.loads(path.read_text())
            cfg["eos_token_id"] = [tok.eos_token_id, int(generated[-1])]
            path.write_text(json.dumps(cfg, indent=2))
    (out / "greedy_eos.json").write_text(json.dumps([int(t) for t in generated]))
    return out


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir: Path) -> Any:
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


# ---- in-process server over the fake engine --------------------------------------------------

@dataclass
class InProcessServer:
    url: str
    fake: Any
    engine: Any


@pytest.fixture(scope="module")
def fake_server(tokenizer: Any) -> Iterator[InProcessServer]:
    import uvicorn

    from entrypoints.fake_engine import FakeEngine
    from tandem.engine.async_engine import AsyncLLMEngine
    from tandem.entrypoints.openai.api_server import build_app

    fake = FakeEngine(tokenizer, max_model_len=128, spec_k=3)
    engine = AsyncLLMEngine(fake)
    app = build_app(engine, ["fake-model"])
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           lifespan="off", timeout_graceful_shutdown=1))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "in-process server did not start"
        time.sleep(0.02)
    yield InProcessServer(f"http://127.0.0.1:{port}", fake, engine)
    server.should_exit = True
    thread.join(10)
    engine.shutdown()


# ---- real `tandem serve` subprocesses (one per configuration per session) ---------------

@pytest.fixture(scope="session")
def server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[ServerProcess]:
    srv = start_server(str(tiny_model_dir), ["--served-model-name", "tiny"],
                       tmp_path_factory.mktemp("logs") / "server.log")
    yield srv
    stop_server(srv.proc)


@pytest.fixture(scope="session")
def spec_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
                ) -> Iterator[ServerProcess]:
    spec = json.dumps({"model": str(tiny_model_dir), "num_speculative_tokens": 3,
                       "adaptive": False})
    srv = start_server(str(tiny_model_dir), ["--served-model-name", "tiny-spec", "tiny-alias",
                                             "--speculative-config", spec],
                       tmp_path_factory.mktemp("logs") / "spec_server.log")
    yield srv
    stop_server(srv.proc)


@pytest.fixture(scope="session")
def rel_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
               ) -> Iterator[ServerProcess]:
    """A draft model, a KV cache that forces preemption under load, and 16 sequences at most."""
    spec = json.dumps({"model": str(tiny_model_dir), "num_speculative_tokens": 3, "adaptive": False,
                       "draft_sample_method": "probabilistic"})
    srv = start_server(str(tiny_model_dir), ["--served-model-name", "tiny-rel",
                                             "--speculative-config", spec,
                                             "--kv-cache-memory-bytes",
                                             str(REL_BLOCKS * TINY_BLOCK_BYTES),
                                             "--max-num-seqs", "16"],
                       tmp_path_factory.mktemp("logs") / "rel_server.log")
    yield srv
    stop_server(srv.proc)


@pytest.fixture(scope="session")
def tli_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
               ) -> Iterator[ServerProcess]:
    """A draft with another tokenizer (SentencePiece-style) through --speculative-config."""
    draft = build_tli_draft(tiny_model_dir, tmp_path_factory.mktemp("tli-draft"), noise=0.3)
    spec = json.dumps({"model": str(draft), "num_speculative_tokens": 3, "adaptive": False,
                       "method": "draft_model",
                       "use_heterogeneous_vocab": True, "draft_sample_method": "probabilistic"})
    srv = start_server(str(tiny_model_dir), ["--served-model-name", "tiny-tli",
                                             "--speculative-config", spec],
                       tmp_path_factory.mktemp("logs") / "tli_server.log")
    yield srv
    stop_server(srv.proc)


@pytest.fixture(scope="session")
def secured_base_server(tiny_base_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
                        ) -> Iterator[ServerProcess]:
    """No chat template, API key from the environment, underscore flag spellings; trusts
    templates sent with requests."""
    srv = start_server(str(tiny_base_model_dir), ["--served_model_name", "base",
                                                  "--trust_request_chat_template"],
                       tmp_path_factory.mktemp("logs") / "secured_server.log",
                       env={"TANDEM_API_KEY": API_KEY})
    yield srv
    stop_server(srv.proc)


@pytest.fixture(scope="session")
def client(server: ServerProcess) -> Any:
    return client_for(server)


@pytest.fixture(scope="session")
def spec_client(spec_server: ServerProcess) -> Any:
    return client_for(spec_server)


@pytest.fixture(scope="session", params=["plain", "spec"])
def srv(request: pytest.FixtureRequest) -> ServerProcess:
    """Runs a test against the server without and with speculative decoding (checklist 53:
    every behaviour must hold with a draft model too)."""
    return request.getfixturevalue("server" if request.param == "plain" else "spec_server")


@pytest.fixture(scope="session")
def oa(srv: ServerProcess) -> Any:
    return client_for(srv)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for flags, seconds in STARTUP_TIMES.items():
        terminalreporter.write_line(f"tandem serve start-up (launch to healthy /health): "
                                    f"{seconds:.1f} s  [{flags}]")
    from entrypoints.reliability_helpers import RELIABILITY
    if RELIABILITY:
        terminalreporter.section("reliability")
        for what, value in RELIABILITY.items():
            terminalreporter.write_line(f"{what}: {value}")
