#!/usr/bin/env bash
# Set up (once; cached outside the checkout) and run the main job on the embedded default.
#   scripts/demo.sh [trajlake demo options]
set -euo pipefail
cd "$(dirname "$0")/.."
venv=$(scripts/venv.sh)
exec "$venv/bin/trajlake" demo "$@"
