"""`trajlake vllm up|down|status`: the real server started, reported and stopped; every failure says the fix."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import psutil
import pytest

from trajlake.cli import main
from trajlake.ingest.broker import free_port
from trajlake.rollout.engine import server as vllm_server_module
from trajlake.rollout.engine.server import VllmServerError, ensure_venv, read_record, record_path, stop_server

pytestmark = pytest.mark.integration


def test_up_status_down_leaves_no_process_behind(vllm_server, tmp_path, capsys):
    port, state = free_port(), tmp_path / "state"
    args = ["--port", str(port), "--state-dir", str(state)]
    assert main(["vllm", "up", "--model", str(vllm_server.model_dir), "--name", "mine", "--json", *args]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["base_url"] == f"http://127.0.0.1:{port}" and record["model"] == "mine"
    family = [psutil.Process(record["pid"]), *psutil.Process(record["pid"]).children(recursive=True)]
    assert main(["vllm", "status", "--state-dir", str(state), "--json"]) == 0
    (status,) = json.loads(capsys.readouterr().out)
    assert status["healthy"] and status["running"] and status["pid"] == record["pid"]
    # a second `up` on the same port finds the running server instead of starting another
    assert main(["vllm", "up", "--model", str(vllm_server.model_dir), "--json", *args]) == 0
    assert json.loads(capsys.readouterr().out)["pid"] == record["pid"]

    assert main(["vllm", "down", "--state-dir", str(state)]) == 0
    assert f"stopped the vLLM server on port {port}" in capsys.readouterr().out
    assert not [p for p in family if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not vllm_server_module.port_in_use(port)
    assert main(["vllm", "status", "--state-dir", str(state)]) == 0
    assert "no vLLM server recorded" in capsys.readouterr().out


def test_down_never_signals_a_process_that_reused_the_pid(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    # a record whose pid is alive now but is not the server that was launched (another start time)
    me = psutil.Process(os.getpid())
    record = {"pid": os.getpid(), "started_at": me.create_time() - 100, "port": 1, "base_url": "http://127.0.0.1:1",
              "model": "x", "log": str(state / "vllm-1.log")}  # fmt: skip
    record_path(state, 1).write_text(json.dumps(record))
    assert read_record(state, 1) is None
    assert stop_server(state, 1) is False  # and this process is still here to assert it
    assert not record_path(state, 1).exists()


@pytest.mark.parametrize(
    ("setup", "match"),
    [
        (lambda d: None, "does not exist; create one with `trajlake model init"),
        (lambda d: d.mkdir(), "not a Hugging Face model directory"),
        (lambda d: (d.mkdir(), (d / "config.json").write_text("{}")), "no weights"),
    ],
    ids=["missing", "empty", "no-weights"],
)
def test_a_model_directory_vllm_cannot_load_is_refused_before_anything_starts(tmp_path, capsys, setup, match):
    model = tmp_path / "model"
    setup(model)
    code = main(
        ["vllm", "up", "--model", str(model), "--port", str(free_port()), "--state-dir", str(tmp_path / "s")]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert match in err and "Traceback" not in err


def test_a_port_in_use_is_refused_with_the_fix(vllm_server, tmp_path, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = main(["vllm", "up", "--model", str(vllm_server.model_dir), "--port", str(port),
                     "--state-dir", str(tmp_path / "s")])  # fmt: skip
    assert code == 2
    assert f"port {port} on 127.0.0.1 is already in use; pass --port" in capsys.readouterr().err


def test_a_server_that_dies_while_starting_shows_the_end_of_its_log(vllm_server, tmp_path, capsys):
    model = tmp_path / "model"
    model.mkdir()
    for f in Path(vllm_server.model_dir).iterdir():
        (model / f.name).write_bytes(f.read_bytes())
    config = json.loads((model / "config.json").read_text())
    config["architectures"] = ["NoSuchModelForCausalLM"]
    (model / "config.json").write_text(json.dumps(config))
    port = free_port()
    code = main(
        ["vllm", "up", "--model", str(model), "--port", str(port), "--state-dir", str(tmp_path / "s")]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert "exited with code" in err and "while starting" in err
    assert "NoSuchModelForCausalLM" in err  # vLLM's own words, from the tail of its log
    assert not vllm_server_module.port_in_use(port)


def test_an_install_that_cannot_happen_says_what_failed_and_how_to_fix_it(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAJLAKE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(
        vllm_server_module, "venv_spec", lambda device: (("trajlake-no-such-package-for-tests==0.0.1",), ())
    )
    with pytest.raises(
        VllmServerError, match=r"installing trajlake-no-such-package.* failed .*check access to PyPI"
    ):
        ensure_venv("cpu")
    assert not list((tmp_path / "cache").glob("vllm-*/.complete"))  # nothing half-installed is taken for done
