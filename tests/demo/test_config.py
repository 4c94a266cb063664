"""Where the demo runs its episodes: Ray from RAY_MIN_CORES cores, threads below, and what the user says."""

from __future__ import annotations

import os

import pytest

from trajlake.cli import build_parser
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
