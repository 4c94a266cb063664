"""The demo's warm start: a short supervised run that teaches the tiny model to write its tool calls.

A randomly initialised model never writes `<tool_call>{...}</tool_call>`, and RL from there
would take hours on two cores. So `trajlake demo` first trains it on synthetic transcripts in
its own chat template, each a real `ChatEpisode` of the demo environment played by a `Teacher`
that writes what a model should (the right tool, its argument copied from the task, then the
`answer` call), with the real harness in between: the tool runner's results and errors, the
truncation, the nudge. A share of the teacher's episodes first call the wrong tool, get that
tool's real error and either answer anyway for reward 0 (the mistake RL then removes) or call
the right tool before answering (a recovery long enough for the 80% context nudge to fire). Another share
first write a malformed call (left out of the loss), read the runner's error, and write the
call again: the retry turn. The loss covers the assistant tokens of the trained turns only.

Copying an argument from the task is what takes the steps: the model learns it abruptly, after
~200 steps at lr 1.5e-3 (greedy: 52% of calls exact at step 200, 99% at 250; sampled at
temperature 1 after 300 steps: 62% right tool, 54% right tool with exact arguments, 2% malformed).
At 3e-3 the jump came after 400-500 steps, at 6e-3 not within 400.

The shares set what RL has left to fix, so they decide whether the demo's run shows learning.
With 40% wrong-tool transcripts, half of them recovering (20% answering wrong), the async run
rose by 0.07-0.16 (first fifth of versions to last, 60 steps; eleven runs) and fell short of the
demo's +0.1 bar in three: it starts near 0.65, and argument copying at temperature 1 caps it
near 0.8. With 50%, 30% of them recovering (35% answering wrong), it rose 0.46 -> 0.68 (t = 6.3);
with 60%/35%, 0.50 -> 0.72 (t = 7.1), but longer recoveries slowed each step by a third.

The warm-started model is a model directory of its own (`<lake>/model-warm` by default), keyed
by the base model, these settings and the harness's words, so a rerun reuses it; a copy is kept
under `~/.cache/trajlake/warm-start/<key>` (`TRAJLAKE_CACHE_DIR`), so a demo on a fresh lake
reuses it too (`trajlake model init` is seeded: the same base model, the same key).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from trajlake.common.settings import cache_dir
from trajlake.demo.envs.config import EnvConfig, FaultConfig
from trajlake.demo.envs.tasks import TOOL_FOR_KIND, Task, make_task
from trajlake.rollout.engine.chatml import IM_END, tool_call_text

STAMP = "trajlake-warm-start.json"
"""The file in a warm-started model directory that says what made it (and its cache key)."""


class WarmStartConfig(BaseModel):
    """The supervised warm start of the demo's chat model (env TRAJLAKE_DEMO_WARM_START__<FIELD>)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    steps: int = Field(
        300, ge=0, description="Optimizer steps (0: no warm start; RL starts from the model as it is)."
    )
    transcripts: int = Field(3000, ge=1, description="Synthetic transcripts to train on.")
    batch_size: int = Field(32, ge=1, description="Transcripts per step.")
    lr: float = Field(
        1.5e-3, gt=0, description="Peak AdamW learning rate (linear warmup, cosine decay to 0)."
    )
    warmup_steps: int = Field(20, ge=0, description="Steps of linear warmup.")
    wrong_tool_share: float = Field(
        0.5,
        ge=0,
        le=1,
        description="Transcripts that call the wrong tool first, then answer anyway (reward 0).",
    )
    recover_share: float = Field(
        0.3,
        ge=0,
        le=1,
        description="Of the wrong-tool transcripts, those that then call the right tool before answering "
        "(the long turn the 80% context nudge fires on).",
    )
    retry_share: float = Field(
        0.1,
        ge=0,
        le=1,
        description="Transcripts that write a malformed call first (not trained on), then retry.",
    )

    @model_validator(mode="after")
    def _shares(self) -> WarmStartConfig:
        if self.wrong_tool_share + self.retry_share > 1:
            raise ValueError(
                f"wrong_tool_share + retry_share must be <= 1 (got {self.wrong_tool_share} + {self.retry_share})"
            )
        return self


