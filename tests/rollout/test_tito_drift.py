"""A harness that re-tokenises its history with a lossy tokenizer is caught as TITO drift."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

from trajlake.ingest.recorder import Recorder

CORPUS = [
    "The Answer is Four",
    "the answer is four",
    "Run The Tool Now",
    "tool output says ok",
    "what is two plus two",
]


@pytest.fixture(scope="module")
def lossy_tokenizer() -> Tokenizer:
    """A word-level tokenizer trained here on a tiny corpus, whose encoder lowercases.

    The vocabulary keeps "The" and "the" apart, but the normalizer (added after training)
    lowercases everything it encodes, so encode(decode(ids)) != ids for capitalised words.
    """
    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.train_from_iterator(CORPUS, trainers.WordLevelTrainer(special_tokens=["[UNK]"]))
    tok.normalizer = normalizers.Lowercase()
    return tok


def test_the_tokenizer_is_really_lossy(lossy_tokenizer):
    ids = [lossy_tokenizer.token_to_id(w) for w in ["The", "Answer"]]
    assert lossy_tokenizer.encode(lossy_tokenizer.decode(ids)).ids != ids


def run_episode(recorder, tok, *, retokenise: bool) -> str:
    prompt = tok.encode("what is two plus two").ids
    # the engine samples capitalised words: ids the lossy encoder can never produce
    out1 = [tok.token_to_id(w) for w in ["Run", "The", "Tool", "Now"]]
    out2 = [tok.token_to_id(w) for w in ["The", "Answer", "is", "Four"]]
    tool = tok.encode("tool output says ok").ids
    with recorder.start("task-drift", environment="toy", context_budget_tokens=64) as traj:
        traj.turn(out1, [-0.1] * 4, policy_version=1, full_input_token_ids=prompt)
        if retokenise:  # the bug: rebuild the history from text
            history = tok.encode(tok.decode(prompt + out1) + " tool output says ok").ids
        else:  # TITO: extend the ids the engine saw and sampled
            history = prompt + out1 + tool
        traj.turn(out2, [-0.2] * 4, policy_version=1, full_input_token_ids=history)
        traj.reward(1.0)
        traj.finish("completed")
        return traj.trajectory_id


def test_retokenised_history_is_flagged_as_tito_drift(lake, bus, drain, lossy_tokenizer):
    recorder = Recorder(bus, run_id="drift-run", vocab_size=lossy_tokenizer.get_vocab_size())
    clean = run_episode(recorder, lossy_tokenizer, retokenise=False)
    drifted = run_episode(recorder, lossy_tokenizer, retokenise=True)
    drain()
    rows = {
        r["trajectory_id"]: r
        for r in lake.sql(
            "select trajectory_id, tito_drift, n_drift_turns from trajectories where run_id = 'drift-run'"
        ).to_pylist()
    }
    assert rows[clean]["tito_drift"] is False
    assert rows[drifted]["tito_drift"] is True and rows[drifted]["n_drift_turns"] == 1
    flagged = (
        lake.sql(
            "select turn_index from turns where trajectory_id = $id and tito_drift order by turn_index",
            {"id": drifted},
        )
        .column("turn_index")
        .to_pylist()
    )
    assert flagged == [1]
