"""`tandem bench {latency,throughput,serve,spec}`."""

from __future__ import annotations

import argparse
from typing import Optional, Sequence


def make_parser() -> argparse.ArgumentParser:
    from tandem.bench import latency, serve, spec, throughput
    p = argparse.ArgumentParser(prog="tandem bench", description="Benchmarks that print ratios "
                                "from one run; run them on a quiet machine.")
    sub = p.add_subparsers(dest="command", required=True)
    for module in (latency, throughput, serve, spec):
        module.add_parser(sub)
    return p


def main(argv: Optional[Sequence[str]] = None) -> None:
    args = make_parser().parse_args(argv)
    try:
        args.func(args)
    except (ValueError, OSError) as e:  # a bad model, config or prompt file: one line
        raise SystemExit(f"tandem bench {args.command}: error: {e}") from None
