"""A tiny verifiers 0.4 taskset for the example: arithmetic questions, reward 1 when the reply has the answer."""

import verifiers.v1 as vf

QUESTIONS = [("What is 2 + 3?", "5"), ("What is 7 - 4?", "3"), ("What is 3 * 3?", "9")]


class ArithData(vf.TaskData):
    answer: str = ""


class ArithTask(vf.Task[ArithData]):
    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        return float(self.data.answer in trace.last_reply)


class ArithConfig(vf.TasksetConfig):
    num_tasks: int = 3


class ArithTaskset(vf.Taskset[ArithTask, ArithConfig]):
    def load(self) -> list[ArithTask]:
        rows = (QUESTIONS * self.config.num_tasks)[: self.config.num_tasks]
        return [ArithTask(ArithData(prompt=q, answer=a), self.config.task) for q, a in rows]


__all__ = ["ArithTaskset"]
