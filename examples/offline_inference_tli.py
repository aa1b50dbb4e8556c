"""A draft model with another tokenizer (Token-Level Intersection), offline.

Target: the bundled Gemma 3 270M (262,144-token SentencePiece vocabulary, `▁` spaces). Draft: the
bundled SmolLM2-135M-Instruct (49,152-token byte-level BPE, `Ġ` spaces). The draft proposes only
tokens both vocabularies share; the target verifies them with the usual rejection sampler, so the
output is exactly what Gemma alone would produce. Gemma 3 270M is a base model: plain prompts.
"""

from tandem import LLM, SamplingParams

llm = LLM(model="google/gemma-3-270m",
          speculative_config={"model": "HuggingFaceTB/SmolLM2-135M-Instruct",
                              "num_speculative_tokens": 3, "method": "draft_model",
                              "use_heterogeneous_vocab": True,
                              "draft_sample_method": "probabilistic",
                              # A fixed k, to show the mechanics: adaptive k (the default) would
                              # rightly stop drafting, as this draft costs about what its target does.
                              "adaptive": False})
prompts = ["The future of AI is", "The capital of France is", "Once upon a time,"]
outputs = llm.generate(prompts, SamplingParams(temperature=0.8, top_p=0.95, max_tokens=48))
for output in outputs:
    stats = output.outputs[0].spec_decode_stats
    print(f"Prompt: {output.prompt!r}, Generated text: {output.outputs[0].text!r}")
    print(f"  drafted {stats.num_draft_tokens}, accepted {stats.num_accepted_tokens} "
          f"(acceptance rate {stats.draft_acceptance_rate:.2%}, "
          f"mean acceptance length {stats.mean_acceptance_length:.2f})")
