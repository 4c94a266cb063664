#!/usr/bin/env bash
# Ensure the project's virtualenv exists and holds this checkout; print its path.
#
# The venv lives outside the checkout, keyed on what it installs (pyproject's Python version and
# dependencies, nothing else), so a new clone (CI clones afresh every run) or an edit to pytest's
# settings reuses it instead of reinstalling torch, ray and the rest.
set -euo pipefail
cd "$(dirname "$0")/.."
hash=$(python3 - <<'PY'
import hashlib, json, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
keys = ("requires-python", "dependencies", "optional-dependencies")
print(hashlib.sha256(json.dumps([project.get(k) for k in keys], sort_keys=True).encode()).hexdigest()[:16])
PY
)
venv=${TRAJLAKE_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/trajlake/venv-$hash}
if [ ! -f "$venv/.complete" ]; then
  echo "creating $venv (first run for these dependencies: several minutes)" >&2
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q -U pip setuptools wheel >&2
  "$venv/bin/pip" install -q -e ".[all,dev]" >&2
  touch "$venv/.complete"
else
  # point the editable install at this checkout (cheap: no dependency is resolved)
  "$venv/bin/pip" install -q --no-deps --no-build-isolation -e . >&2
fi
echo "$venv"
