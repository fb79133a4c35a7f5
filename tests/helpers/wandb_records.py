"""Read what an offline W&B run recorded: the records of its ``run-<id>.wandb`` transaction log.

wandb >= 0.2x no longer ships a Python reader for this file (its Go core writes it), so the framing
is read here and every record is decoded with wandb's own protobuf schema
(``wandb.proto.wandb_internal_pb2.Record``). The framing is LevelDB's log format behind a 7-byte
W&B header: 32 KiB blocks of chunks, each ``crc32c(4) | length(2, LE) | type(1) | data``, where
type 1 is a whole record and 2/3/4 are the first/middle/last pieces of one split across blocks.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_HEADER = b":W&B" + struct.pack("<HB", 0xBEE1, 0)
_BLOCK = 32 * 1024
_CHUNK_HEADER = 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _payloads(data: bytes) -> list[bytes]:
    if not data.startswith(_HEADER):
        raise ValueError(f"not a W&B transaction log (header {data[:7]!r})")
    records: list[bytes] = []
    pending = b""
    offset = len(_HEADER)
    while offset + _CHUNK_HEADER <= len(data):
        left_in_block = _BLOCK - offset % _BLOCK
        if left_in_block < _CHUNK_HEADER:  # the block's tail is padding
            offset += left_in_block
            continue
        _crc, length, kind = struct.unpack_from("<IHB", data, offset)
        if kind == 0 and length == 0:  # zero padding at the end of a block
            offset += left_in_block
            continue
        chunk = data[offset + _CHUNK_HEADER : offset + _CHUNK_HEADER + length]
        offset += _CHUNK_HEADER + length
        if kind == _FULL:
            records.append(chunk)
        elif kind == _FIRST:
            pending = chunk
        elif kind == _MIDDLE:
            pending += chunk
        elif kind == _LAST:
            records.append(pending + chunk)
            pending = b""
        else:
            raise ValueError(f"unknown chunk type {kind} at byte {offset}")
    return records


def _items(items: Any) -> dict[str, Any]:
    return {(item.key or "/".join(item.nested_key)): json.loads(item.value_json) for item in items}


@dataclass
class OfflineRun:
    """What one offline run recorded."""

    path: Path
    run_id: str = ""
    project: str = ""
    display_name: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    artifacts: list[dict[str, Any]] = field(default_factory=list)
    finished: bool = False


def read_offline_run(run_dir: Path) -> OfflineRun:
    """Decode ``run_dir/run-<id>.wandb`` (``run_dir`` is a ``wandb/offline-run-*`` folder)."""
    from wandb.proto import wandb_internal_pb2

    (log_file,) = Path(run_dir).glob("run-*.wandb")
    run = OfflineRun(path=Path(run_dir))
    for payload in _payloads(log_file.read_bytes()):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(payload)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run.run_id, run.project, run.display_name = (
                record.run.run_id,
                record.run.project,
                record.run.display_name,
            )
            run.config.update(_items(record.run.config.update))
        elif kind == "config":
            run.config.update(_items(record.config.update))
        elif kind == "history":
            run.history.append(_items(record.history.item))
        elif kind == "artifact":
            artifact = record.artifact
            run.artifacts.append(
                {
                    "name": artifact.name,
                    "type": artifact.type,
                    "aliases": list(artifact.aliases),
                    "files": [entry.path for entry in artifact.manifest.contents],
                    "metadata": json.loads(artifact.metadata or "{}"),
                }
            )
        elif kind == "exit":
            run.finished = True
    # wandb keeps config values as {"value": ...} (with "desc"); unwrap them.
    run.config = {k: v["value"] if isinstance(v, dict) and "value" in v else v for k, v in run.config.items()}
    return run


def offline_runs(root: Path) -> list[OfflineRun]:
    """Every offline run under ``root`` (searched recursively), oldest first.

    Stops this process's W&B service first: ``run.finish()`` returns before the service has
    written the run's last records; ``wandb.teardown()`` waits until it has (as process exit does).
    """
    import wandb

    wandb.teardown()
    return [read_offline_run(path) for path in sorted(Path(root).rglob("offline-run-*")) if path.is_dir()]
