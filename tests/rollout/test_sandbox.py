"""Sandboxes: the local backend for real; Modal through its interface with a stand-in `modal` module.

Modal cannot be reached from the test machine, so `fake_modal` below is an object with the
same surface as the `modal` package (`App.lookup`, `Image.from_registry`, `Sandbox.create`,
`sandbox.exec(...).wait()/stdout.read()`, `sandbox.terminate`), injected as `modal_module`.
Its `exec` runs the command locally, and its calls can be made to hang to test the timeouts.
"""

from __future__ import annotations

import subprocess
import threading
from types import SimpleNamespace

import pytest

from trajlake.rollout.config import SandboxConfig
from trajlake.rollout.errors import SandboxTimeout
from trajlake.rollout.sandbox import setup_sandbox
from trajlake.rollout.sandbox.local import LocalSandbox
from trajlake.rollout.sandbox.modal import ModalSandbox


def test_local_sandbox_runs_commands_in_its_own_directory():
    with LocalSandbox() as box:
        box.exec("echo data > f.txt")
        result = box.exec("cat f.txt; echo oops >&2; exit 3")
        workdir = box.workdir
    assert (result.exit_code, result.stdout, result.stderr, result.timed_out) == (
        3,
        "data\n",
        "oops\n",
        False,
    )
    assert not __import__("os").path.exists(workdir)


def test_local_sandbox_timeout_kills_the_command_and_its_children():
    with LocalSandbox(SandboxConfig(exec_timeout_s=0.3)) as box:
        result = box.exec("sleep 30 & sleep 30; echo never")
    assert result.timed_out and "never" not in result.stdout


def test_the_factory_picks_the_backend_from_config():
    box = setup_sandbox(SandboxConfig(type="local"))
    assert isinstance(box, LocalSandbox)
    box.terminate()


class _Stream:
    def __init__(self, text: str) -> None:
        self.text = text

    def read(self) -> str:
        return self.text


class _Process:
    def __init__(self, args: tuple[str, ...], timeout: int, hang: threading.Event | None) -> None:
        self.args, self.timeout, self.hang = args, timeout, hang
        self.returncode: int | None = None

    def wait(self) -> int:
        if self.hang is not None:
            self.hang.wait(30)
        done = subprocess.run(
            list(self.args), capture_output=True, text=True, timeout=self.timeout, check=False
        )
        self.stdout, self.stderr, self.returncode = (
            _Stream(done.stdout),
            _Stream(done.stderr),
            done.returncode,
        )
        return done.returncode


class _FakeSandbox:
    def __init__(self, owner: FakeModal, kwargs: dict) -> None:
        self.owner, self.kwargs = owner, kwargs
        self.terminated = False

    def exec(self, *args: str, timeout: int) -> _Process:
        self.owner.calls.append(("exec", args, timeout))
        return _Process(args, timeout, self.owner.hang.get("exec"))

    def terminate(self) -> None:
        self.owner.calls.append(("terminate",))
        if "terminate" in self.owner.hang:
            self.owner.hang["terminate"].wait(30)
        self.terminated = True


class FakeModal(SimpleNamespace):
    """The slice of the `modal` package that ModalSandbox uses."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple] = []
        self.hang: dict[str, threading.Event] = {}
        owner = self
        self.App = SimpleNamespace(
            lookup=lambda name, create_if_missing: owner.calls.append(("app", name)) or f"app:{name}"
        )
        self.Image = SimpleNamespace(from_registry=lambda ref: f"image:{ref}")

        def create(**kwargs):
            owner.calls.append(("create", kwargs))
            if "create" in owner.hang:
                owner.hang["create"].wait(30)
            return _FakeSandbox(owner, kwargs)

        self.Sandbox = SimpleNamespace(create=create)


@pytest.fixture
def fake_modal():
    fake = FakeModal()
    yield fake
    for event in fake.hang.values():
        event.set()


def modal_config(**kw) -> SandboxConfig:
    limits = {"create_timeout_s": 0.5, "exec_timeout_s": 0.5, "terminate_timeout_s": 0.5}
    return SandboxConfig(type="modal", **{**limits, **kw})


def test_modal_sandbox_creates_runs_and_terminates_through_the_modal_api(fake_modal):
    box = setup_sandbox(modal_config(image="python:3.12-slim"), modal_module=fake_modal)
    result = box.exec("echo from-modal")
    box.terminate()
    box.terminate()  # idempotent
    assert result.ok and result.stdout == "from-modal\n"
    kinds = [c[0] for c in fake_modal.calls]
    assert kinds == ["app", "create", "exec", "terminate"]
    assert fake_modal.calls[1][1]["image"] == "image:python:3.12-slim"
    assert fake_modal.calls[2][1] == ("bash", "-c", "echo from-modal")


@pytest.mark.parametrize("stage", ["create", "terminate"])
def test_a_hung_modal_call_becomes_a_sandbox_timeout_naming_the_stage(fake_modal, stage):
    fake_modal.hang[stage] = threading.Event()
    with pytest.raises(SandboxTimeout) as info:
        box = ModalSandbox(modal_config(**{f"{stage}_timeout_s": 0.1}), modal_module=fake_modal)
        box.terminate()
    assert info.value.stage == stage


def test_a_hung_modal_exec_returns_a_timed_out_result(fake_modal):
    fake_modal.hang["exec"] = threading.Event()
    box = ModalSandbox(modal_config(), modal_module=fake_modal, exec_slack_s=0.1)
    result = box.exec("echo hi", timeout_s=0.2)
    assert result.timed_out and not result.ok
