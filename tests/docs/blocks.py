"""The code blocks of the docs (README.md, CONTRIBUTING.md, docs/, examples/*/README.md), as the suite runs them.

A fenced block in Python, shell or SQL is executed by `tests/docs/test_code_blocks.py`. A block
that cannot run as written (it needs a GPU, a framework's venv, or it serves forever) says so
right above its fence, with the reason, in a comment the rendered page does not show:

    <!-- not-run: serves until stopped; tests/dashboards/test_e2e_chromium.py drives it -->
    ```bash
    trajlake dashboard --lake trajlake-data
    ```

A block the reader saves as a file (a script that a later shell block starts, e.g. once per
trainer rank) says where, in the same kind of comment; the suite writes it there instead of
running it, and the shell block that starts it runs it:

    <!-- save-as: rank.py -->
    ```python
    ...
    ```

    python tests/docs/blocks.py     # how many blocks run, and which do not (with why)
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

from markdown_it import MarkdownIt

ROOT = Path(__file__).resolve().parents[2]
RUN = {"python": "python", "py": "python", "bash": "shell", "sh": "shell", "shell": "shell", "sql": "sql"}
"""Fence languages the suite executes, and how."""
NOT_RUN = re.compile(r"<!--\s*not-run:\s*(?P<why>.+?)\s*-->\s*$")
SAVE_AS = re.compile(r"<!--\s*save-as:\s*(?P<path>[\w.-]+)\s*-->\s*$")
"""A file name in the page's directory: no folders, nothing outside it."""


@dataclass(frozen=True)
class Block:
    """One fenced code block of a page."""

    path: Path
    line: int
    """1-based line of its opening fence."""
    language: str
    code: str
    not_run: str | None
    """Why it is not executed, as its page says; None: the suite runs it."""
    save_as: str | None = None
    """The file the reader saves it as (a later block runs it); None: it runs where it stands."""

    @property
    def kind(self) -> str | None:
        """How the suite runs it ("python", "shell", "sql"), or None for text, JSON, YAML, …."""
        return RUN.get(self.language)

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def pages() -> list[Path]:
    """Every Markdown page whose blocks the suite checks."""
    found = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]
    found += sorted((ROOT / "examples").glob("*/README.md"))
    return [p for p in found if p.exists()]


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of `path`, in order."""
    lines = path.read_text().splitlines()
    out = []
    for token in MarkdownIt("commonmark").parse("\n".join(lines)):
        if token.type != "fence" or token.map is None:
            continue
        start = token.map[0]
        before = lines[start - 1].strip() if start > 0 else ""
        marker, saved = NOT_RUN.match(before), SAVE_AS.match(before)
        language = (token.info.split() or [""])[0].lower()
        out.append(
            Block(
                path, start + 1, language, token.content,
                marker["why"] if marker else None, saved["path"] if saved else None,
            )
        )  # fmt: skip
    return out


def main() -> int:
    every = [b for p in pages() for b in blocks(p) if b.kind]
    run = [b for b in every if b.not_run is None]
    by_kind = {k: sum(b.kind == k for b in run) for k in ("python", "shell", "sql")}
    saved = sum(b.save_as is not None for b in run)
    print(
        f"{len(run)} of {len(every)} Python, shell and SQL blocks are executed by the suite ({by_kind}; "
        f"{saved} of them saved as a file that a later block runs)"
    )
    for b in every:
        if b.not_run is not None:
            print(f"  not run: {b.where} ({b.language}): {b.not_run}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
