"""The demo's warm start: the teacher's transcripts, and a warm-started model reused from the cache."""

from __future__ import annotations

import json
import random
from collections import Counter

from trajlake.demo.envs import EnvConfig, FaultConfig
from trajlake.demo.envs.chat_episode import NUDGE_TEXT
from trajlake.demo.warm_start import STAMP, WarmStartConfig, make_transcripts, warm_start

CHAT_ENV = EnvConfig(
    context_budget_tokens=512, max_new_tokens=48, nudge_threshold=0.25, faults=FaultConfig.none()
)  # room for the test tokenizer's longer encodings; the nudge at 128 tokens: past a call and its answer


def test_the_teachers_transcripts_answer_retry_and_recover_through_the_real_harness(tokenizer):
    config = WarmStartConfig(transcripts=120, wrong_tool_share=0.5, recover_share=0.5, retry_share=0.2)
    data = make_transcripts(tokenizer, config, CHAT_ENV, seed=1)
    texts = [tokenizer.decode(ids) for ids, _ in data]
    shapes = Counter(text.count("<tool_call>") for text in texts)
    assert shapes[2] > 0 and shapes[3] > 0  # a call then the answer; a wrong or malformed call first
    assert any("Malformed tool call" in text for text in texts)
    assert any(NUDGE_TEXT in text for text in texts)  # a recovery runs past 80% of the context
    for ids, mask in data:  # the loss covers the model's own well-formed turns, never the harness's words
        trained = tokenizer.decode([i for i, m in zip(ids, mask, strict=True) if m])
        assert "<tool_call>" in trained and "<tool_response>" not in trained and "user" not in trained


def test_a_warm_started_model_is_reused_from_the_cache_by_a_fresh_lake(model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("TRAJLAKE_CACHE_DIR", str(tmp_path / "cache"))
    config = WarmStartConfig(steps=2, transcripts=8, batch_size=4, warmup_steps=1)
    first = warm_start(model_dir, tmp_path / "lake-1" / "model-warm", config, CHAT_ENV, seed=0)
    again = warm_start(model_dir, tmp_path / "lake-1" / "model-warm", config, CHAT_ENV, seed=0)
    fresh = warm_start(model_dir, tmp_path / "lake-2" / "model-warm", config, CHAT_ENV, seed=0)
    other = warm_start(model_dir, tmp_path / "lake-3" / "model-warm", config, CHAT_ENV, seed=1)
    assert (first["cached"], again["cached"], fresh["cached"], other["cached"]) == (False, True, True, False)
    assert fresh["key"] == first["key"] != other["key"]
    assert fresh["model_dir"] == str((tmp_path / "lake-2" / "model-warm").resolve())
    weights = [(tmp_path / f"lake-{i}" / "model-warm" / "model.safetensors").read_bytes() for i in (1, 2)]
    assert weights[0] == weights[1] != (model_dir / "model.safetensors").read_bytes()
    stamp = json.loads((tmp_path / "cache" / "warm-start" / first["key"] / STAMP).read_text())
    assert stamp["steps"] == 2 and stamp["loss_last"] is not None


def test_a_teacher_plan_is_reproducible():
    from trajlake.demo.envs.tasks import make_task
    from trajlake.demo.envs.toolbox import make_tools
    from trajlake.demo.warm_start import plan_for
    from trajlake.rollout.tools import ToolRunner

    def plans(seed: int) -> list:
        rng = random.Random(seed)
        runner = ToolRunner(make_tools(CHAT_ENV, rng))
        return [plan_for(make_task(i, rng, CHAT_ENV), WarmStartConfig(), rng, runner) for i in range(20)]

    assert plans(4) == plans(4)
