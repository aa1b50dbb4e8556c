"""docs/architecture.md's module list is in step with the tree: every module (Python, C, the web
page's scripts) is named under its folder's heading, and every file named there exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "tandem"
SUFFIXES = (".py", ".c", ".h", ".js")


def doc_sections() -> dict[str, str]:
    """The Modules section's text per top-level folder ("" for the top level)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    modules = text.split("## Modules", 1)[1].split("\n## ", 1)[0]
    sections: dict[str, str] = {}
    current = ""
    for line in modules.splitlines():
        heading = re.fullmatch(r"`([a-z_]+)/`", line.strip())
        if heading:
            current = heading.group(1)
        sections[current] = sections.get(current, "") + line + "\n"
    return sections


def tree_files() -> dict[str, set[str]]:
    """The package's module file names per top-level folder."""
    out: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*"):
        rel = path.relative_to(PACKAGE)
        if path.suffix not in SUFFIXES or "vendor" in rel.parts or "__pycache__" in rel.parts \
                or path.name == "__init__.py" and len(rel.parts) > 1:
            continue
        folder = rel.parts[0] if len(rel.parts) > 1 else ""
        out.setdefault(folder, set()).add(path.name)
    return out


NAME = r"`([\w/.]+\.(?:py|c|h|js))`"


def named(section: str) -> set[str]:
    """File names a section names: bare (`llm.py`) or with the folders below its own."""
    return {m.rpartition("/")[2] for m in re.findall(NAME, section)}


def test_every_module_is_named_under_its_folder():
    sections = doc_sections()
    missing = {folder: sorted(names - named(sections.get(folder, "")))
               for folder, names in tree_files().items()}
    missing = {f or "(top level)": n for f, n in missing.items() if n}
    assert not missing, f"modules missing from docs/architecture.md's list: {missing}"


def test_every_named_module_exists():
    stale: dict[str, list[str]] = {}
    for folder, text in doc_sections().items():
        base = PACKAGE / folder
        for name in re.findall(NAME, text):
            # `tandem/x.py` from the root, `kernels/cpu.py` from the package (another folder's
            # module), anything else below this folder
            candidates = [ROOT / name, PACKAGE / name, *base.rglob(Path(name).name)]
            if not any(c.is_file() for c in candidates):
                stale.setdefault(folder or "(top level)", []).append(name)
    assert not stale, f"docs/architecture.md names modules the tree does not have: {stale}"
