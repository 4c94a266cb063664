"""Agent Lightning 1.0 rollouts against a vLLM server, recorded into a trajlake lake.

    python examples/agent_lightning/run.py --lake ./trajlake-data --vllm-url http://127.0.0.1:8000

What it does, top to bottom:
1. re-runs itself in the Agent Lightning venv (`examples/framework_venv.py`, the one way every
   example finds its venv: scripts/framework-venv.sh agent-lightning, Python 3.12, agentlightning
   1.0.2 pinned, trajlake installed) unless agentlightning and trajlake import here;
2. starts an Agent Lightning server and registers the vLLM server as its upstream (at
   `--policy-version`), unless --agl-server names a running one: that server's registration is
   the user's (its model version included) and is left as it is;
3. runs a tiny arithmetic agent: each rollout asks one question through AGL's model proxy
   (train mode: token ids and logprobs on), scores the answer, posts the reward and marks the
   rollout succeeded, as an AGL runner does;
4. runs trajlake's poller (`trajlake import agent-lightning --server URL`, here in-process), then
   prints what the lake stored: each trajectory's status, reward and tokens as the lake counts
   them. It exits 1 when no rollout finished without a system failure. Each run makes new
   rollouts; importing one server twice stores each once.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/: framework_venv
from framework_venv import enter

QUESTIONS = [("What is 2 + 3?", "5"), ("What is 7 - 4?", "3"), ("What is 3 * 3?", "9")]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lake", required=True, help="lake root")
    parser.add_argument("--vllm-url", required=True, help="vLLM server root (without /v1)")
    parser.add_argument(
        "--agl-server", help="a running Agent Lightning server, its upstream registered (default: start one)"
    )
    parser.add_argument("--run-id", default="agl-example", help="run id of the trajectories")
    parser.add_argument("--samples", type=int, default=4, help="rollouts per question")
    parser.add_argument(
        "--policy-version", type=int, default=0,
        help="the model version registered on the server this example starts (ignored with --agl-server)",
    )  # fmt: skip
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    enter("agent-lightning", "agentlightning")
    from trajlake.ingest import shutdown

    return shutdown.run(lambda: run(args), "examples/agent_lightning")


@contextlib.contextmanager
def agl_server(url: str | None, model: str) -> Iterator[str]:
    """A running Agent Lightning server: `url`, or one started here (this venv's) whose proxy serves `model`."""
    import httpx

    if url:
        yield url.rstrip("/")
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="agl-") as workdir:
        cmd = [sys.executable, "-m", "agentlightning.server", f"port={port}", "host=127.0.0.1",
               f"default_proxy.model_name={model}", f"hydra.run.dir={workdir}", "hydra.output_subdir=null"]  # fmt: skip
        log = Path(workdir) / "server.log"
        with log.open("w") as out:
            proc = subprocess.Popen(cmd, cwd=workdir, stdout=out, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 120
            while not _healthy(httpx, url):
                if proc.poll() is not None or time.monotonic() > deadline:
                    sys.exit(f"the Agent Lightning server did not start:\n{log.read_text()[-3000:]}")
                time.sleep(0.1)
            yield url
        finally:
            proc.terminate()
            proc.wait(timeout=10)


def _healthy(httpx: Any, url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def run_rollouts(agl: Any, samples: int, server: str, vllm_url: str, model: str) -> list[str]:
    """The agent: one proxied chat call per rollout, a reward, succeeded. Returns the rollout ids."""
    done = []
    for data_id, (question, answer) in enumerate(QUESTIONS):
        for sample in range(samples):
            rid = uuid.uuid4().hex
            body = [{"input": {"data_id": f"q{data_id}", "question": question}, "rollout_id": rid,
                     "metadata": {"sample_idx_in_batch": sample}}]  # fmt: skip
            agl.post("/api/rollouts", json=body).raise_for_status()
            agl.patch(f"/api/rollouts/{rid}", json={"status": {"state": "running", "last_attempt_id": "0"}})
            done.append(rid)
            proxy = f"/proxy/rollout/{rid}/attempt/0/mode/train/openai/v1/chat/completions"
            reply = agl.post(
                proxy, json={"messages": [{"role": "user", "content": question}], "max_tokens": 16}
            )
            if reply.status_code == 503 and "No servers available" in reply.text:
                agl.patch(
                    f"/api/rollouts/{rid}", json={"status": {"state": "failed", "error_message": reply.text}}
                )
                sys.exit(
                    f"the Agent Lightning server at {server} has no model server registered for its "
                    f"default_proxy.model_name ({reply.json().get('detail')}); register your vLLM there with the "
                    f"policy version it serves, e.g. curl -X POST {server}/api/models -H 'content-type: "
                    f'application/json\' -d \'[{{"model": "{model}", "endpoint": "{vllm_url}/v1", '
                    '"version": 0}]\''
                )
            if reply.status_code != 200:  # the engine failed the call: the rollout failed
                agl.patch(
                    f"/api/rollouts/{rid}", json={"status": {"state": "failed", "error_message": reply.text}}
                )
                continue
            text = reply.json()["choices"][0]["message"]["content"] or ""
            reward = 1.0 if re.search(rf"\b{answer}\b", text) else 0.0
            event = {"event_type": "reward", "data": {"value": reward, "source": "agent"}}
            agl.post(f"/api/rollouts/{rid}/attempt/0/events", json=event).raise_for_status()
            agl.patch(f"/api/rollouts/{rid}", json={"status": {"state": "succeeded"}}).raise_for_status()
    return done


def run(args: argparse.Namespace) -> int:
    import httpx

    from trajlake.rollout.adapters.agent_lightning import import_agent_lightning
    from trajlake.rollout.adapters.stored import StoredTrajectories
    from trajlake.rollout.config import AgentLightningSettings
    from trajlake.store.lake import Lake

    vllm_url = args.vllm_url.rstrip("/")
    model = httpx.get(f"{vllm_url}/v1/models", timeout=10).json()["data"][0]["id"]
    producer_id = f"agl-example-{uuid.uuid4().hex[:8]}"  # what this run stored, read back below
    with agl_server(args.agl_server, model) as url, httpx.Client(base_url=url, timeout=120) as agl:
        if not args.agl_server:
            # AGL's proxy sends every call to its `default_proxy.model_name`, served by the upstreams
            # registered under that name; a server the user runs keeps the registration they made
            upstream = [{"model": model, "endpoint": f"{vllm_url}/v1", "version": args.policy_version}]
            agl.post("/api/models", json=upstream).raise_for_status()
        started = time.monotonic()
        rollouts = run_rollouts(agl, args.samples, url, vllm_url, model)
        rolled = time.monotonic()
        lake = Lake(args.lake)
        report = import_agent_lightning(
            lake, AgentLightningSettings(server=url), args.run_id, producer_id=producer_id
        )
        imported = time.monotonic()
    stored = StoredTrajectories.read(lake, args.run_id, producer_id)
    lake.close()
    print(
        f"{len(rollouts)} rollouts through Agent Lightning in {rolled - started:.1f} s; imported "
        f"{report.trajectories} trajectories ({report.turns} turns) in {imported - rolled:.1f} s; "
        f"{report.dead_letters} dead letters"
    )
    print(stored.render())
    return stored.exit_code(report.dead_letters)


if __name__ == "__main__":
    sys.exit(main())
