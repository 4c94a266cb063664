#!/usr/bin/env bash
# The test command: install what the tests need, start PostgreSQL and Apache Kafka, run pytest.
#
#   scripts/test.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
venv=$(scripts/venv.sh)
export PATH="$venv/bin:$PATH"

# Debian's Chromium and its driver, for the dashboard's browser test
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
  echo "installing chromium + chromium-driver (apt)" >&2
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver) >&2
fi

state=$(mktemp -d "${TMPDIR:-/tmp}/trajlake-test.XXXXXX")
chmod 755 "$state"
cleanup() { scripts/services.sh down "$venv" "$state" || true; rm -rf "$state"; }
trap cleanup EXIT
eval "$(scripts/services.sh up "$venv" "$state")"

export RAY_USAGE_STATS_ENABLED=0 PYTHONDONTWRITEBYTECODE=1
status=0
"$venv/bin/python" -m pytest -p no:cacheprovider "$@" || status=$?
if [ "$status" = 5 ]; then echo "pytest collected no tests: that is a failure" >&2; fi
exit "$status"
