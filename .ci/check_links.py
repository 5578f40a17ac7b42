"""Check that every relative link in README.md and docs/**/*.md points at a file that exists.

A link is `[text](target)`, `![alt](target)` or a reference definition `[name]: target`,
outside fenced code blocks and inline code. Targets with a scheme (http, https, mailto, ...)
are skipped; a `#anchor` is stripped and the file before it must exist, relative to the
markdown file. Prints each broken link as `path:line: target` and exits 1, else prints a
one-line summary. Standard library only.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parents[1]
INLINE_LINK = re.compile(
    r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]"  # [text], one level of nested brackets (images)
    r"\(\s*(<[^>]*>|[^)\s]+)(?:\s+[\"'(][^)]*)?\)"  # (target "optional title")
)
REFERENCE_DEFINITION = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
INLINE_CODE = re.compile(r"(`+).+?\1")
FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def markdown_files(root: Path) -> list[Path]:
    """README.md and every .md file under docs/, in a stable order."""
    files = [root / "README.md"] if (root / "README.md").is_file() else []
    docs = root / "docs"
    if docs.is_dir():
        files += sorted(docs.rglob("*.md"))
    return files


def links(text: str) -> list[tuple[int, str]]:
    """(line number, target) of every link outside code."""
    found: list[tuple[int, str]] = []
    fence: str | None = None
    for number, line in enumerate(text.splitlines(), 1):
        opening = FENCE.match(line)
        if fence is not None:
            if opening and opening.group(1)[0] == fence[0] and len(opening.group(1)) >= len(fence):
                fence = None
            continue
        if opening:
            fence = opening.group(1)
            continue
        line = INLINE_CODE.sub("", line)
        targets = [m.group(1) for m in INLINE_LINK.finditer(line)]
        definition = REFERENCE_DEFINITION.match(line)
        if definition:
            targets.append(definition.group(1))
        found += [(number, target.strip("<>")) for target in targets]
    return found


def broken(path: Path, target: str) -> bool:
    """Whether a relative target does not resolve to an existing file or directory."""
    if SCHEME.match(target):
        return False
    file_part = unquote(target.split("#", 1)[0].split("?", 1)[0])
    if not file_part:
        return False  # an anchor in the same file
    base = ROOT if file_part.startswith("/") else path.parent
    return not (base / file_part.lstrip("/")).exists()


def main() -> int:
    files = markdown_files(ROOT)
    checked = 0
    problems: list[str] = []
    for path in files:
        for number, target in links(path.read_text(encoding="utf-8")):
            checked += 1
            if broken(path, target):
                problems.append(f"{path.relative_to(ROOT)}:{number}: {target}")
    for problem in problems:
        print(problem)
    if problems:
        print(f"check_links: {len(problems)} broken of {checked} links in {len(files)} files")
        return 1
    print(f"check_links: {checked} links in {len(files)} markdown files, all resolve")
    return 0


if __name__ == "__main__":
    sys.exit(main())
