"""Live adapters for RL frameworks: each records what its framework runs into the lake.

A framework is imported only inside its own module (or not at all, where the adapter talks to
its server over HTTP), so trajlake installs and imports without any of them; each framework's
own venv is built by scripts/framework-venv.sh from scripts/frameworks.toml.
"""

from __future__ import annotations

from collections.abc import Sequence


def supported_releases(package: str, lines: Sequence[str]) -> str:
    """The release lines an adapter maps, as a user reads them: "harbor 0.25.x"."""
    return ", ".join(f"{package} {line}.x" for line in lines)


def check_release(package: str, version: str | None, lines: Sequence[str], error: type[Exception]) -> None:
    """Raise `error` unless `version` of `package` is in one of the release `lines` (major.minor)."""
    if ".".join(str(version or "").split(".")[:2]) not in lines:
        raise error(
            f"{package} {version or 'of unknown version'} is not supported; "
            f"this adapter supports {supported_releases(package, lines)}"
        )


def installed_release(package: str, lines: Sequence[str], error: type[Exception], venv: str) -> str:
    """The installed release of `package`; raise `error` (saying how to get one) unless it is supported."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version(package)
    except PackageNotFoundError as err:
        raise error(
            f"{package} is not installed here; install one of: {supported_releases(package, lines)} "
            f"(scripts/framework-venv.sh {venv} builds a venv with it)"
        ) from err
    check_release(package, found, lines, error)
    return found
