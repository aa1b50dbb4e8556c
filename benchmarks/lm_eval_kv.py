"""KV cache formats against the float32 cache, measured by lm-evaluation-harness (issue 43): the
loglikelihood of whole documents (`loglikelihood_rolling`, as its wikitext task), asked of
`tandem serve` over HTTP by lm-eval's `local-completions` model, once per `--kv-cache-dtype`.

The documents, each of 1,000 tokens or more: the shared prompts numbered and joined, and the repetitive
workload's prompts (benchmarks/workloads/: CPython code, public-domain passages, JSON records,
short requests) joined by kind. Each is one rolling window (max_length 2,048), so a document's
loglikelihood is the sum of its tokens' logprobs, each read from a prefill whose attention
read the cache in the given format. Printed per format: the mean per-token loglikelihood, and
against float32 the mean over documents of |loglikelihood difference| / tokens (the issue's
"within 0.02 nats"; a document's changes of opposite sign cancel in it, unlike the per-token
mean absolute change of `bench_kv_cache.py accuracy`), and its largest.

lm-eval is not a dependency of tandem: install it in a venv of its own (torch first, the CPU
build, or pip fetches CUDA's), and pass its executable:

  python -m venv /tmp/lmeval && /tmp/lmeval/bin/pip install torch==2.13.0 "lm_eval[api]"
  python benchmarks/lm_eval_kv.py --lm-eval /tmp/lmeval/bin/lm_eval [--model google/gemma-3-270m]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_serve_core import _start, _stop  # noqa: E402
from common import ROOT, SMOLLM2, prompts, save  # noqa: E402

WORKLOAD = ROOT / "benchmarks" / "workloads" / "repetitive_gemma3.jsonl"  # raw text, no template
TASK = """task: tandem_kv_documents
dataset_path: json
dataset_kwargs:
  data_files:
    test: {docs}
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: word_perplexity
  - metric: byte_perplexity
  - metric: bits_per_byte
"""


def documents() -> list[dict[str, str]]:
    rows = [json.loads(line) for line in WORKLOAD.read_text().splitlines() if line.strip()]
    groups = {"code": ["code"], "quotes": ["quote"], "records": ["json", "self"]}
    docs = [{"id": "shared-prompts",
             "text": "\n\n".join(f"{i}. {p}" for i, p in enumerate(prompts(48), 1))}]
    for name, kinds in groups.items():
        docs.append({"id": name, "text": "\n\n".join(r["prompt"] for r in rows
                                                      if r["kind"] in kinds)})
    return docs


def run_format(args: argparse.Namespace, kv: str, task_dir: Path, out: Path,
               docs: list[dict[str, str]], tokens: dict[str, int]) -> dict[str, float]:
    """lm-eval's per-document loglikelihoods {doc id: nats} with the server on cache `kv`;
    `tokens`, when empty, gets the documents' lengths as this server counts them (/tokenize)."""
    extra = ["--kv-cache-dtype", kv] + (["-q", args.quantization]
                                        if args.quantization != "keep" else [])
    proc = _start(ROOT, args.model, 4096, {}, args.port, out / f"server-{kv}.log", extra)
    try:
        if not tokens:
            tokens.update({d["id"]: httpx.post(f"http://127.0.0.1:{args.port}/tokenize",
                                               json={"prompt": d["text"]}).json()["count"]
                           for d in docs})
        model_args = (f"model={args.model},base_url=http://127.0.0.1:{args.port}/v1/completions,"
                      "tokenizer_backend=remote,tokenized_requests=True,max_length=2048,"
                      "num_concurrent=1,max_retries=1")
        cmd = [args.lm_eval, "run", "--model", "local-completions", "--model_args", model_args,
               "--tasks", "tandem_kv_documents", "--include_path", str(task_dir),
               "--log_samples", "--output_path", str(out / kv), "--batch_size", "1"]
        env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
        subprocess.run(cmd, check=True, env=env, stdout=(out / f"lm-eval-{kv}.log").open("w"),
                       stderr=subprocess.STDOUT)
    finally:
        _stop(proc)
    (path,) = glob.glob(str(out / kv / "**" / "samples_tandem_kv_documents_*.jsonl"),
                        recursive=True)
    result = {}
    for line in Path(path).read_text().splitlines():
        sample = json.loads(line)
        ll = sample["resps"][0][0]
        result[sample["doc"]["id"]] = float(ll[0] if isinstance(ll, list) else ll)
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lm-eval", default="lm_eval", help="lm-evaluation-harness's executable")
    p.add_argument("--model", default=SMOLLM2)
    p.add_argument("-q", "--quantization", default="none",
                   help="the weights: none (float32, as the accuracy table), or keep (a GGUF "
                        "file's blocks)")
    p.add_argument("--formats", nargs="+",
                   default=["float32", "float16", "bfloat16", "q8_0", "fp8_e4m3"])
    p.add_argument("--port", type=int, default=8321)
    args = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    docs = documents()
    with tempfile.TemporaryDirectory() as tmp:
        tmp_dir = Path(tmp)
        (tmp_dir / "docs.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
        (tmp_dir / "task.yaml").write_text(TASK.format(docs=tmp_dir / "docs.jsonl"))
        formats = ["float32"] + [f for f in args.formats if f != "float32"]
        tokens: dict[str, int] = {}
        by_format = {kv: run_format(args, kv, tmp_dir, tmp_dir, docs, tokens) for kv in formats}
    ref = by_format["float32"]
    rows = []
    print(f"{args.model}, weights {args.quantization}; documents: "
          + ", ".join(f"{d['id']} {tokens[d['id']]}" for d in docs) + " tokens")
    for kv, lls in by_format.items():
        diffs = [abs(lls[i] - ref[i]) / tokens[i] for i in ref]
        row = {"format": kv, "nats_per_token": sum(lls.values()) / sum(tokens.values()),
               "mean_abs_diff_per_token": sum(diffs) / len(diffs), "max_abs_diff_per_token":
               max(diffs), "doc_loglikelihood": lls}
        rows.append(row)
        print(f"{kv:>9}: {row['nats_per_token']:.4f} nats a token; against float32 "
              f"{row['mean_abs_diff_per_token']:.4f} nats a token (mean of documents), "
              f"largest {row['max_abs_diff_per_token']:.4f}")
    print(save("lm-eval-kv", {"model": args.model, "quantization": args.quantization,
                              "tokens": tokens, "rows": rows}))


if __name__ == "__main__":
    main()
