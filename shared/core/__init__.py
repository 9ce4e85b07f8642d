"""The pure placement core: topology, job shapes, scratch state, statements, policies and the cycle.

No asyncio, NATS, Redis or clock in here (tests/unit/test_core_purity.py checks it): `now` and the
state come in, decisions come out. The services, the simulator and the benchmarks all call this code.
"""

from shared.core.comm import SlowdownModel
from shared.core.consolidation import plan_consolidation
from shared.core.cycle import LEND_MIN_NODES, CycleConfig, CycleResult, Scheduler, TenantPolicy, order_jobs
from shared.core.decisions import Allocate, Decision, Pending, PendingCode, Preempt, Reserve, Resize
from shared.core.elastic import plan_growth
from shared.core.migration import Evacuation, MigrationBudget, Movable, Move, Plan, plan_defrag, plan_evacuation
from shared.core.policies import POLICIES, Context, Placement, Policy, get_policy
from shared.core.shape import JobSpec, Need, Request, ShapeError, Slice, request, segments, with_segment, with_size
from shared.core.state import Allocation, ClusterState, StateError
from shared.core.statement import Statement
from shared.core.topology import GpuState, Health, NodeSpec, NodeState, Topology, TopologyError

__all__ = [
    "LEND_MIN_NODES",
    "POLICIES",
    "Allocate",
    "Allocation",
    "ClusterState",
    "Context",
    "CycleConfig",
    "CycleResult",
    "Decision",
    "Evacuation",
    "GpuState",
    "Health",
    "JobSpec",
    "MigrationBudget",
    "Movable",
    "Move",
    "Need",
    "NodeSpec",
    "NodeState",
    "Pending",
    "PendingCode",
    "Placement",
    "Plan",
    "Policy",
    "Preempt",
    "Request",
    "Reserve",
    "Resize",
    "Scheduler",
    "ShapeError",
    "Slice",
    "SlowdownModel",
    "StateError",
    "Statement",
    "TenantPolicy",
    "Topology",
    "TopologyError",
    "get_policy",
    "order_jobs",
    "plan_consolidation",
    "plan_defrag",
    "plan_evacuation",
    "plan_growth",
    "request",
    "segments",
    "with_segment",
    "with_size",
]
