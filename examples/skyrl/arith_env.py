"""A tiny skyrl-gym environment for the example: arithmetic questions, a nudge, reward 1 for the answer."""

from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput

QUESTIONS = [("What is 2 + 3?", "5"), ("What is 7 - 4?", "3"), ("What is 3 * 3?", "9")]


class ArithEnv(BaseTextEnv):
    """Two turns: the model answers, is asked to check its answer, answers again; scored on the last."""

    def __init__(self, env_config=None, extras=None):
        super().__init__()
        self.answer = str((extras or {}).get("answer", ""))
        self.max_turns = 2

    def step(self, action: str) -> BaseTextEnvStepOutput:
        self.turns += 1
        if self.turns < self.max_turns:
            nudge = [{"role": "user", "content": "Check your answer and give the number only."}]
            return BaseTextEnvStepOutput(observations=nudge, reward=0.0, done=False, metadata={})
        return BaseTextEnvStepOutput(
            observations=[], reward=float(self.answer in action), done=True, metadata={}
        )
