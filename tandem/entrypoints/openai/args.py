"""Command-line arguments of `tandem serve`, spelled as vLLM spells them.

vLLM users paste their commands unchanged, so flags take hyphen or underscore spellings, JSON
flags take dotted forms (`--speculative-config.model X`; values parsed in `arg_values.py`), and
removed flags point at the new one.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Optional, Sequence

from tandem.entrypoints.openai.arg_values import (ArgumentError, extract_dotted, json_value,
                                                   normalize_argv, parse_bytes,
                                                   parse_compilation_config, parse_max_model_len,
                                                   parse_seconds, parse_speculative_config)
from tandem.entrypoints.openai.serve_flags import (add_compat_flags, check_compat_flags,
                                                   config_file_args)

DEFAULT_PORT = 8000

# Flags vLLM removed in favour of --speculative-config, mapped to the config key they became.
REMOVED_SPEC_FLAGS: dict[str, str] = {
    "--speculative-model": "model",
    "--num-speculative-tokens": "num_speculative_tokens",
    "--speculative-draft-tensor-parallel-size": "draft_tensor_parallel_size",
    "--speculative-max-model-len": "max_model_len",
    "--speculative-disable-by-batch-size": "disable_by_batch_size",
    "--ngram-prompt-lookup-max": "prompt_lookup_max",
    "--ngram-prompt-lookup-min": "prompt_lookup_min",
}


SPEC_KEYS_HELP = """\
--speculative-config keys (JSON, vLLM's names; or --speculative-config.KEY VALUE):
  method                        "draft_model" (the default: a draft model), "ngram" (prompt
                                lookup) or "suffix" (suffix decoding): these two draft from the
                                request's own tokens, with no model
  model                         the draft model (directory, Hub id or GGUF file); required
                                for draft_model ("ngram" or "[ngram]" alone means ngram)
  num_speculative_tokens        draft tokens per step, 1..128; required (suffix: the tree depth)
  prompt_lookup_min, prompt_lookup_max
                                ngram: match the last max..min tokens (default 5, 5; one given,
                                the other copies it)
  suffix_decoding_max_tree_depth (24), suffix_decoding_max_cached_requests (10000),
  suffix_decoding_max_spec_factor (1.0), suffix_decoding_min_token_prob (0.1)
                                suffix: tree depth, finished outputs kept for later requests,
                                drafts per matched token, and the least probability a draft
                                token may have
  lookup_method                 "ngram" or "suffix" beside a draft model, the draft's
                                lookahead (TLI: a request whose lookup matches verifies its
                                drafts, the others the model's); "none" for the draft alone.
                                Default: an n-gram lookahead (2..5) on a shared vocabulary
  draft_sample_method           "auto" (default: from the request's own distribution, greedy for
                                greedy requests), "probabilistic" (the same) or "greedy" (argmax)
  draft_tensor_parallel_size    1 (the draft beside rank 0) or the target's -tp
  max_model_len                 the draft's context; drafting stops past it
  revision                      the draft's revision on the Hub
  quantization                  the draft's weights, as --quantization: gguf, none, q8_0,
                                q4_0, q4_k
  kv_cache_dtype                the draft's own KV cache, as --kv-cache-dtype (default: the
                                target's setting)
  use_heterogeneous_vocab       true: a draft with another tokenizer (Token-Level Intersection)
  heterogeneous_vocab_feedback  "reencode" (default) or "unk": how target tokens the draft's
                                vocabulary lacks reach the draft
  rejection_sample_method       "auto" (default: "gumbel" for seeded sampled requests,
                                "standard" for the rest), "standard" (Leviathan et al.),
                                "gumbel" (drafter-invariant: a seeded request gets the same
                                tokens whatever the draft, k or adaptive choice) or
                                "synthetic" (benchmarks only, not lossless; with
                                synthetic_acceptance_rates [per position] or
                                synthetic_acceptance_length; serve needs
                                --allow-synthetic-acceptance)
  adaptive                      true (default): choose 0..num_speculative_tokens drafts every
                                step from measured acceptance and costs, calibrated at load
                                (tandem's own key); false: a fixed k
  num_speculative_tokens_per_batch_size
                                [[start, end, k], ...]: at most k drafts while start..end
                                requests run (inclusive; caps adaptive's choice too)
  enforce_eager, code_revision  accepted for vLLM compatibility; no effect (logged)
"""


def make_serve_parser(parser: Optional[argparse.ArgumentParser] = None) -> argparse.ArgumentParser:
    p = parser or argparse.ArgumentParser(
        prog="tandem serve", epilog=SPEC_KEYS_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Start the OpenAI-compatible server. Flags follow `vllm serve` (hyphens or "
                    "underscores; --config FILE reads them from YAML).")
    p.add_argument("model_tag", metavar="MODEL", nargs="?", default=None,
                   help="HF model directory, Hub id or GGUF file (or --model)")
    p.add_argument("--model", dest="model_flag", default=None, help="the model, as a flag")
    p.add_argument("--config", default=None,
                   help="a YAML file of flag names and values; the command line overrides it")
    p.add_argument("--host", default=None, help="address to bind (default: all interfaces)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="port to bind (8000)")
    p.add_argument("--seed", type=int, default=0, help="seed of unseeded requests' randomness")
    p.add_argument("-tp", "--tensor-parallel-size", type=int, default=1,
                   help="shard the target across this many ranks (worker processes)")
    p.add_argument("--nnodes", type=int, default=None,
                   help="machines the ranks spread over (default: NNODES/WORLD_SIZE, or 1)")
    p.add_argument("--node-rank", type=int, default=None,
                   help="this machine's rank; > 0 runs workers only (default: NODE_RANK/RANK)")
    p.add_argument("--master-addr", default=None,
                   help="rendezvous address, node 0's (default: MASTER_ADDR, or 127.0.0.1)")
    p.add_argument("--master-port", type=int, default=None,
                   help="rendezvous port (default: MASTER_PORT, or a free port on one node)")
    p.add_argument("--max-model-len", type=parse_max_model_len, default=None,
                   help="context length: 2048, 1k, 1K, 25.6k, -1 or auto")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9,
                   help="share of GPU memory for weights and KV cache (CUDA only)")
    p.add_argument("--kv-cache-memory-bytes", type=parse_bytes, default=None,
                   help="KV cache size in bytes (4G, 512M, ...); the CPU default is 4 GiB")
    p.add_argument("--kv-cache-dtype", default="auto",
                   help="KV cache format: auto (the model's dtype), float32, bfloat16, float16, "
                        "fp8 (= fp8_e4m3), fp8_e5m2 or q8_0 (llama.cpp's 8-bit blocks); the "
                        "draft's own: --speculative-config's kv_cache_dtype")
    p.add_argument("--block-size", type=int, default=16, choices=[1, 8, 16, 32, 64, 128],
                   help="tokens per KV cache block")
    p.add_argument("--load-format", default="auto",
                   help="auto (safetensors or GGUF, detected), safetensors, gguf, or dummy "
                        "(random weights from config.json alone: for benchmarks)")
    p.add_argument("-q", "--quantization", default=None,
                   help="weights' quantization: gguf (a GGUF file's blocks kept as they are: the "
                        "default for GGUF), none (dequantized to --dtype), or q8_0, q4_0, q4_k "
                        "(quantized at load)")
    p.add_argument("-sc", "--speculative-config", default=None,
                   help='JSON, e.g. \'{"model": "DRAFT", "num_speculative_tokens": 5}\' '
                        '(keys below)')
    p.add_argument("--allow-synthetic-acceptance", action="store_true",
                   help="accept rejection_sample_method 'synthetic' in --speculative-config "
                        "(benchmarking only: the output is not the target's distribution)")
    p.add_argument("--served-model-name", nargs="+", default=None,
                   help="one or more names for the API; the first is reported")
    p.add_argument("--tokenizer", default=None, help="tokenizer name or path (default: the model)")
    p.add_argument("--revision", default=None, help="model revision on the Hub")
    p.add_argument("--dtype", default="auto",
                   choices=["auto", "half", "float16", "bfloat16", "float", "float32"],
                   help="weight and activation dtype (auto: float32 on CPU)")
    p.add_argument("--max-num-seqs", type=int, default=None,
                   help="most sequences in a batch (256)")
    p.add_argument("--max-num-batched-tokens", type=int, default=None,
                   help="token budget of one step")
    p.add_argument("--watermark", type=float, default=0.0,
                   help="fraction of the KV cache blocks a waiting or preempted request must "
                        "leave free to be admitted beside running ones (0: off); fewer "
                        "preemptions when many long requests overfill the cache")
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction,
                   default=True, help="reuse KV blocks of shared prompt prefixes (on)")
    p.add_argument("--device", default="auto", help="auto, cpu or cuda[:N]")
    p.add_argument("--enforce-eager", action=argparse.BooleanOptionalAction, default=False,
                   help="never capture CUDA graphs (by default, on CUDA with the Triton kernels, "
                        "decode and verification steps replay graphs; the CPU has none)")
    p.add_argument("-O", "--compilation-config", default=None,
                   help='CUDA graphs, vLLM\'s keys as JSON: {"cudagraph_capture_sizes": '
                        '[1, 2, 4, 8]}, max_cudagraph_capture_size, cudagraph_mode (NONE: '
                        'off); or an optimization level (-O3: no effect, nothing is compiled)')
    p.add_argument("--cuda-graph-sizes", type=int, nargs="+", default=None,
                   help="batch sizes to capture: one value N for 1, 2, 4, 8, 16, ..., N; several "
                        "for those (default: that pattern up to --max-num-seqs)")
    p.add_argument("--generation-config", default="auto",
                   help="defaults for omitted sampling fields: auto (the model's "
                        "generation_config.json), vllm (none), or a folder holding one")
    p.add_argument("--max-logprobs", type=int, default=20,
                   help="most logprobs a request may ask for per token (20)")
    p.add_argument("--response-role", default="assistant",
                   help="the role of chat completions' messages (assistant)")
    p.add_argument("--return-tokens-as-token-ids", action="store_true",
                   help='logprob tokens as "token_id:N" (for tokens that are not valid text)')
    p.add_argument("--enable-auto-tool-choice", action="store_true",
                   help='let the model call tools (tool_choice "auto"); needs --tool-call-parser')
    p.add_argument("--tool-call-parser", default=None,
                   help="how tool calls are read from the model's text: hermes (the "
                        "<tool_call> JSON format of Hermes, Qwen2.5/3 and SmolLM3 templates)")
    p.add_argument("--reasoning-parser", default=None,
                   help="split a thinking model's output into reasoning_content and content: "
                        "deepseek_r1 or qwen3 (<think>...</think>; see docs/serving.md)")
    p.add_argument("--api-key", nargs="+", default=None,
                   help="required bearer key(s); also TANDEM_API_KEY or VLLM_API_KEY")
    p.add_argument("--chat-template", default=None, help="a Jinja file path or inline template")
    p.add_argument("--trust-request-chat-template", action="store_true",
                   help="accept a chat_template sent with a request (rendered in Jinja's "
                        "sandbox under a time limit); refused otherwise")
    p.add_argument("--shutdown-timeout", type=float, default=10.0,
                   help="seconds requests in flight may take to finish after SIGTERM")
    p.add_argument("--engine-iteration-timeout-s", type=parse_seconds, default=None,
                   help="seconds the engine core may stay silent (no step ended, no idle "
                        "heartbeat) before it counts as hung: /health turns 503, requests fail "
                        "and the server exits 1 (default: VLLM_ENGINE_ITERATION_TIMEOUT_S, else "
                        "60; raised to 4x the longest step seen)")
    p.add_argument("--stream-stall-timeout-s", type=parse_seconds, default=300.0,
                   help="seconds a streaming client may read nothing before its request is "
                        "aborted and its KV blocks freed")
    p.add_argument("--stream-interval", type=int, default=1,
                   help="tokens per streamed chunk: a stream's first token goes at once, then "
                        "a chunk each time this many have come, and the rest at the end (vLLM's "
                        "flag; above 1 a client parses fewer, larger chunks)")
    p.add_argument("--enable-log-requests", action=argparse.BooleanOptionalAction,
                   default=False, help="log every request's id, prompt length and parameters")
    p.add_argument("--disable-log-requests", action="store_true",
                   help="do not log requests (the default; kept for older vLLM commands)")
    p.add_argument("--uvicorn-log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug", "trace"],
                   help="uvicorn's log level")
    p.add_argument("--disable-log-stats", action="store_true",
                   help="no periodic engine statistics in the log")
    p.add_argument("--disable-uvicorn-access-log", action="store_true",
                   help="no access log line per HTTP request")
    add_compat_flags(p)
    for flag in REMOVED_SPEC_FLAGS:
        p.add_argument(flag, default=None, help=argparse.SUPPRESS)
    return p


def _removed_flags_message(args: argparse.Namespace, spec: Optional[dict]) -> Optional[str]:
    given: dict[str, Any] = {}
    used: list[str] = []
    for flag, key in REMOVED_SPEC_FLAGS.items():
        value = getattr(args, flag[2:].replace("-", "_"))
        if value is not None:
            given[key] = json_value(value)
            used.append(flag)
    if not used:
        return None
    merged = {**(spec or {}), **given}
    return (f"{', '.join(used)} {'was' if len(used) == 1 else 'were'} removed; use "
            f"--speculative-config '{json.dumps(merged)}' instead")


def parse_serve_args(argv: Sequence[str]) -> argparse.Namespace:
    """Parse `tandem serve` arguments. Raises ArgumentError for errors we explain in one line."""
    try:
        argv = config_file_args(normalize_argv(argv), make_serve_parser())
    except ValueError as e:
        raise ArgumentError(str(e)) from None
    normalized, dotted = extract_dotted(normalize_argv(argv), "--speculative-config")
    normalized, compile_dotted = extract_dotted(normalized, "--compilation-config")
    args = make_serve_parser().parse_args(normalized)
    # The positional model wins over --model (and so over a --config file's `model:`), as in vLLM.
    args.model = args.model_tag or args.model_flag
    if not args.model:
        raise ArgumentError("a model is required: tandem serve MODEL (or --model MODEL)")
    try:
        args.compat_notes = check_compat_flags(args)
    except ValueError as e:
        raise ArgumentError(str(e)) from None
    if args.disable_log_requests:
        args.enable_log_requests = False
    _check_tool_flags(args)
    args.speculative_config = parse_speculative_config(args.speculative_config, dotted)
    args.compilation_config = parse_compilation_config(args.compilation_config, compile_dotted)
    if (args.speculative_config or {}).get("rejection_sample_method") == "synthetic" \
            and not args.allow_synthetic_acceptance:
        raise ArgumentError("rejection_sample_method 'synthetic' accepts drafts at set rates "
                            "whatever the target says, so answers would not be the model's; "
                            "pass --allow-synthetic-acceptance to serve it for benchmarking")
    message = _removed_flags_message(args, args.speculative_config)
    if message:
        raise ArgumentError(message)
    if args.api_key is None:
        env_key = os.environ.get("TANDEM_API_KEY") or os.environ.get("VLLM_API_KEY")
        args.api_key = [env_key] if env_key else None
    args.served_model_name = args.served_model_name or [args.model]
    return args


def _check_tool_flags(args: argparse.Namespace) -> None:
    from tandem.entrypoints.openai.tool_parsers import TOOL_PARSERS

    if args.tool_call_parser is not None and args.tool_call_parser not in TOOL_PARSERS:
        raise ArgumentError(f"invalid tool call parser: {args.tool_call_parser} (choose from "
                            f"{{ {', '.join(sorted(TOOL_PARSERS))} }})")
    if args.enable_auto_tool_choice and args.tool_call_parser is None:
        raise ArgumentError("--enable-auto-tool-choice requires --tool-call-parser")
    from tandem.entrypoints.openai.reasoning_parsers import REASONING_PARSERS

    if args.reasoning_parser is not None and args.reasoning_parser not in REASONING_PARSERS:
        raise ArgumentError(f"invalid reasoning parser: {args.reasoning_parser} (choose from "
                            f"{{ {', '.join(sorted(REASONING_PARSERS))} }})")


def engine_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments `LLMEngine.from_kwargs` (and `tandem.LLM`) take."""
    return dict(model=args.model, tokenizer=args.tokenizer, dtype=args.dtype, seed=args.seed,
                max_model_len=args.max_model_len, tensor_parallel_size=args.tensor_parallel_size,
                nnodes=args.nnodes, node_rank=args.node_rank, master_addr=args.master_addr,
                master_port=args.master_port,
                gpu_memory_utilization=args.gpu_memory_utilization,
                kv_cache_memory_bytes=args.kv_cache_memory_bytes, max_num_seqs=args.max_num_seqs,
                max_num_batched_tokens=args.max_num_batched_tokens,
                enable_prefix_caching=args.enable_prefix_caching, device=args.device,
                speculative_config=args.speculative_config, revision=args.revision,
                block_size=args.block_size, quantization=args.quantization,
                kv_cache_dtype=args.kv_cache_dtype, max_logprobs=args.max_logprobs,
                generation_config=args.generation_config, load_format=args.load_format,
                enforce_eager=args.enforce_eager, compilation_config=args.compilation_config,
                cuda_graph_sizes=args.cuda_graph_sizes, stream_interval=args.stream_interval,
                watermark=args.watermark)


def one_line(error: BaseException) -> str:
    """Collapse an exception message onto one line for start-up errors."""
    text = " ".join(str(error).split()) or type(error).__name__
    return text


def print_error_and_exit(message: str, code: int = 2) -> None:
    print(f"tandem serve: error: {message}", file=sys.stderr)
    sys.exit(code)


def tandem_version() -> str:
    try:
        from importlib.metadata import version
        return version("tandem")
    except Exception:  # running from a source tree that was never installed
        return "0.0.0+unknown"
