"""The Megatron-core adapter, through its interface, without a GPU.

The GPU run itself is scripts/gpu_smoke_megatron.py. Here a small causal model with
GPTModel's forward signature stands in for the GPT, so the adapter's logprob path and the
trainer recipe around it run on CPU; building a real GPTModel is checked in a subprocess.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch.nn import functional as F

from trajlake.trainer.config import SamplerConfig, TrainerConfig
from trajlake.trainer.errors import MegatronUnavailableError
from trajlake.trainer.megatron import MegatronPolicy, MegatronTrainer, megatron_available
from trajlake.trainer.reference import ReferenceTrainer


class CausalStandIn(torch.nn.Module):
    """GPTModel's calling convention: logits [B, T, V] = model(input_ids=, position_ids=, attention_mask=)."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(vocab, 8)
        self.pos = torch.nn.Embedding(256, 8)
        self.rnn = torch.nn.GRU(8, 8, batch_first=True)
        self.head = torch.nn.Linear(8, vocab)

    def forward(self, input_ids, position_ids, attention_mask):
        assert attention_mask is None  # the GPT's own causal mask applies
        out, _ = self.rnn(self.embed(input_ids) + self.pos(position_ids))
        return self.head(out)


def test_without_megatron_or_a_gpu_setup_says_how_to_get_them(lake, tmp_path):
    reason = megatron_available()
    assert reason is not None and "trajlake[train]" in reason  # this machine has no GPU
    trainer = MegatronTrainer(lake, TrainerConfig(run_id="m", checkpoint_dir=str(tmp_path)), device="cpu")
    with pytest.raises(MegatronUnavailableError, match="CUDA GPU"):
        trainer.setup()
    trainer.cleanup()


def test_policy_adapter_matches_a_direct_log_softmax():
    model = CausalStandIn(12)
    policy = MegatronPolicy(model, 12, device="cpu")
    ids = torch.tensor([[1, 2, 3, 4], [5, 6, 0, 0]])
    attn = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    lps, ent = policy.logprobs_and_entropy(ids, attn)
    expected = F.log_softmax(
        model(input_ids=ids, position_ids=torch.arange(4).expand(2, -1), attention_mask=None), -1
    )
    assert torch.allclose(lps[0, 1:], expected[0, :-1].gather(-1, ids[0, 1:, None]).squeeze(-1), atol=1e-6)
    assert lps[0, 0] == 0 and (lps[1, 2:] == 0).all() and (ent[1, 2:] == 0).all()
    assert (ent[0, 1:] > 0).all()


def test_same_recipe_and_interface_as_the_reference_trainer(lake, bus, drain, tmp_path):
    from trajlake.ingest.recorder import Recorder

    recorder = Recorder(bus, "m", vocab_size=12)
    for g in range(2):
        for i, reward in enumerate((1.0, 0.0)):
            traj = recorder.start(task_id=f"t{g}", group_id=f"g{g}", sample_index=i)
            traj.turn([3 + i, 4], [-1.0, -2.0], 0, input_token_ids=[1, 2])
            traj.reward(reward)
            traj.finish("completed")
    drain()
    public = {n for n in dir(ReferenceTrainer) if not n.startswith("_")}
    assert public <= set(dir(MegatronTrainer))
    config = TrainerConfig(
        run_id="m", steps=1, checkpoint_dir=str(tmp_path), sampler=SamplerConfig(groups_per_batch=2)
    )
    trainer = MegatronTrainer(lake, config, model_factory=CausalStandIn, device="cpu")
    trainer.setup()
    (metrics,) = trainer.train()
    trainer.cleanup()
    assert metrics["trainer_version"] == 1 and metrics["n_trajectories"] == 4 and metrics["grad_norm"] > 0
    assert lake.sql("select count(*) n from trainer_steps").to_pylist() == [{"n": 1}]


BUILD = textwrap.dedent(
    """
    import os, warnings
    warnings.simplefilter("ignore")
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("PORT", "29577"))
    dist.init_process_group("gloo", rank=0, world_size=1)
    from megatron.core import parallel_state
    parallel_state.initialize_model_parallel(1, 1)
    from trajlake.trainer.megatron import MegatronConfig, build_gpt_model
    model = build_gpt_model(64, MegatronConfig(hidden_size=32, bf16=False), use_cpu_initialization=True)
    print(type(model).__name__, sum(p.numel() for p in model.parameters()))
    """
)


@pytest.mark.integration  # a process that builds a real Megatron-core model
@pytest.mark.skipif(
    importlib.util.find_spec("megatron") is None, reason="the train extra (megatron-core) is not installed"
)
def test_builds_a_real_megatron_gpt_model_on_cpu():
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    proc = subprocess.run(
        [sys.executable, "-c", BUILD],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PORT": port},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    name, n_params = proc.stdout.split()
    assert name == "GPTModel" and int(n_params) > 0
