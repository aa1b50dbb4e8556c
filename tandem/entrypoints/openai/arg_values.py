"""Values of `tandem serve` flags, parsed as vLLM parses them: `_` or `-` in flag names, sizes
like `1k` or `4GiB`, and the JSON of `--speculative-config` and `--compilation-config` merged
with their dotted forms (`--speculative-config.model X`)."""

from __future__ import annotations

import argparse
import json
import re
from typing import Any, Optional, Sequence, Union


class ArgumentError(Exception):
    """A bad command line; the CLI prints the message on one line and exits with status 2."""


def normalize_argv(argv: Sequence[str]) -> list[str]:
    """Rewrite `_` to `-` in `--flag` names (before any `=` or `.`), as vLLM's parser does."""
    out: list[str] = []
    for arg in argv:
        if arg.startswith("--") and len(arg) > 2:
            name, eq, value = arg.partition("=")
            head, dot, tail = name.partition(".")
            out.append(head.replace("_", "-") + dot + tail + eq + value)
        else:
            out.append(arg)
    return out


def parse_max_model_len(value: str) -> Optional[int]:
    """`2048`, `1k` (1000), `1K` (1024), `25.6k`, `-1`/`auto` (None = the model's own limit)."""
    text = value.strip()
    if text.lower() in ("auto", "-1"):
        return None
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgG]?)", text)
    if not match:
        raise argparse.ArgumentTypeError(
            f"invalid max model length {value!r}: use an integer, 1k/1K-style sizes, -1 or auto")
    number, unit = float(match.group(1)), match.group(2)
    scale = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9,
             "K": 2**10, "M": 2**20, "G": 2**30}[unit]
    result = number * scale
    if result != int(result) or result <= 0:
        raise argparse.ArgumentTypeError(f"invalid max model length {value!r}")
    return int(result)


def parse_bytes(value: str) -> int:
    """`4294967296`, `4G`/`4GiB` (2^30), `4GB` (10^9), `512M`, `64k`."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)(i?[bB])?", value.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"invalid byte count {value!r}: use e.g. 4294967296, "
                                         "4G, 4GiB, 4GB or 512M")
    number, unit, suffix = float(match.group(1)), match.group(2).upper(), match.group(3) or ""
    power = "KMGT".index(unit) + 1 if unit else 0
    base = 1000 if suffix in ("B", "b") and unit else 1024
    result = int(number * base ** power)
    if result <= 0:
        raise argparse.ArgumentTypeError(f"invalid byte count {value!r}: must be positive")
    return result


def parse_seconds(value: str) -> float:
    """A positive number of seconds."""
    try:
        seconds = float(value)
    except ValueError:
        seconds = float("nan")
    if not seconds > 0 or seconds == float("inf"):
        raise argparse.ArgumentTypeError(f"invalid number of seconds {value!r}: must be a "
                                         "positive number")
    return seconds


def json_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_speculative_config(text: Optional[str], dotted: dict[str, str]) -> Optional[dict]:
    """Parse the JSON flag (keys with `-` become `_`) and merge `--speculative-config.KEY` forms."""
    return parse_json_flag("--speculative-config", text, dotted)


def parse_compilation_config(text: Optional[str],
                             dotted: dict[str, str]) -> Union[None, int, dict]:
    """`--compilation-config` / `-O`: an optimization level (`-O3`, which the engine logs as
    having no effect) or JSON of vLLM's keys, with `--compilation-config.KEY` forms merged."""
    if text is not None and text.strip().isdigit() and not dotted:
        return int(text)
    return parse_json_flag("--compilation-config", text, dotted)


def parse_json_flag(flag: str, text: Optional[str], dotted: dict[str, str]) -> Optional[dict]:
    """A JSON-object flag (keys with `-` become `_`) merged with its `FLAG.KEY VALUE` forms."""
    config: dict[str, Any] = {}
    if text is not None:
        try:
            value = json.loads(text)
        except json.JSONDecodeError as e:
            raise ArgumentError(f"{flag} is not valid JSON ({e.msg} at column "
                                f"{e.colno}): {text}") from None
        if not isinstance(value, dict):
            raise ArgumentError(f"{flag} must be a JSON object, got: {text}")
        config.update(value)
    for key, raw in dotted.items():
        config[key] = json_value(raw)
    if not config:
        return None
    return {str(k).replace("-", "_"): v for k, v in config.items()}


def extract_dotted(argv: list[str], prefix: str) -> tuple[list[str], dict[str, str]]:
    """Pull `--prefix.KEY VALUE` / `--prefix.KEY=VALUE` pairs out of argv."""
    rest: list[str] = []
    found: dict[str, str] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith(prefix + "."):
            name, eq, value = arg.partition("=")
            key = name[len(prefix) + 1:]
            if not eq:
                if i + 1 >= len(argv):
                    raise ArgumentError(f"{name} expects a value")
                value = argv[i + 1]
                i += 1
            found[key] = value
        else:
            rest.append(arg)
        i += 1
    return rest, found
