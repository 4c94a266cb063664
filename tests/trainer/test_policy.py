"""TinyPolicy: seeded, causal, and its sampled logprobs match a batched recompute."""

from __future__ import annotations

import pytest
import torch

from trajlake.trainer.policy import TinyPolicy


def test_same_seed_gives_same_weights_and_different_seed_does_not():
    assert TinyPolicy(50, seed=3).fingerprint() == TinyPolicy(50, seed=3).fingerprint()
    assert TinyPolicy(50, seed=3).fingerprint() != TinyPolicy(50, seed=4).fingerprint()


def test_generate_is_deterministic_with_a_seeded_generator():
    policy = TinyPolicy(40, seed=0)
    first = policy.generate([1, 2, 3], 12, generator=torch.Generator().manual_seed(7))
    second = policy.generate([1, 2, 3], 12, generator=torch.Generator().manual_seed(7))
    assert first == second
    ids, logprobs = first
    assert len(ids) == len(logprobs) == 12
    assert all(0 <= t < 40 for t in ids)
    assert all(lp <= 0 for lp in logprobs)


def test_sampled_logprobs_match_token_logprobs_of_the_full_sequence():
    policy = TinyPolicy(30, seed=1)
    prompt = [0, 5, 9]
    ids, logprobs = policy.generate(prompt, 20, generator=torch.Generator().manual_seed(1))
    full = torch.tensor([prompt + ids])
    recomputed = policy.token_logprobs(full)[0, len(prompt) :]
    assert torch.allclose(recomputed, torch.tensor(logprobs), atol=1e-5)


def test_generate_stops_after_a_stop_id():
    policy = TinyPolicy(4, seed=0)
    ids, _ = policy.generate([0], 200, stop_ids=(1, 2), generator=torch.Generator().manual_seed(0))
    assert ids[-1] in (1, 2)
    assert all(t not in (1, 2) for t in ids[:-1])


def test_padding_does_not_change_the_logprobs_of_real_tokens():
    policy = TinyPolicy(20, seed=2)
    short = torch.tensor([[1, 2, 3, 4]])
    padded = torch.tensor([[1, 2, 3, 4, 0, 0, 0], [5, 6, 7, 8, 9, 10, 11]])
    mask = torch.tensor([[1, 1, 1, 1, 0, 0, 0], [1] * 7])
    alone = policy.token_logprobs(short)
    batched = policy.token_logprobs(padded, mask)
    assert torch.allclose(batched[0, :4], alone[0], atol=1e-6)
    assert batched[0, 0] == 0 and (batched[0, 4:] == 0).all()
    assert batched.dtype == torch.float32


def test_entropy_is_between_zero_and_log_vocab():
    policy = TinyPolicy(16, seed=0)
    ent = policy.entropy(torch.tensor([[1, 2, 3, 4, 5]]))
    assert ent[0, 0] == 0
    assert ((ent[0, 1:] > 0) & (ent[0, 1:] <= torch.log(torch.tensor(16.0)) + 1e-5)).all()


def test_a_gradient_step_raises_the_logprob_of_a_rewarded_sequence():
    policy = TinyPolicy(12, seed=0)
    seq = torch.tensor([[0, 3, 3, 3, 3]])
    before = policy.token_logprobs(seq).sum().item()
    optim = torch.optim.SGD(policy.parameters(), lr=0.5)
    for _ in range(5):
        optim.zero_grad()
        (-policy.token_logprobs(seq).sum()).backward()
        optim.step()
    assert policy.token_logprobs(seq).sum().item() > before


def test_checkpoint_round_trip_keeps_weights_and_version(tmp_path):
    policy = TinyPolicy(25, d_model=16, seed=5)
    policy.version = 7
    path = policy.save(str(tmp_path / "policy.pt"))
    loaded = TinyPolicy.load(path)
    assert loaded.version == 7
    assert loaded.fingerprint() == policy.fingerprint()


def test_bad_inputs_name_the_fix():
    policy = TinyPolicy(10)
    with pytest.raises(ValueError, match="at least one token"):
        policy.generate([], 3)
    with pytest.raises(ValueError, match=r"\[0, 10\)"):
        policy.generate([99], 3)
    with pytest.raises(ValueError, match="vocab_size must be >= 2"):
        TinyPolicy(1)


def test_logprobs_and_entropy_in_one_pass_match_the_separate_calls():
    policy = TinyPolicy(16, seed=0)
    ids = torch.tensor([[1, 2, 3, 4], [5, 6, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    lps, ent = policy.logprobs_and_entropy(ids, mask)
    assert torch.allclose(lps, policy.token_logprobs(ids, mask))
    assert torch.allclose(ent, policy.entropy(ids, mask))


def test_logprobs_only_at_requested_positions_match_the_full_computation():
    policy = TinyPolicy(16, seed=0)
    ids = torch.tensor([[1, 2, 3, 4, 5], [6, 7, 8, 0, 0]])
    attn = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    want = torch.tensor([[0, 0, 1, 1, 0], [0, 1, 0, 1, 1]], dtype=torch.bool)
    lps, ent = policy.logprobs_and_entropy(ids, attn, positions=want)
    full_lps, full_ent = policy.token_logprobs(ids, attn), policy.entropy(ids, attn)
    keep = want & attn.bool()
    assert torch.allclose(lps[keep], full_lps[keep], atol=1e-6)
    assert torch.allclose(ent[keep], full_ent[keep], atol=1e-6)
    assert (lps[~keep] == 0).all() and (ent[~keep] == 0).all()
    assert full_lps.shape == full_ent.shape == lps.shape
