"""`vllm serve` flags that mean nothing, or something we do not do, on this engine, and vLLM's
`--config FILE` (YAML whose keys are flag names).

Nothing a user passes is silently ignored: a flag with no effect here is accepted and logged as
such; a flag asking for what tandem does not do is refused (unless it asks for the default) with
a message that says why.
"""

from __future__ import annotations

import argparse
import json
import logging
from typing import Sequence

import yaml

logger = logging.getLogger("tandem")

# flag -> why it changes nothing here (accepted, logged when given).
NO_EFFECT = {
    "--trust-remote-code": "tandem runs only its own model code, never a checkpoint's",
    "--enable-chunked-prefill": "chunked prefill is always on",
    "--disable-frontend-multiprocessing": "the API server and the engine share one process",
    "--async-scheduling": "scheduling is synchronous with each step",
    "--disable-custom-all-reduce": "collectives are torch.distributed's own",
    "--swap-space": "preemption recomputes; nothing is swapped to CPU memory",
    "--max-seq-len-to-capture": "CUDA graphs capture decode and verification steps at every "
                                "context length",
    "--disable-fastapi-docs": "kept: /docs and /openapi.json describe the API",
    "--enable-reasoning": "deprecated by vLLM 0.9 and removed in 0.10: --reasoning-parser alone "
                          "turns reasoning output on",
}

# flag -> (the value that is fine, why other values are refused).
REFUSED_UNLESS = {
    "--pipeline-parallel-size": (1, "pipeline parallelism is not implemented; use "
                                    "--tensor-parallel-size"),
    "--data-parallel-size": (1, "data parallelism is not implemented; start one server per "
                                "replica behind a load balancer"),
    "--distributed-executor-backend": ("mp", "tandem's workers are processes joined through "
                                             "torch.distributed (the 'mp' backend); Ray is not used"),
    "--cpu-offload-gb": (0, "weights are not offloaded"),
    "--enable-lora": (False, "LoRA adapters are not supported"),
    "--tokenizer-mode": ("auto", "tokenizers load through transformers' fast tokenizers"),
    "--download-dir": (None, "models come from the Hugging Face cache or the bundled copies; "
                             "set HF_HOME to move the cache"),
}


def add_compat_flags(p: argparse.ArgumentParser) -> None:
    group = p.add_argument_group("vLLM flags with no effect here (accepted and logged)")
    for flag, why in NO_EFFECT.items():
        if flag in ("--swap-space", "--max-seq-len-to-capture"):  # these take a number
            group.add_argument(flag, default=None, help=why)
        else:
            group.add_argument(flag, default=None, nargs="?", const=True, help=why)
    refused = p.add_argument_group("vLLM flags for what tandem does not do (refused unless the "
                                   "default)")
    for flag, (default, why) in REFUSED_UNLESS.items():
        if isinstance(default, bool):
            refused.add_argument(flag, action="store_true", default=False, help=why)
        else:
            refused.add_argument(flag, default=default, type=type(default) if default is not None
                                 and not isinstance(default, str) else None, help=why)


def check_compat_flags(args: argparse.Namespace) -> list[str]:
    """Raise ValueError for a refused flag; return the log lines for no-effect ones given."""
    for flag, (default, why) in REFUSED_UNLESS.items():
        value = getattr(args, _dest(flag))
        if value != default and not (value is None and default is None):
            raise ValueError(f"{flag} {value} is not supported: {why}.")
    notes = []
    for flag, why in NO_EFFECT.items():
        if getattr(args, _dest(flag)) not in (None, False):
            notes.append(f"{flag} has no effect: {why}")
    return notes


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def config_file_args(argv: Sequence[str], parser: argparse.ArgumentParser) -> list[str]:
    """`--config FILE`: the YAML file's keys become flags placed before the command line's, so
    the command line wins (as in vLLM). A key `model` becomes the positional model. `parser` is
    the serve parser (a key set to false becomes its `--no-FLAG`, where it has one)."""
    argv = list(argv)
    if "--config" not in argv and not any(a.startswith("--config=") for a in argv):
        return argv
    out, i, path = [], 0, None
    while i < len(argv):
        a = argv[i]
        if a == "--config":
            if i + 1 >= len(argv):
                raise ValueError("--config expects a YAML file")
            path, i = argv[i + 1], i + 2
            continue
        if a.startswith("--config="):
            path, i = a.split("=", 1)[1], i + 1
            continue
        out.append(a)
        i += 1
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f) or {}
    except OSError as e:
        raise ValueError(f"--config {path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise ValueError(f"--config {path} is not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"--config {path} must hold a mapping of flag names to values")
    flags: list[str] = []
    for key, value in data.items():
        flag = "--" + str(key).replace("_", "-")
        if value is True:
            flags.append(flag)
        elif value is False:  # --no-FLAG where the flag has one; else the default already
            if "--no-" + flag[2:] in _negatable_flags(parser):
                flags.append("--no-" + flag[2:])
        elif value is None:
            continue
        elif isinstance(value, list):
            flags += [flag, *[str(v) for v in value]]
        elif isinstance(value, dict):
            flags += [flag, json.dumps(value)]
        else:
            flags += [flag, str(value)]
    return flags + out


def _negatable_flags(parser: argparse.ArgumentParser) -> set[str]:
    """The parser's `--no-FLAG` spellings (flags on by default, such as prefix caching)."""
    return {o for a in parser._actions for o in a.option_strings if o.startswith("--no-")}


def log_notes(notes: list[str]) -> None:
    for note in notes:
        logger.warning(note)
