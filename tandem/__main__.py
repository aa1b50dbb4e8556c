"""`python -m tandem ...` is the `tandem` command."""

from __future__ import annotations

from tandem.cli import main

main()
