"""A local S3 server for dev and tests: SeaweedFS's `weed mini` (master, volume, filer and S3 in one
process), every listener on 127.0.0.1, credentials enforced.

`start_s3` builds `weed` once (`seaweedfs_build`), lays out the data directory (`server.json`: every
port and the credentials, generated on first start and kept, so data and clients survive a
restart; `s3.json`: SeaweedFS's identity file; `weed.log`, `weed.pid`), starts the process
detached, waits until the S3 API answers and creates the bucket. `stop_s3` stops it.

Besides the admin key (`trajlake`: creates buckets), the server knows one identity per role with
the rights the role needs (`ROLE_ACTIONS`): `trajlake-writer` writes lakes (sinks, projector,
trainers, compaction), `trajlake-reader` reads and lists only (dashboards, SQL users).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import secrets
import signal
import socket
import subprocess
from collections.abc import Collection
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from trajlake.common.procs import proc_stat
from trajlake.common.retry import wait_until
from trajlake.common.settings import Settings
from trajlake.store.seaweedfs_build import S3ServerError, ensure_weed

log = logging.getLogger(__name__)

LAYOUT_FILE = "server.json"
PID_FILE = "weed.pid"
ACCESS_KEY = "trajlake"
ADMIN_ACTIONS = ["Admin", "Read", "List", "Tagging", "Write"]
ROLE_ACTIONS: dict[str, list[str]] = {
    "writer": ["Read", "List", "Tagging", "Write"],
    "reader": ["Read", "List"],
}
"""SeaweedFS's per-action rights of each role's identity (access key `trajlake-<role>`)."""
COMPONENTS = ("master", "volume", "filer", "admin")
"""The components besides S3 that listen (each also on a gRPC port)."""


class S3ServerConfig(Settings):
    """Settings of the local S3 server."""

    model_config = SettingsConfigDict(env_prefix="TRAJLAKE_S3_")

    port: int = Field(
        8333,
        ge=1,
        le=65535,
        description="S3 API port on 127.0.0.1 (the other listeners take free ports, kept in the data dir)",
    )
    data_dir: Path = Field(
        Path("./trajlake-s3"), description="the objects, metadata, credentials, log and pid file"
    )
    bucket: str = Field(
        "trajlake",
        pattern=r"^([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])?$",
        description="bucket to create at start (S3 rules: 3-63 of a-z 0-9 . -); empty: none",
    )
    start_timeout_s: float = Field(60.0, gt=0, description="how long to wait for the S3 API to answer")


@dataclass(frozen=True)
class S3Layout:
    """What `server.json` keeps: the ports and the credentials of the server in one data directory."""

    port: int
    ports: dict[str, int]
    """component (and component.grpc) -> port."""
    secret_key: str
    access_key: str = ACCESS_KEY
    role_secrets: dict[str, str] = field(default_factory=dict)
    """role (`ROLE_ACTIONS`) -> the secret key of its identity."""

    def env(self, role: str | None = None) -> dict[str, str]:
        """The `AWS_*` settings a client (trajlake, delta-rs, pyarrow, boto3) needs: with the admin
        key, or with `role`'s (`ROLE_ACTIONS`)."""
        if role is not None and role not in self.role_secrets:
            raise S3ServerError(
                f"the S3 server on port {self.port} has no identity for role {role!r} (its data dir "
                f"predates roles); roles: {', '.join(self.role_secrets) or 'none'}"
            )
        key, secret = (
            (self.access_key, self.secret_key)
            if role is None
            else (f"{ACCESS_KEY}-{role}", self.role_secrets[role])
        )
        return {
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{self.port}",
            "AWS_ACCESS_KEY_ID": key,
            "AWS_SECRET_ACCESS_KEY": secret,
            "AWS_REGION": "us-east-1",
            "AWS_ALLOW_HTTP": "true",
        }

    @classmethod
    def load(cls, data_dir: Path) -> S3Layout | None:
        """The layout saved in `data_dir`, or None."""
        path = Path(data_dir) / LAYOUT_FILE
        return cls(**json.loads(path.read_text())) if path.exists() else None

    @classmethod
    def plan(cls, port: int) -> S3Layout:
        """A new layout: S3 on `port`, every other listener on a free port, a fresh secret key."""
        taken = {port}
        ports = {}
        for name in (*COMPONENTS, *(f"{c}.grpc" for c in ("s3", *COMPONENTS))):
            ports[name] = free_port(taken)
            taken.add(ports[name])
        roles = {role: secrets.token_urlsafe(24) for role in ROLE_ACTIONS}
        return cls(port, ports, secrets.token_urlsafe(24), role_secrets=roles)

    def identities(self) -> list[dict]:
        """SeaweedFS's identities: the admin's, then each role's with its actions."""
        keys = [(self.access_key, self.secret_key, ADMIN_ACTIONS)]
        keys += [
            (f"{ACCESS_KEY}-{role}", secret, ROLE_ACTIONS[role]) for role, secret in self.role_secrets.items()
        ]
        return [{"name": key, "credentials": [{"accessKey": key, "secretKey": secret}], "actions": actions}
                for key, secret, actions in keys]  # fmt: skip

    def save(self, data_dir: Path) -> None:
        """Write `server.json` and SeaweedFS's identity file, readable by this user alone."""
        for name, body in ((LAYOUT_FILE, asdict(self)), ("s3.json", {"identities": self.identities()})):
            path = data_dir / name
            path.touch(mode=0o600)
            path.chmod(0o600)
            path.write_text(json.dumps(body))


