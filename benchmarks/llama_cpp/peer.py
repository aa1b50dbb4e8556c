"""llama.cpp as a benchmark peer: the same GGUF files through llama.cpp's own tools and through
`tandem bench`, side by side in one run, with the CPU named. A benchmark, never a test.

Run it under the machine's exclusive timing lock, in tandem's venv (build.sh first):

    flock -x /tmp/tandem-heavy.lock /work/main/.venv/bin/python benchmarks/llama_cpp/peer.py
        [--side both|llama|tandem] [--files smollm2-q4_1,gemma3-q4_k_m] [--threads 2] [--rounds 3]
        [--isa avx2]   (both sides held to AVX2; build.sh with LLAMA_CPP_ISA=avx2 first)
    python peer.py server FILE [--port 8090]         # llama-server on loopback; prints URL, pid
    python peer.py spec --target T --draft D [--k 3]  # llama-speculative-simple vs plain

Per file (labels from files.py, or any GGUF path):
- one stream: llama-bench tg128 (128 tokens from an empty context) against `tandem bench latency`,
  one prompt, greedy, 128 tokens (decode tok/s: its first token, the prefill's, is not counted).
- 16 streams: llama-batched-bench's text-generation rate S_TG at 16 sequences of 64 prompt + 64
  generated tokens, against `tandem bench throughput` on the same shape (16 prompts of 64 tokens,
  --input-len 64, 64 generated): its generation rate (the tokens after each first one, once
  every prompt is prefilled), as S_TG counts. "with prefill" is tandem's rate end to end (its
  prefill's time counted, S_TG's not: the stricter ratio, which sessions before 2026-12-04
  reported as the 16-stream figure, on shorter prompts).
JSON goes to benchmarks/results/llama_cpp/. tandem's speed changes as its kernels do: this script
only runs and reports, it tunes nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from files import CACHE, llama_bin, make_files  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results" / "llama_cpp"
TANDEM = Path(sys.executable).parent / "tandem"  # the `tandem` of the venv running this script


# `--isa avx2`: both sides as on a CPU with AVX2, FMA and F16C alone, on one that has more:
# llama.cpp built so (build.sh with LLAMA_CPP_ISA=avx2), tandem's kernels built for haswell and
# torch's held to AVX2 (as benchmarks/isa.sh does). Inherited by every command run() starts.
HOLD_AVX2 = {"LLAMA_CPP_ISA": "avx2", "TANDEM_CPU_MARCH": "haswell", "ATEN_CPU_CAPABILITY": "avx2",
             "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}


def lscpu() -> tuple[dict, set]:
    """lscpu's fields, and its CPU flags."""
    info = dict(re.findall(r"^([^:\n]+):\s*(.*)$", subprocess.run(
        ["lscpu"], capture_output=True, text=True).stdout, re.M))
    return info, set(info.get("Flags", "").split())


def hold_isa(isa: str) -> None:
    if isa == "avx2":
        if not {"avx2", "fma", "f16c"} <= lscpu()[1]:
            raise SystemExit("--isa avx2: this CPU lacks AVX2, FMA or F16C")
        os.environ.update(HOLD_AVX2)


def cpu() -> dict:
    """What decides the speed of -march=native code: the model, and AVX2 vs AVX-512."""
    info, flags = lscpu()
    return {"name": info.get("Model name"), "family": info.get("CPU family"),
            "model": info.get("Model"), "cpus": os.cpu_count(),
            "avx2": "avx2" in flags, "avx512f": "avx512f" in flags,
            "avx512_vnni": "avx512_vnni" in flags,
            "held_to": os.environ.get("LLAMA_CPP_ISA")}  # set by hold_isa


def cpu_line(c: dict) -> str:
    isa = "AVX-512" + (" (VNNI)" if c["avx512_vnni"] else "") if c["avx512f"] else \
        "AVX2" if c["avx2"] else "no AVX2"
    held = f", both sides held to {c['held_to'].upper()}" if c.get("held_to") else ""
    return (f"{c['name']} (family {c['family']}, model {c['model']}, {isa}, {c['cpus']} cpus"
            f"{held})")


