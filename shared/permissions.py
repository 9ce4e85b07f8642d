"""NATS permissions per service, derived from `Names`: each service may publish and subscribe only where it must.

The lists follow the services table of docs/architecture.md, subject by subject, plus what JetStream
needs underneath: every service creates or updates the streams at start (`Bus.ensure_streams`), publishes
to JetStream as a request (the reply comes to its `_INBOX`), and a pull consumer talks to the JetStream
API only for its own durable (info, create, next) and acks on `$JS.ACK.<stream>.<durable>.>`.

`authorization_conf()` renders them as a nats-server `authorization {}` block, with each user's password
taken from the server's environment (`$NATS_PASS_GATEWAY`, ...). The deploy files carry its output:

    python -m shared.permissions > deploy/nats/auth.conf              # compose
    python -m shared.permissions --k8s > deploy/k8s/nats-auth.yaml    # Kubernetes

and `tests/unit/test_deploy.py` fails when they drift from what this module derives; the integration
test `tests/integration/test_nats_permissions.py` runs every service under these users against a real
server and checks a job completes with no permission violation.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field

from shared.names import Names

JS_API = "$JS.API"
INBOX = "_INBOX.>"

# The services that connect to NATS (the simulated fleet connects as "agent").
SERVICES = ("gateway", "inventory", "queue", "placement", "migration", "agent")


@dataclass(frozen=True, slots=True)
class Permissions:
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    allow_responses: bool = False  # may answer requests (reply subjects) without publish rights on _INBOX
    consumers: tuple[tuple[str, str], ...] = field(default=())  # (stream, durable or "*"), for docs and tests


def password_env(service: str) -> str:
    """Variable the NATS server reads the service's password from (not a Rackscale setting: the server's)."""
    return f"NATS_PASS_{service.upper()}"


def _consumer_subjects(stream: str, durable: str) -> list[str]:
    """Subjects a pull consumer `durable` on `stream` publishes to; `durable` may be "*"."""
    return [
        f"{JS_API}.CONSUMER.INFO.{stream}.{durable}",
        f"{JS_API}.CONSUMER.CREATE.{stream}.{durable}",
        f"{JS_API}.CONSUMER.CREATE.{stream}.{durable}.>",  # with a filter subject (nats-py >= 2.7)
        f"{JS_API}.CONSUMER.DURABLE.CREATE.{stream}.{durable}",
        f"{JS_API}.CONSUMER.MSG.NEXT.{stream}.{durable}",
        f"$JS.ACK.{stream}.{durable}.>",
    ]


def nats_permissions(names: Names) -> dict[str, Permissions]:
    """Publish/subscribe allow-lists for each service of one prefix and cell."""
    n = names
    streams = [s.name for s in n.streams]
    # Bus.ensure_streams: every service may look up, create and update Rackscale's streams (never delete).
    stream_admin = [f"{JS_API}.STREAM.{op}.{s}" for s in streams for op in ("INFO", "CREATE", "UPDATE")]

    def stream(subject: str) -> str:
        return n.stream_for(subject)

    # (service, durable consumers as (subject, what), JetStream/core publishes, core subscriptions)
    consume: dict[str, list[tuple[str, str]]] = {
        "gateway": [],
        "inventory": [],
        "queue": [
            (stream(n.job_submit), n.consumer("queue", "submit")),
            (stream(n.job_cancel), n.consumer("queue", "cancel")),
            (stream(n.job_inbox), n.consumer("queue", "inbox")),
            # a rebuild of the view reads JOBS and EVENTS back through ephemeral consumers
            (stream(n.job_submit), "*"),
            (stream(n.events_all), "*"),
            (stream(n.node_events), n.consumer("queue", "node")),
            (stream(n.job_move), n.consumer("queue", "move")),
        ],
        "placement": [(stream(n.orders), n.consumer("placement", "orders"))],
        "migration": [
            (stream(n.node_events), n.consumer("migration", "node")),
            # at start it reads its records back through an ephemeral consumer
            (stream(n.migration_records_all), "*"),
        ],
        # one durable per node (`agent-<node>`) or one for a simulated fleet: any durable on the AGENT stream
        "agent": [(stream(n.agent_cmd_all), "*")],
    }
    publish: dict[str, list[str]] = {
        "gateway": [
            n.job_submit,
            n.job_cancel,
            n.node_admin,
            n.dry_run,  # asks the queue leader where a job would go
            # a job without a record is "not yet" while the queue's submit consumer has submits to handle
            f"{JS_API}.CONSUMER.INFO.{stream(n.job_submit)}.{n.consumer('queue', 'submit')}",
            # a job's logs read back through ordered consumers
            f"{JS_API}.CONSUMER.CREATE.{stream(n.logs_all)}",
            f"{JS_API}.CONSUMER.DELETE.{stream(n.logs_all)}.*",
            f"$JS.FC.{stream(n.logs_all)}.>",
            f"{JS_API}.STREAM.MSG.GET.{stream(n.logs_all)}",
        ],
        # a node's last verdict is read back from the log (`get_last_msg`) when Redis lost its record
        # it speaks for an agent whose ranks are gone (their lost exits) and stops ranks whose attempt is over
        "inventory": [
            n.node_event("*"),
            f"{JS_API}.STREAM.MSG.GET.{stream(n.node_events)}",
            n.agent_events,
            n.agent_cmd("*"),
        ],
        "queue": [
            n.job_event("*"),
            n.orders,
            n.cycle_kick,  # a replica kicks the leader's cycle
            *(f"{JS_API}.CONSUMER.CREATE.{stream(s)}" for s in (n.job_submit, n.events_all)),
            *(f"{JS_API}.CONSUMER.DELETE.{stream(s)}.*" for s in (n.job_submit, n.events_all)),
            *(f"$JS.FC.{stream(s)}.>" for s in (n.job_submit, n.events_all)),  # its ordered consumers' flow control
            # a dependency's end counts once the job's last event says it (services/queue/gate.py, `get_last_msg`)
            f"{JS_API}.STREAM.MSG.GET.{stream(n.events_all)}",
        ],
        "placement": [n.placement_events, n.agent_cmd("*")],
        "migration": [
            n.job_move,
            n.migration_events,
            n.migration_record("*"),
            # the ephemeral consumer that reads the records back: created unnamed, deleted after
            f"{JS_API}.CONSUMER.CREATE.{stream(n.migration_records_all)}",
            f"{JS_API}.CONSUMER.DELETE.{stream(n.migration_records_all)}.*",
        ],
        "agent": [n.agent_register, n.agent_heartbeat, n.agent_events, n.telemetry("*"), n.logs_all],
    }
    subscribe: dict[str, list[str]] = {
        # server-sent events; placement's commits and releases keep /v1/cluster's allocations between full reads
        "gateway": [n.job_events_all, n.node_events, n.placement_events],
        "inventory": [n.agent_register, n.agent_heartbeat, n.telemetry_all, n.node_admin],
        "queue": [n.cycle_kick, n.dry_run],
        "placement": [],
        "migration": [n.job_events_all, n.telemetry_all],  # moves' progress (hints); heat per domain
        "agent": [],
    }
    out: dict[str, Permissions] = {}
    for service in SERVICES:
        pub = [*publish[service], n.dead_letter(service), *stream_admin]
        for s, durable in consume[service]:
            pub += _consumer_subjects(s, durable)
        out[service] = Permissions(
            publish=tuple(pub),
            subscribe=(*subscribe[service], INBOX),  # JetStream and request replies come to the inbox
            allow_responses=service in ("inventory", "queue"),  # answer the gateway's drains and dry runs
            consumers=tuple(consume[service]),
        )
    return out


def _list(items: tuple[str, ...], indent: str) -> str:
    return "[\n" + "".join(f"{indent}  {json.dumps(i)}\n" for i in items) + indent + "]"


def authorization_conf(names: Names | None = None) -> str:
    """nats-server config text: one user per service with its allow-lists; passwords from the environment."""
    names = names or Names()
    lines = [
        "# Generated by `python -m shared.permissions` from shared/names.py; do not edit by hand.",
        f"# prefix {names.prefix!r}, cell {names.cell!r}. Passwords come from the server's environment.",
        "authorization {",
        "  users = [",
    ]
    for service, p in nats_permissions(names).items():
        lines += [
            f"    {{user: {service}, password: ${password_env(service)}, permissions: {{",
            f"      publish: {{allow: {_list(p.publish, '      ')}}}",
            f"      subscribe: {{allow: {_list(p.subscribe, '      ')}}}",
        ]
        if p.allow_responses:
            lines.append("      allow_responses: true")
        lines.append("    }}")
    lines += ["  ]", "}"]
    return "\n".join(lines) + "\n"


def k8s_configmap(names: Names | None = None) -> str:
    """The same block as a ConfigMap (deploy/k8s/nats-auth.yaml), for an existing NATS to include."""
    body = "".join(f"    {line}\n" if line else "\n" for line in authorization_conf(names).splitlines())
    return (
        "# Generated by `python -m shared.permissions --k8s`; do not edit by hand. The NATS users and permissions\n"
        "# of Rackscale's services, for an existing NATS (e.g. the nats Helm chart): mount this ConfigMap, include\n"
        "# auth.conf from the server config, and set NATS_PASS_* in the server's environment.\n"
        "apiVersion: v1\n"
        "kind: ConfigMap\n"
        "metadata:\n"
        "  name: rackscale-nats-auth\n"
        "  namespace: rackscale\n"
        "data:\n"
        "  auth.conf: |\n" + body
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m shared.permissions", description=__doc__.split("\n")[0])
    parser.add_argument("--prefix", default=Names().prefix)
    parser.add_argument("--cell", default=Names().cell)
    parser.add_argument("--k8s", action="store_true", help="as a Kubernetes ConfigMap (deploy/k8s/nats-auth.yaml)")
    args = parser.parse_args(argv)
    names = Names(prefix=args.prefix, cell=args.cell)
    print(k8s_configmap(names) if args.k8s else authorization_conf(names), end="")


if __name__ == "__main__":
    main()
