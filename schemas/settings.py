"""The settings several commands share: where the lake is, which run, output format, Kafka.

Each is a `trajlake.common.settings.Settings` model, declared once; commands add them to their
parsers with `add_settings`.
"""

from __future__ import annotations

import argparse
from typing import Literal

from pydantic import Field

from trajlake.common.settings import Settings, cli

DEFAULT_LAKE = "./trajlake-data"


# -- settings shared by several commands (one declaration each) ---------------------------------


class LakeSettings(Settings):
    """Where the lake is."""

    lake: str = Field(
        DEFAULT_LAKE,
        validation_alias="TRAJLAKE_LAKE",
        description="lake root: a directory or s3://bucket/prefix",
    )


LakeAccess = Literal["read", "write", "update"]
LAKE_ACCESS_HELP: dict[str, str] = {
    "read": "; it must hold a lake (a command that writes one creates it)",
    "write": "; a new lake is created there when the path holds none",
    "update": "; it must hold a lake, which the command writes to",
}


def uses_lake(parser: argparse.ArgumentParser, access: LakeAccess, unless: str | None = None) -> None:
    """Declare what the command does with its `--lake`: "read" it (`trajlake` refuses a path that
    holds no lake before the command runs, and creates nothing), "write" it (creating it), or
    "update" it (it must hold one; as a writer's, its store is checked before the command runs); with
    `unless` (an option's dest), it leaves the lake alone when that option is set (`loadgen --kafka`
    produces to the topic: the sinks write the lake, a producer needs no key that may)."""
    lake = next((a for a in parser._actions if a.dest == "lake"), None)
    if lake is None or not lake.help:
        raise TypeError(f"{parser.prog} has no --lake option: add its settings first")
    description, env = lake.help.split(" (env ", 1)
    unused = f"; unused with --{unless.replace('_', '-')}" if unless else ""
    lake.help = f"{description}{LAKE_ACCESS_HELP[access]}{unused} (env {env}"
    parser.set_defaults(lake_access=access, lake_unless=unless)


class RunSettings(Settings):
    """Which run a command reads."""

    run_id: str = Field(..., min_length=1, validation_alias="TRAJLAKE_RUN", description="the run to read")


DEFAULT_SUCCESS_THRESHOLD = 1.0


class PassSettings(Settings):
    """When a sample counts as passed (the dashboards' pass@k, `trajlake rescore`'s flips)."""

    success_threshold: float = Field(
        DEFAULT_SUCCESS_THRESHOLD, description="a sample passes when its reward is >= this"
    )


class KafkaSwitch(Settings):
    """Whether a producer uses Kafka, and where it is."""

    kafka: str | None = Field(
        None,
        validation_alias="TRAJLAKE_KAFKA",
        description="bootstrap servers HOST:PORT of Apache Kafka; unset: the in-process bus",
        json_schema_extra=cli(metavar="HOST:PORT"),
    )


class FormatSettings(Settings):
    """How a command prints a table."""

    format: Literal["table", "csv", "json"] = Field(
        "table",
        validation_alias="TRAJLAKE_FORMAT",
        description="print an aligned table, CSV (LF line ends) or JSON",
    )
    max_width: int | None = Field(
        None,
        ge=0,
        validation_alias="TRAJLAKE_MAX_WIDTH",
        description="fit a table in N characters, eliding middle columns and cutting long values; 0: "
        "cut nothing (default: the terminal's width; piped: every column, values cut at 60 characters)",
    )
