"""What the browser tests share besides fixtures: how Chromium is found and launched, the two
servers, and the screenshots taken (listed at the end of the run)."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from entrypoints.server_helpers import ServerProcess

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
SCREENSHOTS: list[str] = []  # printed in the terminal summary


def chromium_path() -> str | None:
    """TANDEM_CHROMIUM if set, else Debian's chromium."""
    override = os.environ.get("TANDEM_CHROMIUM")
    if override is not None:
        return override if Path(override).is_file() else None
    found = shutil.which("chromium")
    if found:
        return found
    return "/usr/bin/chromium" if Path("/usr/bin/chromium").is_file() else None


@dataclass
class WebServers:
    spec: ServerProcess   # a draft with its own random weights: both kinds of token appear
    plain: ServerProcess  # no draft, --api-key
