"""The queue leader's answer to a dry run (`names.dry_run`, request/reply from the gateway's
`POST /v1/jobs?dry_run=true`): where a job would go if it were submitted now.

The leader decides with the core's `dry_run` on exactly what its next cycle takes: the state of held GPUs and the
pending jobs as `QueueService._cycle_inputs` gives them, its scheduler with its memory, and a kicked cycle's
`reuse_forecasts` (a submit's cycle is a kicked one); the job comes in as a submit would (`lifecycle.submitted`,
`record_spec`). Nothing changes but the views' caches a cycle would refresh anyway: no record is written, nothing
is published, and the job does not exist afterwards. Only the leader answers; the other replicas stay silent, so
the gateway hears the leader or nobody (503).
"""

from __future__ import annotations

from shared.core import JobSpec, Topology
from shared.core.dry_run import DryRun
from shared.schemas import DryRunReply, NodeGpus


def reply_of(got: DryRun, topo: Topology, job: JobSpec) -> DryRunReply:
    """The core's answer for `job` on the bus: node names and GPU indices of `topo`. `gpus`: its layout's, else
    what it asks for (an elastic job's most)."""
    return DryRunReply(
        ok=True,
        start=got.start.value,  # type: ignore[arg-type]  # Start's values are the literal's
        allocation=[NodeGpus(node, list(gpus)) for node, gpus in got.gpus_by_node(topo).items()],
        domains=list(got.domains(topo)),
        gpus=got.gpus or job.gpus,
        segment=got.segment,
        forecast_start=got.forecast_start,
        reason=got.reason,
        reserved=got.reserved,
        preempts=len(got.preempts),
        shrinks=len(got.shrinks),
    )