@dataclass
class Teacher:
    """A chat policy that writes the turns of a planned transcript (what a `ChatEpisode` samples from)."""

    tokenizer: Any
    plan: list[tuple[str, bool]]  # each turn's text and whether the loss covers it
    spans: list[tuple[int, int, bool]] = field(default_factory=list)  # (start, length, trained) per turn
    fallback_version: int = 0

    @property
    def episode_type(self) -> type:
        """`run_episode` plays a `ChatEpisode` with this policy."""
        from trajlake.demo.envs.chat_episode import ChatEpisode

        return ChatEpisode

    def sample(self, prompt_ids: list[int], max_new_tokens: int) -> Any:
        """The plan's next turn, encoded as the tokenizer would (ending at <|im_end|>)."""
        from trajlake.rollout.tito import Completion

        text, trained = self.plan[min(len(self.spans), len(self.plan) - 1)]
        ids = self.tokenizer.encode(text + IM_END, add_special_tokens=False)[:max_new_tokens]
        self.spans.append((len(prompt_ids), len(ids), trained))
        return Completion(list(prompt_ids), ids, [0.0] * len(ids), "stop")


def corrupt(call: str, rng: random.Random, runner: Any) -> str:
    """`call` with one character of its JSON deleted, such that the runner rejects it as malformed."""
    from trajlake.rollout.engine.chat import parse_tool_calls
    from trajlake.rollout.tools import MalformedCall

    body = parse_tool_calls(call)[0].raw
    for _ in range(100):
        i = rng.choice([i for i, c in enumerate(body) if c in '{}":,'])
        broken = body[:i] + body[i + 1 :]
        try:
            runner.parse(broken)
        except MalformedCall:
            return call.replace(body, broken)
    raise AssertionError(f"no deletion makes {call!r} malformed")


def plan_for(task: Task, config: WarmStartConfig, rng: random.Random, runner: Any) -> list[tuple[str, bool]]:
    """The teacher's turns for `task`: right call then answer; or a wrong call first; or a malformed one."""
    from trajlake.demo.envs.toolbox import call_arguments

    right = tool_call_text(**call_arguments(task.tool, task))  # type: ignore[arg-type]
    answer = tool_call_text("answer")
    draw = rng.random()
    if draw < config.wrong_tool_share:
        wrong = next(t for t in sorted(set(TOOL_FOR_KIND.values())) if t != task.tool)
        recover = [(right, True)] if rng.random() < config.recover_share else []
        return [(tool_call_text(**call_arguments(wrong, task)), True), *recover, (answer, True)]  # type: ignore[arg-type]
    if draw < config.wrong_tool_share + config.retry_share:
        return [(corrupt(right, rng, runner), False), (right, True), (answer, True)]
    return [(right, True), (answer, True)]


def make_transcripts(
    tokenizer: Any, config: WarmStartConfig, env: EnvConfig, seed: int
) -> list[tuple[list[int], list[bool]]]:
    """(token ids, loss mask) of `config.transcripts` teacher episodes, played through the real harness."""
    from trajlake.demo.envs.episode import run_episode
    from trajlake.demo.envs.toolbox import make_tools
    from trajlake.ingest.recorder import Recorder
    from trajlake.rollout.tools import ToolRunner
    from trajlake.rollout.workers import CollectingBus

    env = env.model_copy(update={"faults": FaultConfig.none(), "tool_latency_s": 0.0})
    rng = random.Random(seed)
    checker = ToolRunner(make_tools(env, rng))
    bus = CollectingBus()
    recorder = Recorder(
        bus, "warm-start", vocab_size=len(tokenizer), flush_each_turn=False, handle_signals=False
    )
    out = []
    for index in range(config.transcripts):
        task = make_task(index, rng, env)
        teacher = Teacher(tokenizer, plan_for(task, config, rng, checker))
        result = run_episode(recorder, task, teacher, env, rng, model="warm-start")
        bus.events.clear()  # a transcript's events are not kept: only its ids
        mask = [False] * len(result.token_ids)
        for start, length, trained in teacher.spans:
            mask[start : start + length] = [trained] * length
        out.append((result.token_ids, mask))
    return out


def cache_key(base_dir: Path, config: WarmStartConfig, env: EnvConfig, seed: int) -> str:
    """What the warm-started weights depend on: the base model, the settings, the harness's words."""
    from trajlake.demo.envs.chat_episode import harness_texts

    digest = hashlib.sha256()
    for name in ("model.safetensors", "config.json", "tokenizer.json"):
        digest.update((base_dir / name).read_bytes())
    settings = {"warm_start": config.model_dump(), "env": env.model_dump(exclude={"faults"}), "seed": seed,
                "harness": harness_texts()}  # fmt: skip
    digest.update(json.dumps(settings, sort_keys=True).encode())
    return digest.hexdigest()[:16]


def length_batches(lengths: list[int], batch_size: int, generator: Any, pool: int = 8) -> Iterator[list[int]]:
    """Endless random batches of indices, each drawn from `pool` batches' worth of random transcripts sorted
    by length, so a batch pads little (random batches of these transcripts pad 70% on top)."""
    import torch

    while True:
        order = torch.randperm(len(lengths), generator=generator).tolist()
        for start in range(0, len(order), batch_size * pool):
            chunk = sorted(order[start : start + batch_size * pool], key=lengths.__getitem__)
            group = [chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size)]
            yield from (group[i] for i in torch.randperm(len(group), generator=generator).tolist())


