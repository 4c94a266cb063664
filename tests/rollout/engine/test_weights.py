"""Weights into the running vLLM server: a push takes effect in place, labelled; a bad one changes nothing."""

from __future__ import annotations

import shutil

import pytest
import torch

from trajlake.rollout.engine.chat import ChatSession
from trajlake.rollout.engine.weights import WeightSync, WeightUpdateError
from trajlake.rollout.tito import TitoClient
from trajlake.trainer.hf_policy import HFPolicy

pytestmark = pytest.mark.integration


@pytest.fixture
def trained(vllm_server, tmp_path):
    """A checkpoint directory whose weights differ from the served model's."""
    policy = HFPolicy(vllm_server.model_dir)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(torch.randn_like(p, generator=torch.Generator().manual_seed(1)) * 0.05)
    policy.save(tmp_path / "step-1")
    return policy, tmp_path / "step-1"


def sample(vllm_server, tokenizer, seed: int = 7):
    prompt = ChatSession(tokenizer, [{"role": "user", "content": "reverse a b"}]).prompt_ids
    with TitoClient(vllm_server.tito_config("generate")) as client:
        return prompt, client.complete(prompt, max_tokens=8, seed=seed)


def test_pushed_weights_serve_the_next_request_with_their_version(vllm_server, tiny_tokenizer, trained):
    policy, checkpoint = trained
    _, before = sample(vllm_server, tiny_tokenizer)
    sync = WeightSync(vllm_server.url, serving=(vllm_server.model_dir, 0))
    paused_s = sync.push(checkpoint, 1)
    sync.close()
    prompt, after = sample(vllm_server, tiny_tokenizer)
    assert after.policy_version == 1 and before.policy_version == 0
    assert after.output_logprobs != before.output_logprobs
    # the server now computes what the trainer's weights compute (float32 on CPU)
    ours = policy.token_logprobs(torch.tensor([prompt + after.output_token_ids]))[0, len(prompt) :]
    assert ours.tolist() == pytest.approx(after.output_logprobs, abs=1e-4)
    assert 0 < paused_s < 30


@pytest.mark.parametrize("damage", ["truncated", "missing", "wrong-shape"])
def test_a_reload_that_fails_leaves_the_old_version_serving_and_says_so(
    vllm_server, tiny_tokenizer, trained, damage
):
    _, checkpoint = trained
    _, before = sample(vllm_server, tiny_tokenizer)
    bad = checkpoint.parent / "bad"
    shutil.copytree(checkpoint, bad)
    weights = bad / "model.safetensors"
    if damage == "truncated":
        weights.write_bytes(weights.read_bytes()[:100_000])
    elif damage == "missing":
        weights.unlink()
    else:
        from safetensors.torch import load_file, save_file

        tensors = load_file(str(weights))
        tensors["model.norm.weight"] = torch.ones(7)
        save_file(tensors, str(weights))
    sync = WeightSync(vllm_server.url, serving=(vllm_server.model_dir, 0))
    with pytest.raises(WeightUpdateError, match=r"truncated|not a readable|does not fit") as info:
        sync.push(bad, 1)
    assert info.value.serving_version == 0
    assert sync.version == 0 and sync.served_version() == "0"
    sync.close()
    _, after = sample(vllm_server, tiny_tokenizer)
    assert after.policy_version == 0
    assert after.output_token_ids == before.output_token_ids
    assert after.output_logprobs == pytest.approx(before.output_logprobs, abs=1e-6)
