"""A Hugging Face causal LM as the trainer's policy: the model vLLM serves, trained with transformers on CPU.

`HFPolicy` gives the shared `policy_step` what it needs (per-token logprobs and entropy of the
sampled tokens, parameters) from any `AutoModelForCausalLM` directory, e.g. the one
`trajlake model init` writes. Its checkpoints are model directories (safetensors + config),
which is what vLLM's in-place reload reads, so a trainer step ends with weights the running
server can load. `HFTrainer` is the reference recipe with this model swapped in.

Logprobs are computed in float32 over the distribution the engine sampled from: the model's
logits / temperature over the whole vocabulary (vLLM's `--logprobs-mode processed_logprobs`, as
`trajlake vllm up` serves), so a healthy fp32 run on CPU mismatches by ~1e-7.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trajlake.common.threads import importing
from trajlake.trainer.policy import score_next_tokens
from trajlake.trainer.reference import ReferenceTrainer

WEIGHTS_FILE = "model.safetensors"


class HFPolicy(nn.Module):
    """A transformers causal LM with the tiny policy's trainer interface; `version` counts updates."""

    def __init__(
        self,
        model_dir: str | Path,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        with importing():  # the demo's rollout threads may be loading transformers' tokenizers meanwhile
            from transformers import AutoModelForCausalLM
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()  # a bar per checkpoint load or save would bury the run's output
            self.model_dir = Path(model_dir)
            self.model = AutoModelForCausalLM.from_pretrained(str(self.model_dir), dtype=dtype)
        self.model.train()
        self.vocab_size = int(self.model.config.vocab_size)
        self.version = 0

    def logprobs_and_entropy(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        temperature: float = 1.0,
        positions: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """log p(token_t | tokens < t) and the entropy of that distribution, float32 [B, T].

        Position 0 and padding are 0; with `positions` (bool [B, T]) the vocabulary head runs
        only where it is set (the tokens a loss trains on).
        """
        input_ids = input_ids.long()
        if input_ids.shape[1] < 2:
            empty = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
            return empty, empty.clone()
        hidden = self.model.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state[
            :, :-1
        ]
        return score_next_tokens(
            input_ids, hidden, self.model.lm_head, attention_mask, positions, temperature
        )

    def token_logprobs(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """log p(token_t | tokens < t), float32 [B, T], without gradients (for checks against the engine)."""
        with torch.no_grad():
            return self.logprobs_and_entropy(input_ids, attention_mask)[0]

    def save(self, path: str | Path) -> str:
        """Write the model directory `path` (write-then-rename, so vLLM never reads half of it)."""
        target = Path(path)
        tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        self.model.save_pretrained(str(tmp), safe_serialization=True)
        shutil.rmtree(target, ignore_errors=True)
        os.replace(tmp, target)
        return str(target)

    def load(self, path: str | Path) -> None:
        """Load weights from a model directory written by `save`."""
        from safetensors.torch import load_file

        self.model.load_state_dict(load_file(str(Path(path) / WEIGHTS_FILE)), strict=False)


class HFTrainer(ReferenceTrainer):
    """The reference recipe training a Hugging Face model directory; checkpoints are model directories."""

    def __init__(self, *args: Any, model_dir: str | Path, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.model_dir = Path(model_dir)
        self.last_checkpoint: str | None = None  # what a weight update loads into the inference server

    def build_policy(self, vocab_size: int) -> HFPolicy:
        """The model in `model_dir` (its own vocabulary; `vocab_size` of the run must fit it)."""
        policy = HFPolicy(self.model_dir)
        if vocab_size > policy.vocab_size:
            raise ValueError(
                f"the run's events declare a vocabulary of {vocab_size}, the model in {self.model_dir} "
                f"has {policy.vocab_size}; train the model that generated the run"
            )
        return policy

    def _resume(self) -> int:
        latest = self.catalog.latest_policy_version(self.config.run_id) if self.catalog else None
        if latest and latest["checkpoint"] and (Path(latest["checkpoint"]) / WEIGHTS_FILE).exists():
            self.policy.load(latest["checkpoint"])
            self.step = int(latest["step"])
            return int(latest["version"])
        return 0

    def save_checkpoint(self) -> str:
        """Write the model directory `<checkpoint_dir>/step-<step>`; return its path."""
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        self.last_checkpoint = self.policy.save(self.checkpoint_dir / f"step-{self.step:06d}")
        return self.last_checkpoint
