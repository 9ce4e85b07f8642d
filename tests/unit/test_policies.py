"""Placement policies (flat, tree, block, rackscale) on hand-drawn fleets, expected nodes derived from the rules.

Every case draws its fleet (one row per NVLink domain, cells as in tests/unit/builders.py: '.' free,
'#' busy, 'x' down, 'd' draining, digit = free GPUs of a partly used node, 'g'/'G' free/busy node with a
degraded GPU 0, '-' node with GPU 0 down) and gives, per policy, the nodes it must pick (``d00-n14..17``;
``=1000`` after a node is its GPU mask, GPU 0 rightmost) or None. Each expectation has a one-line reason.

The rules (shared/core/policies/*.py docstrings):
- flat: first fitting nodes by index; ignores domains, `required` and segments.
- tree: one domain by best fit (fewest free, ties lowest index) if one fits, else fewest domains
  (largest first, the last one by best fit); ignores segments/slices; `required` is best effort.
- block: a job that fits a domain goes in ONE domain: fewest free wins, ties highest index; nodes in
  index order; segments greedily one at a time; bigger jobs without segment: aligned 2^L domain groups
  (smallest L whose size holds the job, fewest free, ties highest start).
- rackscale: per domain choice, lowest (slot loss, stranded, free left) with slot loss
  ``cap // P - left // P``, P = max(18 - 2, largest waiting run); ties: fewer degraded GPUs used, lowest
  index (never the running jobs' estimated ends). Segments scored as whole layouts. preferred: one domain else fewest
  domains; none: one domain if it breaks no run, else smallest fragments first. Degraded GPUs/nodes last;
  partial jobs best fit onto the fullest node.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from shared.core import POLICIES, ClusterState, Context, JobSpec, Need, Placement, Request, Slice, get_policy, request
from tests.unit.builders import (
    Fleet,
    busy_domains,
    clone,
    expect_layout,
    fleet,
    from_sketch,
    layout,
    names,
    occupy,
    sketch,
    snapshot,
)

INF = float("inf")
POLICY_NAMES = ("flat", "tree", "block", "rackscale", "ceiling")
AS_FLAT = "ceiling"  # the yardstick places as flat does; it differs only in what the simulator charges it
Expect = dict[str, str | None]


def E(*, flat: str | None, tree: str | None, block: str | None, rackscale: str | None) -> Expect:
    return {"flat": flat, "tree": tree, "block": block, "rackscale": rackscale}


def ALL(hostspec: str | None) -> Expect:
    return dict.fromkeys(POLICY_NAMES, hostspec)


def J(gpus: int, **kw: object) -> JobSpec:
    return JobSpec("j", gpus, **kw)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Case:
    id: str
    sketch: str
    job: JobSpec
    expect: Expect
    demand: frozenset[int] = frozenset()
    job_end: float = INF
    ends: dict[str, float] = field(default_factory=dict)  # expected end of each domain's busy job
    leaves: int | None = None
    cliques: int = 1
    gpus: int = 4

    def state(self) -> Fleet:
        return from_sketch(self.sketch, self.gpus, leaves=self.leaves, cliques=self.cliques, ends=self.ends)

    def ctx(self) -> Context:
        return Context(now=0.0, job_end=self.job_end, demand=self.demand)


# --- fleets ---------------------------------------------------------------------------------------------
# free: d00 4 (n14-17), d01 16 (n02-17), d02 18, d03 1 (n17); 39 nodes free
S1 = """
d00 ##############....
d01 ##................
d02 ..................
d03 #################.
"""
# spare awareness: d00 18 free, d01 16 free
S2 = """
d00 ..................
d01 ##................
"""
# d01 has one spare node beyond a 16-node run
S2B = """
d00 ..................
d01 #.................
"""
# a domain with two trays down still hosts a 16-node run
S3 = """
d00 ..................
d01 xx................
"""
# fragments: d00 6 free, d01 5 free
S4 = """
d00 ############......
d01 #############.....
"""
# segments: d00 6 free (n12-17), d01 8 free (n10-17)
S5 = """
d00 ############......
d01 ##########........
d02 ##################
d03 ##################
"""
# three equal domains of 4 free nodes
S6 = """
d00 ##############....
d01 ##############....
d02 ##############....
"""
# same, d00-n14 (free) has a degraded GPU
S6_DEGRADED_FREE = """
d00 ##############g...
d01 ##############....
d02 ##############....
"""
# same, d00-n00 (busy) has a degraded GPU
S6_DEGRADED_BUSY = """
d00 G#############....
d01 ##############....
d02 ##############....
"""
# partial nodes: n01 2 GPUs free (0b1100), n02 1 GPU free (0b1000)
S7 = """
d00 .21...
"""
S8 = """
d00 ....
d01 1...
"""
# n00 down, n01 draining, n02 GPU 0 down (free 0b1110), n03 GPU 0 degraded
H1 = """
d00 xd-g..
"""
H2 = """
d00 g#
"""
# 10 free nodes (n08-17) in each of 4 domains: 40 free, no domain holds 12
S9 = """
d00 ########..........
d01 ########..........
d02 ########..........
d03 ########..........
"""
# leaves of 3 domains: leaf00 = d00-d02 (34 free), leaf01 = d03-d05 (50 free)
L1 = """
d00 ..................  leaf00
d01 ##................  leaf00
d02 ##################  leaf00
d03 ##................  leaf01
d04 ##................  leaf01
d05 ..................  leaf01
"""
# leaf00 hosts two 16-node runs (d00, d01), leaf01 one (d03)
L3 = """
d00 ##................  leaf00
d01 ##................  leaf00
d02 ##################  leaf00
d03 ##................  leaf01
d04 ##################  leaf01
d05 ##################  leaf01
"""
# two equal, entirely free leaves
L0 = """
d00 ..................  leaf00
d01 ..................  leaf00
d02 ..................  leaf00
d03 ..................  leaf01
d04 ..................  leaf01
d05 ..................  leaf01
"""
# one domain, cliques of 9: clique d00.0 has n07-08 free, d00.1 all 9 free
C1 = """
d00 #######..|.........
"""
# HGX: each 8-GPU node is a domain
HGX = """
d00 .
d01 .
d02 .
d03 .
"""

PREF = {"nvlink": "preferred"}
NONE = {"nvlink": Need.NONE}
LEAF_32_16 = (Slice("leaf", 32), Slice("domain", 16))
LEAF_48_16 = (Slice("leaf", 48), Slice("domain", 16))

CASES = [
    # --- required, fits one domain -------------------------------------------------------------------
    # flat: first free node d00-n14; tree/block: fewest free >= 1 is d03 (1); rackscale: d03 leaves 0, breaks no run
    Case("s1-req-1node", S1, J(4), E(flat="d00-n14", tree="d03-n17", block="d03-n17", rackscale="d03-n17")),
    # all: d00 (4 free) is the best fit >= 2;
    # rackscale: d00 (0 loss, 2 left) beats d02 (0 loss, 16 left); d01 loses a run
    Case("s1-req-2nodes", S1, J(8), ALL("d00-n14..15")),
    # all: d00 has exactly 4 (flat: they are the first free nodes too)
    Case("s1-req-4nodes", S1, J(16), ALL("d00-n14..17")),
    # flat: 4 of d00 + first of d01; tree/block: fewest >= 5 is d01 (16);
    # rackscale: d01, d02 both lose 1 run, d01 leaves 11 < 13
    Case("s1-req-5nodes", S1, J(20), E(flat="d00-n14..17 d01-n02", tree="d01-n02..06", block="d01-n02..06",
                                        rackscale="d01-n02..06")),
    # flat: first 16 free by index; others: d01 has exactly 16 (best fit over d02's 18)
    Case("s1-req-16nodes", S1, J(64), E(flat="d00-n14..17 d01-n02..13", tree="d01-n02..17", block="d01-n02..17",
                                         rackscale="d01-n02..17")),
    # only d02 has 18 (flat spans by index)
    Case("s1-req-18nodes", S1, J(72), E(flat="d00-n14..17 d01-n02..15", tree="d02-n00..17", block="d02-n00..17",
                                         rackscale="d02-n00..17")),
    # --- nothing fits -----------------------------------------------------------------------------------
    # 39 free nodes < 40
    Case("s1-pref-40nodes-nowhere", S1, J(160, **PREF), ALL(None)),
    Case("s9-pref-41nodes-nowhere", S9, J(164, **PREF), ALL(None)),
    # required 12 and no domain has 12: flat/tree spread (best effort, tree: d00 10 + best fit d01 for 2);
    # block/rackscale wait
    Case("s9-req-12nodes-spread", S9, J(48), E(flat="d00-n08..17 d01-n08..09", tree="d00-n08..17 d01-n08..09",
                                               block=None, rackscale=None)),
    # --- preferred / none -------------------------------------------------------------------------------
    # fits a domain: same as required (d00 exact)
    Case("s1-pref-4nodes", S1, J(16, **PREF), ALL("d00-n14..17")),
    # 20 > 18: tree/rackscale fewest domains: d02 (18, largest) + best fit d00 for 2; block: aligned pair (d00,d01)
    # has 20 >= 20, (d02,d03) 19; flat: first 20 by index
    Case("s1-pref-20nodes", S1, J(80, **PREF), E(flat="d00-n14..17 d01-n02..17", tree="d02-n00..17 d00-n14..15",
                                                 block="d00-n14..17 d01-n02..17",
                                                 rackscale="d02-n00..17 d00-n14..15")),
    # 30 nodes: block's smallest L is a pair (36 >= 30) and no pair has 30 free -> None; tree/rackscale: d02 18 +
    # best fit for 12 = d01 (16); flat: 4 + 16 + 10
    Case("s1-pref-30nodes", S1, J(120, **PREF), E(flat="d00-n14..17 d01-n02..17 d02-n00..09",
                                                  tree="d02-n00..17 d01-n02..13", block=None,
                                                  rackscale="d02-n00..17 d01-n02..13")),
    # block keeps a job that fits a domain's size inside one domain even when preferred: none has 12 -> None;
    # rackscale/tree: fewest domains d00 10 + d01 2
    Case("s9-pref-12nodes", S9, J(48, **PREF), E(flat="d00-n08..17 d01-n08..09", tree="d00-n08..17 d01-n08..09",
                                                 block=None, rackscale="d00-n08..17 d01-n08..09")),
    # pairs (d00,d01) and (d02,d03) both have 20: block ties to the highest start; tree/rackscale d00 10 + d01 10
    Case("s9-pref-20nodes", S9, J(80, **PREF), E(flat="d00-n08..17 d01-n08..17", tree="d00-n08..17 d01-n08..17",
                                                 block="d02-n08..17 d03-n08..17",
                                                 rackscale="d00-n08..17 d01-n08..17")),
    # none, 5 nodes: every single domain that fits (d01, d02) loses a 16-run -> rackscale fills fragments smallest
    # first: d03 (1) + d00 (4); block/tree: one domain, fewest >= 5 = d01
    Case("s1-none-5nodes", S1, J(20, **NONE), E(flat="d00-n14..17 d01-n02", tree="d01-n02..06", block="d01-n02..06",
                                                rackscale="d03-n17 d00-n14..17")),
    # none, 2 nodes: d00 takes it without breaking a run -> one domain for rackscale too
    Case("s1-none-2nodes", S1, J(8, **NONE), ALL("d00-n14..15")),
    # none, 12 with no domain of 12: rackscale fragments ascending (all 10, by index): d00 10 + d01 2
    Case("s9-none-12nodes", S9, J(48, **NONE), E(flat="d00-n08..17 d01-n08..09", tree="d00-n08..17 d01-n08..09",
                                                 block=None, rackscale="d00-n08..17 d01-n08..09")),
    # --- segments --------------------------------------------------------------------------------------
    # 2 x 16: block/rackscale d01 (16, best fit) then d02; tree ignores segments: d02 18 + best fit d01 for 14
    Case("s1-seg16-32nodes", S1, J(128, segment=16), E(flat="d00-n14..17 d01-n02..17 d02-n00..11",
                                                       tree="d02-n00..17 d01-n02..15",
                                                       block="d01-n02..17 d02-n00..15",
                                                       rackscale="d01-n02..17 d02-n00..15")),
    # 2 x 4 on runs of 6 and 8: block greedy puts the first in d00 (6 < 8) and the second in d01;
    # rackscale's layout {d01: 2} (one domain, nothing left) beats {d00: 1, d01: 1}; tree: d01 has exactly 8
    Case("s5-seg4-8nodes", S5, J(32, segment=4), E(flat="d00-n12..17 d01-n10..11", tree="d01-n10..17",
                                                   block="d00-n12..15 d01-n10..13", rackscale="d01-n10..17")),
    # 3 x 4: both end at d00 x1 + d01 x2 (every layout needs 2 domains; this one leaves 2); tree: d01 8 + d00 4
    Case("s5-seg4-12nodes", S5, J(48, segment=4), E(flat="d00-n12..17 d01-n10..15", tree="d01-n10..17 d00-n12..15",
                                                    block="d00-n12..15 d01-n10..17",
                                                    rackscale="d00-n12..15 d01-n10..17")),
    # HGX, 2 x 1 node: block greedy ties to the highest index (d03 then d02); rackscale ties to the lowest
    Case("hgx-seg1-2nodes", HGX, J(16, segment=1), E(flat="d00-n00 d01-n00", tree="d00-n00 d01-n00",
                                                     block="d02-n00 d03-n00", rackscale="d00-n00 d01-n00"),
         gpus=8),
    # HGX preferred 2 nodes: block's aligned pairs (d00,d01) (d02,d03) tie -> highest start; tree/rackscale: fewest
    # domains, all of cap 1 -> d00 then best fit d01
    Case("hgx-pref-2nodes", HGX, J(16, **PREF), E(flat="d00-n00 d01-n00", tree="d00-n00 d01-n00",
                                                  block="d02-n00 d03-n00", rackscale="d00-n00 d01-n00"), gpus=8),
    # HGX, half a node: tree/rackscale ties lowest, block highest
    Case("hgx-4gpus", HGX, J(4), E(flat="d00-n00=00001111", tree="d00-n00=00001111", block="d03-n00=00001111",
                                   rackscale="d00-n00=00001111"), gpus=8),
    # --- multi-layer slices on leaves --------------------------------------------------------------------
    # leaf: best fit leaf00 (34 < 50; hosts 2 domain runs of 16: d00, d01); inside: d01 (16) then d00;
    # tree/flat ignore slices: d00 18 + best fit d01 for 14 / first 32 by index
    Case("l1-slices-32", L1, J(128, slices=LEAF_32_16), E(flat="d00-n00..17 d01-n02..15",
                                                          tree="d00-n00..17 d01-n02..15",
                                                          block="d00-n00..15 d01-n02..17",
                                                          rackscale="d00-n00..15 d01-n02..17"), leaves=3),
    # 2 leaf pieces: leaf00 -> d01, d00; leaf01 -> block d04 (16, ties highest) then d03, rackscale d03 and d04
    # (same nodes); tree: d00 18 + d05 18 + d01 16 + best fit d03 for 12
    Case("l1-slices-64", L1, J(256, slices=LEAF_32_16), E(flat="d00-n00..17 d01-n02..17 d03-n02..17 d04-n02..15",
                                                          tree="d00-n00..17 d05-n00..17 d01-n02..17 d03-n02..13",
                                                          block="d00-n00..15 d01-n02..17 d03-n02..17 d04-n02..17",
                                                          rackscale="d00-n00..15 d01-n02..17 d03-n02..17 d04-n02..17"),
         leaves=3),
    # segment 16 alone: block greedy d03 (16, highest) then d01 -> spans leaves; rackscale ties by index: d00, d01
    Case("l3-seg16-32", L3, J(128, segment=16), E(flat="d00-n02..17 d01-n02..17", tree="d00-n02..17 d01-n02..17",
                                                  block="d01-n02..17 d03-n02..17",
                                                  rackscale="d00-n02..17 d01-n02..17"), leaves=3),
    # leaf slice 32: only leaf00 hosts two 16-runs -> d01 and d00 for block and rackscale
    Case("l3-slices-32", L3, J(128, slices=LEAF_32_16), E(flat="d00-n02..17 d01-n02..17",
                                                          tree="d00-n02..17 d01-n02..17",
                                                          block="d00-n02..17 d01-n02..17",
                                                          rackscale="d00-n02..17 d01-n02..17"), leaves=3),
    # leaf slice 48 = 3 domain runs: no leaf hosts 3 -> block/rackscale wait; flat/tree take the 48 free nodes
    Case("l3-slices-48-nowhere", L3, J(192, slices=LEAF_48_16), E(flat="d00-n02..17 d01-n02..17 d03-n02..17",
                                                                  tree="d00-n02..17 d01-n02..17 d03-n02..17",
                                                                  block=None, rackscale=None), leaves=3),
    # equal leaves: block's piece order is fewest free, ties to the HIGHEST index -> leaf01, inside it ties
    # highest (d05, d04); rackscale ties to the LOWEST index at every level -> leaf00, then (d00, d01);
    # tree/flat: d00 18 + best fit d01 for 14
    Case("l0-slices-32-leaf-tie", L0, J(128, slices=LEAF_32_16), E(flat="d00-n00..17 d01-n00..13",
                                                                   tree="d00-n00..17 d01-n00..13",
                                                                   block="d04-n00..15 d05-n00..15",
                                                                   rackscale="d00-n00..15 d01-n00..15"), leaves=3),
    # --- other levels ----------------------------------------------------------------------------------
    # clique level: 2 nodes fit clique .0 exactly (best fit everywhere)
    Case("c1-clique-2nodes", C1, J(8, level="clique"), ALL("d00-n07..08"), cliques=2),
    # 3 nodes: only clique .1 holds 3; flat ignores cliques
    Case("c1-clique-3nodes", C1, J(12, level="clique"), E(flat="d00-n07..09", tree="d00-n09..11",
                                                          block="d00-n09..11", rackscale="d00-n09..11"), cliques=2),
    # --- rackscale spare awareness -----------------------------------------------------------------------
    # 2 nodes: d01 16 -> 14 breaks its run, d00 18 -> 16 keeps one -> rackscale d00; block/tree best fit d01
    Case("s2-req-2nodes-keeps-run", S2, J(8), E(flat="d00-n00..01", tree="d01-n02..03", block="d01-n02..03",
                                                rackscale="d00-n00..01")),
    # 1 node: same reasoning (d00 18 -> 17 still one run; d01 16 -> 15 none)
    Case("s2-req-1node-keeps-run", S2, J(4), E(flat="d00-n00", tree="d01-n02", block="d01-n02",
                                               rackscale="d00-n00")),
    # 16 nodes: both lose their run; d01 leaves 0 < 2 -> exact fit, although d00 has the lower index
    Case("s2-req-16nodes-exact", S2, J(64), E(flat="d00-n00..15", tree="d01-n02..17", block="d01-n02..17",
                                              rackscale="d01-n02..17")),
    # waiting 18-node job: P = 18, only d00 holds a run; d01 (16 -> 14) breaks none -> rackscale d01
    Case("s2-req-2nodes-demand18", S2, J(8), E(flat="d00-n00..01", tree="d01-n02..03", block="d01-n02..03",
                                               rackscale="d01-n02..03"), demand=frozenset({18})),
    # 1 node: d01 (17 free) -> 16 keeps its run and is the best fit (16 left < 17) -> everyone but flat: d01
    Case("s2b-req-1node-spare", S2B, J(4), E(flat="d00-n00", tree="d01-n01", block="d01-n01", rackscale="d01-n01")),
    # 2 nodes: d01 17 -> 15 breaks its run; d00 18 -> 16 keeps one -> rackscale d00; block/tree fewest free d01
    Case("s2b-req-2nodes-spare", S2B, J(8), E(flat="d00-n00..01", tree="d01-n01..02", block="d01-n01..02",
                                              rackscale="d00-n00..01")),
    # two trays down in d01: a 1-node job leaves d01's 16 usable nodes alone (d00 18 -> 17 keeps a run)
    Case("s3-req-1node-tray-down", S3, J(4), E(flat="d00-n00", tree="d01-n02", block="d01-n02", rackscale="d00-n00")),
    # and d01 still hosts a 16-node run (exact fit)
    Case("s3-req-16nodes-tray-down", S3, J(64), E(flat="d00-n00..15", tree="d01-n02..17", block="d01-n02..17",
                                                  rackscale="d01-n02..17")),
    # --- rackscale stranded nodes ---------------------------------------------------------------------
    # waiting runs of 4: d01 (5 -> 3) strands 3, d00 (6 -> 4) strands 0 -> rackscale d00; block/tree best fit d01
    Case("s4-req-2nodes-demand4", S4, J(8), E(flat="d00-n12..13", tree="d01-n13..14", block="d01-n13..14",
                                              rackscale="d00-n12..13"), demand=frozenset({4})),
    # no waiting runs: plain best fit d01 (3 left < 4)
    Case("s4-req-2nodes-no-demand", S4, J(8), E(flat="d00-n12..13", tree="d01-n13..14", block="d01-n13..14",
                                                rackscale="d01-n13..14")),
    # --- tie-breaks -----------------------------------------------------------------------------------
    # three equal domains: tree/rackscale lowest index, block highest
    Case("s6-req-4nodes-tie", S6, J(16), E(flat="d00-n14..17", tree="d00-n14..17", block="d02-n14..17",
                                           rackscale="d00-n14..17")),
    # running jobs end at 100 / 500 / 1000 (estimates), this one at 450: rackscale ignores the estimates -> d00
    Case("s6-req-4nodes-end-450", S6, J(16), E(flat="d00-n14..17", tree="d00-n14..17", block="d02-n14..17",
                                               rackscale="d00-n14..17"),
         job_end=450.0, ends={"d00": 100.0, "d01": 500.0, "d02": 1000.0}),
    # ... at 900: still d00 (packing order, not the closest estimated end)
    Case("s6-req-4nodes-end-900", S6, J(16), E(flat="d00-n14..17", tree="d00-n14..17", block="d02-n14..17",
                                               rackscale="d00-n14..17"),
         job_end=900.0, ends={"d00": 100.0, "d01": 500.0, "d02": 1000.0}),
    # rackscale: d00 would use degraded d00-n14 -> d01 (lowest of the clean ones); others ignore health
    Case("s6-degraded-free-4nodes", S6_DEGRADED_FREE, J(16), E(flat="d00-n14..17", tree="d00-n14..17",
                                                               block="d02-n14..17", rackscale="d01-n14..17")),
    # 1 node: d00 can give a healthy one -> tie stays at d00 and the degraded node goes last inside it
    Case("s6-degraded-free-1node", S6_DEGRADED_FREE, J(4), E(flat="d00-n14", tree="d00-n14", block="d02-n14",
                                                             rackscale="d00-n15")),
    # 2 segments of 4 over three 4-free domains: every layout uses 2 domains and leaves 0 -> tie; the rule "fewer
    # degraded GPUs used" picks d01 + d02 for rackscale; block greedy: d02 then d01 (highest index); tree d00 + d01
    Case("s6-degraded-free-seg4", S6_DEGRADED_FREE, J(32, segment=4), E(flat="d00-n14..17 d01-n14..17",
                                                                        tree="d00-n14..17 d01-n14..17",
                                                                        block="d01-n14..17 d02-n14..17",
                                                                        rackscale="d01-n14..17 d02-n14..17")),
    # the degraded GPU is on a busy node: no choice uses a degraded GPU -> tie -> lowest index d00
    Case("s6-degraded-busy-4nodes", S6_DEGRADED_BUSY, J(16), E(flat="d00-n14..17", tree="d00-n14..17",
                                                               block="d02-n14..17", rackscale="d00-n14..17")),
    # --- partial nodes --------------------------------------------------------------------------------
    # 1 GPU: rackscale best fit = fullest node that fits (n02, 1 free: GPU 3); others first fit n00, GPU 0
    Case("s7-1gpu", S7, J(1), E(flat="d00-n00=0001", tree="d00-n00=0001", block="d00-n00=0001",
                                rackscale="d00-n02=1000")),
    # 2 GPUs on one node: rackscale n01 (2 free: GPUs 2,3); others n00 GPUs 0,1
    Case("s7-2gpus", S7, J(2), E(flat="d00-n00=0011", tree="d00-n00=0011", block="d00-n00=0011",
                                 rackscale="d00-n01=1100")),
    # 2 x 1 GPU: rackscale n02 then n01; others n00 then n01 (lowest free GPU of each)
    Case("s7-2x1gpu", S7, J(2, gpus_per_node=1), E(flat="d00-n00=0001 d00-n01=0100",
                                                   tree="d00-n00=0001 d00-n01=0100",
                                                   block="d00-n00=0001 d00-n01=0100",
                                                   rackscale="d00-n02=1000 d00-n01=0100")),
    # 3 GPUs: only the free nodes fit; n00 first; GPUs 0-2
    Case("s7-3gpus", S7, J(3), ALL("d00-n00=0111")),
    # exclusive 1 GPU: a whole free node, all its GPUs held
    Case("s7-exclusive-1gpu", S7, J(1, exclusive=True), ALL("d00-n00=1111")),
    # 8 GPUs (exclusive or not): the first two entirely free nodes n00, n03
    Case("s7-exclusive-8gpus", S7, J(8, exclusive=True), ALL("d00-n00 d00-n03")),
    Case("s7-8gpus", S7, J(8), ALL("d00-n00 d00-n03")),
    # 1 GPU on two domains whose nodes all have >= 1 free GPU: domain counts tie (4 and 4) -> rackscale lowest
    # index d00 (the partly used d01-n00 doesn't make d01 a better fit at the domain level); block highest
    # index d01, whose first node is the partly used one
    Case("s8-1gpu-domain-tie", S8, J(1), E(flat="d00-n00=0001", tree="d00-n00=0001", block="d01-n00=1000",
                                           rackscale="d00-n00=0001")),
    # --- health ---------------------------------------------------------------------------------------
    # whole node: n00 down, n01 draining, n02 lacks a GPU -> n03; rackscale puts degraded n03 last -> n04
    Case("h1-1node", H1, J(4), E(flat="d00-n03", tree="d00-n03", block="d00-n03", rackscale="d00-n04")),
    Case("h1-2nodes", H1, J(8), E(flat="d00-n03..04", tree="d00-n03..04", block="d00-n03..04",
                                  rackscale="d00-n04..05")),
    # 3 whole nodes: exactly n03-n05 can
    Case("h1-3nodes", H1, J(12), ALL("d00-n03..05")),
    # 4 whole nodes: only 3 fit
    Case("h1-4nodes-nowhere", H1, J(16), ALL(None)),
    # 1 GPU: n02 (3 healthy GPUs) is first fit and the best fit; its lowest free GPU is 1
    Case("h1-1gpu", H1, J(1), ALL("d00-n02=0010")),
    # 3 GPUs: n02's three healthy GPUs
    Case("h1-3gpus", H1, J(3), ALL("d00-n02=1110")),
    # exclusive: n02 isn't whole (3 GPUs) -> n03; rackscale avoids degraded n03 -> n04
    Case("h1-exclusive-1gpu", H1, J(1, exclusive=True), E(flat="d00-n03=1111", tree="d00-n03=1111",
                                                          block="d00-n03=1111", rackscale="d00-n04=1111")),
    # only node free has a degraded GPU 0: rackscale uses GPU 1 instead
    Case("h2-1gpu", H2, J(1), E(flat="d00-n00=0001", tree="d00-n00=0001", block="d00-n00=0001",
                                rackscale="d00-n00=0010")),
    Case("h2-1node", H2, J(4), ALL("d00-n00=1111")),
]  # fmt: skip

PARAMS = [
    pytest.param(c, p, id=f"{c.id}-{p}")
    for c in CASES
    for p in POLICY_NAMES
    if ("flat" if p == AS_FLAT else p) in c.expect
]


def check_valid(state: ClusterState, req: Request, got: Placement, honours_required: bool) -> None:
    """A placement any policy returns: distinct usable nodes, free GPUs, right GPU count, layers kept."""
    topo = state.topo
    assert len(set(got.nodes)) == len(got.nodes) == req.nodes
    for node, mask in zip(got.nodes, got.masks, strict=True):
        assert state.usable[node], topo.node_names[node]
        assert mask & ~state.free[node] == 0, topo.node_names[node]
        if req.exclusive:
            assert mask == state.full[node] and not state.node_jobs[node]
        else:
            assert mask.bit_count() == req.per_node
    if honours_required:
        for level, size in req.slices:
            per_group: dict[int, int] = {}
            for node in got.nodes:
                g = topo.node_group[level][node]
                per_group[g] = per_group.get(g, 0) + 1
            assert all(n % size == 0 for n in per_group.values()), (level, size, per_group)
    scratch = clone(state)
    scratch.allocate(got.allocation(req, 0.0, INF))
    scratch.check()


@pytest.mark.parametrize(("case", "policy"), PARAMS)
def test_placement(case: Case, policy: str) -> None:
    state = case.state()
    topo = state.topo
    req = request(case.job, topo)
    pol = get_policy(policy)
    before = snapshot(state)
    got = pol.place(state, req, case.ctx())
    assert snapshot(state) == before, "place() changed the state"
    want = case.expect["flat" if policy == AS_FLAT else policy]
    picture = f"\n{sketch(state)}\n{policy} -> {layout(topo, got)}"
    if want is None:
        assert got is None, picture
        return
    assert got is not None, picture
    assert layout(topo, got) == expect_layout(want, (1 << case.gpus) - 1), picture
    check_valid(state, req, got, pol.honours_required)


def test_builders_agree() -> None:
    """busy_domains draws the same S1 as its sketch, and names() lists a placement's nodes in order."""
    state = fleet(4)
    busy_domains(state, {"d00": 14, "d01": 2, "d02": 0, "d03": 17})
    assert sketch(state) == S1.strip()
    assert snapshot(state) == snapshot(from_sketch(S1))
    got = get_policy("flat").place(state, request(J(20), state.topo), Context())
    assert names(state.topo, got) == [f"d00-n{n}" for n in range(14, 18)] + ["d01-n02"]
    assert names(state.topo, None) is None