def free_port(taken: Collection[int] = ()) -> int:
    """A TCP port free on 127.0.0.1 now, below the kernel's ephemeral range: an outbound connection
    never takes it while the server is down, so a restart finds its ports free."""
    floor = 32768
    with contextlib.suppress(OSError, ValueError):
        floor = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    pick = random.SystemRandom()
    while True:
        port = pick.randrange(10000, floor)
        if port not in taken and not _port_open(port):
            with socket.socket() as s, contextlib.suppress(OSError):
                s.bind(("127.0.0.1", port))
                return port


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def weed_command(weed: Path, data_dir: Path, layout: S3Layout) -> list[str]:
    """`weed mini` with every listener on 127.0.0.1 at a chosen port (parallel servers never collide)."""
    p = layout.ports
    ports = [f"-s3.port={layout.port}", f"-s3.port.grpc={p['s3.grpc']}"]
    for name in COMPONENTS:
        ports += [f"-{name}.port={p[name]}", f"-{name}.port.grpc={p[f'{name}.grpc']}"]
    return [
        str(weed), "mini", f"-dir={data_dir / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", *ports,
        "-admin.port.legacy=0", "-admin.ui=false", "-s3.port.iceberg=0", "-s3.port.lance=0", "-webdav=false",
        "-master.telemetry=false",  # it would report to telemetry.seaweedfs.com
        f"-s3.config={data_dir / 's3.json'}", "-s3.autoCreateBucket=false",
        # each bucket is a collection that takes volumes of its own (several at its first write);
        # mini's default (free disk / a volume size of up to 1 GB) ran out after a few buckets
        # ("No writable volumes and no free volumes left"): small volumes, many of them (sparse files)
        "-master.volumeSizeLimitMB=64", "-volume.max=2000",
    ]  # fmt: skip


def running_pid(data_dir: Path) -> int | None:
    """The pid of the `weed` started in `data_dir` if it still runs (a reused pid is not taken for it)."""
    pid_file = Path(data_dir).resolve() / PID_FILE
    with contextlib.suppress(OSError, ValueError):
        pid = int(pid_file.read_text())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        stat = proc_stat(pid)
        if stat is not None and stat[0] != "Z" and f"-dir={pid_file.parent / 'data'}".encode() in cmdline:
            return pid
    return None


