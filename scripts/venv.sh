#!/usr/bin/env bash
# Ensure the project's virtualenv exists and holds this checkout; print its path.
#
# The venv lives outside the checkout, keyed on the hash of pyproject.toml, so a new clone
# (CI clones afresh every run) reuses it instead of reinstalling torch, ray and the rest.
set -euo pipefail
cd "$(dirname "$0")/.."
hash=$(sha256sum pyproject.toml | cut -c1-16)
venv=${TRAJLAKE_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/trajlake/venv-$hash}
if [ ! -f "$venv/.complete" ]; then
  echo "creating $venv (first run for this pyproject.toml: several minutes)" >&2
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
