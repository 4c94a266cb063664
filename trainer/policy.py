"""A tiny causal language model for the embedded trainer: CPU-only, seeded, versioned.

`TinyPolicy` is an embedding, a one-layer GRU and a linear head (d_model≈64). It is the
policy of `trajlake demo` and of the reference trainer: `generate` samples tokens and
returns the exact float32 logprob of each sampled token under the current weights, and
`token_logprobs` recomputes those logprobs in one batched forward pass, so the
train/inference mismatch of a healthy run is ~1e-6 (far below the 0.03 threshold).

Batches are right-padded: row b holds its tokens at positions 0..len_b-1 and
`attention_mask[b, t]` is 1 there, 0 after. The GRU is causal, so padding after a
sequence cannot change the logprobs of its tokens.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Callable, Iterable

import torch
from torch import nn
from torch.nn import functional as F


def score_next_tokens(
    input_ids: torch.Tensor,
    features: torch.Tensor,
    head: Callable[[torch.Tensor], torch.Tensor],
    attention_mask: torch.Tensor | None = None,
    positions: torch.Tensor | None = None,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logprob of each next token and the entropy of its distribution, float32 [B, T]; 0 elsewhere.

    Shared by every policy: `features[:, t]` (hidden states or logits, [B, T-1, ...]) predicts
    token t+1, and `head` turns the selected rows into logits. Only real tokens (attention
    mask) that a loss trains on (`positions`, when given) are scored: the head is most of the
    cost.
    """
    batch, length = input_ids.shape
    device = features.device
    logprobs = torch.zeros(batch, length, dtype=torch.float32, device=device)
    entropy = torch.zeros_like(logprobs)
    want = torch.ones(batch, length - 1, dtype=torch.bool, device=device)
    if positions is not None:
        want = want & positions[:, 1:].bool().to(device)
    if attention_mask is not None:
        want = want & attention_mask[:, 1:].bool().to(device)
    targets = input_ids[:, 1:].long().to(device)[want]
    log_probs = F.log_softmax(head(features[want]).float() / temperature, dim=-1)
    picked = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    ent = -(log_probs.exp() * log_probs).sum(-1)
    rows, cols = want.nonzero(as_tuple=True)
    return logprobs.index_put((rows, cols + 1), picked), entropy.index_put((rows, cols + 1), ent)


