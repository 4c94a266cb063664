"""Task generation and verifiers: arithmetic that needs the calculator, string tasks that need code.

A task's prompt names its kind in its second token (`calc`, `reverse`, `count`), so a
tiny policy can learn which tool fits; the tool computes the result; `<answer>` submits
it. The reward therefore depends on a short structured action sequence, which a policy
trained from scratch learns in a few dozen updates.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from trajlake.demo.envs import vocab
from trajlake.demo.envs.config import EnvConfig

TASK_KINDS = ("calc", "reverse", "count")
TOOL_FOR_KIND = {"calc": "calc", "reverse": "python", "count": "python"}


@dataclass(frozen=True)
class Task:
    """One task: its prompt tokens, the tool it needs, and the expected answer tokens."""

    task_id: str
    kind: str
    operands: tuple[str, ...]
    prompt_ids: tuple[int, ...]
    answer: tuple[str, ...]

    @property
    def tool(self) -> str:
        """The tool that solves this task."""
        return TOOL_FOR_KIND[self.kind]


def _number_tokens(value: int) -> tuple[str, ...]:
    return (("-",) if value < 0 else ()) + tuple(str(abs(value)))


def solve(kind: str, operands: tuple[str, ...]) -> tuple[str, ...]:
    """The exact answer tokens of a task (what the right tool returns)."""
    if kind == "calc":
        a, op, b = int(operands[0]), operands[1], int(operands[2])
        value = a + b if op == "+" else a - b if op == "-" else a * b
        return _number_tokens(value)
    if kind == "reverse":
        return tuple(reversed(operands))
    if kind == "count":
        target, letters = operands[0], operands[2:]
        return tuple(str(sum(1 for x in letters if x == target)))
    raise ValueError(f"unknown task kind {kind!r}; known kinds: {TASK_KINDS}")


def _letters(rng: random.Random, config: EnvConfig) -> tuple[str, ...]:
    """A string that fits the tool output budget, or (at `long_output_rate`) one letter longer."""
    budget = config.max_tool_output_tokens
    length = budget + 1 if rng.random() < config.faults.long_output_rate else rng.randint(2, budget)
    return tuple(rng.choice(vocab.LETTERS) for _ in range(length))


def make_task(index: int, rng: random.Random, config: EnvConfig | None = None) -> Task:
    """Draw task number `index`: kinds rotate, operands come from `rng`."""
    config = config or EnvConfig()
    kind = TASK_KINDS[index % len(TASK_KINDS)]
    if kind == "calc":
        operands: tuple[str, ...] = (
            str(rng.randint(0, 9)),
            rng.choice(vocab.OPERATORS),
            str(rng.randint(0, 9)),
        )
    elif kind == "reverse":
        operands = _letters(rng, config)
    else:
        operands = (rng.choice(vocab.LETTERS), "in", *_letters(rng, config))
    prompt = (vocab.BOS, *vocab.encode((kind, *operands)))
    return Task(f"{kind}-{index:05d}", kind, operands, prompt, solve(kind, operands))


def make_tasks(n: int, seed: int = 0, config: EnvConfig | None = None) -> list[Task]:
    """`n` tasks, reproducible from `seed`."""
    rng = random.Random(seed)
    return [make_task(i, rng, config) for i in range(n)]


RIGHT_TOOL_CREDIT = 0.1
"""Partial credit for a successful call of the right tool without a correct answer.

It gives a policy trained from scratch a reward gradient toward the first half of the action
sequence; a correct answer is worth ten times more, so the credit never competes with it."""


def verify(task: Task, submitted: tuple[str, ...] | None) -> float:
    """Exact-match verifier: 1.0 when the submitted tokens equal the answer, else 0.0."""
    return 1.0 if submitted is not None and tuple(submitted) == task.answer else 0.0


def reward_components(
    task: Task, submitted: tuple[str, ...] | None, used_right_tool: bool
) -> dict[str, float]:
    """The reward's parts: `correct` (exact match) and `right_tool` (partial credit when not correct)."""
    correct = verify(task, submitted)
    return {"correct": correct, "right_tool": RIGHT_TOOL_CREDIT if used_right_tool and not correct else 0.0}
