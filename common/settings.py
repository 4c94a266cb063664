"""Settings: pydantic-settings models read from TRAJLAKE_* env vars, and the argparse options made from them.

Each setting is declared once, as a field of a `Settings` model: its name, env var, default,
description and validator. `add_settings(parser, Model)` turns the fields into `--kebab-name`
options whose help shows the env var and the default; argparse never reads or converts the
environment. When a command runs, its parser builds the models from the options given and the
environment (options win), so a bad `TRAJLAKE_*` value fails only the command that reads it,
with one line naming the variable, the value and the fix.

    class SinkConfig(Settings):
        max_rows: int = Field(50_000, ge=1, description="flush after this many events")

    add_settings(parser, SinkConfig, fields=["max_rows"])   # --max-rows, env TRAJLAKE_MAX_ROWS
    args = parser.parse_args(argv)                           # args.SinkConfig, args.max_rows
"""

from __future__ import annotations

import argparse
import contextvars
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Self, Union, get_args, get_origin

from pydantic import Field, ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict
from pydantic_settings import SettingsError as SourceError

_READ_ENV: contextvars.ContextVar[bool] = contextvars.ContextVar("trajlake_read_env", default=False)


class SettingsError(ValueError):
    """Settings a command cannot run with; the message is one line that names each and its fix."""


class _EnvWhenLoading(PydanticBaseSettingsSource):
    """The env source, consulted only inside `Settings.from_env`: a model built in code reads no env."""

    def __init__(self, settings_cls: type[BaseSettings], env: PydanticBaseSettingsSource) -> None:
        super().__init__(settings_cls)
        self.env = env

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        return self.env() if _READ_ENV.get() else {}


