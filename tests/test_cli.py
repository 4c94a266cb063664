"""The `trajlake` entry point: instant help, the contract's command names, meaningful exit codes."""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import platform
import re
import subprocess
import sys

import pytest

from tests.helpers import trajlake
from trajlake.cli import build_parser, commands, main

CONTRACT = ("demo", "loadgen", "sql", "rebuild", "compact", "kafka", "ingest", "import", "doctor", "metrics",
            "ablate", "select-overfit", "dashboard", "model", "vllm")  # fmt: skip
F_SETPIPE_SZ = 1031  # Linux: set a pipe's buffer size


@pytest.mark.integration  # runs the trajlake CLI in a process
def test_help_lists_every_contract_command() -> None:
    out = trajlake("--help").stdout
    for name in CONTRACT:
        assert name in out, name


@pytest.mark.integration  # runs the trajlake CLI in a process
def test_help_imports_nothing_heavy() -> None:
    code = (
        "import sys\nfrom trajlake.cli import build_parser\nbuild_parser()\n"
        "print(','.join(m for m in ('torch','duckdb','ray','streamlit','deltalake','pyarrow','kafka','transformers','psutil') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


@pytest.mark.integration
def test_loadgen_json_prints_counts_that_match_the_lake(tmp_path) -> None:
    root = str(tmp_path / "lake")
    counts = json.loads(trajlake("loadgen", "--lake", root, "--trajectories", "40", "--json").stdout)
    assert counts["trajectories"] == 40
    got = json.loads(trajlake("sql", "--lake", root, "--format", "json",
                              "select count(*) as events, (select count(*) from trajectories) as trajectories, "
                              "(select sum(len(token_ids)) from trajectories) as tokens from events").stdout)[0]  # fmt: skip
    assert got == {k: counts[k] for k in ("events", "trajectories", "tokens")}


@pytest.mark.integration  # runs the trajlake CLI in a process
def test_bad_options_name_the_fix(tmp_path) -> None:
    out = trajlake("loadgen", "--lake", str(tmp_path), "--trajectories", "0", check=False)
    assert out.returncode == 2 and "trajectories" in out.stderr and "TRAJLAKE_TRAJECTORIES" in out.stderr


@pytest.mark.integration
def test_options_read_environment_variables(tmp_path) -> None:
    import os

    env = {**os.environ, "TRAJLAKE_LAKE": str(tmp_path / "envlake"), "TRAJLAKE_TRAJECTORIES": "3"}
    trajlake("loadgen", env=env)
    assert (tmp_path / "envlake" / "events" / "_delta_log").is_dir()


def _lake_access() -> dict[str, tuple[str | None, argparse.ArgumentParser]]:
    """Every registered command with a --lake option: its declared access ("read", "write") and parser."""
    return {
        name: (sub.get_default("lake_access"), sub)
        for name, sub in commands(build_parser())
        if any(a.dest == "lake" for a in sub._actions)
    }


LAKE_ACCESS = _lake_access()
READERS = [name for name, (access, _) in LAKE_ACCESS.items() if access in ("read", "update")]
"""The commands that refuse a --lake holding no lake (those that update one among them)."""


def test_every_command_with_a_lake_declares_whether_it_reads_or_writes_it() -> None:
    assert {
        name: access for name, (access, _) in LAKE_ACCESS.items() if access not in ("read", "write", "update")
    } == {}
    updaters = {name for name, (access, _) in LAKE_ACCESS.items() if access == "update"}
    assert {"rebuild", "compact", "train"} <= updaters  # each writes an existing lake: its store is checked
    assert {"sql", "export", "rebuild", "compact", "doctor", "metrics", "ablate", "dashboard"} <= set(READERS)
    assert {"loadgen", "demo", "ingest", "import harbor"}.isdisjoint(READERS)


def _required_arguments(parser: argparse.ArgumentParser) -> list[str]:
    """A value for each positional argument and required setting of `parser`: enough to reach the command."""
    argv = []
    for action in parser._actions:
        if not action.option_strings and action.dest != "help":
            argv.append("select 1" if action.dest == "query" else "x")
    for reg in parser._settings:
        for field in reg.fields:
            if field in reg.required or (reg.model.model_fields[field].is_required() and not reg.optional):
                argv += [next(a for a in parser._actions if a.dest == field).option_strings[0], "x"]
    return argv


@pytest.mark.parametrize("name", READERS)
@pytest.mark.parametrize("there", ["missing", "empty directory"])
def test_a_command_that_reads_a_lake_refuses_a_path_without_one_and_creates_nothing(
    name, there, tmp_path, monkeypatch, capsys
) -> None:
    """`trajlake sql --lake no-such-lake …` printed 0; `export` wrote an empty dataset; `ablate` blamed
    the run id; each left an empty directory behind."""
    monkeypatch.chdir(tmp_path)
    if there == "empty directory":
        (tmp_path / "no-such-lake").mkdir()
    before = sorted(tmp_path.rglob("*"))
    argv = [*name.split(), *_required_arguments(LAKE_ACCESS[name][1]), "--lake", "no-such-lake"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"trajlake {name.split()[0]}: error: no lake at {tmp_path / 'no-such-lake'} ")
    assert "--lake (or TRAJLAKE_LAKE)" in err and "`trajlake loadgen --lake no-such-lake" in err
    assert "`trajlake demo`" in err and "`trajlake import …`" in err
    assert sorted(tmp_path.rglob("*")) == before


@pytest.mark.integration  # runs the trajlake CLI in a process
def test_rebuild_of_a_missing_lake_fails_with_a_hint(tmp_path) -> None:
    out = trajlake("rebuild", "--lake", str(tmp_path / "nothing"), check=False)
    assert out.returncode == 2 and "no lake at" in out.stderr and "trajlake loadgen --lake" in out.stderr
    assert not (tmp_path / "nothing").exists()


@pytest.mark.integration
def test_successive_embedded_runs_into_one_lake_keep_every_event(tmp_path) -> None:
    """Each process's in-process bus starts at offset 0; none may be mistaken for an earlier one's."""
    root = str(tmp_path / "lake")
    produced = {}
    for run in ("r0", "r1", "r2"):
        out = trajlake(
            "loadgen", "--lake", root, "--run", run, "--trajectories", "12", "--seed", run[1], "--json"
        )
        produced[run] = json.loads(out.stdout)["events"]
    stored = json.loads(
        trajlake(
            "sql",
            "--lake",
            root,
            "--format",
            "json",
            "select run_id, count(*) as n from events group by 1 order by 1",
        ).stdout
    )
    assert {r["run_id"]: r["n"] for r in stored} == produced


@pytest.mark.integration
def test_a_lake_path_that_is_a_file_is_an_error_naming_it(tmp_path) -> None:
    not_a_dir = tmp_path / "notes.txt"
    not_a_dir.write_text("not a lake")
    for args in (["loadgen", "--trajectories", "2"], ["sql", "select count(*) from events"]):
        out = trajlake(args[0], "--lake", str(not_a_dir / "lake"), *args[1:], check=False)
        assert out.returncode == 2 and "Traceback" not in out.stderr
        assert f"trajlake {args[0]}: error: cannot use the lake at {not_a_dir / 'lake'}" in out.stderr
        assert "is a directory this user can write" in out.stderr
    assert not_a_dir.read_text() == "not a lake"


@pytest.mark.integration
def test_a_bad_numeric_variable_fails_only_the_command_that_reads_it(tmp_path) -> None:
    import os

    env = {**os.environ, "TRAJLAKE_UNTIL_IDLE": "soon", "TRAJLAKE_TRAJECTORIES": "2"}
    trajlake("loadgen", "--lake", str(tmp_path), env=env)  # does not read TRAJLAKE_UNTIL_IDLE
    out = trajlake("ingest", "--kafka", "127.0.0.1:9", "--lake", str(tmp_path), env=env, check=False)
    assert out.returncode == 2 and "(got 'soon'); set --until-idle or TRAJLAKE_UNTIL_IDLE" in out.stderr
    assert "Traceback" not in out.stderr
    out = trajlake(
        "ingest", "--kafka", "127.0.0.1:9", "--until-idle", "-1", "--lake", str(tmp_path), check=False
    )
    assert out.returncode == 2 and "until_idle: Input should be greater than or equal to 0" in out.stderr


@pytest.fixture(scope="module")
def versions_lake(tmp_path_factory) -> str:
    """A lake whose `events` and per-version metrics both outgrow a small pipe."""
    root = str(tmp_path_factory.mktemp("pipe") / "lake")
    trajlake("loadgen", "--lake", root, "--trajectories", "200", "--policy-versions", "100")
    return root


@pytest.mark.integration
@pytest.mark.parametrize(
    "args",
    [["sql", "select * from events"], ["metrics", "--run", "loadgen"]],
    ids=["sql", "metrics"],
)
def test_a_reader_that_stops_early_ends_the_command_quietly(versions_lake, args) -> None:
    """`trajlake sql ... | head`: the reader closes the pipe after one line; no traceback follows."""
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, F_SETPIPE_SZ, 4096)  # the output must outgrow the pipe to meet the closed end
    cmd = [
        sys.executable,
        "-c",
        "from trajlake.cli import run; run()",
        args[0],
        "--lake",
        versions_lake,
        *args[1:],
    ]
    child = subprocess.Popen(cmd, stdout=write_end, stderr=subprocess.PIPE, text=True)
    os.close(write_end)
    with os.fdopen(read_end) as reader:
        first = reader.readline()
    _, err = child.communicate(timeout=120)
    assert first.split()[0] in ("event_id", "policy_version")
    assert child.returncode in (0, 141) and err == ""


