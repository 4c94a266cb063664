"""Shared fixtures: a fresh lake and an in-process bus per test; server fixtures live in tests/fixtures/."""

from __future__ import annotations

import faulthandler
import fcntl
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from _pytest.faulthandler import fault_handler_stderr_fd_key

from trajlake.ingest.bus.inprocess import InProcessBus
from trajlake.ingest.sink import DeltaSink, SinkConfig
from trajlake.store.lake import Lake

pytest_plugins = [
    name
    for name in (
        "tests.fixtures.postgres",
        "tests.fixtures.kafka",
        "tests.fixtures.s3",
        "tests.fixtures.spark",
        "tests.fixtures.vllm",
        "tests.fixtures.agent_lightning",
        "tests.fixtures.verifiers_venv",
        "tests.fixtures.harbor_venv",
        "tests.fixtures.skyrl_venv",
    )
    if (Path(__file__).parent / "fixtures" / (name.rsplit(".", 1)[1] + ".py")).exists()
]


PRODUCT_KAFKA_ENV = ("TRAJLAKE_KAFKA", "TRAJLAKE_KAFKA_BOOTSTRAP")
"""The product's Kafka variables. A shell pointed at a real cluster must never send it test topics:
tests find their broker through TRAJLAKE_TEST_KAFKA_BOOTSTRAP alone (tests/fixtures/kafka.py), and
these leave the environment of the tests and of every process they start."""
for _name in PRODUCT_KAFKA_ENV:
    os.environ.pop(_name, None)


@pytest.fixture
def lake(tmp_path: Path) -> Iterator[Lake]:
    """An empty lake in a temporary directory."""
    lake = Lake(tmp_path / "lake")
    yield lake
    lake.close()


@pytest.fixture
def bus() -> InProcessBus:
    """The embedded in-process bus."""
    return InProcessBus()


@pytest.fixture
def drain(lake: Lake, bus: InProcessBus):
    """Call to move everything published on `bus` into `lake` (one sink run until idle)."""

    def _drain(**config: object) -> DeltaSink:
        sink = DeltaSink(lake, bus, SinkConfig(**config))  # type: ignore[arg-type]
        sink.run(until_idle_s=0.0)
        return sink

    return _drain


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], object]) -> Path:
    """`build(path)` run once per pytest run, then shared read-only by every xdist worker.

    The first worker to ask builds it in the run's common temporary directory while the others wait
    on a file lock; a worker whose build failed leaves no marker, so the next one tries again.
    """
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # popen-gw0, popen-gw1, … share their parent
    target, done = base / f"shared-{name}", base / f"shared-{name}.done"
    with open(base / f"shared-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir()
            build(target)
            done.touch()
    return target


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> Path:
    """The tiny Qwen2 chat model `trajlake model init` writes (shared: read it, never change it)."""
    from trajlake.cli import main

    def init(root: Path) -> None:
        assert main(["model", "init", str(root / "tiny"), "--vocab-size", "400", "--seed", "3"]) == 0

    return built_once(tmp_path_factory, "model", init) / "tiny"


@pytest.fixture(scope="session")
def tiny_demo_lake(tmp_path_factory) -> Path:
    """A shortened `trajlake demo --engine tiny` (runs `demo` and `demo-overfit`, seconds, no server)
    in `<dir>/trajlake-data`, shared by the docs pages and the Spark tour: copy it before writing."""
    import subprocess

    def demo(root: Path) -> None:
        done = subprocess.run(
            [str(Path(sys.executable).parent / "trajlake"), "demo", "--engine", "tiny", "--no-ray", "--steps", "20",
             "--overfit-tasks", "8", "--lake", str(root / "trajlake-data")],
            capture_output=True, text=True, timeout=900, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]

    return built_once(tmp_path_factory, "tiny-demo", demo) / "trajlake-data"


@pytest.fixture(scope="session")
def tokenizer(model_dir: Path):
    """The tiny model's tokenizer, loaded with transformers."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)


@pytest.fixture(autouse=True)
def _no_proxy_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests talk to loopback servers only; a proxy in the environment must not intercept them."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def pytest_configure(config: pytest.Config) -> None:
    """A bare `pytest` runs the unit tests alone (no servers): the integration tests run through
    scripts/test.sh, which starts their servers and passes `-m ""`. Tests named on the command
    line, or a `-m` given, run as asked."""
    given = config.invocation_params.args
    chose_marks = any(a == "-m" or (a.startswith("-m") and not a.startswith("--")) for a in given)
    if not chose_marks and config.args_source != pytest.Config.ArgsSource.ARGS:  # no test named
        config.option.markexpr = "not integration"


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Torch computes on one thread: the models are tiny, and xdist already runs a worker per core."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.get_num_threads() != 1:
        torch.set_num_threads(1)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[pytest.TestReport]:
    """A failure is printed as it happens, not only in the summary: a run that a native crash ends
    later (the whole suite runs in one process) still shows what failed before it."""
    report = yield
    terminal = item.config.pluginmanager.get_plugin("terminalreporter")
    if report.failed and terminal is not None:
        terminal.write_line("")
        terminal.write_sep("!", f"FAILED {report.nodeid} ({report.when})")
        terminal.write_line(str(report.longrepr)[-6000:])
    return report


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    """`ray.init` replaces the handler that prints every thread's stack on a native crash, and
    `ray.shutdown` leaves none: a later segfault would end the run without a word. It is re-armed
    on pytest's own copy of stderr after every test (after the fixtures' teardown)."""
    fd = item.config.stash.get(fault_handler_stderr_fd_key, None)
    if fd is not None:
        faulthandler.disable()
        faulthandler.enable(file=fd, all_threads=True)