class Settings(BaseSettings):
    """Base of every settings model: env vars TRAJLAKE_<FIELD> (or the field's alias), no unknown keys."""

    model_config = SettingsConfigDict(
        env_prefix="TRAJLAKE_",
        env_nested_delimiter="__",
        env_ignore_empty=True,
        extra="forbid",
        populate_by_name=True,
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, _EnvWhenLoading(settings_cls, env_settings)

    @classmethod
    def from_env(cls, **overrides: Any) -> Self:
        """The model from its env vars, then `overrides` (None = not given); raises pydantic's ValidationError."""
        token = _READ_ENV.set(True)
        try:
            return cls(**{k: v for k, v in overrides.items() if v is not None})
        except SourceError as err:  # a value pydantic-settings could not decode (JSON of a nested field)
            raise SettingsError(str(err)) from None
        finally:
            _READ_ENV.reset(token)


def env_name(model: type[BaseSettings], field: str) -> str:
    """The env var of `model.field`: its alias if it has one, else TRAJLAKE_<PREFIX><FIELD>."""
    alias = model.model_fields[field].validation_alias
    if isinstance(alias, str):
        return alias
    return f"{model.model_config.get('env_prefix', '')}{field}".upper()


UNIT_SUFFIXES = {"_id": None, "_s": "SECONDS"}
"""Field-name suffixes an option leaves out, and the metavar they give: `run_id` is `--run`,
`max_latency_s` is `--max-latency SECONDS`, in every command."""


def _extra(model: type[BaseSettings], field: str) -> dict[str, Any]:
    extra = model.model_fields[field].json_schema_extra
    return extra if isinstance(extra, dict) else {}


def option_name(model: type[BaseSettings], field: str) -> str:
    """The command-line option of `model.field`: `--kebab-name` without a unit suffix
    (`UNIT_SUFFIXES`), unless the field names another."""
    option = _extra(model, field).get("option")
    if isinstance(option, str):
        return option
    stem = next((field.removesuffix(s) for s in UNIT_SUFFIXES if field.endswith(s)), field)
    return "--" + stem.replace("_", "-")


def cli(
    option: str | None = None,
    metavar: str | None = None,
    *,
    aliases: Sequence[str] = (),
    off: str | None = None,
) -> dict[str, Any]:
    """`json_schema_extra` of a field whose option or metavar is not the default one. `aliases`:
    other spellings the option accepts (only where a documented contract needs an old name);
    `off`: what a `--no-X` option of a boolean field does (its description says what X does)."""
    given = {"option": option, "metavar": metavar, "aliases": list(aliases) or None, "off": off}
    return {k: v for k, v in given.items() if v is not None}


class CacheSettings(Settings):
    """Where trajlake caches downloads: Kafka jars, the vLLM venv, the producer spool."""

    cache_dir: Path = Field(
        default_factory=lambda: Path.home() / ".cache" / "trajlake",
        validation_alias="TRAJLAKE_CACHE_DIR",
        description="cache root (default ~/.cache/trajlake)",
    )


def cache_dir() -> Path:
    """The cache root: TRAJLAKE_CACHE_DIR, else ~/.cache/trajlake."""
    return CacheSettings.from_env().cache_dir


# -- argparse ----------------------------------------------------------------------------------


class SettingsParser(argparse.ArgumentParser):
    """An ArgumentParser that builds the settings models registered on it once it has parsed a command.

    Only the parser of the command that runs resolves its models, so only that command reads
    (and validates) its env vars; `--help` exits before any is read. Its commands are `_Commands`.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._settings: list[_Registration] = []
        self.register("action", "parsers", _Commands)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        ns, rest = super().parse_known_args(args, namespace)
        problems = []
        for reg in self._settings:
            try:
                reg.resolve(ns)
            except ValidationError as err:
                problems.append(settings_error(err, reg.where(), reg.names()))
            except SettingsError as err:
                problems.append(str(err))
        if problems:
            raise SettingsError(f"{self.prog}: error: {'; '.join(problems)}")
        return ns, rest


class _Commands(argparse._SubParsersAction):
    """Subcommands that each have a help line, shown by `trajlake --help` and, as the description,
    atop the command's own `--help`."""

    def add_parser(self, name: str, **kwargs: Any) -> Any:
        if not kwargs.get("help"):
            raise TypeError(f"command {name!r} needs a help line saying what it does")
        kwargs.setdefault("description", kwargs["help"][0].upper() + kwargs["help"][1:] + ".")
        return super().add_parser(name, **kwargs)


class _Registration:
    """One model registered on one parser: which of its fields are options there."""

    def __init__(
        self,
        model: type[Settings],
        fields: list[str],
        key: str,
        required: Iterable[str],
        optional: bool,
        choices: Mapping[str, Sequence[str]],
    ) -> None:
        self.model, self.fields, self.key, self.required = model, fields, key, set(required)
        self.optional, self.choices = optional, choices

    def where(self) -> dict[str, str]:
        out = {}
        for name in self.model.model_fields:
            env = env_name(self.model, name)
            fix = f"{option_name(self.model, name)} or {env}" if name in self.fields else env
            out[name] = out[env] = fix
        return out

    def names(self) -> dict[str, str]:
        return {env_name(self.model, name): name for name in self.model.model_fields}

    def resolve(self, ns: argparse.Namespace) -> None:
        given = {f: getattr(ns, f) for f in self.fields if hasattr(ns, f)}
        try:
            settings = self.model.from_env(**given)
        except ValidationError as err:
            if not self.optional or any(e["type"] != "missing" for e in err.errors()):
                raise
            setattr(ns, self.key, None)  # left out as a whole: the command says what it needs instead
            for f in self.fields:
                setattr(ns, f, None)
            return
        missing = [f for f in sorted(self.required) if f not in settings.model_fields_set]
        if missing:
            where = self.where()
            raise SettingsError("; ".join(f"{f}: required; set {where[f]}" for f in missing))
        for f, allowed in self.choices.items():  # an env var may hold a value another command takes
            if getattr(settings, f) not in allowed:
                raise SettingsError(
                    f"{f}: this command takes {' or '.join(allowed)} (got {getattr(settings, f)!r}); "
                    f"set {self.where()[f]}"
                )
        setattr(ns, self.key, settings)
        for f in self.fields:
            setattr(ns, f, getattr(settings, f))


def group_usage(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    """The handler of a command group run without one of its actions (`trajlake kafka`): print the
    group's help and exit 2."""

    def handler(_args: argparse.Namespace) -> int:
        parser.print_help()
        return 2

    return handler


def add_settings(
    parser: argparse.ArgumentParser,
    model: type[Settings],
    fields: Iterable[str] | None = None,
    *,
    key: str | None = None,
    required: Iterable[str] = (),
    optional: bool = False,
    help: Mapping[str, str] | None = None,
    choices: Mapping[str, Sequence[str]] | None = None,
) -> None:
    """Add `model`'s fields (all, or `fields`) as options of `parser`, resolved when it parses.

    The model lands in the namespace as `key` (default: the model's class name), each field as its
    own name. `required` fields must be given (option or env) although the model has a default;
    an `optional` model may be left out: when the only problem is required fields not given, `key`
    and each field are None (the command then says what it needs). `help` replaces a field's
    description in this command's help; `choices` narrows a field's values in this command (a
    command that prints no CSV takes `--format table|json`: one vocabulary, the part it supports).
    """
    if not isinstance(parser, SettingsParser):
        raise TypeError("add_settings needs a SettingsParser (cli.build_parser makes them)")
    names = list(fields) if fields is not None else list(model.model_fields)
    for name in names:
        needed = name in set(required) or (model.model_fields[name].is_required() and not optional)
        _add_option(parser, model, name, (help or {}).get(name), needed, (choices or {}).get(name))
    parser._settings.append(
        _Registration(model, names, key or model.__name__, required, optional, choices or {})
    )


def _add_option(
    parser: argparse.ArgumentParser,
    model: type[Settings],
    name: str,
    text: str | None,
    required: bool,
    choices: Sequence[str] | None = None,
) -> None:
    field, extra = model.model_fields[name], _extra(model, name)
    env, option = env_name(model, name), option_name(model, name)
    kind, allowed = _option_type(field.annotation)
    kwargs: dict[str, Any] = {"dest": name, "default": argparse.SUPPRESS}
    if kind is bool and type(None) in get_args(field.annotation):  # unset: the model decides (--X / --no-X)
        kwargs["action"] = argparse.BooleanOptionalAction
    elif kind is bool:
        kwargs["action"] = "store_false" if option.startswith("--no-") else "store_true"
    else:
        kwargs["type"] = kind
        if choices or allowed:
            kwargs["choices"] = list(choices or allowed or [])
        else:
            suffix = next((m for s, m in UNIT_SUFFIXES.items() if name.endswith(s) and m), None)
            kwargs["metavar"] = extra.get("metavar") or suffix or option.lstrip("-").upper().replace("-", "_")
    kwargs["help"] = _help_text(model, name, option, text, required).replace("%", "%%")
    action = parser.add_argument(option, *extra.get("aliases", []), **kwargs)
    action.env = env  # type: ignore[attr-defined]  # read by the tests that walk every option


def _help_text(model: type[Settings], name: str, option: str, text: str | None, required: bool) -> str:
    """What the option does, then its env var and default. A `--no-X` flag says what it turns off
    (`cli(off=…)`): the field's description says what X does, the opposite of passing the flag."""
    field, env = model.model_fields[name], env_name(model, name)
    if option.startswith("--no-"):
        off = _extra(model, name).get("off")
        if not isinstance(off, str) or not off:
            raise TypeError(f"{model.__name__}.{name}: {option} needs cli(off=...) saying what the flag does")
        return f"{off.rstrip('.')} (env {env}=false; default: on)"
    description = text or field.description
    if not description:
        raise TypeError(f"{model.__name__}.{name} has no description: its option needs a help line")
    if required:
        default = "; required"
    elif field.is_required() or field.default_factory is not None or field.default is None:
        default = ""
    elif isinstance(field.default, list | tuple):
        default = "; default " + ",".join(map(str, field.default)) if field.default else ""
    else:
        default = f"; default {field.default}"
    return f"{description.rstrip('.')} (env {env}{default})"


def _option_type(annotation: Any) -> tuple[Any, list[str] | None]:
    """The argparse `type` (and `choices`) of a field: the model validates everything else."""
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        return _option_type(args[0]) if len(args) == 1 else (str, None)
    if origin is Literal:
        return str, [str(a) for a in get_args(annotation)]
    if annotation in (int, float, bool):
        return annotation, None
    return str, None  # str, Path, and lists given as comma-separated text


def settings_error(
    err: Any, where: Mapping[str, str] | None = None, names: Mapping[str, str] | None = None
) -> str:
    """A pydantic `ValidationError` as one line: each bad setting, what is wrong, what it got, and
    (from `where`: field or env var -> the options that set it) where to change it; `names` maps
    an env var alias back to its field."""
    parts = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"])
        msg = str(e["msg"]).removeprefix("Value error, ")
        if not loc:  # a check across several fields: its message names them
            parts.append(msg)
            continue
        fix = f"; set {where[loc]}" if where and loc in where else ""
        name = (names or {}).get(loc) or loc
        if e["type"] == "missing":
            parts.append(f"{name}: required{fix}")
        else:
            parts.append(f"{name}: {msg} (got {e.get('input')!r}){fix}")
    return "; ".join(parts)
