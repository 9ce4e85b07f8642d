"""The records a service keeps one of per job or node are invisible to the cyclic garbage collector (msgspec
`gc=False`): on a busy cluster a full collection walked thousands of them with the event loop held. They hold
plain data; this checks the instances stay untracked, decoded or built, so the setting isn't lost unnoticed."""

from __future__ import annotations

import gc

import msgspec
import pytest

from shared.schemas import (
    AllocationRecord,
    JobBody,
    JobRecord,
    MoveTicket,
    NodeGpus,
    NodeRecord,
    TopologyBody,
    encode,
)

SPEC = JobBody(name="j", tenant="t", gpus=8, topology=TopologyBody(nvlink="required"), command=["python", "x.py"])
NODES = [NodeGpus("d00-n00", [0, 1, 2, 3]), NodeGpus("d00-n01", [0, 1, 2, 3])]
RECORDS = [
    SPEC,
    SPEC.topology,
    NODES[0],
    JobRecord(
        id="j",
        spec=SPEC,
        allocation=NODES,
        domains=["d00"],
        move=MoveTicket(migration_id="m", target=NODES, reason="r", since=1.0),
    ),
    AllocationRecord(job_id="j", attempt=1, nodes=NODES, committed_at=1.0),
    NodeRecord(name="d00-n00", domain="d00", gpu_health={"1": "degraded"}),
]


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: type(r).__name__)
def test_kept_records_are_not_tracked_by_the_collector(record: msgspec.Struct) -> None:
    assert not gc.is_tracked(record)
    decoded = msgspec.msgpack.decode(encode(record), type=type(record))
    assert decoded == record
    assert not gc.is_tracked(decoded)
