"""HFPolicy: a transformers model as the trainer's policy."""

from __future__ import annotations

import pytest
import torch

from trajlake.trainer.hf_policy import HFPolicy


def test_logprobs_are_the_models_own_and_padding_changes_nothing(model_dir):
    policy = HFPolicy(model_dir)
    ids = torch.tensor([[5, 9, 13, 21, 34], [5, 9, 13, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    with torch.no_grad():
        logprobs, entropy = policy.logprobs_and_entropy(ids, mask)
        full = torch.log_softmax(policy.model(ids[:1]).logits.float(), -1)[0]
    expected = full[:-1].gather(-1, ids[0, 1:, None])[:, 0]
    assert logprobs[0, 1:].tolist() == pytest.approx(expected.tolist(), abs=1e-5)
    assert logprobs[1, 1:3].tolist() == pytest.approx(logprobs[0, 1:3].tolist(), abs=1e-5)  # right padding
    assert logprobs[1, 3:].abs().sum() == 0 and entropy[1, 3:].abs().sum() == 0
    assert float(entropy[0, 1]) == pytest.approx(-(full[0].exp() * full[0]).sum().item(), abs=1e-4)


def test_a_saved_checkpoint_is_a_model_directory_that_loads_back(model_dir, tmp_path):
    policy = HFPolicy(model_dir)
    with torch.no_grad():
        next(policy.parameters()).add_(1.0)
    path = policy.save(tmp_path / "step-000001")
    again = HFPolicy(model_dir)
    again.load(path)
    ids = torch.tensor([[5, 9, 13, 21]])
    assert again.token_logprobs(ids)[0].tolist() == pytest.approx(
        policy.token_logprobs(ids)[0].tolist(), abs=1e-6
    )
    assert not list(tmp_path.glob("*.tmp-*"))  # written then renamed
