"""Each speculative_config mistake gets vLLM's message (or a clear one naming the field)."""

from __future__ import annotations

import pytest

from tandem import LLM, SpeculativeConfig
from tiny_models import build_tiny_model


@pytest.mark.parametrize("config,message", [
    ({"model": "D", "num_speculative_tokens": 3, "tensor_parallel_size": 1},
     "'tensor_parallel_size' is not a valid argument in the speculative_config. Please pass "
     "'draft_tensor_parallel_size' instead."),
    ({"model": "D"}, "A speculative model was provided, but `num_speculative_tokens` was not "
                     "provided"),
    ({"model": "D", "num_speculative_tokens": 0},
     "Expected num_speculative_tokens to be greater than zero (0)."),
    ({"num_speculative_tokens": 3}, "num_speculative_tokens was provided but without "
                                    "speculative model."),
    ({"model": "D", "num_speculative_tokens": 3, "method": "eagle"},
     "Unsupported speculative method: 'eagle' is not supported by tandem; supported methods: "
     "['draft_model', 'ngram', 'suffix']"),
    ({"model": "D", "num_speculative_tokens": 3, "method": "magic"},
     "Unsupported speculative method: 'magic' is unknown"),
    ({"model": "D", "num_speculative_tokens": 3, "draft_tensor_parallel_size": 3},
     "speculative_draft_tensor_parallel_size=3 cannot be other value than 1 or target model "
     "tensor_parallel_size"),
    ({"model": "D", "num_speculative_tokens": 3, "draft_sample_method": "beam"},
     "draft_sample_method must be one of ['auto', 'greedy', 'probabilistic'], got 'beam'."),
    ({"model": "D", "num_speculative_tokens": 3, "rejection_sample_method": "coupled"},
     "rejection_sample_method 'coupled' is unknown; supported: ['auto', 'gumbel', 'standard', "
     "'synthetic']."),
    ({"model": "D", "num_speculative_tokens": 3,
      "num_speculative_tokens_per_batch_size": [[1, 4, 3], [4, 8, 1]]},
     "speculative_config['num_speculative_tokens_per_batch_size']: batch-size ranges must not "
     "overlap (ranges are inclusive), got [[1, 4, 3], [4, 8, 1]]."),
    ({"model": "D", "num_speculative_tokens": 3,
      "num_speculative_tokens_per_batch_size": [[1, 4, 5]]},
     "k=5 in [1, 4, 5] is above num_speculative_tokens=3"),
    ({"model": "D", "num_speculative_tokens": 3,
      "num_speculative_tokens_per_batch_size": [[2, 4, 1]]},
     "the first batch-size range must start at 1"),
    ({"model": "D", "num_speculative_tokens": 3,
      "num_speculative_tokens_per_batch_size": [[1, 4]]},
     "each entry must be 3 integers [range_start, range_end, num_speculative_tokens], got [1, 4]"),
    ({"model": "D", "num_speculative_tokens": 3,
      "num_speculative_tokens_per_batch_size": [[1, 4, -1]]},
     "num_speculative_tokens values must be >= 0, got -1"),
    ({"model": "D", "num_speculative_tokens": 3,
      "num_speculative_tokens_per_batch_size": [[5, 4, 1]]},
     "batch-size range start must be <= end for (5, 4, 1)"),
    ({"model": "D", "num_speculative_tokens": 3, "num_speculative_tokens_per_batch_size": []},
     "must be a non-empty list of [range_start, range_end, num_speculative_tokens] entries"),
    ({"model": "D", "num_speculative_tokens": 3, "enforce_eager": "yes"},
     "speculative_config['enforce_eager'] must be true or false, got 'yes'."),
    ({"model": "D", "num_speculative_tokens": 3, "use_heterogeneous_vocab": True,
      "method": "ngram"},
     "use_heterogeneous_vocab only works with method='draft_model', got method='ngram'."),
    ({"model": "D", "num_speculative_tokens": 3, "use_heterogeneous_vocab": "yes"},
     "use_heterogeneous_vocab must be true or false, got 'yes'."),
    ({"model": "D", "num_speculative_tokens": 3, "use_heterogeneous_vocab": True,
      "heterogeneous_vocab_feedback": "drop"},
     "heterogeneous_vocab_feedback must be one of ['reencode', 'unk'], got 'drop'."),
    ({"model": "D", "num_speculative_tokens": 3, "bogus": 1}, "Unknown key(s) ['bogus']"),
    # the model-free methods (ngram, suffix) and a lookup beside a draft model
    ({"method": "suffix", "draft_sample_method": "probabilistic"},
     "draft_sample_method='probabilistic' needs a draft model's distribution; method='suffix'"),
    ({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 4,
      "prompt_lookup_max": 2}, "prompt_lookup_min=4 must be <= prompt_lookup_max=2"),
    ({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 0},
     "speculative_config['prompt_lookup_max'] must be an integer >= 1, got 0."),
    ({"method": "ngram"}, "method='ngram' needs num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": 0},
     "Expected num_speculative_tokens to be greater than zero (0)."),
    ({"method": "ngram", "num_speculative_tokens": 129},
     "num_speculative_tokens must be at most 128, got 129."),
    ({"method": "ngram", "num_speculative_tokens": 3, "model": "D"},
     "speculative_config['model'] names a draft model, but method='ngram' drafts without one"),
    ({"method": "suffix", "quantization": "q8_0"},
     "speculative_config['quantization'] is a draft model's setting; method='suffix' has no "
     "draft model."),
    ({"method": "suffix", "prompt_lookup_min": 2},
     "speculative_config['prompt_lookup_min'] is only valid with method='ngram' (or "
     "lookup_method='ngram'), got method='suffix'."),
    ({"method": "ngram", "num_speculative_tokens": 3, "suffix_decoding_max_tree_depth": 8},
     "speculative_config['suffix_decoding_max_tree_depth'] is only valid with method='suffix'"),
    ({"model": "D", "num_speculative_tokens": 3, "prompt_lookup_max": 3},
     "speculative_config['prompt_lookup_max'] is only valid with method='ngram' (or "
     "lookup_method='ngram'), got method=None."),
    ({"method": "suffix", "suffix_decoding_min_token_prob": 1.5},
     "speculative_config['suffix_decoding_min_token_prob'] must be a number in [0, 1], got 1.5."),
    ({"method": "suffix", "suffix_decoding_max_spec_factor": 0},
     "speculative_config['suffix_decoding_max_spec_factor'] must be a number > 0, got 0."),
    ({"method": "suffix", "suffix_decoding_max_cached_requests": -1},
     "speculative_config['suffix_decoding_max_cached_requests'] must be an integer >= 0"),
    ({"method": "suffix", "use_heterogeneous_vocab": True},
     "use_heterogeneous_vocab only works with method='draft_model', got method='suffix'."),
    ({"method": "ngram", "num_speculative_tokens": 3, "max_model_len": 100000},
     "speculative_max_model_len=100000 cannot be larger than target_max_model_len"),
    ({"model": "D", "num_speculative_tokens": 3, "lookup_method": "medusa"},
     "speculative_config['lookup_method'] must be one of ['ngram', 'suffix', 'none'], got "
     "'medusa'."),
    ({"method": "ngram", "num_speculative_tokens": 3, "lookup_method": "suffix"},
     "speculative_config['lookup_method'] adds a lookup beside a draft model "
     "(method='draft_model'), got method='ngram'."),
    ({"model": "D", "num_speculative_tokens": 3, "lookup_method": "ngram",
      "suffix_decoding_max_tree_depth": 4},
     "speculative_config['suffix_decoding_max_tree_depth'] is only valid with method='suffix' "
     "(or lookup_method='suffix')"),
])
def test_config_errors(tiny_llama, config, message):
    config = {k: (tiny_llama if v == "D" else v) for k, v in config.items()}
    with pytest.raises(ValueError) as e:
        LLM(tiny_llama, speculative_config=config)
    assert message in str(e.value)


