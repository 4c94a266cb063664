"""The packages' layers, read from their imports: schemas <- store <- ingest <- {rollout, trainer} <- demo,
with the dashboards reading the store only and the CLI on top. Nothing imports upward or sideways."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).parents[1]
# each package and the packages it may import
MAY_IMPORT = {
    "schemas": set(),
    "store": {"schemas"},
    "ingest": {"schemas", "store"},
    "rollout": {"schemas", "store", "ingest"},
    "trainer": {"schemas", "store", "ingest"},
    "dashboards": {"schemas", "store"},
    "demo": {"schemas", "store", "ingest", "rollout", "trainer", "dashboards"},
}


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, imported trajlake package) for every `trajlake.<package>` import in one file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "trajlake" and len(parts) > 1:
                found.append((node.lineno, parts[1]))
    return found


def test_no_package_imports_a_layer_above_it() -> None:
    wrong = []
    for package, allowed in MAY_IMPORT.items():
        for path in sorted((ROOT / package).rglob("*.py")):
            for line, target in _imports(path):
                if target != package and target not in allowed:
                    wrong.append(f"{path.relative_to(ROOT)}:{line} imports trajlake.{target}")
    assert not wrong, "\n".join(wrong)


def test_the_package_root_holds_only_the_cli() -> None:
    assert sorted(p.name for p in ROOT.glob("*.py")) == ["__init__.py", "cli.py"]
