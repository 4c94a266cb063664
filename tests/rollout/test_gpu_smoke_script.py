"""scripts/gpu_smoke_vllm.py runs end to end against the real vLLM server (the CPU build; no GPU needed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from trajlake.rollout.engine.server import VLLM_VERSION

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_smoke_vllm.py"
pytestmark = pytest.mark.integration


def test_the_smoke_script_passes_against_the_vllm_server(vllm_server, tmp_path):
    out = tmp_path / "figures.json"
    cmd = [sys.executable, str(SCRIPT), "--base-url", vllm_server.url, "--model", str(vllm_server.model_dir)]
    cmd += ["--served-name", vllm_server.name, "--turns", "2", "--max-tokens", "8", "--batch", "4"]
    cmd += ["--lake", str(tmp_path / "lake"), "--json", str(out)]
    env = {"PATH": "/usr/bin:/bin", "NO_PROXY": "127.0.0.1", "OUT": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert figures["passed"] is True and figures["vllm_version"].startswith(VLLM_VERSION)
    assert figures["served_name"] == vllm_server.name and figures["tokenizer_agrees"] is True
    assert figures["turns"] == 6 and 0 < figures["sampled_tokens"] <= 48
    # float32 on CPU: the engine re-scores its own samples, and transformers agrees, within ~1e-6
    assert figures["logprob_mean_abs_diff"] < 1e-4 and figures["hf_logprob_mean_abs_diff"] < 1e-4
    assert figures["output_tok_s"] > 0 and figures["batch_output_tok_s"] > 0
    # the weight update: labelled, in effect, the perturbed weights' logprobs; then the old weights back
    assert figures["weight_transfer"] == "reload" and figures["weight_update_s"] > 0
    assert figures["policy_version_after_update"] == 1 and figures["served_version_after_update"] == "1"
    assert figures["hf_logprob_mean_abs_diff_after_update"] < 1e-4
    assert figures["logprob_change_after_update"] > 1e-3
    assert figures["restored_version"] == "0"
    assert httpx.get(f"{vllm_server.url}/weight_info", timeout=10).json()["weight_version"] == "0"
    # the lake: three conversations at version 0 and one turn sampled after the update
    assert figures["lake_trajectories_checked"] == 4 and figures["lake_policy_versions"] == [0, 1]
