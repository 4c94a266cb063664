#!/usr/bin/env bash
# Build SeaweedFS's `weed` (the project's S3 server) once and print its path.
#
# The recipe and its pinned version live in one place, trajlake.store.seaweedfs_build (which
# `trajlake s3 up` uses too): the module's source alone from the Go module proxy, `go build` in a
# copy of it, the binary renamed into ${TRAJLAKE_CACHE_DIR:-~/.cache/trajlake}/seaweedfs/<version>/
# once complete. Minutes the first time (Go 1.21+ needed), then instant.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=$(scripts/venv.sh)
"$venv/bin/trajlake" s3 build
