#!/usr/bin/env bash
# Start (or stop) the real servers the integration tests use: PostgreSQL, Apache Kafka and vLLM.
#
#   eval "$(scripts/services.sh up VENV STATE_DIR)"   # exports TRAJLAKE_TEST_POSTGRES_URL, TRAJLAKE_KAFKA_BOOTSTRAP,
#                                                     # TRAJLAKE_TEST_VLLM_* (a tiny model served by vLLM on CPU)
#   scripts/services.sh down VENV STATE_DIR
set -euo pipefail
action=$1 venv=$2 state=$3
pg_bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)

free_port() { "$venv/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

as_postgres() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

if [ "$action" = up ]; then
  mkdir -p "$state"
  if [ -z "$pg_bin" ]; then
    echo "PostgreSQL is not installed: run scripts/test.sh, which installs it (apt package postgresql)" >&2
    exit 1
  fi
  pg_port=$(free_port)
  pg_dir="$state/postgres"
  rm -rf "$pg_dir" && mkdir -p "$pg_dir"
  if [ "$(id -u)" = 0 ]; then chown postgres "$pg_dir"; chmod 700 "$pg_dir"; fi
  as_postgres "$pg_bin/initdb" -D "$pg_dir/data" -U postgres -A trust --no-sync >/dev/null
  as_postgres "$pg_bin/pg_ctl" -D "$pg_dir/data" -l "$pg_dir/log" -w \
    -o "-c listen_addresses=127.0.0.1 -p $pg_port -k $pg_dir -c fsync=off -c max_connections=200" start >&2
  echo "export TRAJLAKE_TEST_POSTGRES_URL=postgresql+psycopg://postgres@127.0.0.1:$pg_port/postgres"
  echo "export TRAJLAKE_TEST_PG_DATA=$pg_dir/data"

  kafka_port=$(free_port)
  "$venv/bin/trajlake" kafka up --port "$kafka_port" --data-dir "$state/kafka" >&2
  echo "export TRAJLAKE_KAFKA_BOOTSTRAP=127.0.0.1:$kafka_port"

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
  if [ -n "$pg_bin" ] && [ -d "$state/postgres/data" ]; then
    as_postgres "$pg_bin/pg_ctl" -D "$state/postgres/data" -m immediate stop >&2 || true
  fi
fi
