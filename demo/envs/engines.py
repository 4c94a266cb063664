"""Where the demo's policy runs: the tiny torch policy in each worker, or a chat model served by vLLM.

An engine answers the few questions the async loop asks: the model name and vocabulary the
events declare, a policy client for a rollout thread, the agent function and payload of a Ray
task, and how a trainer step's weights reach the rollouts (`publish`).

- `TinyEngine`: the GRU policy over the demo vocabulary; workers keep a copy of the weights and
  load newer snapshots from a shared `PolicyStore` (Ray: a board actor) before each turn.
- `VllmEngine`: a Qwen2-architecture model directory served by one vLLM server (started here with
  `trajlake.rollout.engine.server`, or an existing one); workers talk to it through the TITO
  client, and every trainer step's checkpoint is loaded into the running server in place.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trajlake.common.threads import importing
from trajlake.demo.envs.config import EnvConfig


class TinyEngine:
    """The tiny torch policy, copied into every worker."""

    model = "tinypolicy-d64"

    def __init__(self, trainer: Any) -> None:
        from trajlake.demo.envs.loop import PolicyStore
        from trajlake.demo.envs.vocab import VOCAB_SIZE

        self.vocab_size = VOCAB_SIZE
        self.store = PolicyStore(trainer.policy.snapshot())

    def policy(self, seed: int, env: EnvConfig) -> Any:
        """A policy client for one rollout thread."""
        from trajlake.demo.envs.loop import LocalPolicyClient

        return LocalPolicyClient(self.store, seed, env.temperature)

    def publish(self, trainer: Any) -> None:
        """Make the trainer's weights the ones workers load before their next turn."""
        self.store.publish(trainer.policy.snapshot())

    def close(self) -> None:
        """Nothing to release."""


class VllmEngine:
    """A chat model served by vLLM; trainer checkpoints are reloaded into the server in place."""

    def __init__(
        self, model_dir: str | Path, base_url: str, served_name: str, temperature: float = 1.0
    ) -> None:
        from trajlake.rollout.engine.weights import WeightSync

        self.model_dir = Path(model_dir).resolve()
        self.model = str(self.model_dir)  # trajectories name the directory: its tokenizer decodes them
        self.base_url, self.served_name, self.temperature = base_url, served_name, temperature
        with importing():  # transformers imports the tokenizer's classes on first use, from any thread
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(self.model_dir))
        self.vocab_size = len(tokenizer)
        self.weights = WeightSync(base_url, serving=(self.model_dir, 0))
        self.weights.push(self.model_dir, 0)  # fresh weights, whatever the server ran before, labelled 0

    def tito_config(self) -> Any:
        """The TITO client's settings: the generate route, which reports the weight version of each output."""
        from trajlake.rollout.config import TitoConfig

        return TitoConfig(base_url=self.base_url, model=self.served_name, route="generate")

    def policy(self, seed: int, env: EnvConfig) -> Any:
        """A chat policy for one rollout thread (its own connection pool)."""
        from trajlake.demo.envs.chat_episode import ChatPolicy
        from trajlake.rollout.tito import TitoClient

        return ChatPolicy.from_model_dir(TitoClient(self.tito_config()), self.model_dir, env.temperature)

    def payload(self) -> dict[str, Any]:
        """What a Ray task needs to build its chat policy."""
        return {"base_url": self.base_url, "served_name": self.served_name, "model_dir": str(self.model_dir)}

    def publish(self, trainer: Any) -> None:
        """Load the trainer's last checkpoint into the server as its version."""
        self.weights.push(trainer.last_checkpoint, trainer.version)

    def reset(self) -> None:
        """Serve the model directory's own weights again, as version 0 (a run that starts fresh)."""
        self.weights.push(self.model_dir, 0)

    def close(self) -> None:
        """Close the weight-sync connection."""
        self.weights.close()
