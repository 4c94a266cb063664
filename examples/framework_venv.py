"""How every example finds its RL framework's venv, from any shell: one function, standard library only.

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/, for this module
    from framework_venv import enter
    enter("verifiers", "verifiers.v1")   # a table of scripts/frameworks.toml, and a module it provides

If the framework's module and trajlake both import in this interpreter, `enter` only puts its
`bin` on PATH (verifiers runs its harnesses as uv scripts from there). Otherwise it gets the venv
from `scripts/framework-venv.sh NAME` (built once, then cached outside the checkout, with trajlake
installed from this checkout) and runs the example again there with the same arguments and the
same working directory: a plain `python`, another project's venv or trajlake's own all work.
It runs before anything but the standard library is importable, so it imports nothing else.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENTERED = "TRAJLAKE_EXAMPLE_VENV"
"""Set to the venv an example re-ran itself in: a second re-run would loop, so it stops with the fix."""


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # a parent package is missing
        return False


def _on_path(bindir: Path) -> None:
    path = os.environ.get("PATH", "")
    if str(bindir) not in path.split(os.pathsep):
        os.environ["PATH"] = f"{bindir}{os.pathsep}{path}" if path else str(bindir)


def enter(name: str, module: str) -> None:
    """Continue in a Python where `module` (of framework `name`) and trajlake import; re-run there if need be."""
    if _importable(module) and _importable("trajlake"):
        _on_path(Path(sys.executable).parent)
        return
    if os.environ.get(ENTERED):
        sys.exit(
            f"{module} or trajlake does not import in {os.environ[ENTERED]}; rebuild that venv "
            f"(remove it, then run scripts/framework-venv.sh {name})"
        )
    script = ROOT / "scripts" / "framework-venv.sh"
    done = subprocess.run([str(script), name], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"could not get the {name} venv ({script} {name} failed):\n{done.stderr[-3000:]}")
    venv = Path(done.stdout.strip().splitlines()[-1])
    os.environ[ENTERED] = str(venv)
    _on_path(venv / "bin")
    python = venv / "bin" / "python"
    os.execv(python, [str(python), str(Path(sys.argv[0]).resolve()), *sys.argv[1:]])
