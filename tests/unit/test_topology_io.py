"""Topology importers/exporters: hostlists, agent reports, Kubernetes labels, Slurm topology.yaml.

The fleets used below (levels outermost first; a node holds GPUs):

    NVL72 (GB200)                 NVL36x2                       HGX
    domain = 1 rack               domain = 2 racks cabled       domain = 1 node
    +-------------+-------------+ +------------+------------+   +--------+ +--------+
    | clique .0   | clique .1   | | rack A     | rack B     |   | 8 GPUs | | 8 GPUs |
    | 9 nodes x 4 | 9 nodes x 4 | | 9 nodes x 4| 9 nodes x 4|   +--------+ +--------+
    +-------------+-------------+ +------------+------------+   each its own domain
      18 nodes, 72 GPUs             one clusterUuid, 72 GPUs
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.core.topology import GpuState, NodeSpec, NodeState, Topology, TopologyError
from shared.core.topology_io import (
    CLIQUE_LABEL,
    DEFAULT_DOMAIN_LABEL,
    GPU_COUNT_LABEL,
    LEAF_LABEL,
    SPINE_LABEL,
    AgentReport,
    HostlistError,
    LabelError,
    SlurmTopologyError,
    agent_reports_from_topology,
    compress,
    dump_topology_yaml,
    expand,
    labels_from_topology,
    load_topology_yaml,
    natural_key,
    topology_from_agents,
    topology_from_labels,
)


def shape(topo: Topology) -> list[tuple[str, int, tuple[str, ...]]]:
    """What a round trip must keep: names, GPU counts and group paths, in order."""
    return [(name, topo.node_gpus[i], topo.node_path(i)) for i, name in enumerate(topo.node_names)]


def domains(topo: Topology) -> dict[str, list[str]]:
    dom = topo.domain
    return {
        topo.group_names[dom][g]: [topo.node_names[i] for i in members]
        for g, members in enumerate(topo.group_nodes[dom])
    }


def _spec(name: str, *groups: str) -> NodeSpec:
    return NodeSpec(name, 4, groups)


# == hostlist =========================================================================================
@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("node[01-04,07],gpu9", ["node01", "node02", "node03", "node04", "node07", "gpu9"]),
        ("gpu9", ["gpu9"]),
        ("", []),
        ("  ", []),
        ("a, b", ["a", "b"]),
        ("n[8-10]", ["n8", "n9", "n10"]),
        ("n[08-10]", ["n08", "n09", "n10"]),
        ("n[098-100]", ["n098", "n099", "n100"]),
        ("n[3]", ["n3"]),
        ("n[1-2]-ib", ["n1-ib", "n2-ib"]),
        ("r[1-2]n[1-3]", ["r1n1", "r1n2", "r1n3", "r2n1", "r2n2", "r2n3"]),
        ("x[1,3],y[1-2]z", ["x1", "x3", "y1z", "y2z"]),
        ("n[3,1-2]", ["n3", "n1", "n2"]),
    ],
)
def test_expand(expr: str, names: list[str]) -> None:
    assert expand(expr) == names


@pytest.mark.parametrize(
    ("expr", "why"),
    [
        ("node[01-04", "never closed"),
        ("node01]", "without '['"),
        ("n[1-[2]]", "nested"),
        ("node[]", "empty brackets"),
        ("node[a-b]", "not a number"),
        ("node[5-3]", "backwards"),
        ("node[1-2-3]", "not a number"),
        ("a,,b", "empty name"),
        ("a b", "whitespace"),
        ("n[0-99999999]", "longer than"),
        ("n[0-999]m[0-9999]", "more than"),
    ],
)
def test_expand_errors(expr: str, why: str) -> None:
    with pytest.raises(HostlistError) as err:
        expand(expr)
    assert why in str(err.value) and repr(expr) in str(err.value)


@pytest.mark.parametrize(
    ("names", "text"),
    [
        (["node01", "node02", "node03", "node04", "node07", "gpu9"], "node[01-04,07],gpu9"),
        (["gpu9"], "gpu9"),
        ([], ""),
        (["login", "n1", "n2"], "login,n[1-2]"),
        (["n9", "n10", "n11"], "n[9-11]"),
        (["n08", "n09", "n10"], "n[08-10]"),
        (["n3", "n1", "n2", "n2"], "n[1-3]"),  # sorted, deduplicated
        (["a1", "b1", "a2"], "a[1-2],b1"),  # prefixes in order of first appearance
        (["n1-ib", "n2-ib", "n3"], "n[1-2]-ib,n3"),  # suffix kept apart
        (["n1", "n01"], "n[1,01]"),  # same value, different spelling: both survive
        ([f"d00-n{i:02d}" for i in range(18)], "d00-n[00-17]"),
    ],
)
def test_compress(names: list[str], text: str) -> None:
    assert compress(names) == text
    assert sorted(expand(text)) == sorted(set(names))


@pytest.mark.parametrize(
    ("names", "text"),
    [
        (["n3", "n1", "n2"], "n[3,1-2]"),
        (["n1", "n2", "m1", "n3"], "n[1-2],m1,n3"),
        (["n1", "n1"], "n[1,1]"),
    ],
)
def test_compress_keeps_order(names: list[str], text: str) -> None:
    assert compress(names, sort=False) == text
    assert expand(text) == names


@pytest.mark.parametrize("bad", ["", "a,b", "n[1]", "a b"])
def test_compress_rejects_names_a_hostlist_cannot_hold(bad: str) -> None:
    with pytest.raises(HostlistError, match="host name"):
        compress(["ok1", bad])


_host = st.builds(
    lambda p, n, w, s: f"{p}{n:0{w}d}{s}",
    st.sampled_from(["node", "gpu-", "r1n", "x"]),
    st.integers(0, 120),
    st.integers(1, 3),
    st.sampled_from(["", "-ib"]),
)


@given(st.lists(_host, max_size=40))
def test_compress_round_trips(names: list[str]) -> None:
    assert expand(compress(names, sort=False)) == names
    assert set(expand(compress(names))) == set(names)


def test_natural_key() -> None:
    assert sorted(["n10", "n2", "n", "n1", "n01"], key=natural_key) == ["n", "n01", "n1", "n2", "n10"]


# == agents ===========================================================================================
def nvl72_reports(uuid: str = "c0ffee00-0000-4000-8000-000000000001") -> list[AgentReport]:
    """One GB200 rack split into two cliques of 9 trays."""
    return [AgentReport(f"{uuid[:4]}-n{n:02d}", uuid, n // 9, (0, 1, 2, 3)) for n in range(18)]


def nvl36x2_reports() -> list[AgentReport]:
    """Two 36-GPU racks cabled into one domain: both halves report the same clusterUuid."""
    return [
        AgentReport(f"{rack}-n{n}", "feed0000-0000-4000-8000-000000000036", 0, (0, 1, 2, 3))
        for rack in ("rackA", "rackB")
        for n in range(9)
    ]


def hgx_reports() -> list[AgentReport]:
    """HGX nodes: no multi-node fabric (NVML gives an empty or all-zero uuid): one domain per node."""
    zero = "00000000-0000-0000-0000-000000000000"
    return [AgentReport(f"hgx{n}", "" if n % 2 else zero, 0, tuple(range(8))) for n in range(4)]


@pytest.mark.parametrize(
    ("reports", "n_domains", "n_cliques", "gpus"),
    [
        (nvl72_reports(), 1, 2, 72),
        (nvl36x2_reports(), 1, 1, 72),
        (hgx_reports(), 4, 4, 32),
        (nvl72_reports("u1") + nvl72_reports("u2") + hgx_reports(), 6, 8, 176),
    ],
    ids=["nvl72", "nvl36x2", "hgx", "mixed"],
)
def test_agents_build(reports: list[AgentReport], n_domains: int, n_cliques: int, gpus: int) -> None:
    topo, health = topology_from_agents(reports, generation=7)
    assert topo.levels == ("cluster", "domain", "clique")
    assert len(topo.group_nodes[topo.domain]) == n_domains
    assert len(topo.group_nodes[topo.level("clique")]) == n_cliques
    assert sum(topo.node_gpus) == gpus
    assert topo.generation == 7
    assert health.nodes == {} and health.gpus == {}


def test_agents_names_cliques_and_hgx_domains() -> None:
    topo, _ = topology_from_agents(nvl72_reports("u1"))
    assert topo.node_path(0) == ("u1", "u1.0") and topo.node_path(17) == ("u1", "u1.1")
    hgx, _ = topology_from_agents(hgx_reports())
    assert hgx.node_path(hgx.node_index["hgx1"]) == ("hgx1", "hgx1.0")


def test_agents_order_independent() -> None:
    reports = nvl72_reports("u2") + nvl36x2_reports() + hgx_reports()
    shuffled = reports[:]
    random.Random(4).shuffle(shuffled)
    a, _ = topology_from_agents(reports)
    b, _ = topology_from_agents(shuffled + shuffled[:5])  # re-delivered reports are fine
    assert shape(a) == shape(b)
    assert list(a.node_names[:3]) == ["rackA-n0", "rackA-n1", "rackA-n2"]  # feed... sorts before hgx, u2


def test_agents_switch_levels_and_health() -> None:
    reports = [
        AgentReport("n1", "u1", 0, (0, 1, 2, 3), leaf="l1", spine="s1", gpu_health={2: GpuState.DOWN, 3: GpuState.OK}),
        AgentReport("n2", "u1", 0, (0, 1, 2, 3), leaf="l1", spine="s1", node_state=NodeState.DRAINING),
        AgentReport("n3", "u2", 0, (0, 1, 2, 3), leaf="l2", spine="s1"),
    ]
    topo, health = topology_from_agents(reports)
    assert topo.levels == ("cluster", "spine", "leaf", "domain", "clique")
    assert topo.node_path(2) == ("s1", "l2", "u2", "u2.0")
    assert health.gpus == {("n1", 2): GpuState.DOWN}
    assert health.nodes == {"n2": NodeState.DRAINING}
    back = agent_reports_from_topology(topo, health)
    assert back[0].gpu_health == {2: GpuState.DOWN}  # "ok" is the default, not carried
    assert back[1:] == reports[1:]
    again, again_health = topology_from_agents(back)
    assert shape(again) == shape(topo) and again_health == health


@pytest.mark.parametrize(
    "topo",
    [Topology.uniform(3, cliques_per_domain=2), Topology.uniform(4, domains_per_leaf=2), Topology.uniform(2, 1, 8)],
    ids=["cliques", "leaves", "hgx"],
)
def test_agents_round_trip(topo: Topology) -> None:
    rebuilt, _ = topology_from_agents(agent_reports_from_topology(topo))
    assert shape(rebuilt) == shape(topo)


_R = AgentReport


@pytest.mark.parametrize(
    ("reports", "node", "why"),
    [
        ([_R("n1", "u", 0, (0, 1)), _R("n1", "u", 1, (0, 1))], "n1", "disagree"),
        ([_R("n1", "u", 0, (0, 1), leaf="l"), _R("n2", "u", 0, (0, 1))], "n2", "no leaf"),
        ([_R("n1", "u", 0, (0, 1)), _R("n2", "u", 0, (0, 1), spine="s")], "n1", "no spine"),
        ([_R("n1", "u", 0, ())], "n1", "0..n-1"),
        ([_R("n1", "u", 0, (0, 0))], "n1", "0..n-1"),
        ([_R("n1", "u", 0, (1, 2))], "n1", "0..n-1"),
        ([_R("n1", "u", -1, (0,))], "n1", "clique_id"),
        ([_R("n1", "u", 0, (0,), gpu_health={3: GpuState.DOWN})], "n1", "gpu_health"),
        ([_R("n1", "u", 0, (0,), gpu_health={0: "down"})], "n1", "GpuState"),  # type: ignore[dict-item]
        ([_R("n1", "u", 0, (0,), leaf="")], "n1", "leaf"),
        ([_R("n1", "u", 0, (0,), leaf="a"), _R("n2", "u", 0, (0,), leaf="b")], "n2", "two leafs"),
        ([], "", "no agent reports"),
    ],
)
def test_agents_errors(reports: list[AgentReport], node: str, why: str) -> None:
    with pytest.raises(TopologyError, match=why) as err:
        topology_from_agents(reports)
    assert node in str(err.value)


def test_agent_export_errors() -> None:
    bad_clique = Topology(["domain", "clique"], [_spec("n1", "d", "d.x")])
    with pytest.raises(TopologyError, match=r"n1.*whole-number"):
        agent_reports_from_topology(bad_clique)
    merged = Topology(["domain", "clique"], [_spec("n1", "d", "a.0"), _spec("n2", "d", "b.0")])
    with pytest.raises(TopologyError, match=r"n2.*merge"):
        agent_reports_from_topology(merged)
    odd_level = Topology(["row", "domain"], [_spec("n1", "r", "d")])
    with pytest.raises(TopologyError, match="row"):
        agent_reports_from_topology(odd_level)


# == Kubernetes labels ================================================================================
def gb200_labels(rack: int, n: int, clique: int = 0, **extra: str) -> dict[str, str]:
    return {
        CLIQUE_LABEL: f"uuid-{rack}.{clique}",
        GPU_COUNT_LABEL: "4",
        DEFAULT_DOMAIN_LABEL: f"rack{rack}",
        "kubernetes.io/hostname": f"gb-{rack}-{n}",
        **extra,
    }


def test_labels_import() -> None:
    nodes = {f"gb-{r}-{n}": gb200_labels(r, n, n // 9) for r in (2, 1) for n in range(18)}
    nodes["cpu-0"] = {"kubernetes.io/os": "linux", DEFAULT_DOMAIN_LABEL: "rack9"}
    nodes["hgx-0"] = {GPU_COUNT_LABEL: "8"}
    result = topology_from_labels(nodes)
    topo = result.topology
    assert result.skipped == ["cpu-0"]
    assert topo.node_names[0] == "hgx-0" and topo.node_names[1] == "gb-1-0"  # sorted by domain, node
    assert topo.node_path(topo.node_index["gb-2-10"]) == ("rack2", "uuid-2.1")
    assert topo.node_path(0) == ("hgx-0", "hgx-0.0")
    assert sum(topo.node_gpus) == 2 * 72 + 8


@pytest.mark.parametrize(
    ("labels", "kwargs", "path", "gpus"),
    [
        ({CLIQUE_LABEL: "u.3", GPU_COUNT_LABEL: "4"}, {"domain_label": None}, ("u", "u.3"), 4),
        ({CLIQUE_LABEL: "u.3"}, {"gpus_per_node": 4}, ("u", "u.3"), 4),
        ({CLIQUE_LABEL: "u.1.3", GPU_COUNT_LABEL: "2"}, {}, ("u.1", "u.1.3"), 2),
        ({"my/domain": "r7", GPU_COUNT_LABEL: "4"}, {"domain_label": "my/domain"}, ("r7", "r7.0"), 4),
        ({CLIQUE_LABEL: "u.0", GPU_COUNT_LABEL: "4", DEFAULT_DOMAIN_LABEL: "r1"}, {}, ("r1", "u.0"), 4),
    ],
)
def test_labels_one_node(labels: dict[str, str], kwargs: dict[str, Any], path: tuple[str, ...], gpus: int) -> None:
    topo = topology_from_labels({"n": labels}, **kwargs).topology
    assert topo.node_path(0) == path and topo.node_gpus == (gpus,)


@pytest.mark.parametrize(
    "topo",
    [
        Topology.uniform(3, cliques_per_domain=2),
        Topology.uniform(4, domains_per_leaf=2),
        Topology.uniform(2, 1, 8),
        topology_from_agents(nvl36x2_reports())[0],
    ],
    ids=["cliques", "leaves", "hgx", "nvl36x2"],
)
@pytest.mark.parametrize("domain_label", [DEFAULT_DOMAIN_LABEL, None])
def test_labels_round_trip(topo: Topology, domain_label: str | None) -> None:
    labels = labels_from_topology(topo, domain_label=domain_label)
    first = topology_from_labels(labels, domain_label=domain_label).topology
    labels_again = labels_from_topology(first, domain_label=domain_label)
    again = topology_from_labels(labels_again, domain_label=domain_label).topology
    assert shape(first) == shape(again) == shape(topo)


def test_labels_export_with_switches() -> None:
    topo = topology_from_agents([AgentReport("n1", "u", 0, (0, 1), leaf="l1", spine="s1")])[0]
    assert labels_from_topology(topo) == {
        "n1": {
            CLIQUE_LABEL: "u.0",
            GPU_COUNT_LABEL: "2",
            DEFAULT_DOMAIN_LABEL: "u",
            SPINE_LABEL: "s1",
            LEAF_LABEL: "l1",
        }
    }


GOOD = {CLIQUE_LABEL: "u.0", GPU_COUNT_LABEL: "4"}


@pytest.mark.parametrize(
    ("nodes", "kwargs", "node", "key"),
    [
        ({"gpu-7": {**GOOD, GPU_COUNT_LABEL: "x"}}, {}, "gpu-7", GPU_COUNT_LABEL),
        ({"gpu-7": {**GOOD, GPU_COUNT_LABEL: "0"}}, {}, "gpu-7", GPU_COUNT_LABEL),
        ({"gpu-7": {**GOOD, GPU_COUNT_LABEL: "-4"}}, {}, "gpu-7", GPU_COUNT_LABEL),
        ({"gpu-7": {CLIQUE_LABEL: "u.0"}}, {}, "gpu-7", GPU_COUNT_LABEL),
        ({"gpu-7": {**GOOD, CLIQUE_LABEL: "nodot"}}, {}, "gpu-7", CLIQUE_LABEL),
        ({"gpu-7": {**GOOD, CLIQUE_LABEL: "u."}}, {}, "gpu-7", CLIQUE_LABEL),
        ({"gpu-7": {**GOOD, DEFAULT_DOMAIN_LABEL: ""}}, {}, "gpu-7", DEFAULT_DOMAIN_LABEL),
        ({"a": {**GOOD, LEAF_LABEL: "l1"}, "gpu-7": GOOD}, {}, "gpu-7", LEAF_LABEL),
        ({"a": GOOD, "gpu-7": {**GOOD, SPINE_LABEL: "s"}}, {}, "a", SPINE_LABEL),
        (  # one clique in two domains
            {"a": {**GOOD, DEFAULT_DOMAIN_LABEL: "r1"}, "gpu-7": {**GOOD, DEFAULT_DOMAIN_LABEL: "r2"}},
            {},
            "gpu-7",
            CLIQUE_LABEL,
        ),
        (  # one domain under two leaves
            {"a": {**GOOD, LEAF_LABEL: "l1"}, "gpu-7": {**GOOD, CLIQUE_LABEL: "u.1", LEAF_LABEL: "l2"}},
            {},
            "gpu-7",
            LEAF_LABEL,
        ),
        ({"cpu": {"kubernetes.io/os": "linux"}}, {}, "", GPU_COUNT_LABEL),
    ],
    ids=[
        "count-word",
        "count-zero",
        "count-negative",
        "count-missing",
        "clique-nodot",
        "clique-noid",
        "domain-empty",
        "leaf-partial",
        "spine-partial",
        "clique-two-domains",
        "domain-two-leaves",
        "no-gpu-nodes",
    ],
)
def test_label_errors(nodes: dict[str, dict[str, str]], kwargs: dict[str, Any], node: str, key: str) -> None:
    with pytest.raises(LabelError) as err:
        topology_from_labels(nodes, **kwargs)
    assert f"node {node}" in str(err.value) or not node
    assert key in str(err.value)


def test_label_error_message_shape() -> None:
    with pytest.raises(LabelError, match=r"^node gpu-7: label nvidia.com/gpu.count='x' is not a whole number$"):
        topology_from_labels({"gpu-7": {**GOOD, GPU_COUNT_LABEL: "x"}})


@pytest.mark.parametrize(
    ("topo", "kwargs", "why"),
    [
        (Topology(["domain", "clique"], [_spec("n1", "d", "nodot")]), {}, "n1.*gpu.clique"),
        (Topology(["domain", "clique"], [_spec("n1", "d", "u.0")]), {"domain_label": None}, "n1.*domain 'u'"),
        (Topology(["domain", "clique"], [_spec("n1", "d", "bad value!.0")]), {}, "n1.*not a valid"),
        (Topology(["row", "domain"], [_spec("n1", "r", "d")]), {}, "row"),
    ],
)
def test_label_export_errors(topo: Topology, kwargs: dict[str, Any], why: str) -> None:
    with pytest.raises(LabelError, match=why):
        labels_from_topology(topo, **kwargs)


# == Slurm topology.yaml ==============================================================================
EXAMPLE = """\
- topology: nvl72
  cluster_default: true
  block:
    block_sizes: [16, 32]
    blocks:
      - block: b01
        nodes: node[001-018]
      - block: b02
        nodes: node[019-036]