def test_every_policy_has_cases() -> None:
    assert set(POLICIES) == set(POLICY_NAMES)
    assert get_policy("flat").honours_required is False
    assert get_policy("tree").honours_required is False
    assert get_policy("block").honours_required is True
    assert get_policy("rackscale").honours_required is True
    assert get_policy("ceiling").honours_required is False and get_policy("ceiling").yardstick is True
    assert not any(get_policy(p).yardstick for p in POLICY_NAMES if p != "ceiling")
    with pytest.raises(ValueError, match="unknown policy"):
        get_policy("nope")


# --- determinism ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_deterministic(policy: str) -> None:
    """Same state and request -> same placement: twice in a row, and on a fresh copy of the state."""
    pol = get_policy(policy)
    for case in CASES:
        state = case.state()
        req = request(case.job, state.topo)
        first = pol.place(state, req, case.ctx())
        again = pol.place(state, req, case.ctx())
        fresh = get_policy(policy).place(clone(state), request(case.job, state.topo), case.ctx())
        rebuilt = pol.place(case.state(), req, case.ctx())
        assert first == again == fresh == rebuilt, case.id


# --- block and rackscale never break `required` ---------------------------------------------------------------
def random_fleet(seed: int) -> Fleet:
    """4 domains x 18 nodes: a few nodes down/draining, a GPU down and one degraded, and a random number of
    random busy nodes per domain (a quarter of them partly busy: GPUs 0,1 held)."""
    rng = random.Random(seed)
    names = [f"d{d:02d}-n{n:02d}" for d in range(4) for n in range(18)]
    sick = rng.sample(names, 5)
    state = fleet(
        4,
        down=sick[:2],
        draining=sick[2:3],
        gpu_down=[(sick[3], rng.randrange(4))],
        degraded=[(sick[4], rng.randrange(4))],
    )
    for d in range(4):
        busy = rng.sample(range(18), rng.randint(0, 18))
        whole = [f"d{d:02d}-n{n:02d}" for n in busy[: len(busy) * 3 // 4]]
        if whole:
            occupy(state, f"busy-d{d:02d}", whole)
        for n in busy[len(busy) * 3 // 4 :]:
            name = f"d{d:02d}-n{n:02d}"
            occupy(
                state,
                f"part-{name}",
                [name],
                gpus=[g for g in (0, 1) if state.full[state.topo.node_index[name]] >> g & 1],
            )
    return state


REQUIRED_JOBS = [J(4), J(8), J(16), J(32), J(48), J(64), J(72), J(2), J(4, gpus_per_node=2), J(1, exclusive=True),
                 J(32, segment=4), J(48, segment=4), J(128, segment=16), J(24, segment=2),
                 J(64, segment=8, nvlink="preferred")]  # fmt: skip


@pytest.mark.parametrize("policy", ["block", "rackscale"])
@pytest.mark.parametrize("seed", range(8))
def test_honours_required(policy: str, seed: int) -> None:
    """Each piece inside one domain, and a placement whenever such a layout exists."""
    state = random_fleet(seed)
    topo = state.topo
    dom = topo.domain
    pol = get_policy(policy)
    for spec in REQUIRED_JOBS:
        req = request(spec, topo)
        ((level, size),) = req.slices
        assert level == dom
        got = pol.place(state, req, Context())
        caps = [state.count[dom][g][req.k] for g in range(len(topo.group_nodes[dom]))]
        feasible = sum(c // size for c in caps) >= req.nodes // size
        assert (got is not None) == feasible, f"{spec}\n{sketch(state)}"
        if got is not None:
            check_valid(state, req, got, honours_required=True)


SPILL_JOBS = [J(4), J(16, nvlink="preferred"), J(80, nvlink="preferred"), J(100, nvlink=Need.NONE), J(3),
              J(6, gpus_per_node=2, nvlink=Need.NONE), J(2, exclusive=True), J(128, segment=16)]  # fmt: skip


@pytest.mark.parametrize("policy", ["flat", "tree"])
@pytest.mark.parametrize("seed", range(8))
def test_baselines_place_whenever_enough_nodes_fit(policy: str, seed: int) -> None:
    """flat and tree are best effort: they place any job whenever enough usable nodes have room for it."""
    state = random_fleet(seed)
    pol = get_policy(policy)
    for spec in SPILL_JOBS + REQUIRED_JOBS:
        req = request(spec, state.topo)
        got = pol.place(state, req, Context())
        enough = sum(state.node_fits(n, req.k, req.exclusive) for n in range(len(state.topo))) >= req.nodes
        assert (got is not None) == enough, f"{spec}\n{sketch(state)}"
        if got is not None:
            check_valid(state, req, got, honours_required=False)
