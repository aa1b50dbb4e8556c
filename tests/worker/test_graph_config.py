"""vLLM's CUDA-graph settings (`enforce_eager`, `compilation_config`, `cuda_graph_sizes` and
their `tandem serve` flags): the batch sizes they give, the errors that name the field, and the
CPU path they leave as it was (nothing captured, no buffers, run_model as before)."""

from __future__ import annotations

import logging

import pytest

from tandem import LLM, SamplingParams
from tandem.compilation_config import CompilationConfig, vllm_size_pattern
from tandem.config import EngineConfig
from tandem.entrypoints.openai.args import engine_kwargs, parse_serve_args
from tandem.kernels import triton_route


def sizes(value=None, cuda_graph_sizes=None, max_num_seqs=256) -> list[int]:
    return list(CompilationConfig.create(value, cuda_graph_sizes,
                                         max_num_seqs).cudagraph_capture_sizes)


def test_sizes_follow_vllm():
    assert vllm_size_pattern(32) == [1, 2, 4, 8, 16, 24, 32]
    assert sizes(max_num_seqs=20) == [1, 2, 4, 8, 16, 20]  # and max_num_seqs itself
    assert sizes(max_num_seqs=1) == [1]
    assert sizes(cuda_graph_sizes=[16]) == [1, 2, 4, 8, 16]       # one value: the pattern
    assert sizes(cuda_graph_sizes=[8, 3, 3, 1]) == [1, 3, 8]      # several: those
    assert sizes({"cudagraph_capture_sizes": [4, 2]}) == [2, 4]
    assert sizes({"max_cudagraph_capture_size": 24}) == [1, 2, 4, 8, 16, 24]
    assert sizes(cuda_graph_sizes=[4, 64], max_num_seqs=8) == [4]  # above max_num_seqs: dropped
    assert sizes(3) == sizes()  # an optimization level: no effect on graphs
    config = CompilationConfig.create({"cudagraph_mode": "none", "level": 3}, None, 8)
    assert not config.use_cudagraph and config.cudagraph_mode == "NONE"
    assert CompilationConfig.create(config, None, 8) == config


@pytest.mark.parametrize("value,graph_sizes,words", [
    ({"cudagraph_capture_sizes": [0, 2]}, None,
     "compilation_config['cudagraph_capture_sizes'] must be a non-empty list of positive "
     "integers"),
    ({"cudagraph_capture_sizes": "8"}, None, "got '8'"),
    ({"cudagraph_capture_sizes": []}, None, "non-empty list"),
    (None, [True], "cuda_graph_sizes must be a non-empty list of positive integers"),
    ({"max_cudagraph_capture_size": -1}, None,
     "compilation_config['max_cudagraph_capture_size'] must be a positive integer"),
    ({"cudagraph_capture_sizes": [1]}, [2], "compilation_config['cudagraph_capture_sizes'] and "
                                           "cuda_graph_sizes both set the CUDA graph sizes"),
    ({"cudagraph_mode": "EAGER"}, None, "compilation_config['cudagraph_mode'] must be one of "
                                        "['NONE', 'PIECEWISE', 'FULL'"),
    ({"cudagraphs": True}, None, "compilation_config has unknown key(s) ['cudagraphs']; "
                                 "supported: ['cudagraph_capture_sizes'"),
    ("full", None, "compilation_config must be a dict"),
    (None, [512, 300], "cuda_graph_sizes: every size [300, 512] is above max_num_seqs=256"),
])
def test_bad_values_name_the_field(value, graph_sizes, words):
    with pytest.raises(ValueError) as info:
        CompilationConfig.create(value, graph_sizes, 256)
    assert words in str(info.value)


def test_engine_arguments(tiny_llama):
    config = EngineConfig.create(tiny_llama, max_num_seqs=8)
    assert config.enforce_eager is False  # vLLM's default; on the CPU nothing is captured
    assert config.compilation_config.cudagraph_capture_sizes == (1, 2, 4, 8)
    config = EngineConfig.create(tiny_llama, max_num_seqs=8, enforce_eager=True,
                                 compilation_config={"cudagraph_capture_sizes": [2, 4]})
    assert config.enforce_eager and config.compilation_config.cudagraph_capture_sizes == (2, 4)
    with pytest.raises(ValueError, match="enforce_eager must be true or false, got 'yes'"):
        EngineConfig.create(tiny_llama, enforce_eager="yes")
    with pytest.raises(ValueError, match="cuda_graph_sizes must be"):
        EngineConfig.create(tiny_llama, cuda_graph_sizes=[-4])


def test_serve_flags_reach_the_engine():
    kwargs = engine_kwargs(parse_serve_args(
        ["m", "--enforce-eager", "--cuda-graph-sizes", "1", "4", "--max-num-seqs", "8"]))
    assert kwargs["enforce_eager"] is True and kwargs["cuda_graph_sizes"] == [1, 4]
    args = parse_serve_args(["m", "--compilation-config", '{"cudagraph_capture_sizes": [2]}'])
    assert args.compilation_config == {"cudagraph_capture_sizes": [2]} and not args.enforce_eager
    assert parse_serve_args(["m", "-O3"]).compilation_config == 3
    assert parse_serve_args(["m", "--compilation-config.cudagraph_mode", "NONE"]
                            ).compilation_config == {"cudagraph_mode": "NONE"}
    assert parse_serve_args(["m", "--enforce_eager"]).compat_notes == []  # it acts now


def test_the_cpu_path_is_untouched(tiny_llama, caplog):
    """On the CPU (no route) the runners hold no buffers and capture nothing, whatever the
    graph settings; the step is run_model's as before."""
    with caplog.at_level(logging.INFO, logger="tandem"):
        llm = LLM(tiny_llama, max_num_seqs=4, disable_log_stats=True)
    runner = llm.llm_engine.executor.runners["target"]
    assert runner.plan is None and runner.buffers is None and not runner.graphs
    assert "CUDA graph" not in caplog.text  # nothing to say on the CPU
    out = llm.generate(["Hello"], SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 3 and not runner.replays


def test_cuda_kernels_mode_is_checked(monkeypatch):
    monkeypatch.setenv("TANDEM_CUDA_KERNELS", "cuda")
    with pytest.raises(ValueError, match=r"TANDEM_CUDA_KERNELS must be one of \['auto', "
                                         r"'triton', 'torch'\], got 'cuda'"):
        triton_route.cuda_kernels_mode()
    monkeypatch.setenv("TANDEM_CUDA_KERNELS", "torch")
    assert triton_route.cuda_kernels_mode() == "torch"
