"""`tandem bench latency|throughput|spec` run end to end on tiny models and write what they say
(JSON with the machine named; the spec plot as a PNG). Numbers here are not measurements: the
suite's machine is busy; benchmarks are run on a quiet one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tandem.bench.common import load_prompts


def bench(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "tandem", "bench", *args], check=True, timeout=300,
                   capture_output=True)


def test_latency_and_throughput_write_json(tiny_llama: str, tmp_path: Path) -> None:
    spec = json.dumps({"model": tiny_llama, "num_speculative_tokens": 2, "adaptive": False})
    bench("latency", "--model", tiny_llama, "--speculative-config", spec, "--num-prompts", "2",
          "--max-tokens", "12", "--output-json", str(tmp_path / "lat.json"))
    lat = json.loads((tmp_path / "lat.json").read_text())
    assert lat["benchmark"] == "latency" and lat["machine"]["cpu"]
    assert lat["ttft"]["mean_ms"] > 0 and lat["itl"]["mean_ms"] > 0
    assert lat["decode_tokens_per_s"] > 0
    bench("throughput", "--model", tiny_llama, "--num-prompts", "6", "--max-tokens", "8",
          "--input-len", "10", "--quantization", "q8_0", "--output-json", str(tmp_path / "tput.json"))
    tput = json.loads((tmp_path / "tput.json").read_text())
    assert tput["num_prompts"] == 6 and tput["output_tokens_per_s"] > 0
    assert tput["input_len"] == 10 and tput["generation_tokens_per_s"] > 0
    for result in (lat, tput):  # the process's memory, next to the speeds
        mem = result["memory"]
        assert mem["rss_after_load_mb"] > mem["rss_before_load_mb"] > 0
        assert mem["load_added_mb"] == pytest.approx(mem["rss_after_load_mb"]
                                                     - mem["rss_before_load_mb"])
        assert mem["peak_rss_mb"] >= mem["rss_after_load_mb"] * 0.99


def test_rounds_interleave_ours_and_the_peer(tiny_llama: str, tmp_path: Path) -> None:
    bench("latency", "--model", tiny_llama, "--num-prompts", "1", "--max-tokens", "6",
          "--peers", "--rounds", "2", "--output-json", str(tmp_path / "lat.json"))
    lat = json.loads((tmp_path / "lat.json").read_text())
    assert len(lat["rounds"]) == 2 and all(r["transformers_generate"] > 0 for r in lat["rounds"])
    ratios = sorted(r["ratio_vs_transformers"] for r in lat["rounds"])
    assert lat["ratio_vs_transformers"] == pytest.approx(sum(ratios) / 2)  # median of two
    bench("throughput", "--model", tiny_llama, "--num-prompts", "3", "--max-tokens", "6",
          "--peers", "--rounds", "2", "--output-json", str(tmp_path / "tput.json"))
    tput = json.loads((tmp_path / "tput.json").read_text())
    assert len(tput["rounds"]) == 2 and tput["ratio_vs_transformers_single_stream"] > 0
    assert tput["machine"]["cpu_kernels"] in ("c", "torch")
    r = subprocess.run([sys.executable, "-m", "tandem", "bench", "latency", "--model", tiny_llama,
                        "--rounds", "0"], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "--rounds: must be at least 1, got 0" in r.stderr


def test_spec_reports_acceptance_by_position_and_plots(tiny_llama: str, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    spec = json.dumps({"model": tiny_llama})
    bench("spec", "--model", tiny_llama, "--speculative-config", spec, "--k", "1", "3",
          "--adaptive", "--num-prompts", "2", "--max-tokens", "17",  # 1 + 4 steps of 4
          "--rounds", "2", "--plot", str(tmp_path / "spec.png"), "--output-json", str(tmp_path / "spec.json"))
    result = json.loads((tmp_path / "spec.json").read_text())
    runs = {(r["k"], r["adaptive"]): r for r in result["runs"]}
    assert set(runs) == {(1, False), (3, False), (3, True)} and result["rounds"] == 2
    # a self-draft: every position accepted, acceptance length k + 1
    assert runs[(3, False)]["acceptance_by_position"] == pytest.approx([1.0, 1.0, 1.0])
    assert runs[(3, False)]["mean_acceptance_length"] == pytest.approx(4.0)
    assert runs[(1, False)]["acceptance_by_position"] == pytest.approx([1.0])
    assert result["target_tokens_per_s"] > 0 and result["target_alone_tokens_per_s"] > 0
    assert result["cost_ratio_c"] > 0 and runs[(1, False)]["speedup_predicted"] > 0
    assert (tmp_path / "spec.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # k and adaptive are what the benchmark varies: set in the config, they would be overridden
    r = subprocess.run([sys.executable, "-m", "tandem", "bench", "spec", "--model", tiny_llama,
                        "-sc", json.dumps({"model": tiny_llama, "num_speculative_tokens": 2})],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "leave them out of --speculative-config" in r.stderr


def test_prompts_from_jsonl_and_text(tmp_path: Path) -> None:
    (tmp_path / "p.jsonl").write_text('{"prompt": "a"}\n{"prompt": "b"}\n')
    (tmp_path / "p.txt").write_text("x\n\ny\n")
    assert load_prompts(str(tmp_path / "p.jsonl"), 3) == ["a", "b", "a"]
    assert load_prompts(str(tmp_path / "p.txt"), 2) == ["x", "y"]


def test_a_bad_model_is_one_line(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "tandem", "bench", "throughput", "--model",
                        str(tmp_path / "missing")], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "tandem bench throughput: error:" in r.stderr
    assert "Traceback" not in r.stderr


def test_input_len_gives_every_prompt_that_many_tokens_of_its_own_text() -> None:
    from tandem.bench.throughput import fixed_length

    class Words:  # a tokenizer: one id per word
        def encode(self, text: str) -> list[int]:
            return [len(w) for w in text.split()]

    ids = fixed_length(Words(), ["a bb ccc", "dddd", ""], 5)
    assert ids == [[1, 2, 3, 1, 2], [4, 4, 4, 4, 4], [0, 0, 0, 0, 0]]
