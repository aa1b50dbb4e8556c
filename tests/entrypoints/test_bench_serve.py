"""`tandem bench serve` against a running server: each concurrency level answered, in JSON; with
--peer-url, the same levels against a second server and the ratios between them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from entrypoints.server_helpers import ServerProcess


def test_bench_serve_levels_and_peer_ratios(server: ServerProcess, tmp_path: Path) -> None:
    out = tmp_path / "serve.json"
    # The server is its own peer here: the ratios must be computed from the two runs.
    run = subprocess.run([sys.executable, "-m", "tandem", "bench", "serve", "--base-url",
                          server.url, "--peer-url", server.url + "/v1", "--concurrency", "1",
                          "3", "--num-prompts", "3", "--max-tokens", "8", "--no-progress",
                          "--output-json", str(out)],
                         check=True, timeout=300, capture_output=True, text=True)
    result = json.loads(out.read_text())
    assert result["model"] == "tiny" and result["peer"]["model"] == "tiny"
    for levels in (result["levels"], result["peer"]["levels"]):
        assert [lv["concurrency"] for lv in levels] == [1, 3]
        for lv in levels:
            assert lv["requests"] == 3 and lv["output_tokens_per_s"] > 0
            # A busy machine's server may merge a slow reader's deltas into fewer chunks (8
            # tokens can arrive as one), leaving no gap to measure: ITL is then 0, never less.
            assert lv["ttft"]["median_ms"] > 0 and lv["itl"]["median_ms"] >= 0
            assert lv["tokens_counted_by"] == "usage" and lv["retries"] == 0
    for ratio, ours, theirs in zip(result["ratios"], result["levels"],
                                   result["peer"]["levels"]):
        assert ratio["output_tokens_per_s"] == \
            ours["output_tokens_per_s"] / theirs["output_tokens_per_s"]
    assert "the peer's tok/s" in run.stdout and "takes CPU time" in run.stdout