- topology: fabric
  tree:
    switches:
      - switch: s0
        children: s[1-2]
      - switch: s1
        nodes: node[001-018]
      - switch: s2
        nodes: node[019-036]
- topology: off
  flat: true
"""


def test_slurm_block() -> None:
    st_ = load_topology_yaml(EXAMPLE)
    assert (st_.name, st_.kind, st_.block_sizes) == ("nvl72", "block", (16, 32))
    topo = st_.topology
    assert topo.levels == ("cluster", "domain", "clique")
    assert domains(topo) == {
        "b01": [f"node{i:03d}" for i in range(1, 19)],
        "b02": [f"node{i:03d}" for i in range(19, 37)],
    }
    assert topo.node_path(0) == ("b01", "b01.0") and set(topo.node_gpus) == {4}


@pytest.mark.parametrize(
    ("domain_size", "leaf_domains"),
    [(None, 36), (18, 2), (9, 4)],
)
def test_slurm_tree(domain_size: int | None, leaf_domains: int) -> None:
    st_ = load_topology_yaml(EXAMPLE, name="fabric", gpus_per_node=8, domain_size=domain_size)
    topo = st_.topology
    assert (st_.kind, st_.block_sizes) == ("tree", ())
    assert topo.levels == ("cluster", "leaf", "domain", "clique")
    assert topo.group_names[topo.level("leaf")] == ("s1", "s2")
    assert len(topo.group_nodes[topo.domain]) == leaf_domains
    assert topo.node_names[0] == "node001" and set(topo.node_gpus) == {8}
    expected = ("s1", "node001", "node001.0") if domain_size is None else ("s1", "s1.0", "s1.0.0")
    assert topo.node_path(0) == expected


def test_slurm_chooses_first_without_default() -> None:
    text = EXAMPLE.replace("  cluster_default: true\n", "")
    assert load_topology_yaml(text).name == "nvl72"
    text = EXAMPLE.replace("- topology: fabric\n", "- topology: fabric\n  cluster_default: True\n")
    assert load_topology_yaml(text.replace("  cluster_default: true\n", "")).name == "fabric"


@pytest.mark.parametrize(
    ("topo", "sizes"),
    [
        (Topology.uniform(4), [16, 32, 64]),
        (Topology.uniform(4), None),
        (Topology.uniform(3, cliques_per_domain=2), [9]),
        (topology_from_agents(nvl36x2_reports() + hgx_reports())[0], [1]),
    ],
    ids=["nvl72x4", "no-sizes", "cliques", "mixed"],
)
def test_slurm_round_trip(topo: Topology, sizes: list[int] | None) -> None:
    text = dump_topology_yaml(topo, block_sizes=sizes)
    back = load_topology_yaml(text, gpus_per_node=topo.node_gpus[0])
    assert back.name == "rackscale" and back.kind == "block"
    assert back.block_sizes == tuple(sizes or ())
    assert back.topology.node_names == topo.node_names
    assert domains(back.topology) == domains(topo)
    assert dump_topology_yaml(back.topology, block_sizes=sizes) == text


def test_slurm_dump_text() -> None:
    text = dump_topology_yaml(Topology.uniform(2), block_sizes=[16])
    assert "nodes: d00-n[00-17]" in text and "block: d01" in text


def test_slurm_dump_rejects_bad_sizes() -> None:
    with pytest.raises(SlurmTopologyError, match="block_sizes\\[1\\]=24 is not 16 x a power of two"):
        dump_topology_yaml(Topology.uniform(2), block_sizes=[16, 24])


BLOCK_HEAD = "- topology: t\n  block:\n"


def _blocks(*lines: str) -> str:
    return BLOCK_HEAD + "".join(f"{line}\n" for line in lines)


BAD_FILES: list[tuple[str, str, int, str]] = [
    (
        "missing-nodes",
        _blocks("    blocks:", "      - block: b01", "        nodes: n[1-4]", "      - block: b02"),
        6,
        "block 'b02': key 'nodes' is missing",
    ),
    ("missing-blocks", _blocks("    block_sizes: [4]"), 3, "key 'blocks' is missing"),
    ("missing-name", _blocks("    blocks:", "      - nodes: n1"), 4, "key 'block' is missing"),
    ("missing-topology", "- block:\n    blocks: []\n", 1, "key 'topology' is missing"),
    ("no-kind", "- topology: t\n  cluster_default: true\n", 1, "needs one of the keys"),
    (
        "unknown-key",
        _blocks("    blocks:", "      - block: b01", "        nodes: n[1-4]", "        weight: 3"),
        6,
        "unknown key 'weight'",
    ),
    ("unknown-top-key", "- topology: t\n  flat: true\n  colour: blue\n", 3, "unknown key 'colour'"),
    ("ring", "- topology: t\n  ring: {}\n", 2, "type 'ring' is not supported"),
    ("two-kinds", "- topology: t\n  flat: true\n  block: {}\n", 3, "has both 'flat' and 'block'"),
    (
        "bad-block-size",
        _blocks("    block_sizes: [16, 24]", "    blocks:", "      - block: b", "        nodes: n[1-18]"),
        3,
        "block_sizes[1]=24 is not 16 x a power of two",
    ),
    (
        "block-size-order",
        _blocks(
            "    block_sizes:",
            "      - 4",
            "      - 16",
            "      - 8",
            "    blocks:",
            "      - block: b",
            "        nodes: n[1-18]",
        ),
        6,
        "block_sizes[2]=8 is not larger than block_sizes[1]=16",
    ),
    (
        "base-too-big",
        _blocks("    block_sizes: [18]", "    blocks:", "      - block: b", "        nodes: n[1-16]"),
        3,
        "larger than the smallest block",
    ),
    (
        "block-size-word",
        _blocks("    block_sizes: [sixteen]", "    blocks:", "      - block: b", "        nodes: n1"),
        3,
        "block_sizes[0] must be a whole number",
    ),
    (
        "duplicate-node",
        _blocks(
            "    blocks:", "      - block: b01", "        nodes: n[1-4]", "      - block: b02", "        nodes: n[4-8]"
        ),
        6,
        "node 'n4' is already in block 'b01' (line 4)",
    ),
    (
        "duplicate-block",
        _blocks("    blocks:", "      - block: b01", "        nodes: n1", "      - block: b01", "        nodes: n2"),
        6,
        "block 'b01' is defined twice",
    ),
    (
        "duplicate-key",
        _blocks("    blocks:", "      - block: b01", "        nodes: n1", "        nodes: n2"),
        6,
        "key 'nodes' appears twice",
    ),
    ("bad-hostlist", _blocks("    blocks:", "      - block: b", "        nodes: n[1-"), 5, "never closed"),
    ("empty-hostlist", _blocks("    blocks:", "      - block: b", "        nodes: ''"), 5, "is empty"),
    ("blocks-not-list", _blocks("    blocks: b01"), 3, "must be a non-empty list"),
    ("malformed", _blocks("    blocks:", "      - block: b01", "       nodes: [n1"), 5, "not valid YAML"),
    ("tabs", "- topology: t\n\tflat: true\n", 2, "not valid YAML"),
    ("not-a-list", "topology: t\n", 1, "list of topologies"),
    ("empty", "# nothing\n", 1, "empty"),
    ("default-word", "- topology: t\n  cluster_default: maybe\n  flat: true\n", 2, "true or false"),
    ("dup-topology", "- topology: t\n  flat: true\n- topology: t\n  flat: true\n", 3, "defined twice"),
    ("flat-chosen", "- topology: t\n  flat: true\n", 1, "is flat"),
    (
        "tree-unknown-child",
        "- topology: t\n  tree:\n    switches:\n      - switch: s0\n        children: s[1-2]\n"
        "      - switch: s1\n        nodes: n1\n",
        5,
        "child switch 's2' is not defined",
    ),
    (
        "tree-both",
        "- topology: t\n  tree:\n    switches:\n      - switch: s0\n        children: s1\n        nodes: n1\n",
        4,
        "both 'children' and 'nodes'",
    ),
    (
        "tree-neither",
        "- topology: t\n  tree:\n    switches:\n      - switch: s0\n",
        4,
        "key 'nodes' or 'children' is missing",
    ),
    (
        "tree-duplicate-node",
        "- topology: t\n  tree:\n    switches:\n      - switch: s1\n        nodes: n[1-2]\n"
        "      - switch: s2\n        nodes: n2\n",
        6,
        "node 'n2' is already in switch 's1'",
    ),
]


@pytest.mark.parametrize(("text", "line", "why"), [c[1:] for c in BAD_FILES], ids=[c[0] for c in BAD_FILES])
def test_slurm_bad_files(text: str, line: int, why: str) -> None:
    with pytest.raises(SlurmTopologyError) as err:
        load_topology_yaml(text)
    message = str(err.value)
    assert message.startswith(f"topology.yaml line {line}: "), message
    assert why in message, message
    assert err.value.line == line


@pytest.mark.parametrize(
    ("call", "why"),
    [
        (lambda: load_topology_yaml(EXAMPLE, name="nope"), "no topology named 'nope'"),
        (lambda: load_topology_yaml(EXAMPLE, name="fabric", domain_size=5), "don't split into domains of 5"),
        (lambda: load_topology_yaml(EXAMPLE, name="fabric", domain_size=0), "domain_size=0"),
        (lambda: dump_topology_yaml(Topology(["domain"], [_spec("a,b", "d")])), "hostlist"),
    ],
)
def test_slurm_other_errors(call: Callable[[], object], why: str) -> None:
    with pytest.raises(SlurmTopologyError, match=why):
        call()
