"""`request()`: every validation error (field + phrase) and the shapes valid jobs turn into.

Topologies used (levels outermost first; index 0 is the synthetic ``cluster`` root):

    NVL72 x2           cluster(0) > domain(1) > clique(2)      2 domains x 18 nodes x 4 GPUs = 36 nodes
    NVL72 x4           same, 4 domains                         72 nodes
    leaves 12/3        cluster(0) > leaf(1) > domain(2) > clique(3)
                       leaf00 = d00 d01 d02 (54 nodes) ... leaf03 = d09 d10 d11; 216 nodes
    NVL36x2            one domain = 36 nodes, two cliques of 18 (the two racks)
                       +------------------+------------------+
                       | clique d00.0: 18 | clique d00.1: 18 |   x2 domains
                       +------------------+------------------+
    HGX                every 8-GPU node is its own domain: [8] [8] [8] [8]
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from shared.core import JobSpec, Need, ShapeError, Slice, Topology, request

NVL72x2 = Topology.uniform(2)
NVL72x4 = Topology.uniform(4)
LEAVES = Topology.uniform(12, domains_per_leaf=3)
NVL36x2 = Topology.uniform(2, nodes_per_domain=36, cliques_per_domain=2)
HGX = Topology.uniform(4, nodes_per_domain=1, gpus_per_node=8)

TOPOS = {"nvl72x2": NVL72x2, "nvl72x4": NVL72x4, "leaves": LEAVES, "nvl36x2": NVL36x2, "hgx": HGX}


def J(gpus: object, **kw: object) -> JobSpec:
    return JobSpec("j", gpus, **kw)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Bad:
    id: str
    topo: str
    job: JobSpec
    field: str
    phrase: str


BAD = [
    Bad("empty-id", "nvl72x2", JobSpec("", 4), "id", "must not be empty"),
    Bad("gpus-zero", "nvl72x2", J(0), "gpus", "at least 1, got 0"),
    Bad("gpus-negative", "nvl72x2", J(-4), "gpus", "at least 1, got -4"),
    Bad("gpus-bool", "nvl72x2", J(True), "gpus", "whole number"),
    Bad("gpus-float", "nvl72x2", J(4.0), "gpus", "whole number"),
    # 6 GPUs defaults to whole 4-GPU nodes: 6 % 4 != 0
    Bad("gpus-not-multiple-default", "nvl72x2", J(6), "gpus", "6 is not a multiple of gpus_per_node 4"),
    Bad("gpus-not-multiple", "nvl72x2", J(5, gpus_per_node=2), "gpus", "5 is not a multiple of gpus_per_node 2"),
    # HGX: 12 GPUs default to 8 per node
    Bad("hgx-not-multiple", "hgx", J(12), "gpus", "12 is not a multiple of gpus_per_node 8"),
    Bad("per-node-zero", "nvl72x2", J(4, gpus_per_node=0), "gpus_per_node", "at least 1"),
    Bad("per-node-too-big", "nvl72x2", J(8, gpus_per_node=8), "gpus_per_node", "8 is more than any node has"),
    # 36 nodes in the cluster; 148 GPUs = 37 nodes
    Bad("more-nodes-than-cluster", "nvl72x2", J(148, nvlink="none"), "gpus", "need 37 nodes; the cluster has 36"),
    Bad("bad-nvlink", "nvl72x2", J(4, nvlink="sometimes"), "topology.nvlink", "must be required, preferred or none"),
    Bad("unknown-level", "nvl72x2", J(4, level="spine"), "topology.level", "unknown topology level 'spine'"),
    Bad("negative-runtime", "nvl72x2", J(4, expected_runtime_s=-1.0), "expected_runtime_s", "must not be negative"),
    Bad("priority-float", "nvl72x2", J(4, priority=1.5), "priority", "whole number"),
    # 12 nodes, segment 5
    Bad("segment-not-dividing", "nvl72x2", J(48, segment=5), "segment", "12 nodes is not a multiple of segment 5"),
    Bad("segment-zero", "nvl72x2", J(48, segment=0), "segment", "at least 1"),
    # 40 nodes in segments of 20 > 18-node domains
    Bad("segment-too-big", "nvl72x4", J(160, segment=20), "segment", "20 nodes is larger than any NVLink domain"),
    Bad("segment-nvlink-none", "nvl72x2", J(64, segment=8, nvlink="none"), "segment", "required or preferred"),
    Bad("slices-nvlink-none", "leaves", J(128, slices=(Slice("domain", 16),), nvlink="none"), "slices", "required or"),
    Bad(
        "segment-and-slices",
        "leaves",
        J(128, segment=16, slices=(Slice("domain", 16),)),
        "segment",
        "give segment or slices, not both",
    ),
    # 96 nodes: domain 16 first, then leaf 48: inner before outer
    Bad(
        "slices-inner-first",
        "leaves",
        J(384, slices=(Slice("domain", 16), Slice("leaf", 48))),
        "slices[1].level",
        "from outer levels to inner ones",
    ),
    Bad(
        "slices-same-level-twice",
        "leaves",
        J(384, slices=(Slice("leaf", 48), Slice("leaf", 16))),
        "slices[1].level",
        "from outer levels to inner ones",
    ),
    Bad("slice-unknown-level", "leaves", J(64, slices=(Slice("pod", 16),)), "slices[0].level", "unknown"),
    Bad("slice-zero-nodes", "leaves", J(64, slices=(Slice("domain", 0),)), "slices[0].nodes", "at least 1"),
    # 120 nodes in leaf slices of 60 > 54-node leaves
    Bad(
        "slice-larger-than-leaf",
        "leaves",
        J(480, slices=(Slice("leaf", 60),)),
        "slices[0].nodes",
        "60 nodes is larger than any leaf (largest: 54 nodes)",
    ),
    # 120 nodes = leaf 40 > domain 20, and 20 > 18
    Bad(
        "slice-larger-than-domain",
        "leaves",
        J(480, slices=(Slice("leaf", 40), Slice("domain", 20))),
        "slices[1].nodes",
        "20 nodes is larger than any NVLink domain (largest: 18 nodes)",
    ),
    # 96 = 2 x 48, but 48 is not a multiple of 18
    Bad(
        "slice-not-dividing-outer",
        "leaves",
        J(384, slices=(Slice("leaf", 48), Slice("domain", 18))),
        "slices[1].nodes",
        "48 nodes is not a multiple of slices 18",
    ),
    Bad(
        "slice-not-dividing-job",
        "leaves",
        J(384, slices=(Slice("domain", 10),)),
        "slices[0].nodes",
        "96 nodes is not a multiple of slices 10",
    ),
    # 19 nodes required in one 18-node domain
    Bad("required-bigger-than-domain", "nvl72x2", J(76), "gpus", "can't fit in one NVLink domain"),
    Bad("required-bigger-than-domain-hint", "nvl72x2", J(76), "gpus", "set a segment"),
    Bad("required-bigger-than-clique", "nvl36x2", J(76, level="clique"), "gpus", "can't fit in one clique"),
    Bad("nvl36-required-37-nodes", "nvl36x2", J(148), "gpus", "(largest: 36 nodes)"),
    Bad("hgx-required-two-nodes", "hgx", J(16), "gpus", "can't fit in one NVLink domain (largest: 1 nodes)"),
]


@pytest.mark.parametrize("case", BAD, ids=[c.id for c in BAD])
def test_invalid_shape(case: Bad) -> None:
    with pytest.raises(ShapeError) as err:
        request(case.job, TOPOS[case.topo])
    assert err.value.field == case.field, str(err.value)
    assert case.phrase in err.value.message, str(err.value)
    assert str(err.value) == f"{case.field}: {err.value.message}"


@dataclass(frozen=True)
class Good:
    id: str
    topo: str
    job: JobSpec
    nodes: int
    per_node: int
    k: int
    need: Need = Need.REQUIRED
    level: str = "domain"  # level name the need applies to
    slices: tuple[tuple[str, int], ...] = ()  # (level name, nodes per group), outermost first
    exclusive: bool = False
    extra: dict[str, object] = field(default_factory=dict)


GOOD = [
    # < 4 GPUs: all of them on one node; required (default) -> one slice of the whole job in a domain
    Good("one-gpu", "nvl72x2", J(1), nodes=1, per_node=1, k=1, slices=(("domain", 1),)),
    Good("three-gpus-one-node", "nvl72x2", J(3), nodes=1, per_node=3, k=3, slices=(("domain", 1),)),
    # >= 4 GPUs: whole nodes
    Good("four-gpus-whole-node", "nvl72x2", J(4), nodes=1, per_node=4, k=4, slices=(("domain", 1),)),
    Good("eight-gpus-two-nodes", "nvl72x2", J(8), nodes=2, per_node=4, k=4, slices=(("domain", 2),)),
    Good("per-node-1", "nvl72x2", J(2, gpus_per_node=1), nodes=2, per_node=1, k=1, slices=(("domain", 2),)),
    Good("per-node-2", "nvl72x2", J(6, gpus_per_node=2), nodes=3, per_node=2, k=2, slices=(("domain", 3),)),
    # exclusive: per_node stays what the job uses, but a node must be entirely free (k = 4)
    Good("exclusive-one-gpu", "nvl72x2", J(1, exclusive=True), 1, 1, 4, slices=(("domain", 1),), exclusive=True),
    Good("full-domain", "nvl72x2", J(72), nodes=18, per_node=4, k=4, slices=(("domain", 18),)),
    # preferred / none: no hard slices, may exceed a domain
    Good("preferred-19-nodes", "nvl72x2", J(76, nvlink="preferred"), 19, 4, 4, need=Need.PREFERRED),
    Good("none-36-nodes", "nvl72x2", J(144, nvlink=Need.NONE), 36, 4, 4, need=Need.NONE),
    # domain aliases
    Good("level-rack", "nvl72x2", J(8, level="rack"), 2, 4, 4, slices=(("domain", 2),)),
    Good("level-nvlink", "nvl72x2", J(8, level="nvlink"), 2, 4, 4, slices=(("domain", 2),)),
    # segment -> one layer at the job's level
    Good("segment-16", "nvl72x2", J(128, segment=16), nodes=32, per_node=4, k=4, slices=(("domain", 16),)),
    Good(
        "segment-preferred",
        "nvl72x2",
        J(32, segment=4, nvlink="preferred"),
        8,
        4,
        4,
        need=Need.PREFERRED,
        slices=(("domain", 4),),
    ),
    # 96 nodes -> 48 per leaf -> 16 per domain
    Good(
        "multi-layer-96",
        "leaves",
        J(384, slices=(Slice("leaf", 48), Slice("domain", 16))),
        nodes=96,
        per_node=4,
        k=4,
        slices=(("leaf", 48), ("domain", 16)),
    ),
    Good("leaf-required", "leaves", J(200, level="leaf"), 50, 4, 4, level="leaf", slices=(("leaf", 50),)),
    # NVL36x2: a 36-node domain takes a 36-node required job; a clique holds 18
    Good("nvl36-36-nodes", "nvl36x2", J(144), nodes=36, per_node=4, k=4, slices=(("domain", 36),)),
    Good("nvl36-segment-18", "nvl36x2", J(288, segment=18), 72, 4, 4, slices=(("domain", 18),)),
    Good("nvl36-clique-18", "nvl36x2", J(72, level="clique"), 18, 4, 4, level="clique", slices=(("clique", 18),)),
    # HGX: a node of 8 GPUs is the whole domain
    Good("hgx-8", "hgx", J(8), nodes=1, per_node=8, k=8, slices=(("domain", 1),)),
    Good("hgx-4", "hgx", J(4), nodes=1, per_node=4, k=4, slices=(("domain", 1),)),
    Good("hgx-16-preferred", "hgx", J(16, nvlink="preferred"), 2, 8, 8, need=Need.PREFERRED),
    Good("hgx-16-segment-1", "hgx", J(16, segment=1), nodes=2, per_node=8, k=8, slices=(("domain", 1),)),
]


@pytest.mark.parametrize("case", GOOD, ids=[c.id for c in GOOD])
def test_valid_shape(case: Good) -> None:
    topo = TOPOS[case.topo]
    req = request(case.job, topo)
    assert (req.nodes, req.per_node, req.k, req.exclusive) == (case.nodes, case.per_node, case.k, case.exclusive)
    assert req.need is case.need
    assert req.level == topo.level_index[case.level]
    assert req.slices == tuple((topo.level_index[lv], n) for lv, n in case.slices)
    assert req.gpus == case.job.gpus
    assert req.job is case.job


def test_domain_level_index_depends_on_leaves() -> None:
    # with leaves the domain is level 2 (cluster, leaf, domain, clique), without it is level 1
    assert request(J(8), LEAVES).slices == ((2, 2),)
    assert request(J(8), NVL72x2).slices == ((1, 2),)


def test_shape_key_groups_same_shapes() -> None:
    a = request(JobSpec("a", 8, priority=3, tenant="x"), NVL72x2)
    b = request(JobSpec("b", 8, tenant="y"), NVL72x2)
    c = request(JobSpec("c", 8, nvlink="preferred"), NVL72x2)
    assert a.shape_key == b.shape_key
    assert a.shape_key != c.shape_key
