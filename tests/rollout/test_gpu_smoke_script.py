"""scripts/gpu_smoke_vllm.py runs end to end against the local vLLM-format server (no GPU needed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_smoke_vllm.py"


def test_the_smoke_script_passes_against_a_vllm_format_server(fake_vllm, tmp_path):
    out = tmp_path / "figures.json"
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--base-url",
            fake_vllm.url,
            "--model",
            "tiny",
            "--turns",
            "2",
            "--max-tokens",
            "8",
            "--lake",
            str(tmp_path / "lake"),
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        env={"PATH": "/usr/bin:/bin", "NO_PROXY": "127.0.0.1", "OUT": str(tmp_path)},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(out.read_text())
    assert figures["passed"] is True and figures["vllm_version"] == fake_vllm.vllm_version
    assert figures["turns"] == 6 and figures["sampled_tokens"] == 48
    assert figures["logprob_mean_abs_diff"] < 1e-6
    assert figures["lake_trajectories_checked"] == 3