def start_s3(config: S3ServerConfig) -> S3Layout:
    """Start the server in `config.data_dir` unless it runs; return its layout once S3 answers and
    the bucket exists."""
    data_dir = config.data_dir.resolve()
    layout = S3Layout.load(data_dir)
    if layout is not None and layout.port != config.port and "port" in config.model_fields_set:
        raise S3ServerError(
            f"{data_dir} holds a server on port {layout.port}; pass --port {layout.port} or another --data-dir"
        )
    proc = None
    if running_pid(data_dir) is None:
        layout = layout or S3Layout.plan(config.port)
        _check_ports_free(layout, data_dir)
        (data_dir / "data").mkdir(parents=True, exist_ok=True)
        layout.save(data_dir)
        proc = _launch(ensure_weed(), data_dir, layout)
    elif layout is None:
        raise S3ServerError(
            f"a weed runs in {data_dir} but {LAYOUT_FILE} is gone; stop it (`trajlake s3 down`)"
        )
    _wait_until_ready(data_dir, layout, config.start_timeout_s, proc)
    if config.bucket:
        _create_bucket(layout, config.bucket, config.start_timeout_s)
    return layout


def _check_ports_free(layout: S3Layout, data_dir: Path) -> None:
    """Raise `S3ServerError` naming the first port of the layout that another process holds."""
    if _port_open(layout.port):
        raise S3ServerError(
            f"port {layout.port} on 127.0.0.1 is already in use; pass --port with a free port"
        )
    if busy := [(name, port) for name, port in layout.ports.items() if _port_open(port)]:
        name, port = busy[0]
        raise S3ServerError(
            f"port {port} (SeaweedFS's {name}, kept in {data_dir / LAYOUT_FILE}) is in use by another "
            "process; stop it, or delete that file to take new ports"
        )


def _launch(weed: Path, data_dir: Path, layout: S3Layout) -> subprocess.Popen:
    with open(data_dir / "weed.log", "ab") as out:  # the child keeps its own descriptor
        proc = subprocess.Popen(
            weed_command(weed, data_dir, layout), stdout=out, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True, cwd=data_dir,
        )  # fmt: skip
    (data_dir / PID_FILE).write_text(str(proc.pid))
    log.info(
        "SeaweedFS starting: S3 on 127.0.0.1:%d, data %s, log %s",
        layout.port,
        data_dir,
        data_dir / "weed.log",
    )
    return proc


def _wait_until_ready(
    data_dir: Path, layout: S3Layout, timeout_s: float, proc: subprocess.Popen | None
) -> None:
    """Block until the S3 API answers HTTP (403 without credentials), or raise `S3ServerError`."""
    import httpx

    def answers() -> bool:
        # the process, not its pid file: weed re-executes itself to apply the options it saved
        if proc is not None and proc.poll() is not None:
            raise S3ServerError(
                f"weed exited with code {proc.returncode} while starting; see {data_dir / 'weed.log'}"
            )
        return httpx.get(layout.env()["AWS_ENDPOINT_URL"], timeout=2).status_code > 0

    if not wait_until(answers, timeout_s=timeout_s, interval_s=0.1, retry_on=httpx.TransportError):
        raise S3ServerError(
            f"the S3 API on 127.0.0.1:{layout.port} did not answer within {timeout_s:.0f} s; "
            f"see {data_dir / 'weed.log'}"
        )


def _create_bucket(layout: S3Layout, bucket: str, timeout_s: float) -> None:
    """Create `bucket` unless it exists (the filer may still be joining the master: retried)."""
    from trajlake.store.storage import s3_filesystem

    fs = s3_filesystem(layout.env(), allow_bucket_creation=True)

    def created() -> bool:
        fs.create_dir(bucket)
        return True

    if not wait_until(created, timeout_s=timeout_s, interval_s=0.25, retry_on=OSError):
        raise S3ServerError(
            f"could not create bucket {bucket!r} on 127.0.0.1:{layout.port} within {timeout_s:.0f} s"
        )


def stop_s3(data_dir: Path, timeout_s: float = 30.0) -> bool:
    """Stop the server started in `data_dir` (SIGTERM, then SIGKILL); return whether one was running."""
    pid = running_pid(data_dir)
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        if not wait_until(lambda: running_pid(data_dir) is None, timeout_s=timeout_s, interval_s=0.1):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            wait_until(lambda: running_pid(data_dir) is None, timeout_s=10.0, interval_s=0.05)
    (Path(data_dir).resolve() / PID_FILE).unlink(missing_ok=True)
    return pid is not None
