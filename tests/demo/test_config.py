"""Defaults that depend on the machine or the engine: Ray from RAY_MIN_CORES cores, the overfit check's loss; what the user says stands."""

from __future__ import annotations

import os

import pytest

from trajlake.cli import build_parser
from trajlake.common.settings import SettingsError
from trajlake.demo.config import RAY_MIN_CORES, DemoConfig


def parsed(*args: str) -> DemoConfig:
    return build_parser().parse_args(["demo", *args]).DemoConfig


@pytest.mark.parametrize(
    ("cores", "ray"), [(2, False), (RAY_MIN_CORES - 1, False), (RAY_MIN_CORES, True), (64, True)]
)
def test_unset_the_demo_takes_ray_from_enough_cores(
    monkeypatch: pytest.MonkeyPatch, cores: int, ray: bool
) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    assert parsed().ray is ray


@pytest.mark.parametrize("cores", [2, 64])
def test_ray_and_no_ray_are_the_users_whatever_the_cores(monkeypatch: pytest.MonkeyPatch, cores: int) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    assert parsed("--ray").ray is True and parsed("--no-ray").ray is False
    monkeypatch.setenv("TRAJLAKE_DEMO_RAY", "false" if cores > RAY_MIN_CORES else "true")
    assert parsed().ray is (cores <= RAY_MIN_CORES)


@pytest.mark.parametrize(("engine", "loss"), [("vllm", "ppo"), ("tiny", "glm5")])
def test_the_overfit_check_trains_with_the_loss_its_engine_survives(
    monkeypatch: pytest.MonkeyPatch, engine: str, loss: str
) -> None:
    assert parsed("--engine", engine).overfit_loss == loss
    monkeypatch.setenv("TRAJLAKE_DEMO_OVERFIT_LOSS", "glm5" if loss == "ppo" else "ppo")
    assert parsed("--engine", engine).overfit_loss != loss  # the user's choice stands
    monkeypatch.setenv("TRAJLAKE_DEMO_OVERFIT_LOSS", "dppo")
    with pytest.raises(SettingsError, match="TRAJLAKE_DEMO_OVERFIT_LOSS"):  # a loss it was not measured with
        parsed("--engine", engine)
