"""Megatron-core adapter: the reference trainer's interface with a Megatron GPTModel on GPUs.

Install with the `train` extra (`pip install 'trajlake[train]'`, which brings
megatron-core); megatron is imported only when a model is built, so this module imports
anywhere. `MegatronTrainer` keeps the recipe of `ReferenceTrainer` (setup / train /
train_step / save_checkpoint / cleanup, same sampler, losses, metrics and events) and
swaps the model: `MegatronPolicy` wraps a GPTModel so that the shared `policy_step` gets
per-token logprobs and entropy from it. scripts/gpu_smoke_megatron.py runs one on a GPU.

Sequences are right-padded and the GPT's attention is causal, so padding never changes
the logprobs of real tokens (the same contract as the tiny policy).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field

from trajlake.trainer.errors import MegatronUnavailableError
from trajlake.trainer.policy import score_next_tokens
from trajlake.trainer.reference import ReferenceTrainer

INSTALL_HINT = "install the train extra (pip install 'trajlake[train]') on a machine with a CUDA GPU"


class MegatronConfig(BaseModel):
    """Shape and parallelism of the Megatron GPT model."""

    model_config = ConfigDict(extra="forbid")

    num_layers: int = Field(2, ge=1, description="Transformer layers.")
    hidden_size: int = Field(256, ge=8, description="Hidden width.")
    num_attention_heads: int = Field(4, ge=1, description="Attention heads (must divide hidden_size).")
    max_sequence_length: int = Field(8192, ge=2, description="Longest sequence (position embeddings).")
    tensor_parallel: int = Field(1, ge=1, description="Tensor-parallel size.")
    pipeline_parallel: int = Field(
        1, ge=1, description="Pipeline-parallel size (1: the adapter runs the whole model)."
    )
    bf16: bool = Field(True, description="Train in bfloat16 (logprobs are still taken in float32).")


def megatron_available() -> str | None:
    """None when megatron-core and a CUDA GPU are both present, else why not (with the fix)."""
    import importlib.util

    if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
        return f"megatron-core is not installed; {INSTALL_HINT}"
    if not torch.cuda.is_available():
        return f"no CUDA GPU is visible; {INSTALL_HINT}"
    return None


def init_model_parallel(config: MegatronConfig, seed: int) -> None:
    """Start torch.distributed (NCCL; one process unless torchrun set WORLD_SIZE) and Megatron's groups."""
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29511")
        rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl", rank=rank, world_size=world)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(config.tensor_parallel, config.pipeline_parallel)
    model_parallel_cuda_manual_seed(seed)


def build_gpt_model(vocab_size: int, config: MegatronConfig, use_cpu_initialization: bool = False) -> Any:
    """A Megatron-core GPTModel with the local (Transformer-Engine-free) layer spec."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    dtype = torch.bfloat16 if config.bf16 else torch.float32
    transformer = TransformerConfig(
        num_layers=config.num_layers,
        hidden_size=config.hidden_size,
        num_attention_heads=config.num_attention_heads,
        tensor_model_parallel_size=config.tensor_parallel,
        pipeline_model_parallel_size=config.pipeline_parallel,
        use_cpu_initialization=use_cpu_initialization,
        bf16=config.bf16,
        params_dtype=dtype,
        pipeline_dtype=dtype,
    )
    model = GPTModel(
        config=transformer,
        transformer_layer_spec=get_gpt_layer_local_spec(),
        vocab_size=vocab_size,
        max_sequence_length=config.max_sequence_length,
    )
    if not config.bf16:
        return model
    # Megatron's own mixed-precision wrapper: every parameter in bf16 (the local spec's norms are
    # built in fp32, and a bare bf16 GPTModel fails "expected mat1 and mat2 to have the same dtype"
    # on the H200), logits returned in fp32.
    from megatron.core.transformer.module import Float16Module

    return Float16Module(transformer, model)


class MegatronPolicy(torch.nn.Module):
    """Gives a GPT that maps (input_ids, position_ids, attention_mask) to logits the trainer's policy API."""

    def __init__(self, model: torch.nn.Module, vocab_size: int, device: str | torch.device = "cuda") -> None:
        super().__init__()
        self.model = model
        self.vocab_size = vocab_size
        self.device = torch.device(device)
        self.version = 0

    def logprobs_and_entropy(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        temperature: float = 1.0,
        positions: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-token logprob and entropy [B, T] (float32, on CPU); position 0, padding and unrequested tokens are 0."""
        ids = input_ids.long().to(self.device)
        batch, length = ids.shape
        if length < 2:
            empty = torch.zeros(batch, length, dtype=torch.float32)
            return empty, empty.clone()
        position_ids = torch.arange(length, device=self.device).unsqueeze(0).expand(batch, -1)
        logits = self.model(input_ids=ids, position_ids=position_ids, attention_mask=None)[:, :-1]
        logprobs, entropy = score_next_tokens(
            ids, logits, lambda x: x, attention_mask, positions, temperature
        )
        return logprobs.cpu(), entropy.cpu()

    def token_logprobs(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """log p(token_t | tokens < t), [B, T]."""
        return self.logprobs_and_entropy(input_ids, attention_mask)[0]

    def snapshot(self) -> dict[str, Any]:
        """Checkpoint payload: vocab, version and the model's state dict (on CPU)."""
        state = {
            k: v.detach().cpu() for k, v in self.model.state_dict().items() if isinstance(v, torch.Tensor)
        }
        return {"vocab_size": self.vocab_size, "version": self.version, "state_dict": state}

    def load_snapshot(self, payload: dict[str, Any]) -> None:
        """Load weights and version from `snapshot()`."""
        self.model.load_state_dict(payload["state_dict"], strict=False)
        self.version = int(payload["version"])

    def save(self, path: str) -> str:
        """Write a single-rank checkpoint (write-then-rename); with TP/PP > 1 use Megatron's dist checkpointing."""
        tmp = f"{path}.tmp-{os.getpid()}"
        torch.save(self.snapshot(), tmp)
        os.replace(tmp, path)
        return path


class MegatronTrainer(ReferenceTrainer):
    """`ReferenceTrainer`'s recipe with a Megatron-core GPT in place of the tiny policy."""

    def __init__(
        self,
        lake: Any,
        config: Any,
        megatron: MegatronConfig | None = None,
        *,
        model_factory: Callable[[int], torch.nn.Module] | None = None,
        device: str = "cuda",
        **kwargs: Any,
    ) -> None:
        super().__init__(lake, config, **kwargs)
        self.megatron = megatron or MegatronConfig.model_validate({})
        self.model_factory = model_factory
        self.device = device

    def build_policy(self, vocab_size: int) -> MegatronPolicy:
        """Start model parallelism and build the GPT (or the injected model, e.g. in tests)."""
        if self.model_factory is not None:
            return MegatronPolicy(self.model_factory(vocab_size), vocab_size, self.device)
        reason = megatron_available()
        if reason:
            raise MegatronUnavailableError(reason)
        init_model_parallel(self.megatron, self.config.seed)
        model = build_gpt_model(vocab_size, self.megatron).to(self.device)
        return MegatronPolicy(model, vocab_size, self.device)
