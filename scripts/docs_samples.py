"""Fill the sample answers of the SQL cookbook from a real demo lake.

    python scripts/docs_samples.py                 # runs `trajlake demo --engine tiny` into a temp dir first
    python scripts/docs_samples.py --lake DIR      # an existing lake (runs `demo`, `demo-overfit`)

Each ```sql block of docs/how-to/sql-cookbook.md that is followed by `<!-- sample -->` and a
```text block gets that block rewritten with what `trajlake sql` prints for it. Run it again
when the demo or the tables change; the suite runs every query (tests/docs/test_code_blocks.py).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "how-to" / "sql-cookbook.md"
SAMPLE = re.compile(r"(```sql\n(?P<query>.*?)```\n\n<!-- sample -->\n```text\n)(?P<answer>.*?)(```)", re.S)
DEMO = ["demo", "--engine", "tiny", "--no-ray", "--steps", "20", "--overfit-tasks", "8"]
"""The lake the samples come from: the suite's docs fixture builds the same one."""


def answer(lake: str, query: str, tokenizer: str | None) -> str:
    """What `trajlake sql` prints for `query` (a table, up to 110 characters wide)."""
    from trajlake.cli import main

    argv = [
        "sql",
        "--lake",
        lake,
        "--max-width",
        "110",
        *(["--tokenizer", tokenizer] if tokenizer else []),
        query,
    ]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    if code != 0:
        raise SystemExit(f"this query failed ({err.getvalue().strip()}):\n{query}")
    return out.getvalue()


def fill(text: str, lake: str, tokenizer: str | None) -> tuple[str, int]:
    """`text` with every sample answer rewritten, and how many there were."""
    count = 0

    def one(match: re.Match[str]) -> str:
        nonlocal count
        count += 1
        return match[1] + answer(lake, match["query"], tokenizer) + match[4]

    return SAMPLE.sub(one, text), count


def build_lake(scratch: Path) -> tuple[str, str]:
    """A tiny demo lake and the tiny chat model's tokenizer (the tiny engine records none)."""
    exe = str(Path(sys.executable).parent / "trajlake")
    lake, model = scratch / "trajlake-data", scratch / "tiny"
    for argv in (
        [*DEMO, "--lake", str(lake)],
        ["model", "init", str(model), "--vocab-size", "400", "--seed", "3"],
    ):
        subprocess.run([exe, *argv], check=True, stdout=subprocess.DEVNULL)
    return str(lake), str(model)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lake", help="a lake holding the demo's runs (default: build one)")
    p.add_argument("--tokenizer", help="tokenizer for detokenize() when the lake's model is not local")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="trajlake-samples-") as scratch:
        lake, tokenizer = (args.lake, args.tokenizer) if args.lake else build_lake(Path(scratch))
        text, count = fill(PAGE.read_text(), lake, tokenizer)
    PAGE.write_text(text)
    print(f"wrote {count} sample answers into {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