def run(cmd: list, timeout: float = 1800, env: dict | None = None) -> subprocess.CompletedProcess:
    out = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout,
                         env={**os.environ, **(env or {})})
    if out.returncode != 0:
        raise RuntimeError(f"{Path(str(cmd[0])).name} failed ({out.returncode}): "
                           f"{(out.stderr or out.stdout).strip()[-600:]}")
    return out


# ---- llama.cpp side -------------------------------------------------------------------------

def llama_tg(model: Path, threads: int, n: int = 128) -> tuple[float, float]:
    """llama-bench tg<n>: tok/s of one stream, mean and stddev over its 5 repetitions."""
    out = run([llama_bin() / "llama-bench", "-m", model, "-t", threads, "-p", 0, "-n", n,
               "-o", "json"]).stdout  # the JSON is stdout; logs go to stderr
    test = json.loads(out[out.index("["):out.rindex("]") + 1])[0]
    return test["avg_ts"], test["stddev_ts"]


def llama_batched(model: Path, threads: int, streams: int = 16) -> dict:
    """llama-batched-bench at 1 and `streams` sequences of 64 + 64 tokens; S_TG = pl*tg/t_tg."""
    out = run([llama_bin() / "llama-batched-bench", "-m", model, "-t", threads, "-tb", threads,
               "-c", 4096, "-npp", 64, "-ntg", 64, "-npl", f"1,{streams}",
               "--output-format", "jsonl"])
    rows = [json.loads(line) for line in (out.stdout + out.stderr).splitlines()
            if line.startswith("{")]
    return {r["pl"]: {"tg_tokens_per_s": r["speed_tg"], "all_tokens_per_s": r["speed"]}
            for r in rows}


# ---- tandem side ----------------------------------------------------------------------------

def tandem_bench(kind: str, model: Path, threads: int, extra: list) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        js = Path(tmp) / "out.json"
        run([TANDEM, "bench", kind, "--model", model, "--threads", threads,
             "--output-json", js, *extra], env={"OMP_NUM_THREADS": str(threads)})
        return json.loads(js.read_text())


def tandem_one_stream(model: Path, threads: int, spec: dict | None = None) -> float:
    extra = ["--num-prompts", 1, "--max-tokens", 128, "--rounds", 3]
    if spec:
        extra += ["--speculative-config", json.dumps(spec)]
    return tandem_bench("latency", model, threads, extra)["decode_tokens_per_s"]


def tandem_streams(model: Path, threads: int, streams: int = 16) -> tuple[float, float]:
    """(generation rate, rate end to end with the prefill) of 16 prompts of 64 tokens x 64."""
    r = tandem_bench("throughput", model, threads,
                     ["--num-prompts", streams, "--input-len", 64, "--max-tokens", 64])
    return r["generation_tokens_per_s"], r["output_tokens_per_s"]


ERRORS: list[str] = []  # saved with the results


def attempt(fn, *args):
    """A side that fails (e.g. a file tandem cannot load yet) is reported, not fatal."""
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001 - the report carries the reason
        ERRORS.append(f"{fn.__name__}({', '.join(map(str, args))}): {str(e)[-600:]}")
        print(f"  ! {fn.__name__}: {str(e).strip().splitlines()[-1][:300]}", flush=True)
        return None


def ratio(a, b):
    return round(a / b, 2) if a and b else None


def fmt(x):
    return f"{x:7.1f}" if x else "      -"


# ---- modes ----------------------------------------------------------------------------------

def measure(model: Path, args, tandem_first: bool) -> dict:
    """One round on one file: both sides (in the order given), and the ratios."""
    m: dict = {}
    sides = [s for s in (("tandem", "llama") if tandem_first else ("llama", "tandem"))
             if args.side in ("both", s)]
    for side in sides:
        if side == "llama":
            m["llama_tg128"], m["llama_tg128_sd"] = attempt(llama_tg, model, args.threads) \
                or (None, None)
            b = attempt(llama_batched, model, args.threads) or {}
            m["llama_batched"] = b
            m["llama_16_tg"] = b.get(16, {}).get("tg_tokens_per_s")
        else:
            m["tandem_1"] = attempt(tandem_one_stream, model, args.threads)
            m["tandem_16"], m["tandem_16_with_prefill"] = \
                attempt(tandem_streams, model, args.threads) or (None, None)
    m["ratio_1"] = ratio(m.get("tandem_1"), m.get("llama_tg128"))
    m["ratio_16"] = ratio(m.get("tandem_16"), m.get("llama_16_tg"))
    m["ratio_16_with_prefill"] = ratio(m.get("tandem_16_with_prefill"), m.get("llama_16_tg"))
    # a busy machine shows here: anything else running steals from whichever side it hits
    m["loadavg_1min_after"] = os.getloadavg()[0]
    return m


