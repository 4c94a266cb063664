#!/usr/bin/env bash
# Start (or stop) the real servers the integration tests use: PostgreSQL, Apache Kafka, SeaweedFS (S3)
# and vLLM.
#
#   eval "$(scripts/services.sh up VENV STATE_DIR)"   # exports TRAJLAKE_TEST_POSTGRES_URL, TRAJLAKE_TEST_KAFKA_BOOTSTRAP,
#                                                     # TRAJLAKE_TEST_S3_DATA_DIR, TRAJLAKE_TEST_VLLM_* (a tiny
#                                                     # model served by vLLM on CPU)
#   scripts/services.sh down VENV STATE_DIR
set -euo pipefail
action=$1 venv=$2 state=$3

free_port() { "$venv/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

if [ "$action" = up ]; then
  mkdir -p "$state"
  # PostgreSQL (initdb + pg_ctl, as the postgres user when run as root): trajlake.store.postgres_server
  rm -rf "$state/postgres"
  pg_url=$("$venv/bin/python" -c 'import sys; from pathlib import Path; from trajlake.store.postgres_server import start_postgres; print(start_postgres(Path(sys.argv[1]), int(sys.argv[2])))' "$state/postgres" "$(free_port)")
  echo "export TRAJLAKE_TEST_POSTGRES_URL=$pg_url"
  echo "export TRAJLAKE_TEST_PG_DATA=$state/postgres/data"

  kafka_port=$(free_port)
  "$venv/bin/trajlake" kafka up --port "$kafka_port" --data-dir "$state/kafka" >&2
  echo "export TRAJLAKE_TEST_KAFKA_BOOTSTRAP=127.0.0.1:$kafka_port"

  # SeaweedFS, built from source with Go the first time (minutes; cached outside the checkout)
  "$venv/bin/trajlake" s3 up --port "$(free_port)" --data-dir "$state/s3" --bucket "" >/dev/null
  echo "export TRAJLAKE_TEST_S3_DATA_DIR=$state/s3"

  # vLLM in its own cached venv (installed on first use), serving a tiny model built here
  model_dir="$state/vllm-model"
  "$venv/bin/trajlake" model init "$model_dir" >&2
  vllm_port=$(free_port)
  "$venv/bin/trajlake" vllm up --model "$model_dir" --name tiny --port "$vllm_port" --state-dir "$state/vllm" >&2
  echo "export TRAJLAKE_TEST_VLLM_URL=http://127.0.0.1:$vllm_port"
  echo "export TRAJLAKE_TEST_VLLM_PORT=$vllm_port"
  echo "export TRAJLAKE_TEST_VLLM_MODEL_DIR=$model_dir"
  echo "export TRAJLAKE_TEST_VLLM_STATE_DIR=$state/vllm"
else
  "$venv/bin/trajlake" vllm down --state-dir "$state/vllm" >&2 || true
  "$venv/bin/trajlake" kafka down --data-dir "$state/kafka" >&2 || true
  "$venv/bin/trajlake" s3 down --data-dir "$state/s3" >&2 || true
  "$venv/bin/python" -c 'import sys; from trajlake.store.postgres_server import stop_postgres; stop_postgres(sys.argv[1], "immediate")' "$state/postgres" >&2 || true
fi