def train(
    policy: Any, data: list[tuple[list[int], list[bool]]], config: WarmStartConfig, seed: int
) -> list[float]:
    """Supervised steps on random batches of `data` (loss: mean -logprob of the masked tokens); the losses."""
    import torch

    # beta2 0.95: 300 steps are too few for Adam's default 0.999 to forget the first steps' large gradients
    optimizer = torch.optim.AdamW(policy.parameters(), lr=config.lr, betas=(0.9, 0.95))

    def schedule(step: int) -> float:
        if step < config.warmup_steps:
            return (step + 1) / config.warmup_steps
        progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
        return 0.5 * (1 + math.cos(math.pi * progress))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    batches = length_batches(
        [len(ids) for ids, _ in data], config.batch_size, torch.Generator().manual_seed(seed)
    )
    losses = []
    for _ in range(config.steps):
        rows = [data[i] for i in next(batches)]
        width = max(len(ids) for ids, _ in rows)
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        attention = torch.zeros(len(rows), width, dtype=torch.long)
        mask = torch.zeros(len(rows), width, dtype=torch.bool)
        for b, (row_ids, row_mask) in enumerate(rows):
            ids[b, : len(row_ids)] = torch.tensor(row_ids)
            attention[b, : len(row_ids)] = 1
            mask[b, : len(row_mask)] = torch.tensor(row_mask)
        logprobs, _ = policy.logprobs_and_entropy(ids, attention, positions=mask)
        loss = -(logprobs * mask).sum() / mask.sum().clamp(min=1)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        losses.append(float(loss.detach()))
    return losses


def warm_start(
    base_dir: str | Path, out_dir: str | Path, config: WarmStartConfig, env: EnvConfig, seed: int = 0
) -> dict[str, Any]:
    """Warm-start the model in `base_dir` into the model directory `out_dir` (reused when its key matches).

    Returns what `STAMP` records: the directory, the key, whether it was cached, the seconds and losses.
    """
    import torch

    from trajlake.common.threads import importing
    from trajlake.trainer.hf_policy import HFPolicy

    base, out = Path(base_dir), Path(out_dir)
    key = cache_key(base, config, env, seed)
    if stamped(out) == key:
        return {**json.loads((out / STAMP).read_text()), "cached": True}
    cached = cache_dir() / "warm-start" / key  # `trajlake model init` is seeded: a fresh lake's model hits it
    if stamped(cached) == key:
        copy_model(cached, out)
        return {**json.loads((out / STAMP).read_text()), "model_dir": str(out.resolve()), "cached": True}
    started = time.monotonic()
    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))  # the demo's two cores, before rollouts start
    try:
        with importing():
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(base))
        data = make_transcripts(tokenizer, config, env, seed)
        made_s = time.monotonic() - started
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            policy = HFPolicy(base)
            losses = train(policy, data, config, seed)
    finally:
        torch.set_num_threads(threads)
    summary = {
        "key": key, "model_dir": str(out.resolve()), "base_model_dir": str(base.resolve()), "steps": config.steps,
        "transcripts": len(data), "trained_tokens_per_transcript": sum(sum(m) for _, m in data) / len(data),
        "transcripts_s": round(made_s, 2), "seconds": round(time.monotonic() - started, 2),
        "loss_first": losses[0] if losses else None, "loss_last": losses[-1] if losses else None,
        "config": config.model_dump(),
    }  # fmt: skip
    save(policy, base, out, summary)
    copy_model(out, cached)
    return {**summary, "cached": False}


def stamped(model_dir: Path) -> str | None:
    """The warm-start key `model_dir` was made with (None: not a warm-started model directory)."""
    stamp = model_dir / STAMP
    return json.loads(stamp.read_text()).get("key") if stamp.exists() else None


def save(policy: Any, base: Path, out: Path, summary: dict[str, Any]) -> None:
    """Write `out` as the base directory with the trained weights and `STAMP` (write-then-rename)."""
    tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(base, tmp, ignore=shutil.ignore_patterns(STAMP))
    policy.model.save_pretrained(str(tmp), safe_serialization=True)
    (tmp / STAMP).write_text(json.dumps(summary, indent=2))
    replace_dir(tmp, out)


def copy_model(source: Path, dest: Path) -> None:
    """Copy the model directory `source` to `dest`, which appears complete or not at all."""
    tmp = dest.with_name(f"{dest.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(source, tmp)
    replace_dir(tmp, dest)


def replace_dir(tmp: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)
