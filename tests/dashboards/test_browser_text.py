"""The trajectory browser on a run recorded with a real tokenizer: each turn as text, overlays, environment tokens."""

from __future__ import annotations

import html
import re

import pyarrow as pa
import pytest
from streamlit.testing.v1 import AppTest

from trajlake.dashboards.commands import APP
from trajlake.dashboards.views.token_overlays import OVERLAYS
from trajlake.ingest.bus.inprocess import InProcessBus
from trajlake.ingest.recorder import Recorder
from trajlake.ingest.sink import DeltaSink, SinkConfig
from trajlake.rollout.engine.chat import ChatSession
from trajlake.schemas.tables import TRAINER_TOKENS_SCHEMA
from trajlake.store.lake import Lake

pytestmark = pytest.mark.integration  # renders the whole Streamlit app (AppTest)

TOOLS = [{"type": "function", "function": {"name": "calc", "parameters": {}}}]
CALL = '<tool_call>\n{"name": "calc", "arguments": {"expression": "3 + 4"}}\n</tool_call><|im_end|>'
ADVANTAGE = 0.75


def play(recorder: Recorder, tokenizer, model: str, trajectory_id: str) -> None:
    """A tool-use chat as the demo's vLLM engine records it: ChatML prompt, tool call, tool output, answer."""
    session = ChatSession(tokenizer, [{"role": "user", "content": "calc 3 + 4, then answer"}], tools=TOOLS)
    traj = recorder.start("calc", trajectory_id=trajectory_id, model=model)
    for output, tool_output in ((CALL, "7"), ("It is 7.<|im_end|>", None)):
        ids = tokenizer.encode(output)
        session.add_output(ids)
        traj.turn(ids, [-0.05 * (i + 1) for i in range(len(ids))], 0, input_token_ids=session.take_pending())
        if tool_output:
            session.add_messages([{"role": "tool", "content": tool_output}])
    traj.reward(1.0)
    traj.finish("completed")


@pytest.fixture(scope="module")
def text_lake(tmp_path_factory, model_dir, tokenizer) -> Lake:
    """Run `chat` recorded the tiny model's directory (and a trainer gave its trajectory an advantage);
    run `lost` recorded a model directory that is gone; run `kept` has the trainer's per-token values
    of steps 0 and 3 (`keep_token_values`)."""
    lake = Lake(tmp_path_factory.mktemp("text") / "lake")
    bus = InProcessBus()
    play(Recorder(bus, "chat"), tokenizer, str(model_dir), "chat-1")
    play(Recorder(bus, "lost"), tokenizer, str(model_dir.parent / "deleted-model"), "lost-1")
    play(Recorder(bus, "kept"), tokenizer, str(model_dir), "kept-1")
    Recorder(bus, "chat", producer_id="trainer").batch_consumed(0, 1, ["chat-1"], [0], advantages=[ADVANTAGE])
    DeltaSink(lake, bus, SinkConfig()).run(until_idle_s=0.0)
    keep_token_values(lake)
    yield lake
    lake.close()


def keep_token_values(lake: Lake) -> None:
    """`trainer_tokens` rows of run `kept`: at step 3 DPPO masked turn 1's first token and clipped its
    second (ratios 1.5 and 0.5); at step 0 it kept every token (ratio 1)."""
    rows = []
    for turn in turns_of(lake, "kept"):
        n, last = len(turn["output_token_ids"]), turn["turn_index"] == 1
        for step in (0, 3):
            touched = step == 3 and last
            ratios = [1.5, 0.5, *[1.0] * (n - 2)] if touched else [1.0] * n
            rows.append({
                "run_id": "kept", "step": step, "trainer_version": step + 1, "rank": 0, "trajectory_id": "kept-1",
                "seq": turn["seq"], "turn_index": turn["turn_index"], "policy_loss": "dppo", "advantage": 1.0,
                "trainer_logprobs": [-0.05 * (i + 1) for i in range(n)], "entropies": [1.0] * n, "ratios": ratios,
                "clipped": [touched, touched, *[False] * (n - 2)], "masked": [touched, *[False] * (n - 1)],
            })  # fmt: skip
    lake.append("trainer_tokens", pa.Table.from_pylist(rows, schema=TRAINER_TOKENS_SCHEMA))


def open_browser(lake: Lake, monkeypatch, run: str, tokenizer: str | None = None) -> AppTest:
    monkeypatch.setenv("TRAJLAKE_LAKE", lake.root)
    if tokenizer:
        monkeypatch.setenv("TRAJLAKE_TOKENIZER", tokenizer)
    else:
        monkeypatch.delenv("TRAJLAKE_TOKENIZER", raising=False)
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.query_params.update(page="browser", run=run)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def turn_bodies(at: AppTest) -> list[str]:
    return [h.proto.body for h in at.get("html") if 'class="tok' in h.proto.body]


def text_of(body: str) -> str:
    """What a reader sees: the spans' text, the markup gone."""
    return html.unescape(re.sub(r"<[^>]+>", "", body))


def turns_of(lake: Lake, run: str) -> list[dict]:
    return lake.sql(
        "select seq, turn_index, input_token_ids, output_token_ids from turns where run_id = ? order by seq",
        [run],
    ).to_pylist()


def test_each_turn_shows_the_text_the_runs_tokenizer_decodes(text_lake, tokenizer, monkeypatch) -> None:
    at = open_browser(text_lake, monkeypatch, "chat")
    assert not at.warning  # the recorded model directory is here: no note about ids
    turns = turns_of(text_lake, "chat")
    bodies = turn_bodies(at)
    assert [text_of(b) for b in bodies] == [
        tokenizer.decode(t["input_token_ids"]) + tokenizer.decode(t["output_token_ids"]) for t in turns
    ]
    assert "It is 7." in text_of(bodies[1]) and "<tool_response>\n7\n</tool_response>" in text_of(bodies[1])
    for body, turn in zip(bodies, turns, strict=True):  # token boundaries: one span per token
        assert body.count('class="tok env"') == len(turn["input_token_ids"])
        assert body.count('class="tok model"') == len(turn["output_token_ids"])


