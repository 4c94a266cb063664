"""Chat-level TITO against the real vLLM server: the lake holds exactly the server's ids and logprobs,
and the naive re-templating harness drifts and is flagged."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from trajlake.cli import main
from trajlake.demo.envs.chat_episode import TOOLS, ChatPolicy
from trajlake.demo.envs.config import EnvConfig, FaultConfig
from trajlake.demo.envs.episode import run_episode
from trajlake.demo.envs.tasks import make_tasks
from trajlake.ingest.recorder import Recorder
from trajlake.rollout.engine.chat import ChatSession, naive_prompt_ids, parse_tool_calls
from trajlake.rollout.engine.chatml import tool_call_text
from trajlake.rollout.tito import TitoClient

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    ("text", "name", "arguments", "error"),
    [
        (tool_call_text("calc", {"expression": "1 + 2"}), "calc", {"expression": "1 + 2"}, None),
        (
            '<tool_call>\n{"name": "python", "arguments": "{\\"code\\": \\"x\\"}"}',
            "python",
            {"code": "x"},
            None,
        ),
        ("<tool_call>{not json}</tool_call>", None, {}, "not JSON"),
        ('<tool_call>{"arguments": {}}</tool_call>', None, {}, 'string "name"'),
    ],
    ids=["hermes", "unterminated-with-string-arguments", "bad-json", "no-name"],
)
def test_tool_calls_are_parsed_from_generated_text(text, name, arguments, error):
    (call,) = parse_tool_calls(text)
    assert (call.name, call.arguments) == (name, arguments)
    assert call.malformed == (error is not None)
    if error:
        assert error in call.error


def test_text_without_a_tool_call_has_none():
    assert parse_tool_calls("The answer is 7.") == []


def play(session: ChatSession, client: TitoClient, traj, turns: int, tool_output: str) -> list:
    """A multi-turn tool-using conversation: free text from the model, a tool result after each turn."""
    completions = []
    for _ in range(turns):
        done = client.complete(session.prompt_ids, max_tokens=12, seed=len(completions) + 1)
        drift = traj.turn(done.output_token_ids, done.output_logprobs, done.policy_version,
                          input_token_ids=session.take_pending(), finish_reason=done.finish_reason)  # fmt: skip
        assert not drift
        session.add_output(done.output_token_ids)
        session.add_messages([{"role": "tool", "content": tool_output}])
        completions.append(done)
    return completions


def test_a_recorded_chat_stores_exactly_the_servers_ids_and_logprobs(
    vllm_server, tiny_tokenizer, bus, drain, lake, capsys
):
    client = TitoClient(vllm_server.tito_config("generate"))
    recorder = Recorder(bus, "chat-run", vocab_size=len(tiny_tokenizer))
    messages = [{"role": "system", "content": "Use the tools."}, {"role": "user", "content": "calc 7 * 8"}]
    session = ChatSession(tiny_tokenizer, messages, TOOLS)
    opening = list(session.ids)
    with recorder.start("task-1", model=str(vllm_server.model_dir)) as traj:
        completions = play(session, client, traj, 3, "56")
        traj.reward(1.0, verifier="exact")
        traj.finish("completed")
    client.close()
    drain()

    assert main(["sql", "--lake", str(lake.root), "--format", "json",
                 "select turn_index, output_token_ids, output_logprobs, policy_version, tito_drift from turns "
                 "where run_id = 'chat-run' order by turn_index"]) == 0  # fmt: skip
    turns = json.loads(capsys.readouterr().out)
    assert [t["output_token_ids"] for t in turns] == [c.output_token_ids for c in completions]
    for t, c in zip(turns, completions, strict=True):
        assert t["output_logprobs"] == pytest.approx(c.output_logprobs, abs=1e-6)  # float32 storage
        assert t["policy_version"] == 0 and not t["tito_drift"]
    row = lake.sql("select token_ids, tito_drift from trajectories where run_id = 'chat-run'").to_pylist()[0]
    # prompt, outputs and tool results, never re-tokenised (the last tool result was never read by the model)
    assert row["token_ids"] == session.ids[: len(session.ids) - len(session.pending)]
    assert row["token_ids"][: len(opening)] == opening and row["tito_drift"] is False


def test_re_templating_the_whole_conversation_drifts_and_is_flagged(
    vllm_server, tiny_tokenizer, bus, drain, lake
):
    """The classic harness: keep messages, decode each output to text, apply the template again."""
    client = TitoClient(vllm_server.tito_config("generate"))
    recorder = Recorder(bus, "naive-run", vocab_size=len(tiny_tokenizer))
    messages = [{"role": "user", "content": "reverse a b c"}]
    drifted = []
    with recorder.start("task-1") as traj:
        for i in range(3):
            prompt = naive_prompt_ids(tiny_tokenizer, messages, TOOLS)
            done = client.complete(prompt, max_tokens=12, seed=i + 1)
            drifted.append(
                traj.turn(done.output_token_ids, done.output_logprobs, 0, full_input_token_ids=prompt)
            )
            text = tiny_tokenizer.decode(done.output_token_ids, skip_special_tokens=True)
            messages += [{"role": "assistant", "content": text}, {"role": "tool", "content": "c b a"}]
        traj.finish("completed")
    client.close()
    drain()
    assert any(drifted), "re-encoding sampled ids should not reproduce them on this tokenizer"
    flagged = lake.sql("select tito_drift from trajectories where run_id = 'naive-run'").column(0).to_pylist()
    assert flagged == [True]


def test_the_demo_chat_policy_samples_from_the_whole_vocabulary(vllm_server):
    policy = ChatPolicy.from_model_dir(TitoClient(vllm_server.tito_config("generate")), vllm_server.model_dir)
    session = ChatSession(policy.tokenizer, [{"role": "user", "content": "count a in a b a"}], TOOLS)
    outputs = [policy.sample(session.prompt_ids, 16) for _ in range(5)]
    policy.client.close()
    ids = [i for done in outputs for i in done.output_token_ids]
    # a random model writes turns of many tokens, from all over the vocabulary (no action-token mask)
    assert all(len(done.output_token_ids) > 1 for done in outputs) and len(set(ids)) > 20
    assert all(lp <= 0 for done in outputs for lp in done.output_logprobs)


class TimedChatPolicy(ChatPolicy):
    """The demo's chat policy, keeping the latency the TITO client measured for each request."""

    def sample(self, prompt_ids: list[int], max_new_tokens: int) -> Any:
        done = super().sample(prompt_ids, max_new_tokens)
        self.latencies.append(done.latency_s)
        return done


def test_a_demo_chat_episode_records_each_requests_latency(vllm_server, tiny_tokenizer, bus, drain, lake):
    policy = TimedChatPolicy.from_model_dir(
        TitoClient(vllm_server.tito_config("generate")), vllm_server.model_dir
    )
    policy.latencies = []
    recorder = Recorder(bus, "chat-latency", vocab_size=len(tiny_tokenizer), flush_each_turn=False)
    env = EnvConfig(context_budget_tokens=112, faults=FaultConfig.none())
    result = run_episode(
        recorder, make_tasks(1, seed=3, config=env)[0], policy, env, random.Random(0), model="tiny"
    )
    policy.client.close()
    drain()
    stored = lake.sql(
        "select latency_s from turns where trajectory_id = $t order by turn_index",
        {"t": result.trajectory_id},
    )
    assert policy.latencies and all(s > 0 for s in policy.latencies)
    assert stored.column(0).to_pylist() == pytest.approx(policy.latencies, rel=1e-6)  # float32 in the lake
