#!/usr/bin/env bash
# The test command: install what the tests need, start PostgreSQL and Apache Kafka, run pytest.
#
#   scripts/test.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
venv=$(scripts/venv.sh)
export PATH="$venv/bin:$PATH"

# System packages the tests need, installed once on a new machine: Debian's Chromium and its
# driver (dashboard browser test), PostgreSQL (catalog), a JRE and Maven (the Kafka broker), tmux
# (Harbor's terminus-2 agent).
missing=()
command -v chromium >/dev/null || missing+=(chromium)
command -v chromedriver >/dev/null || missing+=(chromium-driver)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing+=(postgresql)
command -v java >/dev/null || missing+=(default-jre-headless)
command -v mvn >/dev/null || missing+=(maven)
command -v tmux >/dev/null || missing+=(tmux)
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing ${missing[*]} (apt)" >&2
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}") >&2
fi

# one venv per RL framework whose adapter tests run its real server (scripts/frameworks.toml):
# built once, then cached outside the checkout like the project's venv
for framework in $(python3 -c 'import tomllib; print(*tomllib.load(open("scripts/frameworks.toml", "rb")))'); do
  scripts/framework-venv.sh "$framework" >/dev/null
done

state=$(mktemp -d "${TMPDIR:-/tmp}/trajlake-test.XXXXXX")
chmod 755 "$state"
cleanup() { scripts/services.sh down "$venv" "$state" || true; rm -rf "$state"; }
trap cleanup EXIT
eval "$(scripts/services.sh up "$venv" "$state")"

export RAY_USAGE_STATS_ENABLED=0 PYTHONDONTWRITEBYTECODE=1
# the docs site: a broken link, a missing page or an API docstring that does not resolve fails here
# (`python -m`: run from bin/, mkdocstrings would take bin/trajlake, the console script, for the package)
NO_MKDOCS_2_WARNING=1 "$venv/bin/python" -m mkdocs build --strict --quiet --site-dir "$state/site"
status=0
# every test (-m "" over tests/conftest.py's unit-tests-only default for a bare pytest), in one
# process (-n 0 over pyproject's worker per core): the integration tests share these servers
"$venv/bin/python" -m pytest -p no:cacheprovider -n 0 -m "" "$@" || status=$?
if [ "$status" = 5 ]; then echo "pytest collected no tests: that is a failure" >&2; fi
exit "$status"