FREED_IN_FASTBINS = """
import ctypes, sys
from trajlake import cli

class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                              "fsmblks", "uordblks", "fordblks", "keepcost")]

def command(argv=None):  # stands in for the command `run` starts: frees small blocks, counts those in fastbins
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.free.argtypes, libc.mallinfo2.restype = ctypes.c_void_p, [ctypes.c_void_p], MallInfo2
    # the pointers live in one buffer that outlives the count: freeing a list of them instead could merge
    # into a free chunk of 64 KiB or more, which empties the fastbins (glibc's consolidation) by chance of layout
    blocks = (ctypes.c_void_p * 1000)()
    for i in range(len(blocks)):
        blocks[i] = libc.malloc(32)
    for block in blocks:
        libc.free(block)
    print(libc.mallinfo2().smblks)
    return 0

cli.main = command
sys.argv = ["trajlake"]
cli.run()
"""


@pytest.mark.integration  # a process of its own: the entry point changes its allocator
@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="fastbins are glibc's")
@pytest.mark.parametrize(("tunables", "fastbins"), [("", False), ("glibc.malloc.mxfast=64", True)])
def test_a_trajlake_process_frees_small_blocks_without_fastbins_unless_told(tunables, fastbins) -> None:
    env = os.environ | {"GLIBC_TUNABLES": tunables}
    out = subprocess.run([sys.executable, "-c", FREED_IN_FASTBINS], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert (int(out.stdout) > 0) is fastbins


@pytest.mark.integration  # runs the trajlake CLI in a process
def test_sigusr1_prints_where_every_thread_of_a_command_waits(tmp_path) -> None:
    """A stuck sink tells where it waits: `kill -USR1 PID` dumps its threads' stacks to its stderr."""
    import signal

    from tests.helpers import wait_until
    from trajlake.ingest.broker import free_port

    err = tmp_path / "ingest.err"
    env = {**os.environ, "TRAJLAKE_KAFKA_CONNECT_TIMEOUT_S": "120"}
    with err.open("w") as out:  # a broker that is not there: the sink waits for it
        proc = subprocess.Popen([sys.executable, "-c", "from trajlake.cli import run; run()", "ingest", "--lake",
                                 str(tmp_path / "lake"), "--kafka", f"127.0.0.1:{free_port()}"],
                                stderr=out, env=env)  # fmt: skip
    try:
        wait_until(lambda: "ECONNREFUSED" in err.read_text(), 60, "the sink trying to reach its broker")
        proc.send_signal(signal.SIGUSR1)
        wait_until(lambda: "most recent call first" in err.read_text(), 30, "the stacks on stderr")
        assert proc.poll() is None  # the dump stops nothing
        dump = err.read_text().split("most recent call first", 1)[1]
        # the command's own frames (faulthandler prints a thread's newest 100: its entry point may be cut)
        assert re.search(r'(cli|sink|commands|kafka_subscriber)\.py", line', dump), dump[-3000:]
    finally:
        proc.kill()
        proc.wait()
