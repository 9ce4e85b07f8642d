"""python -m services.agent --backend sim|nvml [--topology backend|k8s] [--node NAME --domain D --clique N ...]

An agent talks only to NATS; it needs RACKSCALE_NATS_URL (and no Redis).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import sys
from collections.abc import Callable
from pathlib import Path

import msgspec

from services.agent.backends import GpuBackend, NvmlUnavailableError, SimBackend, make_backend
from services.agent.faults import FaultPlanError, faults_for, load_plan
from services.agent.k8s_labels import NodeLabelsError, read_node_labels, with_fabric
from services.agent.process import agent_deps, agent_settings
from services.agent.service import AgentService
from shared.core.topology_io import DEFAULT_DOMAIN_LABEL, LabelError, fabric_from_labels
from shared.runtime import run, setup_logging
from shared.schemas import AgentRegister
from shared.settings import Settings


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m services.agent", description="Rackscale GPU node agent")
    p.add_argument("--backend", choices=("sim", "nvml"), default="sim", help="where GPU facts come from")
    p.add_argument(
        "--topology",
        choices=("backend", "k8s"),
        default="backend",
        help="where domain and clique come from: the backend (NVML fabric info) or the Kubernetes node's labels",
    )
    p.add_argument("--domain-label", default=DEFAULT_DOMAIN_LABEL, help="k8s: a provider's NVLink domain label")
    p.add_argument("--node", default=None, help="node name (default: the short hostname)")
    p.add_argument("--domain", default=None, help="sim: NVLink domain / cluster UUID (default: the node alone)")
    p.add_argument("--clique", type=int, default=0, help="sim: clique id inside the domain")
    p.add_argument("--gpus", type=int, default=4, help="sim: number of GPUs")
    p.add_argument("--seed", type=int, default=0, help="sim: seed for GPU UUIDs and faults")
    p.add_argument("--leaf", default=None, help="leaf switch name, if the fleet reports leaves")
    p.add_argument("--register-every", type=int, default=10, help="re-register every N heartbeats")
    p.add_argument("--stop-grace", type=float, default=10.0, help="seconds between SIGTERM and SIGKILL")
    p.add_argument("--log-dir", type=Path, default=None, help="write each rank's output to a file here")
    p.add_argument(
        "--addr",
        default="",
        help="where a job's other nodes reach this one: its MASTER_ADDR when it is node 0 (default: the node "
        "name; a simulated node 127.0.0.1)",
    )
    return p


def _relabels(*fns: Callable[[AgentRegister], AgentRegister] | None) -> Callable[[AgentRegister], AgentRegister] | None:
    chosen = [f for f in fns if f is not None]
    if not chosen:
        return None
    return functools.reduce(lambda f, g: lambda reg: g(f(reg)), chosen)


async def _serve(settings: Settings, backend: GpuBackend, args: argparse.Namespace) -> None:
    relabel = None
    if args.topology == "k8s":
        # read and checked once: a bad label stops the agent here, named
        labels = await read_node_labels(backend.node)
        fabric = fabric_from_labels(backend.node, labels, domain_label=args.domain_label)
        relabel = functools.partial(with_fabric, fabric=fabric)
    addr = args.addr
    with_addr = (lambda reg: msgspec.structs.replace(reg, addr=addr)) if addr else None
    relabel = _relabels(relabel, with_addr)
    deps = await agent_deps(settings, AgentService.name)
    agent = AgentService(
        deps,
        backend,
        register_every=args.register_every,
        stop_grace_s=args.stop_grace,
        log_dir=args.log_dir,
        relabel=relabel,
    )
    await run(agent)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    settings = agent_settings("agent")
    if args.gpus < 1 or args.clique < 0 or args.register_every < 1 or args.stop_grace < 0:
        sys.exit("agent: --gpus and --register-every must be >= 1, --clique and --stop-grace >= 0")
    setup_logging(settings.log_level)
    try:
        backend = make_backend(
            args.backend,
            node=args.node,
            domain=args.domain,
            clique=args.clique,
            gpus=args.gpus,
            seed=args.seed,
            leaf=args.leaf,
        )
    except NvmlUnavailableError as e:
        sys.exit(f"agent: {e}")
    if isinstance(backend, SimBackend):  # this node's entries of RACKSCALE_FAULT_PLAN
        try:
            backend.schedule(faults_for(backend.node, backend.domain, load_plan(settings.fault_plan_file)))
        except (FaultPlanError, ValueError) as e:
            sys.exit(f"agent: {e}")
    try:
        asyncio.run(_serve(settings, backend, args))
    except (NodeLabelsError, LabelError) as e:
        sys.exit(f"agent: {e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
