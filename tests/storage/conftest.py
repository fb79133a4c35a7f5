"""Remote storage for the tests: fsspec's in-process ``memory://`` filesystem, and a local S3 server."""

from __future__ import annotations

import select
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def memory_root() -> Iterator[str]:
    """A fresh ``memory://`` folder (the memory filesystem is one per process), removed afterwards."""
    import fsspec

    name = f"test-{uuid.uuid4().hex[:10]}"
    yield f"memory://{name}"
    fs = fsspec.filesystem("memory")
    if fs.exists(f"/{name}"):
        fs.rm(f"/{name}", recursive=True)


@pytest.fixture
def local_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The working directory, empty: a remote path written to a local folder (``memory:/``, ``s3:/``) shows here."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return work


_SERVER = """
import logging
import sys
from moto.server import ThreadedMotoServer

logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request

server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
server.start()
print(server.get_host_and_port()[1], flush=True)
sys.stdin.read()  # serve until the test session closes our standard input
server.stop()
"""


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """A real S3 API (moto in server mode) on 127.0.0.1, in its own process for the whole session."""
    pytest.importorskip("moto.server", reason="the S3 tests need moto[server] (drivetrain[dev])")
    pytest.importorskip("s3fs", reason="the S3 tests need s3fs (drivetrain[dev])")
    server = subprocess.Popen(
        [sys.executable, "-c", _SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        ready = select.select([server.stdout], [], [], 60)[0]
        line = server.stdout.readline().strip() if ready else ""
        if not line.isdigit():
            raise RuntimeError(f"the local S3 server did not start (it printed {line!r})")
        yield f"http://127.0.0.1:{line}"
    finally:
        for stream in (server.stdin, server.stdout):
            if stream is not None:
                stream.close()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


@pytest.fixture
def s3_bucket(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """``s3://<new bucket>`` on the local server; the process and its children reach it as a user would,
    through AWS's standard environment variables (credentials, region, endpoint)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    import s3fs

    bucket = f"drivetrain-{uuid.uuid4().hex[:12]}"
    s3fs.S3FileSystem(endpoint_url=s3_endpoint, key="testing", secret="testing").mkdir(bucket)
    return f"s3://{bucket}"
