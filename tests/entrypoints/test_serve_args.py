"""`tandem serve` argument parsing: vLLM spellings, JSON flags, removed flags (no engine needed)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tandem.entrypoints.openai.args import (ArgumentError, engine_kwargs, normalize_argv,
                                            parse_max_model_len, parse_serve_args)


def test_hyphen_and_underscore_spellings_are_equal() -> None:
    hyphen = parse_serve_args(["m", "--max-model-len", "2048", "--gpu-memory-utilization", "0.8",
                               "--tensor-parallel-size", "1", "--max-num-seqs", "4"])
    under = parse_serve_args(["m", "--max_model_len=2048", "--gpu_memory_utilization", "0.8",
                              "-tp", "1", "--max_num_seqs", "4"])
    assert vars(hyphen) == vars(under)
    assert hyphen.max_model_len == 2048 and hyphen.gpu_memory_utilization == 0.8


def test_issue_command_line_parses() -> None:
    argv = ["Qwen/Qwen3-4B-Thinking-2507", "--host", "0.0.0.0", "--port", "8000", "--seed", "42",
            "-tp", "1", "--max-model-len", "2048", "--gpu-memory-utilization", "0.8",
            "--speculative-config",
            '{"model": "Qwen/Qwen3-0.6B", "num_speculative_tokens": 5, "method": "draft_model"}']
    args = parse_serve_args(argv)
    kwargs = engine_kwargs(args)
    assert kwargs["model"] == "Qwen/Qwen3-4B-Thinking-2507"
    assert kwargs["seed"] == 42 and kwargs["max_model_len"] == 2048
    assert kwargs["speculative_config"] == {"model": "Qwen/Qwen3-0.6B",
                                            "num_speculative_tokens": 5, "method": "draft_model"}
    assert args.served_model_name == ["Qwen/Qwen3-4B-Thinking-2507"]


def test_defaults() -> None:
    args = parse_serve_args(["m"])
    assert args.port == 8000 and args.seed == 0 and args.host is None
    assert args.enable_prefix_caching is True and args.speculative_config is None
    assert args.dtype == "auto" and args.device == "auto"
    assert parse_serve_args(["m", "--no-enable-prefix-caching"]).enable_prefix_caching is False


@pytest.mark.parametrize("text,value", [("2048", 2048), ("1k", 1000), ("1K", 1024),
                                        ("25.6k", 25600), ("-1", None), ("auto", None)])
def test_max_model_len_forms(text: str, value: int) -> None:
    assert parse_max_model_len(text) == value


def test_speculative_config_keys_and_dotted_forms() -> None:
    args = parse_serve_args(["m", "-sc", '{"model": "d", "num-speculative-tokens": 3}'])
    assert args.speculative_config == {"model": "d", "num_speculative_tokens": 3}
    args = parse_serve_args(["m", "--speculative_config.model", "d",
                             "--speculative-config.num_speculative_tokens=4"])
    assert args.speculative_config == {"model": "d", "num_speculative_tokens": 4}


def test_served_model_names_and_api_key_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_API_KEY", "from-vllm-env")
    args = parse_serve_args(["m", "--served-model-name", "a", "b"])
    assert args.served_model_name == ["a", "b"] and args.api_key == ["from-vllm-env"]
    monkeypatch.setenv("TANDEM_API_KEY", "from-tandem-env")
    assert parse_serve_args(["m"]).api_key == ["from-tandem-env"]
    assert parse_serve_args(["m", "--api-key", "k"]).api_key == ["k"]


def test_bad_json_and_removed_flags_raise_one_line_errors() -> None:
    with pytest.raises(ArgumentError, match="not valid JSON"):
        parse_serve_args(["m", "--speculative-config", "{model: d}"])
    with pytest.raises(ArgumentError, match="JSON object"):
        parse_serve_args(["m", "--speculative-config", "[1]"])
    with pytest.raises(ArgumentError) as info:
        parse_serve_args(["m", "--speculative_model", "d", "--num-speculative-tokens", "5"])
    shown = str(info.value).split("--speculative-config '")[1].rstrip("' instead")
    assert json.loads(shown) == {"model": "d", "num_speculative_tokens": 5}


def test_normalize_argv_leaves_values_alone() -> None:
    assert normalize_argv(["--served_model_name", "my_model", "--a_b.c_d=x_y", "-tp"]) == \
        ["--served-model-name", "my_model", "--a-b.c_d=x_y", "-tp"]


def _run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tandem", *args], capture_output=True,
                          text=True, timeout=60)


def test_cli_removed_flags_print_the_json_to_use() -> None:
    result = _run_cli("serve", "some/model", "--speculative-model", "some/draft",
                      "--num-speculative-tokens", "5")
    assert result.returncode != 0
    assert '--speculative-config \'{"model": "some/draft", "num_speculative_tokens": 5}\'' \
        in result.stderr
    assert "Traceback" not in result.stderr


def test_cli_bad_json_exits_with_one_line() -> None:
    result = _run_cli("serve", "some/model", "--speculative-config", "{not json")
    assert result.returncode != 0
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "--speculative-config" in result.stderr and "Traceback" not in result.stderr


def test_cli_version_and_help() -> None:
    result = _run_cli("--version")
    assert result.returncode == 0 and result.stdout.startswith("tandem ")
    result = _run_cli("serve", "--help")
    assert result.returncode == 0 and "--speculative-config" in result.stdout
    assert "--max-model-len" in result.stdout
    # the speculative keys' values, the default rejection method among them
    assert '"auto" (default: "gumbel" for seeded sampled requests' in result.stdout