def median(values: list):
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 2) if values else None


def bench(args) -> None:
    files = make_files()
    chosen = args.files.split(",") if args.files else list(files)
    c = cpu()
    print(f"CPU: {cpu_line(c)}; {args.threads} threads each; {args.rounds} round(s), the sides "
          f"taking turns to go first\n", flush=True)
    rows = []
    for label in chosen:
        model = files.get(label) or Path(label)
        print(f"{label}: {model}", flush=True)
        rounds = [measure(model, args, tandem_first=r % 2 == 1) for r in range(args.rounds)]
        # medians of each figure, and each ratio the median of the per-round ratios: the host
        # drifts by more than the sides differ, so a ratio from one pass says little
        row = {key: median([r.get(key) for r in rounds])
               for key in ("llama_tg128", "llama_16_tg", "tandem_1", "tandem_16", "ratio_1",
                           "ratio_16", "tandem_16_with_prefill", "ratio_16_with_prefill")}
        row.update(file=label, path=str(model), rounds=rounds)
        if args.rounds > 1:
            print("  per round: one stream " + ", ".join(str(r["ratio_1"]) for r in rounds)
                  + "; 16 streams " + ", ".join(str(r["ratio_16"]) for r in rounds), flush=True)
        rows.append(row)
    print(f"\n{'file':16} | {'llama 1':>7} {'tandem 1':>8} {'ratio':>5} | "
          f"{'llama 16':>8} {'tandem 16':>9} {'ratio':>5} | {'with prefill':>12}   (tok/s)")
    for r in rows:
        print(f"{r['file']:16} | {fmt(r.get('llama_tg128'))} {fmt(r.get('tandem_1')):>8} "
              f"{r['ratio_1'] or '-':>5} | {fmt(r.get('llama_16_tg')):>8} "
              f"{fmt(r.get('tandem_16')):>9} {r['ratio_16'] or '-':>5} | "
              f"{fmt(r.get('tandem_16_with_prefill'))} {r['ratio_16_with_prefill'] or '-':>4}")
    print("16 streams: generation rates, 16 x (64 prompt + 64 generated) tokens on both sides; "
          "'with prefill': tandem's rate end to end against the same S_TG")
    print(f"ratios are tandem / llama.cpp (medians of per-round ratios); CPU: {cpu_line(c)}")
    save("peer", {"cpu": c, "threads": args.threads, "side": args.side, "rounds": args.rounds,
                  "isa": args.isa, "rows": rows})


