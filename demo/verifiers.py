"""The demo's verifiers for `trajlake rescore`: its tasks judged again from what the lake holds.

The demo's vocabulary episodes (`--engine tiny`) store everything a verifier needs as token ids: the
prompt names the task (`<bos> count b in e a c`), and each tool result the environment appended is
`<result> … </result>` (or `<error>`); `<answer>` submits the last one. So the expected answer is
solved again from the prompt, and the submitted one read from the tokens:

    trajlake rescore --run demo --verifier trajlake.demo.verifiers:exact_match

`as_recorded` gives what the episode's verifier gave (exact match plus the right-tool credit);
`exact_match` drops the credit: a reward of 1 or 0.
"""

from __future__ import annotations

from trajlake.demo.envs import vocab
from trajlake.demo.envs.tasks import RIGHT_TOOL_CREDIT, TASK_KINDS, TOOL_FOR_KIND, solve
from trajlake.rollout.stored import StoredTrajectory


def task_of(traj: StoredTrajectory) -> tuple[str, tuple[str, ...]]:
    """The task's kind and operands, read from its prompt."""
    words = [vocab.TOKENS[i] if 0 <= i < vocab.VOCAB_SIZE else "?" for i in traj.prompt_token_ids]
    if len(words) < 2 or words[0] != "<bos>" or words[1] not in TASK_KINDS:
        raise ValueError(
            f"trajectory {traj.trajectory_id} has no demo task prompt ({' '.join(words[:4])} …): these verifiers "
            "judge the demo's vocabulary episodes (trajlake demo --engine tiny)"
        )
    return words[1], tuple(words[2:])


def submitted(traj: StoredTrajectory) -> tuple[str, ...] | None:
    """The answer the episode submitted: the last tool result before `<answer>`, or None (no answer, or the
    last call failed)."""
    last = traj.turns[-1].output_token_ids if traj.turns else []
    if not last or last[-1] != vocab.ANSWER or not traj.tool_calls or not traj.tool_calls[-1].ok:
        return None
    for turn in reversed(traj.turns[1:]):  # what the environment appended, never what the model wrote
        ids = turn.input_token_ids
        if vocab.RESULT in ids and vocab.END_RESULT in ids[ids.index(vocab.RESULT) :]:
            start = len(ids) - 1 - ids[::-1].index(vocab.RESULT)
            end = ids.index(vocab.END_RESULT, start)
            return tuple(vocab.TOKENS[i] for i in ids[start + 1 : end] if i != vocab.TRUNCATED)
    return None


def exact_match(traj: StoredTrajectory) -> dict[str, float]:
    """1 when the submitted answer is the task's, else 0."""
    kind, operands = task_of(traj)
    return {"correct": float(submitted(traj) == solve(kind, operands))}


exact_match.version = "exact-match-1"  # type: ignore[attr-defined]


def as_recorded(traj: StoredTrajectory) -> dict[str, float]:
    """The episode's own verifier: exact match, plus partial credit for a successful call of the right tool."""
    kind, operands = task_of(traj)
    correct = float(submitted(traj) == solve(kind, operands))
    right_tool = any(c.ok and c.tool_name == TOOL_FOR_KIND[kind] for c in traj.tool_calls)
    return {"correct": correct, "right_tool": RIGHT_TOOL_CREDIT if right_tool and not correct else 0.0}


as_recorded.version = "as-recorded-1"  # type: ignore[attr-defined]
