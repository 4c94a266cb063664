"""Every option's env var: garbage in it leaves help working and fails only its command, in one line."""

from __future__ import annotations

import argparse
from typing import Any

import pytest
from pydantic import ValidationError

from trajlake.cli import build_parser, main
from trajlake.common.settings import SettingsParser


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    """Every runnable (sub)command's parser, by its words: ("kafka", "up") -> parser."""
    found = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found[(*path, name)] = sub
                found.update(_commands(sub, (*path, name)))
    return found


def _options() -> list[tuple[tuple[str, ...], Any, Any]]:
    """(command words, option action, its registration) for every option made from a settings field."""
    out = []
    for words, parser in _commands(build_parser()).items():
        assert isinstance(parser, SettingsParser)
        for reg in parser._settings:
            for action in parser._actions:
                if action.dest in reg.fields and hasattr(action, "env"):
                    out.append((words, action, reg))
    return out


OPTIONS = _options()
IDS = [f"{' '.join(w)} {a.option_strings[0]}" for w, a, _ in OPTIONS]

# the arguments after which each command reaches its settings (positional ones included)
POSITIONAL = {("sql",): ["select 1"], ("import", "harbor"): ["/nowhere"], ("import", "skyrl"): ["/nowhere"],
              ("import", "verifiers"): ["/nowhere"], ("model", "init"): ["/nowhere"]}  # fmt: skip


def _rejects(reg: Any, field: str, value: str) -> bool:
    """True when the model refuses `value` for `field` (built in code: no env read)."""
    try:
        reg.model(**{field: value})
    except ValidationError as err:
        return any(
            e["loc"] and e["loc"][0] in (field, reg.model.model_fields[field].validation_alias)
            for e in err.errors()
        )
    return False


# the options for which "abc" is garbage (a free-text option takes it as a value)
REJECTING = [(w, a, r) for w, a, r in OPTIONS if _rejects(r, a.dest, "abc")]
REJECTING_IDS = [f"{' '.join(w)} {a.option_strings[0]}" for w, a, _ in REJECTING]


def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("TRAJLAKE_"):
            monkeypatch.delenv(name)


def test_every_command_option_has_an_env_var_but_presentation_switches() -> None:
    for words, parser in _commands(build_parser()).items():
        for action in parser._actions:
            if not action.option_strings or action.dest in ("help", "json"):
                continue
            assert hasattr(action, "env"), (
                f"trajlake {' '.join(words)} {action.option_strings[0]} has no env var"
            )


def test_each_env_var_is_one_setting() -> None:
    """One env name, one declaration: the same type, default and description wherever it is read."""
    seen: dict[str, tuple[str, Any, Any, Any]] = {}
    for words, action, reg in OPTIONS:
        info = reg.model.model_fields[action.dest]
        declared = (
            action.dest,
            info.annotation,
            info.get_default(call_default_factory=False),
            info.description,
        )
        first = seen.setdefault(action.env, declared)
        assert declared == first, f"{action.env} means two things: {first} and {declared} ({' '.join(words)})"


def test_the_parser_builds_with_garbage_in_every_env_var(monkeypatch, capsys) -> None:
    """Building the parser reads no env var (`main` builds it once per process): with "abc" in
    all of them at once, it builds and its help works."""
    _clean_env(monkeypatch)
    for _, action, _ in OPTIONS:
        monkeypatch.setenv(action.env, "abc")
    parser = build_parser()
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(["--help"])
    assert exit_.value.code == 0
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize(("words", "action", "reg"), OPTIONS, ids=IDS)
def test_garbage_in_an_env_var_leaves_help_working(words, action, reg, monkeypatch, capsys) -> None:
    _clean_env(monkeypatch)
    monkeypatch.setenv(action.env, "abc")
    for argv in (["--help"], [*words, "--help"]):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 0, argv
    assert "Traceback" not in capsys.readouterr().err


def test_most_options_reject_garbage() -> None:
    """The one-line failure below is checked on many options, not on the few that reject text."""
    assert len(REJECTING) > len(OPTIONS) / 2, [a.env for _, a, _ in REJECTING]


@pytest.mark.parametrize(("words", "action", "reg"), REJECTING, ids=REJECTING_IDS)
def test_garbage_in_an_env_var_fails_its_command_in_one_line(words, action, reg, monkeypatch, capsys) -> None:
    _clean_env(monkeypatch)
    monkeypatch.setenv(action.env, "abc")
    monkeypatch.setenv("TRAJLAKE_RUN", "r")  # required elsewhere: let the bad value be the only problem
    monkeypatch.setenv("TRAJLAKE_IMPORT_RUN_ID", "r")
    monkeypatch.setenv("TRAJLAKE_MODEL", "/nowhere")
    monkeypatch.setenv("TRAJLAKE_TRAJECTORIES", "1")
    if action.env in ("TRAJLAKE_RUN", "TRAJLAKE_IMPORT_RUN_ID", "TRAJLAKE_MODEL", "TRAJLAKE_TRAJECTORIES"):
        monkeypatch.setenv(action.env, "abc")
    assert main([*words, *POSITIONAL.get(words, [])]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"trajlake {' '.join(words)}: error: ")
    assert action.env in err and "'abc'" in err and "; set " in err