def server(args) -> None:
    """Start llama-server on loopback and leave it running (the HTTP benchmark talks to it)."""
    model = Path(args.file)
    if not model.is_file():  # a label: only then are the files made (a requantize takes minutes)
        files = make_files()
        if args.file not in files:
            raise SystemExit(f"{args.file}: neither a GGUF file nor a label ({', '.join(files)})")
        model = files[args.file]
    log = CACHE / f"llama-server-{args.port}.log"
    # 16 slots so 16 concurrent streams all decode; 512 context tokens per slot is plenty for
    # the 64-in/64-out requests of the serving benchmarks (--ctx-per-slot for longer outputs).
    proc = subprocess.Popen(
        [str(llama_bin() / "llama-server"), "-m", str(model), "-t", str(args.threads),
         "--host", "127.0.0.1", "--port", str(args.port), "-np", str(args.parallel),
         "-c", str(args.ctx_per_slot * args.parallel)],
        stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{args.port}"
    for _ in range(240):  # loading takes a few seconds; /health says 200 once ready
        if proc.poll() is not None:
            raise SystemExit(f"llama-server exited ({proc.returncode}); see {log}")
        try:
            if urllib.request.urlopen(url + "/health", timeout=1).status == 200:
                break
        except OSError:
            time.sleep(0.25)
    else:
        proc.kill()
        raise SystemExit(f"llama-server not ready after 60 s; see {log}")
    print(json.dumps({"url": url, "openai_base": url + "/v1", "pid": proc.pid,
                      "model": str(model), "log": str(log), "stop": f"kill {proc.pid}"}))


def spec(args) -> None:
    """llama-speculative-simple (greedy, draft k tokens) against plain decoding of the target."""
    files = make_files()
    target = files.get(args.target) or Path(args.target)
    draft = files.get(args.draft) or Path(args.draft)
    c = cpu()
    print(f"CPU: {cpu_line(c)}; {args.threads} threads; k = {args.k}", flush=True)
    result = {"cpu": c, "target": str(target), "draft": str(draft), "k": args.k}
    if args.side in ("both", "llama"):
        out = run([llama_bin() / "llama-speculative-simple", "-m", target, "-md", draft,
                   "-t", args.threads, "-td", args.threads, "--spec-type", "draft-simple",
                   "--spec-draft-n-max", args.k, "-p", args.prompt, "-n", args.n,
                   "--temp", 0, "--top-k", 1, "--seed", 42, "-c", 4096])
        out = out.stdout + out.stderr
        speed = re.search(r"decoded\s+\d+ tokens in\s+[\d.]+ seconds, speed:\s+([\d.]+)", out)
        accept = re.search(r"accept\s+=\s+([\d.]+)%", out)
        result["llama_spec"] = float(speed.group(1)) if speed else None
        result["llama_accept_pct"] = float(accept.group(1)) if accept else None
        result["llama_plain"] = llama_tg(target, args.threads, args.n)[0]
        result["llama_speedup"] = ratio(result["llama_spec"], result["llama_plain"])
    if args.side in ("both", "tandem"):
        sc = {"model": str(draft), "num_speculative_tokens": args.k, "adaptive": False}
        result["tandem_spec"] = attempt(tandem_one_stream, target, args.threads, sc)
        result["tandem_plain"] = attempt(tandem_one_stream, target, args.threads)
        result["tandem_speedup"] = ratio(result["tandem_spec"], result["tandem_plain"])
    print(json.dumps({k: v for k, v in result.items() if k != "cpu"}, indent=2))
    save("spec", result)


def save(name: str, result: dict) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps({"when": time.strftime("%Y-%m-%d %H:%M:%S"), **result,
                                "errors": ERRORS}, indent=2) + "\n")
    print(f"results written to {path}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=1,
                   help="measure each file this many times, the sides taking turns to go first")
    p.add_argument("--side", choices=("both", "llama", "tandem"), default="both")
    p.add_argument("--files", default=None, help="comma-separated labels or paths (default: all)")
    p.add_argument("--isa", choices=("native", "avx2"), default="native",
                   help="avx2: both sides held to AVX2 with FMA and F16C (before a mode)")
    p.set_defaults(func=bench)
    sub = p.add_subparsers(dest="mode")
    s = sub.add_parser("server", help="start llama-server on 127.0.0.1 and print its URL/pid")
    s.add_argument("file", help="a label from files.py or a GGUF path")
    s.add_argument("--port", type=int, default=8090)
    s.add_argument("--parallel", type=int, default=16, help="server slots (concurrent streams)")
    s.add_argument("--ctx-per-slot", type=int, default=512, help="context tokens of each slot")
    s.add_argument("--threads", type=int, default=2)
    s.set_defaults(func=server)
    s = sub.add_parser("spec", help="llama-speculative-simple on a target/draft pair")
    s.add_argument("--target", required=True)
    s.add_argument("--draft", required=True)
    s.add_argument("--k", type=int, default=3, help="tokens drafted per step")
    s.add_argument("--n", type=int, default=128, help="tokens generated")
    s.add_argument("--prompt", default="The future of AI is")
    s.add_argument("--threads", type=int, default=2)
    s.add_argument("--side", choices=("both", "llama", "tandem"), default="both")
    s.set_defaults(func=spec)
    args = p.parse_args()
    hold_isa(args.isa)
    args.func(args)


if __name__ == "__main__":
    main()
