"""docs/CONTRACTS.md draws kit's layout: every module of kit/ is named there, in its package's line.

A module added without a word in the layout is a module a reader cannot find from the map; this test
fails naming it.
"""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def layout_lines() -> dict[str, str]:
    """{package folder ("kit/train/", "kit/" for the base modules): the words the layout gives it}."""
    text = (ROOT / "docs" / "CONTRACTS.md").read_text()
    block = re.search(r"## Layout.*?```\n(.*?)```\n(.*?)\n\n", text, re.S)
    assert block, "docs/CONTRACTS.md has no Layout section with a fenced block"
    lines: dict[str, str] = {"kit/": block.group(2)}  # the paragraph under the block: the base modules
    current = None
    for line in block.group(1).splitlines():
        for m in re.finditer(r"(kit/[a-z_]+/)", line):  # one line may name two packages
            current = m.group(1)
            lines.setdefault(current, "")
        if current:
            lines[current] += " " + line
    return lines


def test_every_module_is_named_in_the_layout():
    lines = layout_lines()
    missing = []
    for path in sorted((ROOT / "kit").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if path.name in ("__init__.py", "__main__.py"):
            continue
        parts = rel.split("/")
        package = "kit/" if len(parts) == 2 else f"kit/{parts[1]}/"
        words = lines.get(package, "")
        if not re.search(rf"(?<![A-Za-z0-9_]){re.escape(path.stem)}(?![A-Za-z0-9_])", words):
            missing.append(rel)
    assert not missing, f"modules docs/CONTRACTS.md's layout does not name: {', '.join(missing)}"
