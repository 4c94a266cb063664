#!/usr/bin/env python
"""GPU smoke test: TitoClient against a real vLLM server with a small model.

    python scripts/gpu_smoke_vllm.py --model Qwen/Qwen3-0.6B            # starts `vllm serve` itself
    python scripts/gpu_smoke_vllm.py --base-url http://127.0.0.1:8000 --model Qwen/Qwen3-0.6B

It runs a few multi-turn episodes token-in-token-out and asserts, for each turn:
- the server echoes exactly the prompt ids sent (`prompt_token_ids`: nothing re-tokenised);
- one finite logprob <= 0 per sampled id, ids below the vocab size;
- the next turn's input extends the previous input + output (the prefix invariant), so the
  Recorder reports no drift;
- re-scoring the sampled ids with `prompt_logprobs` gives the sampled logprobs back: mean
  absolute difference below 0.03 (DESIGN.md's healthy train/inference mismatch).
Needs `pip install -e .` (trajlake) and vLLM >= 0.10.2 with the model available locally.
With `--lake DIR` the episodes are also recorded into a lake and read back with SQL.
It prints the figures as JSON (and writes them with `--json PATH`). Exit code 0 = pass.
Text is only tokenised for the first prompt and for the tool outputs the environment appends
(via the server's /tokenize), never for anything the model sampled.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

try:
    from trajlake.rollout.config import RetryConfig, TitoConfig
    from trajlake.rollout.tito import TitoClient
except ImportError:
    sys.exit("trajlake is not installed here: run `pip install -e .` in the repository root first")

TASKS = [
    "What is 17 * 23? Think step by step.",
    "Name three prime numbers above 100.",
    "Write a haiku about GPUs.",
]
TOOL_OUTPUT = "\n[tool] The calculator returned 391.\n"


def start_server(model: str, port: int, max_model_len: int, log: Path) -> subprocess.Popen:
    exe = shutil.which("vllm")
    cmd = [exe, "serve"] if exe else [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model"]
    cmd += [
        model,
        "--port",
        str(port),
        "--max-model-len",
        str(max_model_len),
        "--gpu-memory-utilization",
        "0.5",
        "--max-logprobs",
        "5",
        "--enforce-eager",
    ]
    print("starting:", " ".join(cmd), file=sys.stderr)
    return subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)


def wait_ready(base_url: str, timeout_s: float, proc: subprocess.Popen | None, log: Path) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if proc is not None and proc.poll() is not None:
            sys.exit(
                f"vllm exited with {proc.returncode}; last log lines:\n"
                + "\n".join(log.read_text().splitlines()[-30:])
            )
        try:
            if httpx.get(f"{base_url}/v1/models", timeout=2).status_code == 200:
                return time.monotonic() - start
        except httpx.TransportError:
            pass
        time.sleep(2)
    sys.exit(f"vllm not ready after {timeout_s}s")


def tokenize(base_url: str, model: str, text: str, special: bool) -> list[int]:
    r = httpx.post(
        f"{base_url}/tokenize",
        json={"model": model, "prompt": text, "add_special_tokens": special},
        timeout=30,
    )
    r.raise_for_status()
    return r.json()["tokens"]


def rescore(base_url: str, model: str, prefix: list[int], sampled: list[int]) -> list[float]:
    """Logprobs of `sampled` after `prefix`, as the engine scores them (prompt_logprobs)."""
    body = {
        "model": model,
        "prompt": prefix + sampled,
        "max_tokens": 1,
        "prompt_logprobs": 0,
        "temperature": 0,
    }
    r = httpx.post(f"{base_url}/v1/completions", json=body, timeout=120)
    r.raise_for_status()
    entries = r.json()["choices"][0]["prompt_logprobs"][len(prefix) :]
    return [float(entry[str(tok)]["logprob"]) for entry, tok in zip(entries, sampled, strict=True)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=os.environ.get("TRAJLAKE_SMOKE_MODEL", "Qwen/Qwen3-0.6B"))
    ap.add_argument("--base-url", default=None, help="use a running server instead of starting one")
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--startup-timeout-s", type=float, default=420)
    ap.add_argument(
        "--lake", default=None, help="also record the episodes into this lake and check them with SQL"
    )
    ap.add_argument("--json", default=None, metavar="PATH", help="write the figures here")
    args = ap.parse_args()

    proc = None
    log = Path(os.environ.get("OUT", "/tmp")) / "vllm-serve.log"
    base_url = args.base_url or f"http://127.0.0.1:{args.port}"
    if args.base_url is None:
        proc = start_server(args.model, args.port, args.max_model_len, log)
    figures: dict[str, object] = {"model": args.model}
    try:
        figures["startup_s"] = round(wait_ready(base_url, args.startup_timeout_s, proc, log), 1)
        version = httpx.get(f"{base_url}/version", timeout=5)
        figures["vllm_version"] = version.json().get("version") if version.status_code == 200 else None
        client = TitoClient(
            TitoConfig(base_url=base_url, model=args.model, timeout_s=120, retry=RetryConfig(max_attempts=3))
        )
        recorder = lake = None
        if args.lake:
            from trajlake.ingest.bus.inprocess import InProcessBus
            from trajlake.ingest.sink import DeltaSink
            from trajlake.rollout.recorder import Recorder
            from trajlake.store.lake import Lake

            bus, lake = InProcessBus(), Lake(args.lake)
            recorder = Recorder(bus, run_id="gpu-smoke")
        diffs: list[float] = []
        n_tokens = latency = 0.0
        sent_outputs: dict[str, list[int]] = {}
        tool_ids = tokenize(base_url, args.model, TOOL_OUTPUT, special=False)
        for k, task in enumerate(TASKS):
            history = tokenize(base_url, args.model, task, special=True)
            traj = (
                recorder.start(f"smoke-{k}", context_budget_tokens=args.max_model_len) if recorder else None
            )
            full: list[int] = []
            for turn in range(args.turns):
                done = client.complete(history, max_tokens=args.max_tokens, temperature=1.0, seed=1234 + k)
                assert done.raw["choices"][0].get("prompt_token_ids") in (None, history), (
                    "the server re-tokenised the prompt"
                )
                assert len(done.output_token_ids) == len(done.output_logprobs) > 0
                assert all(math.isfinite(v) and v <= 0 for v in done.output_logprobs)
                exact = rescore(base_url, args.model, history, done.output_token_ids)
                diffs.extend(abs(a - b) for a, b in zip(exact, done.output_logprobs, strict=True))
                n_tokens += len(done.output_token_ids)
                latency += done.latency_s
                if traj is not None:
                    assert not done.record(traj, policy_version=0), "TITO drift on an extended prefix"
                full = history + done.output_token_ids
                history = full + tool_ids  # the environment appends ids; nothing sampled is re-encoded
                print(
                    f"task {k} turn {turn}: {len(done.output_token_ids)} ids, finish={done.finish_reason}",
                    file=sys.stderr,
                )
            if traj is not None:
                traj.reward(1.0, verifier="smoke")
                traj.finish("completed")
                sent_outputs[traj.trajectory_id] = full
        mean_diff = statistics.fmean(diffs)
        figures.update(
            turns=len(TASKS) * args.turns,
            sampled_tokens=int(n_tokens),
            tokens_per_s=round(n_tokens / latency, 1),
            logprob_mean_abs_diff=round(mean_diff, 5),
            logprob_max_abs_diff=round(max(diffs), 5),
        )
        assert mean_diff < 0.03, (
            f"sampled vs re-scored logprobs differ by {mean_diff:.4f} on average (>= 0.03)"
        )
        if lake is not None:
            DeltaSink(lake, bus).run(until_idle_s=0.0)
            rows = lake.sql(
                "select trajectory_id, token_ids, tito_drift from trajectories where run_id = 'gpu-smoke'"
            ).to_pylist()
            for row in rows:
                assert row["token_ids"] == sent_outputs[row["trajectory_id"]], (
                    "stored ids differ from the engine's"
                )
                assert not row["tito_drift"]
            figures["lake_trajectories_checked"] = len(rows)
        figures["passed"] = True
    finally:
        if proc is not None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
    print(json.dumps(figures, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