def test_environment_tokens_look_different_from_model_tokens(text_lake, monkeypatch) -> None:
    at = open_browser(text_lake, monkeypatch, "chat")
    body = turn_bodies(at)[0]
    env = re.findall(r'class="tok env" title="[^"]*" style="([^"]*)"', body)
    model = re.findall(r'class="tok model" title="[^"]*" style="([^"]*)"', body)
    assert env and model
    assert all("italic" in s and "#eceff3" in s for s in env)
    assert not any("italic" in s or "#eceff3" in s for s in model)
    assert any("Grey italic: environment tokens" in c.value for c in at.caption)


@pytest.mark.parametrize("overlay", list(OVERLAYS), ids=list(OVERLAYS))
def test_overlays_switch_and_say_when_not_recorded(text_lake, monkeypatch, overlay) -> None:
    at = open_browser(text_lake, monkeypatch, "chat")
    radio = at.radio(key="browser_overlay")
    not_recorded = {o for o in radio.options if o.endswith("(not recorded)")}
    step_overlays = ("trainer_logprob", "mismatch", "entropy", "trainer_entropy", "ratio", "loss_action")
    assert not_recorded == {f"{OVERLAYS[o]} (not recorded)" for o in step_overlays}
    radio.set_value(overlay).run()
    assert not at.exception
    body = turn_bodies(at)[1]
    infos = " ".join(i.value for i in at.info)
    if overlay in step_overlays:
        assert "not recorded" in infos
        assert "background:transparent" in body  # nothing invented: model tokens unshaded
        return
    assert "not recorded" not in infos
    if overlay == "logprob":
        assert "rgba(214,39,40," in body  # red by sampled logprob
    if overlay == "loss_mask":
        assert "rgba(31,119,180,0.28)" in body
    if overlay == "advantage":
        assert "rgba(44,160,44," in body  # the trainer's positive advantage, in green
        assert any(f"advantage {ADVANTAGE:.3f}" in e.label for e in at.expander)  # the turn's expander
        assert any("batch_consumption.advantage (step 0)" in c.value for c in at.caption)


def test_a_kept_steps_values_overlay_each_token_and_another_step_can_be_picked(
    text_lake, monkeypatch
) -> None:
    at = open_browser(text_lake, monkeypatch, "kept")
    step = at.selectbox(key="browser_step")
    assert list(step.options) == ["0", "3"] and step.value == 3  # the latest kept step first
    radio = at.radio(key="browser_overlay")
    # the kept step gives every trainer overlay; the rollout's entropy and an advantage were not recorded
    assert {o for o in radio.options if o.endswith("(not recorded)")} == {
        "Entropy (not recorded)",
        "Advantage (not recorded)",
    }
    radio.set_value("loss_action").run()
    first, second = turn_bodies(at)
    assert "rgba(214,39,40,0.55)" not in first and "rgba(255,187,51,0.6)" not in first
    assert second.count("rgba(214,39,40,0.55)") == 1 and second.count("rgba(255,187,51,0.6)") == 1
    assert "loss masked" in second and "loss clipped" in second and "ratio 1.500" in second
    assert any("Values of trainer_tokens (step 3, dppo)." in c.value for c in at.caption)
    at.radio(key="browser_overlay").set_value("ratio").run()
    assert "rgba(23,190,207,0.34)" in turn_bodies(at)[1]  # |log 1.5| = 0.41 of a factor e
    at.selectbox(key="browser_step").set_value(0).run()
    assert not at.exception
    assert "rgba(23,190,207,0.00)" in turn_bodies(at)[1] and "ratio 1.500" not in turn_bodies(at)[1]
    assert any("Values of trainer_tokens (step 0, dppo)." in c.value for c in at.caption)


def test_a_run_whose_model_is_gone_says_how_to_decode_it(
    text_lake, model_dir, tokenizer, monkeypatch
) -> None:
    at = open_browser(text_lake, monkeypatch, "lost")
    (note,) = at.warning
    assert "deleted-model" in note.value and "--tokenizer DIR" in note.value
    first = turns_of(text_lake, "lost")[0]["input_token_ids"][0]
    assert text_of(turn_bodies(at)[0]).startswith(f"#{first}")  # ids, boundaries still visible
    at = open_browser(text_lake, monkeypatch, "lost", tokenizer=str(model_dir))
    assert not at.warning
    turn = turns_of(text_lake, "lost")[0]
    assert text_of(turn_bodies(at)[0]) == tokenizer.decode(turn["input_token_ids"] + turn["output_token_ids"])


def test_the_sql_console_decodes_with_detokenize(text_lake, tokenizer, monkeypatch) -> None:
    monkeypatch.setenv("TRAJLAKE_LAKE", text_lake.root)
    monkeypatch.delenv("TRAJLAKE_TOKENIZER", raising=False)
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.query_params.update(page="sql", run="chat")
    at.run()
    at.text_area(key="sql_query").set_value(
        "select detokenize(output_token_ids, model) as text from turns join trajectories "
        "using (run_id, trajectory_id) where run_id = 'chat' order by seq"
    )
    at.button(key="sql_run").click().run()
    assert not at.error
    outputs = [tokenizer.decode(t["output_token_ids"]) for t in turns_of(text_lake, "chat")]
    assert list(at.dataframe[0].value["text"]) == outputs
