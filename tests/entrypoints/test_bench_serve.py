"""`tandem bench serve` against a running server: each concurrency level answered, in JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from entrypoints.server_helpers import ServerProcess


def test_bench_serve_levels(server: ServerProcess, tmp_path: Path) -> None:
    out = tmp_path / "serve.json"
    subprocess.run([sys.executable, "-m", "tandem", "bench", "serve", "--base-url", server.url,
                    "--concurrency", "1", "3", "--num-prompts", "3", "--max-tokens", "8",
                    "--no-progress", "--output-json", str(out)],
                   check=True, timeout=300, capture_output=True)
    result = json.loads(out.read_text())
    assert result["model"] == "tiny"
    assert [lv["concurrency"] for lv in result["levels"]] == [1, 3]
    for lv in result["levels"]:
        assert lv["requests"] == 3 and lv["output_tokens_per_s"] > 0
        assert lv["ttft"]["median_ms"] > 0 and lv["itl"]["median_ms"] > 0
