"""The CLI's conventions, read from the parser: every command and option says what it does, a
`--no-X` flag says what it turns off, one concept has one option name, one `--format` vocabulary."""

from __future__ import annotations

import argparse
from collections import defaultdict

import pytest

from trajlake.cli import build_parser, commands
from trajlake.schemas.settings import FormatSettings

COMMANDS = dict(commands(build_parser()))
OPTIONS = [
    (name, action)
    for name, parser in COMMANDS.items()
    for action in parser._actions
    if action.dest != "help" and not isinstance(action, argparse._SubParsersAction)
]
CONTRACT_ALIASES = {"--run-id"}
"""Old spellings kept because the CLI contract (docs/design.md#cli-contract) names them (`loadgen`, `import … --run-id R`)."""
FILE_FORMATS = {"export"}
"""Commands whose `--format` is a file format (`export --format parquet|jsonl|hf`, in the contract)."""
UNIT_SUFFIXES = ("-id", "-ids", "-s", "-dir", "-path", "-file", "-url")


def _help(action: argparse.Action) -> str:
    """What the option's help says it does, without the env var and default the generator adds."""
    return (action.help or "").split(" (env ")[0].strip()


def _parent_help(name: str) -> str | None:
    words = name.split()
    parent = build_parser() if len(words) == 1 else COMMANDS[" ".join(words[:-1])]
    for action in parent._actions:
        if isinstance(action, argparse._SubParsersAction):
            return next((c.help for c in action._choices_actions if c.dest == words[-1]), None)
    return None


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_command_has_a_help_line_and_a_description(name: str) -> None:
    """Only `sql` and `demo` had a description atop their own --help."""
    assert _parent_help(name), f"trajlake {name} has no help line in its parent's --help"
    assert COMMANDS[name].description, f"trajlake {name} --help has no description"


@pytest.mark.parametrize(("name", "action"), OPTIONS, ids=[f"{n} {a.dest}" for n, a in OPTIONS])
def test_every_option_says_what_it_does(name: str, action: argparse.Action) -> None:
    said = _help(action)
    spelled = (action.dest, *(o.lstrip("-") for o in action.option_strings))
    assert said and said.replace("_", "-") not in {s.replace("_", "-") for s in spelled}, (
        f"trajlake {name} {action.option_strings or action.dest}: help {action.help!r} says nothing"
    )


NO_FLAGS = [
    (n, a)
    for n, a in OPTIONS
    if any(o.startswith("--no-") for o in a.option_strings)
    and not isinstance(a, argparse.BooleanOptionalAction)
]
"""The `--no-X` flags of fields on by default (an `--X / --no-X` pair leaves an unset field to the model)."""


@pytest.mark.parametrize(
    ("name", "action"), NO_FLAGS, ids=[f"{n} {a.option_strings[0]}" for n, a in NO_FLAGS]
)
def test_a_no_flag_says_what_passing_it_does(name: str, action: argparse.Action) -> None:
    """`--no-vacuum`'s help was "delete unreferenced files after merging": what the flag stops."""
    parser = COMMANDS[name]
    reg = next(r for r in parser._settings if action.dest in r.fields)
    described = (reg.model.model_fields[action.dest].description or "").rstrip(".").lower()
    assert described and described not in _help(action).lower(), action.help
    assert f"{action.env}=false" in (action.help or "")  # type: ignore[attr-defined]
    assert NO_FLAGS, "the walk found no --no-X flag"


def _concept(option: str) -> str:
    """An option's name without what spellings drift on: `--no-`, a unit suffix, hyphens."""
    name = option.removeprefix("--").removeprefix("no-")
    for suffix in UNIT_SUFFIXES:
        name = name.removesuffix(suffix)
    return name.replace("-", "")


def test_one_concept_has_one_option_name_across_commands() -> None:
    """`--run` here, `--run-id` there; `--poll-interval-s` beside `--max-latency`: each concept is
    spelled one way (its first option string), and an alias is only an old name the contract keeps."""
    spellings: dict[str, set[str]] = defaultdict(set)
    where: dict[str, set[str]] = defaultdict(set)
    aliases = set()
    for name, action in OPTIONS:
        if not action.option_strings:
            continue
        primary, *others = action.option_strings
        spellings[_concept(primary)].add(primary)
        where[primary].add(name)
        if isinstance(action, argparse.BooleanOptionalAction):  # --X / --no-X: one option, both ways
            others = [o for o in others if o != f"--no-{primary[2:]}"]
        aliases.update(others)
        assert all(_concept(o) == _concept(primary) for o in others), action.option_strings
    drifted = {k: {s: sorted(where[s]) for s in v} for k, v in spellings.items() if len(v) > 1}
    assert drifted == {}
    assert aliases <= CONTRACT_ALIASES


def test_format_is_one_vocabulary() -> None:
    """`doctor --format {text,json}` beside `{table,csv,json}` elsewhere."""
    vocabulary = set(FormatSettings.model_fields["format"].annotation.__args__)  # type: ignore[union-attr]
    formats = {name: set(a.choices or ()) for name, a in OPTIONS if "--format" in a.option_strings}
    assert len(formats) >= 5
    for name, choices in formats.items():
        assert name in FILE_FORMATS or ({"table", "json"} <= choices <= vocabulary), (name, choices)


@pytest.mark.parametrize(
    "argv",
    [["loadgen", "--trajectories", "1"], ["import", "harbor", "JOB_DIR"], ["import", "skyrl", "FILE"]],
    ids=["loadgen", "import-harbor", "import-skyrl"],
)
def test_the_contracts_run_id_spelling_still_names_the_run(argv: list[str], monkeypatch) -> None:
    """docs/design.md#cli-contract: `loadgen [--run-id R]`, `import harbor JOB_DIR [--run-id R]`; `--run` elsewhere."""
    monkeypatch.delenv("TRAJLAKE_RUN_ID", raising=False)
    monkeypatch.delenv("TRAJLAKE_IMPORT_RUN_ID", raising=False)
    parser = build_parser()
    assert parser.parse_args([*argv, "--run-id", "r7"]).run_id == "r7"
    assert parser.parse_args([*argv, "--run", "r8"]).run_id == "r8"
