"""New weights into a running vLLM server, without restarting it, labelled with their policy version.

`WeightSync.push(model_dir, version)` uses vLLM's own RL control plane and in-place reload
(the server runs with `VLLM_SERVER_DEV_MODE=1`, as `trajlake vllm up` starts it):

1. `POST /pause?mode=wait` — requests in flight finish on the old weights; new ones queue;
2. `POST /collective_rpc` `reload_weights(weights_path=model_dir)` — every worker loads the
   directory's safetensors in place;
3. `POST /reset_prefix_cache` — cached KV blocks were computed by the old weights;
4. `POST /update_weight_version` — outputs sampled from now on carry `version` in their
   `weight_versions` spans (the generate route), which turns record as their policy version;
5. `POST /resume`.

A checkpoint is checked before the server sees it (every tensor of the serving checkpoint, same
dtype and shape, and the file as long as its header says): vLLM's engine dies on a file it cannot
read. A reload that fails anyway reloads the directory that was serving, resumes, and raises
`WeightUpdateError`: the old version keeps serving, and the caller decides what to do.
On GPUs the same sequence carries NCCL transfers instead of a directory (scripts/gpu_smoke_vllm.py).
"""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path
from typing import Any

import httpx

from trajlake.schemas.errors import TrajlakeError


class WeightUpdateError(TrajlakeError, RuntimeError):
    """The server did not take the new weights; `serving_version` is what it still serves."""

    def __init__(self, message: str, *, serving_version: int | None) -> None:
        super().__init__(message)
        self.serving_version = serving_version


class WeightSync:
    """Pushes model directories into one vLLM server and tracks the version it serves."""

    def __init__(
        self, base_url: str, *, timeout_s: float = 120.0, serving: tuple[Path, int] | None = None
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout_s)
        self.serving_dir, self.version = serving if serving else (None, None)
        self.pushes: list[dict[str, Any]] = []  # per push: version, seconds, ok

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def label(self, version: int) -> None:
        """Name the weights the server holds now (at start: the model directory it loaded)."""
        self._post("/update_weight_version", json={"new_version": str(version)})
        self.version = version

    def push(self, model_dir: str | Path, version: int) -> float:
        """Load `model_dir` into the server as `version`; return the seconds the server was paused."""
        started = time.monotonic()
        self.check(model_dir)
        self._post("/pause", params={"mode": "wait"})
        try:
            try:
                self._reload(Path(model_dir))
            except WeightUpdateError as err:
                if self.serving_dir is not None:
                    self._reload(self.serving_dir)  # a half-applied reload must not keep serving
                self._post("/reset_prefix_cache")
                self.pushes.append({"version": version, "seconds": time.monotonic() - started, "ok": False})
                raise WeightUpdateError(
                    f"{err}; version {self.version} keeps serving", serving_version=self.version
                ) from err
            self._post("/reset_prefix_cache")
            self._post("/update_weight_version", json={"new_version": str(version)})
            self.serving_dir, self.version = Path(model_dir), version
        finally:
            self._post("/resume")
        seconds = time.monotonic() - started
        self.pushes.append({"version": version, "seconds": seconds, "ok": True})
        return seconds

    def check(self, model_dir: str | Path) -> None:
        """Raise `WeightUpdateError` unless `model_dir` is a checkpoint the serving model can load."""
        new = read_safetensors_header(Path(model_dir), self.version)
        if self.serving_dir is None:
            return
        old = read_safetensors_header(self.serving_dir, self.version)
        problems = [f"{name} is missing" for name in sorted(old.keys() - new.keys())]
        problems += [f"{name} is not in the served model" for name in sorted(new.keys() - old.keys())]
        problems += [
            f"{name} is {new[name]['dtype']}{new[name]['shape']}, the served model has {old[name]['dtype']}{old[name]['shape']}"
            for name in sorted(old.keys() & new.keys())
            if (new[name]["dtype"], new[name]["shape"]) != (old[name]["dtype"], old[name]["shape"])
        ]
        if problems:
            raise WeightUpdateError(
                f"{model_dir} does not fit the served model: {'; '.join(problems[:5])}",
                serving_version=self.version,
            )

    def _reload(self, model_dir: Path) -> None:
        response = self._post(
            "/collective_rpc",
            json={"method": "reload_weights", "kwargs": {"weights_path": str(model_dir.resolve())}},
            check=False,
        )
        if response.status_code != 200:
            raise WeightUpdateError(
                f"reloading {model_dir} failed: HTTP {response.status_code} {response.text[:300]}",
                serving_version=self.version,
            )

    def _post(self, path: str, *, check: bool = True, **kwargs: Any) -> httpx.Response:
        try:
            response = self._http.post(path, **kwargs)
        except httpx.TransportError as err:
            raise WeightUpdateError(
                f"the vLLM server at {self.base_url} did not answer {path}: {err}",
                serving_version=self.version,
            ) from err
        if check and response.status_code != 200:
            hint = (
                " (start it with VLLM_SERVER_DEV_MODE=1, as `trajlake vllm up` does)"
                if response.status_code == 404
                else ""
            )
            raise WeightUpdateError(
                f"{path} answered HTTP {response.status_code}{hint}: {response.text[:300]}",
                serving_version=self.version,
            )
        return response

    def served_version(self) -> str:
        """The weight version the server reports (`/weight_info`)."""
        return str(self._http.get("/weight_info").json()["weight_version"])


def read_safetensors_header(model_dir: Path, serving_version: int | None = None) -> dict[str, dict[str, Any]]:
    """Tensor name -> {dtype, shape} of `model_dir/model.safetensors`; raise if the file is unreadable or short."""
    path = model_dir / "model.safetensors"
    try:
        with open(path, "rb") as fh:
            (length,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(length))
            size = fh.seek(0, 2)
    except (OSError, struct.error, ValueError, UnicodeDecodeError) as err:
        raise WeightUpdateError(
            f"{path} is not a readable safetensors file: {err}", serving_version=serving_version
        ) from err
    header.pop("__metadata__", None)
    end = max((int(t["data_offsets"][1]) for t in header.values()), default=0)
    if size < 8 + length + end:
        raise WeightUpdateError(
            f"{path} is truncated ({size} bytes, its header needs {8 + length + end})",
            serving_version=serving_version,
        )
    return {name: {"dtype": t["dtype"], "shape": list(t["shape"])} for name, t in header.items()}