def test_max_model_len_bounds(tiny_llama):
    with pytest.raises(ValueError, match="speculative_max_model_len=100000 cannot be larger than "
                                         "draft_max_model_len=512"):
        LLM(tiny_llama, speculative_config={"model": tiny_llama, "num_speculative_tokens": 2,
                                            "max_model_len": 100000})
    with pytest.raises(ValueError, match="speculative_max_model_len=300 cannot be larger than "
                                         "target_max_model_len=256"):
        LLM(tiny_llama, max_model_len=256, speculative_config={
            "model": tiny_llama, "num_speculative_tokens": 2, "max_model_len": 300})


def test_draft_with_other_tokenizer_is_refused_with_a_hint(tiny_llama, tmp_path):
    other = build_tiny_model(tmp_path / "sp", "llama", tokenizer="sentencepiece")
    with pytest.raises(ValueError) as e:
        LLM(tiny_llama, speculative_config={"model": str(other), "num_speculative_tokens": 2})
    msg = str(e.value)
    assert "vocab_size=384" in msg and "use_heterogeneous_vocab" in msg


def test_padded_vocabulary_with_same_tokenizer_is_accepted(tiny_llama, tmp_path):
    """Like Qwen's 151,936 vs 152,064: configs differ in vocab_size, tokenizers are equal."""
    padded = build_tiny_model(tmp_path / "padded", "llama", seed=5, vocab_size=448)
    llm = LLM(tiny_llama, speculative_config={"model": str(padded), "num_speculative_tokens": 2})
    out = llm.generate("Hello", use_tqdm=False)[0]
    assert len(out.outputs[0].token_ids) == 16


def test_speculative_config_object_and_method_default(tiny_llama):
    cfg = SpeculativeConfig(model=tiny_llama, num_speculative_tokens=2)
    llm = LLM(tiny_llama, speculative_config=cfg)
    spec = llm.llm_engine.config.speculative_config
    assert spec.num_speculative_tokens == 2 and spec.draft_sample_method == "auto"
    assert spec.rejection_sample_method == "auto"


def test_vllm_keys_without_effect_are_accepted_and_logged(tiny_llama, caplog):
    with caplog.at_level("INFO", logger="tandem"):
        LLM(tiny_llama, speculative_config={"model": tiny_llama, "num_speculative_tokens": 2,
                                            "enforce_eager": True, "code_revision": "main"})
    assert "speculative_config['enforce_eager']=True has no effect" in caplog.text
    assert "speculative_config['code_revision']='main' has no effect" in caplog.text
