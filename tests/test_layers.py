"""The packages' layers, read from their imports: common <- schemas <- store <- ingest <- {rollout, trainer} <- demo,
with the dashboards reading the store only and the CLI on top. Nothing imports upward or sideways."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).parents[1]
# each package and the packages it may import
MAY_IMPORT = {
    "common": set(),
    "schemas": {"common"},
    "store": {"common", "schemas"},
    "ingest": {"common", "schemas", "store"},
    "rollout": {"common", "schemas", "store", "ingest"},
    "trainer": {"common", "schemas", "store", "ingest"},
    "dashboards": {"common", "schemas", "store"},
    "deploy": {"common", "schemas", "store", "ingest"},
    "demo": {"common", "schemas", "store", "ingest", "rollout", "trainer", "dashboards", "deploy"},
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


def _module_imports(path: Path) -> set[str]:
    """Every `trajlake.<package>.<module>` one file imports, at the top, in a function or for typing."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("trajlake."):
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}  # `from trajlake.store import reads`
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("trajlake.")}
    return found


def test_the_stores_modules_import_in_one_direction_and_no_private_names() -> None:
    """The lake's roles stay apart: no module of `store/` imports another's private name, and no two
    import each other, directly or round a circle (the lake and SQL among them)."""
    modules = {f"trajlake.store.{p.stem}": p for p in sorted((ROOT / "store").glob("*.py"))}
    graph = {name: _module_imports(path) & modules.keys() - {name} for name, path in modules.items()}
    private = [
        f"{path.relative_to(ROOT)}:{node.lineno} imports {a.name} from {node.module}"
        for path in modules.values()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("trajlake.")
        for a in node.names
        if a.name.startswith("_")
    ]
    assert not private, "\n".join(private)

    def circle(start: str, at: str, path: list[str]) -> list[str] | None:
        for nxt in sorted(graph[at]):
            if nxt == start:
                return [*path, nxt]
            if nxt not in path:
                found = circle(start, nxt, [*path, nxt])
                if found:
                    return found
        return None

    circles = [found for name in graph if (found := circle(name, name, [name]))]
    assert not circles, " -> ".join(circles[0])
