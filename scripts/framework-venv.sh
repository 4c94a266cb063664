#!/usr/bin/env bash
# Ensure the venv of one RL framework exists (its Python, the framework pinned, trajlake
# installed into it from this checkout); print its path.
#
#   scripts/framework-venv.sh NAME        # NAME: a table of scripts/frameworks.toml
#
# Like scripts/venv.sh, the venv lives outside the checkout, keyed on what it installs (the
# framework's entry and trajlake's own Python requirement and dependencies), so a new clone
# reuses it; a later call only re-points trajlake's editable install at this checkout.
# The interpreter: TRAJLAKE_PYTHON_<MAJOR><MINOR> (e.g. TRAJLAKE_PYTHON_312), else pythonX.Y on
# PATH, else pyenv's newest X.Y.*, else uv's (`uv python install X.Y` when it has none).
set -euo pipefail
cd "$(dirname "$0")/.."
name=${1:?usage: scripts/framework-venv.sh NAME (a table of scripts/frameworks.toml)}
spec=$(python3 - "$name" <<'PY'
import hashlib, json, sys, tomllib
name = sys.argv[1]
frameworks = tomllib.load(open("scripts/frameworks.toml", "rb"))
if name not in frameworks:
    sys.exit(f"unknown framework {name!r}; scripts/frameworks.toml has: {', '.join(sorted(frameworks))}")
entry = frameworks[name]
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
key = [name, entry["python"], entry["packages"], project.get("requires-python"), project.get("dependencies")]
print(hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12], entry["python"], *entry["packages"])
PY
)
read -r hash version packages <<<"$spec"
cache=${TRAJLAKE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/trajlake}
venv=$cache/fw-$name-$hash

find_python() {
  local v=$1 var="TRAJLAKE_PYTHON_${1//./}" p
  if [ -n "${!var:-}" ]; then echo "${!var}"; return; fi
  if p=$(command -v "python$v") && "$p" -c '' 2>/dev/null; then echo "$p"; return; fi
  if command -v pyenv >/dev/null; then
    p=$(ls -d "$(pyenv root)/versions/$v".*/bin/"python$v" 2>/dev/null | sort -V | tail -1 || true)
    if [ -n "$p" ]; then echo "$p"; return; fi
  fi
  if command -v uv >/dev/null; then  # uv is in the project venv (the vllm extra); it may download $v
    if p=$(uv python find "$v" 2>/dev/null) || { uv python install "$v" >&2 && p=$(uv python find "$v"); }; then
      echo "$p"; return
    fi
  fi
  echo "no Python $v found for $name: install it (pyenv install $v, or uv python install $v) or set $var" >&2
  return 1
}

mkdir -p "$cache"
exec 9>"$venv.lock"
flock 9  # several test sessions may build the same venv at once
if [ ! -f "$venv/.complete" ]; then
  python=$(find_python "$version")
  echo "creating $venv ($packages on Python $version; first run for this pin)" >&2
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/pip" install -q -U pip "setuptools>=77" wheel >&2
  # shellcheck disable=SC2086  # the packages are separate words
  "$venv/bin/pip" install -q $packages -e . >&2
  echo "$packages" >"$venv/.complete"
else
  "$venv/bin/pip" install -q --no-deps --no-build-isolation -e . >&2
fi
echo "$venv"
