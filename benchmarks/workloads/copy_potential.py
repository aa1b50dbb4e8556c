"""How much of each model's greedy output an n-gram ("prompt lookup") proposer would predict, on
the repetitive prompt set (`repetitive.py`), measured without any speculation.

For each model: generate every prompt of its file with `LLM(model, max_model_len=4096)` and
`SamplingParams(temperature=0, max_tokens=256)` (plain decoding, no speculative_config), then
replay the decode over context = prompt token ids + output token ids as speculative decoding
would run it, step by step:
  at output position i, take the last n tokens of the context before i (n = 5 down to 2, the
  first n that matches wins), find their most recent earlier occurrence in that context, and
  propose the (up to) k = 8 tokens that followed it; the accepted length a is the longest prefix
  of the proposal equal to the actual output from i on; the step then emits a + 1 tokens (the
  accepted ones plus the target's own next token), so the next step starts at i + a + 1.
Per prompt it reports: output tokens; predicted = accepted tokens / output tokens (the share of
output tokens an n-gram proposal supplied); accepted length per proposal; the share of steps
that had any proposal; and tokens per step (output tokens / steps: the speed-up ceiling if
drafting and verifying k tokens cost what one plain step costs). The last row per model sums
over all prompts. No timing: this is a property of the prompts and the model's outputs.

  .venv/bin/python benchmarks/workloads/copy_potential.py [--models smollm2 gemma3] [--show]
      [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from repetitive import HERE, MODELS  # noqa: E402


def propose(ctx: list[int], end: int, n_max: int, n_min: int, k: int) -> list[int]:
    """The n-gram proposal for position `end` from ctx[:end]: the tokens that followed the most
    recent earlier occurrence of the last n tokens, longest n first."""
    for n in range(n_max, n_min - 1, -1):
        if end <= n:
            continue
        suffix = ctx[end - n:end]
        for j in range(end - n - 1, -1, -1):  # occurrences that start before the suffix itself
            if ctx[j:j + n] == suffix:
                return ctx[j + n:min(j + n + k, end)]
    return []


def replay(prompt_ids: list[int], out_ids: list[int], n_max: int = 5, n_min: int = 2,
           k: int = 8) -> dict:
    ctx = list(prompt_ids) + list(out_ids)
    start, total = len(prompt_ids), len(out_ids)
    i = steps = proposals = accepted = 0
    while i < total:
        draft = propose(ctx, start + i, n_max, n_min, k)
        a = 0
        while a < len(draft) and i + a < total and draft[a] == out_ids[i + a]:
            a += 1
        steps += 1
        proposals += bool(draft)
        accepted += a
        i += a + 1
    return dict(output_tokens=total, steps=steps, proposals=proposals, accepted=accepted)


def summarize(c: dict) -> dict:
    return dict(c, predicted=c["accepted"] / max(c["output_tokens"], 1),
                accepted_per_proposal=c["accepted"] / max(c["proposals"], 1),
                proposal_share=c["proposals"] / max(c["steps"], 1),
                tokens_per_step=c["output_tokens"] / max(c["steps"], 1))


def load(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def measure(key: str, rows: list[dict], max_tokens: int, show: bool) -> list[dict]:
    from tandem import LLM, SamplingParams
    llm = LLM(MODELS[key](), max_model_len=4096)
    outs = llm.generate([r["prompt"] for r in rows],
                        SamplingParams(temperature=0, max_tokens=max_tokens), use_tqdm=False)
    results = []
    for r, o in zip(rows, outs):
        c = summarize(replay(list(o.prompt_token_ids), list(o.outputs[0].token_ids)))
        results.append(dict(id=r.get("id", ""), kind=r["kind"],
                            prompt_tokens=len(o.prompt_token_ids), **c))
        if show:
            print(f"--- {key} {r.get('id', '')}: {c['predicted']:.0%} predicted\n"
                  f"{o.outputs[0].text}\n")
    totals = {f: sum(x[f] for x in results)
              for f in ("output_tokens", "steps", "proposals", "accepted")}
    results.append(dict(id="ALL", kind="", prompt_tokens=sum(x["prompt_tokens"] for x in results),
                        **summarize(totals)))
    return results


def table(key: str, results: list[dict]) -> str:
    head = (f"{'prompt':20} {'kind':5} {'in':>5} {'out':>4} {'predicted':>9} "
            f"{'acc/prop':>8} {'prop%':>6} {'tok/step':>8}")
    lines = [f"## {key}", head, "-" * len(head)]
    for x in results:
        lines.append(f"{x['id']:20} {x['kind']:5} {x['prompt_tokens']:5} {x['output_tokens']:4} "
                     f"{x['predicted']:9.1%} {x['accepted_per_proposal']:8.2f} "
                     f"{x['proposal_share']:6.0%} {x['tokens_per_step']:8.2f}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", choices=sorted(MODELS), default=["smollm2", "gemma3"])
    ap.add_argument("--dir", type=Path, default=HERE, help="where repetitive_<model>.jsonl are")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--show", action="store_true", help="print each output")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args()
    everything = {}
    for key in args.models:
        results = measure(key, load(args.dir / f"repetitive_{key}.jsonl"), args.max_tokens,
                          args.show)
        everything[key] = results
        print(table(key, results) + "\n", flush=True)
    if args.json:
        args.json.write_text(json.dumps(everything, indent=2))


if __name__ == "__main__":
    main()
