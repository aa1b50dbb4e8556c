"""Synthetic acceptance (benchmarking only): drafts accepted at the set per-position rates or
mean acceptance length whatever the target says; its config checks; the server's refusal."""

from __future__ import annotations

import pytest

from tandem import LLM, SamplingParams
from tandem.entrypoints.openai.args import ArgumentError, parse_serve_args
from tandem.sample.synthetic_sampler import conditional_rates, rates_for_length


def _spec(draft: str, **extra) -> dict:
    return {"model": draft, "num_speculative_tokens": 3, "adaptive": False,
            "rejection_sample_method": "synthetic",
            **extra}


def _per_position(llm: LLM) -> tuple[list[float], float]:
    m = {x.name: x for x in llm.get_metrics()}
    drafts = m["vllm:spec_decode_num_drafts"].value
    per_pos = m["vllm:spec_decode_num_accepted_tokens_per_pos"].values
    accepted = m["vllm:spec_decode_num_accepted_tokens"].value
    return [c / drafts for c in per_pos], 1 + accepted / drafts


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_rates_are_met_with_a_draft_that_never_agrees(tiny_dirs, prompts, temperature):
    rates = [0.8, 0.6, 0.3]
    llm = LLM(model=tiny_dirs["llama"],
              speculative_config=_spec(tiny_dirs["llama_other"],
                                       synthetic_acceptance_rates=rates))
    llm.generate(prompts * 4, SamplingParams(max_tokens=64, temperature=temperature,
                                             ignore_eos=True, seed=3), use_tqdm=False)
    measured, _ = _per_position(llm)
    assert measured == pytest.approx(rates, abs=0.06)


def test_mean_acceptance_length_is_met(tiny_dirs, prompts):
    llm = LLM(model=tiny_dirs["llama"],
              speculative_config=_spec(tiny_dirs["llama_other"], synthetic_acceptance_length=2.5))
    llm.generate(prompts * 4, SamplingParams(max_tokens=64, temperature=0, ignore_eos=True),
                 use_tqdm=False)
    _, length = _per_position(llm)
    assert length == pytest.approx(2.5, abs=0.15)


def test_rate_arithmetic():
    assert conditional_rates([0.8, 0.4, 0.4]) == pytest.approx([0.8, 0.5, 1.0])
    rates = rates_for_length(2.5, 3)
    assert 1 + sum(rates) == pytest.approx(2.5)


@pytest.mark.parametrize("extra,message", [
    ({"rejection_sample_method": "standard", "synthetic_acceptance_rates": [0.5] * 3},
     "only valid with rejection_sample_method='synthetic'"),
    ({"rejection_sample_method": "synthetic"}, "exactly one of"),
    ({"rejection_sample_method": "synthetic", "synthetic_acceptance_rates": [0.5, 0.6, 0.1]},
     "non-increasing"),
    ({"rejection_sample_method": "synthetic", "synthetic_acceptance_rates": [0.5]},
     "a list of 3 numbers"),
    ({"rejection_sample_method": "synthetic", "synthetic_acceptance_length": 9},
     r"must be in \[1, 4\]"),
    ({"rejection_sample_method": "fly"}, "'fly' is not supported by tandem"),
])
def test_config_errors_name_the_key(tiny_llama, extra, message):
    with pytest.raises(ValueError, match=message):
        LLM(model=tiny_llama, speculative_config={"model": tiny_llama,
                                                  "num_speculative_tokens": 3, "adaptive": False,
                                                  **extra})


def test_serve_refuses_synthetic_unless_asked(tiny_llama):
    spec = ('{"model": "%s", "num_speculative_tokens": 3, "rejection_sample_method": '
            '"synthetic", "synthetic_acceptance_length": 2}' % tiny_llama)
    with pytest.raises(ArgumentError, match="--allow-synthetic-acceptance"):
        parse_serve_args([tiny_llama, "--speculative-config", spec])
    args = parse_serve_args([tiny_llama, "--speculative-config", spec,
                             "--allow-synthetic-acceptance"])
    assert args.speculative_config["rejection_sample_method"] == "synthetic"