class TinyPolicy(nn.Module):
    """Embedding → GRU → linear head over a small vocabulary; `version` counts updates."""

    def __init__(self, vocab_size: int, d_model: int = 64, seed: int = 0) -> None:
        super().__init__()
        if vocab_size < 2:
            raise ValueError(f"vocab_size must be >= 2 (got {vocab_size})")
        if d_model < 1:
            raise ValueError(f"d_model must be >= 1 (got {d_model})")
        self.vocab_size = int(vocab_size)
        self.d_model = int(d_model)
        self.seed = int(seed)
        self.version = 0
        # Build the layers under a private RNG so a seed gives the same weights whatever
        # else the process has drawn from torch's global generator.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.embed = nn.Embedding(vocab_size, d_model)
            self.rnn = nn.GRU(d_model, d_model, num_layers=1, batch_first=True)
            self.norm = nn.LayerNorm(d_model)
            self.head = nn.Linear(d_model, vocab_size)

    # -- forward ------------------------------------------------------------------------
    def forward(
        self, input_ids: torch.Tensor, hidden: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits [B, T, V] of the next token after each position, and the final hidden state."""
        out, hidden = self.rnn(self.embed(input_ids), hidden)
        return self.head(self.norm(out)), hidden

    def _shifted_log_probs(self, input_ids: torch.Tensor, temperature: float) -> torch.Tensor:
        """log p(· | tokens < t) for t = 1..T-1, as [B, T-1, V]."""
        logits, _ = self(input_ids[:, :-1])
        return F.log_softmax(logits.float() / temperature, dim=-1)

    def token_logprobs(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, temperature: float = 1.0
    ) -> torch.Tensor:
        """log p(token_t | tokens < t) as float32 [B, T]; position 0 and padding are 0.

        Args:
            input_ids: LongTensor [B, T], right-padded.
            attention_mask: [B, T], 1 for real tokens (default: all real).
            temperature: the sampling temperature the tokens were drawn with.
        """
        input_ids = input_ids.long()
        batch, length = input_ids.shape
        result = torch.zeros(batch, length, dtype=torch.float32, device=input_ids.device)
        if length < 2:
            return result
        log_probs = self._shifted_log_probs(input_ids, temperature)
        picked = log_probs.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
        result = torch.cat([result[:, :1], picked], dim=1)
        if attention_mask is not None:
            result = result * attention_mask.to(result.dtype)
        return result

    def entropy(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, temperature: float = 1.0
    ) -> torch.Tensor:
        """Entropy (nats) of the distribution that predicted each token, [B, T]; position 0 and padding are 0."""
        input_ids = input_ids.long()
        batch, length = input_ids.shape
        result = torch.zeros(batch, length, dtype=torch.float32, device=input_ids.device)
        if length < 2:
            return result
        log_probs = self._shifted_log_probs(input_ids, temperature)
        ent = -(log_probs.exp() * log_probs).sum(-1)
        result = torch.cat([result[:, :1], ent], dim=1)
        if attention_mask is not None:
            result = result * attention_mask.to(result.dtype)
        return result

    def logprobs_and_entropy(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        temperature: float = 1.0,
        positions: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`token_logprobs` and `entropy` from one forward pass (the trainer needs both).

        With `positions` (bool [B, T]), the vocabulary head runs only where it is set (the
        tokens a loss trains on) and every other entry is 0: the head is most of the cost.
        """
        input_ids = input_ids.long()
        if input_ids.shape[1] < 2:
            empty = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
            return empty, empty.clone()
        hidden, _ = self.rnn(self.embed(input_ids[:, :-1]))
        return score_next_tokens(
            input_ids, hidden, lambda h: self.head(self.norm(h)), attention_mask, positions, temperature
        )

    # -- sampling -----------------------------------------------------------------------
    @torch.no_grad()
    def generate(
        self,
        prompt_ids: list[int],
        max_new_tokens: int,
        temperature: float = 1.0,
        stop_ids: Iterable[int] = (),
        generator: torch.Generator | None = None,
    ) -> tuple[list[int], list[float]]:
        """Sample up to `max_new_tokens` after `prompt_ids`; return (ids, logprobs).

        Each logprob is the float32 log-probability of the sampled token under the
        sampling distribution softmax(logits / temperature) of the current weights (at
        temperature 1.0, exactly what `token_logprobs` recomputes). Sampling stops after a
        token in `stop_ids` (kept in the output).
        """
        if not prompt_ids:
            raise ValueError("prompt_ids must hold at least one token (e.g. a BOS id)")
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0 (got {temperature})")
        bad = [t for t in prompt_ids if not 0 <= int(t) < self.vocab_size]
        if bad:
            raise ValueError(f"prompt ids must be in [0, {self.vocab_size}) (got {bad[:5]})")
        stops = {int(s) for s in stop_ids}
        was_training = self.training
        self.eval()
        try:
            logits, hidden = self(torch.tensor([list(prompt_ids)], dtype=torch.long))
            next_logits = logits[:, -1]
            ids: list[int] = []
            logprobs: list[float] = []
            for _ in range(max_new_tokens):
                log_probs = F.log_softmax(next_logits.float() / temperature, dim=-1)
                token = torch.multinomial(log_probs.exp(), 1, generator=generator)
                token_id = int(token.item())
                ids.append(token_id)
                logprobs.append(float(log_probs[0, token_id].item()))
                if token_id in stops:
                    break
                logits, hidden = self(token, hidden)
                next_logits = logits[:, -1]
            return ids, logprobs
        finally:
            self.train(was_training)

    # -- versioning ---------------------------------------------------------------------
    def fingerprint(self) -> str:
        """A short sha256 of the weights: equal fingerprints mean identical weights."""
        digest = hashlib.sha256()
        for name, tensor in sorted(self.state_dict().items()):
            digest.update(name.encode())
            digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
        return digest.hexdigest()[:16]

    def snapshot(self) -> dict[str, object]:
        """A checkpoint payload: config, version and a copy of the state dict."""
        return {
            "vocab_size": self.vocab_size,
            "d_model": self.d_model,
            "seed": self.seed,
            "version": self.version,
            "state_dict": {k: v.detach().clone() for k, v in self.state_dict().items()},
        }

    def load_snapshot(self, payload: dict[str, object]) -> None:
        """Load weights and version from `snapshot()` (e.g. a rollout worker picking up a new policy)."""
        if payload["vocab_size"] != self.vocab_size or payload["d_model"] != self.d_model:
            raise ValueError(
                f"checkpoint is vocab_size={payload['vocab_size']} d_model={payload['d_model']}, "
                f"this policy is vocab_size={self.vocab_size} d_model={self.d_model}; build a matching TinyPolicy"
            )
        self.load_state_dict(payload["state_dict"])  # type: ignore[arg-type]
        self.version = int(payload["version"])  # type: ignore[call-overload]

    def save(self, path: str) -> str:
        """Write a checkpoint file (write-then-rename, so a reader never sees half a file)."""
        import os

        buffer = io.BytesIO()
        torch.save(self.snapshot(), buffer)
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "wb") as fh:
            fh.write(buffer.getvalue())
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, path: str) -> TinyPolicy:
        """Rebuild a policy from a checkpoint written by `save`."""
        payload = torch.load(path, map_location="cpu", weights_only=True)
        policy = cls(int(payload["vocab_size"]), d_model=int(payload["d_model"]), seed=int(payload["seed"]))
        policy.load_snapshot(payload)
        return policy
