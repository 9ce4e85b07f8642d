"""A Python client of Rackscale's HTTP API, standard library only.

    from rackscale import Client
    client = Client()  # $RACKSCALE_URL (else http://127.0.0.1:8080), $RACKSCALE_TOKEN
    job = client.submit({"name": "hello", "tenant": "alice", "gpus": 8})
    print(client.wait(job.id).state)

`AsyncClient` is the same for asyncio code. The bodies and views (`rackscale.types`) are generated from the
gateway's schemas.
"""

from __future__ import annotations

from rackscale._protocol import TERMINAL, VERSION, ClusterChanged, Event
from rackscale.aio import AsyncClient, AsyncStream
from rackscale.client import Client, Stream
from rackscale.errors import ApiError
from rackscale.types import (
    Accepted,
    ClusterView,
    JobBody,
    JobEvent,
    JobList,
    JobState,
    JobView,
    LogLine,
    NodeChanged,
    Placed,
    TopologyBody,
)

__version__ = VERSION
Job = JobView  # what `get` and `wait` return

__all__ = [
    "TERMINAL",
    "Accepted",
    "ApiError",
    "AsyncClient",
    "AsyncStream",
    "Client",
    "ClusterChanged",
    "ClusterView",
    "Event",
    "Job",
    "JobBody",
    "JobEvent",
    "JobList",
    "JobState",
    "JobView",
    "LogLine",
    "NodeChanged",
    "Placed",
    "Stream",
    "TopologyBody",
    "__version__",
]
