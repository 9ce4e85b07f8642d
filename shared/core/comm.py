"""What a split costs an NVLink-sensitive job: the communication model the simulator charges and the cycle
weighs (a flexible job's smaller layout against the wait for its preferred one).

A job needs its ranks of each *unit* (its segment, or the whole job when it has none) inside one NVLink
domain. Inside a domain a GPU has about 1.8 TB/s of NVLink; across domains, about 50 GB/s of scale-out
fabric: a bandwidth ratio ``R = 36``. Of a step's time a share ``c`` (default 0.05) is the NVLink
collectives (tensor/expert parallel) when everything is local. When a unit of ``n`` nodes is spread
over domains holding ``n_d`` nodes each, the share of its rank pairs that cross a domain boundary is
``x = 1 - sum_d (n_d / n)^2`` (all-to-all traffic; 0 when local, 0.5 for an even split in two). Those
bytes go ``R`` times slower, so the step takes

    slowdown = 1 + c * x * (R - 1)      (averaged over the job's units)

e.g. an even two-domain split costs 1 + 0.05 * 0.5 * 35 = 1.875x. Jobs with no NVLink need (single
node, or ``nvlink=none``) pay nothing. `flat` and `tree` pay it when they split a unit; `block` and
`rackscale` never split one. A unit is the job's nodes in allocation order, chunked by the unit size
(policies lay segments out one after another).

A flexible job (segments ``[S, s, ...]``, largest first) keeps its tensor/expert-parallel traffic inside
its smallest accepted segment (that is what accepting it says) and runs best with its preferred segment
``S``: the traffic between its smaller islands (pipeline stages, data-parallel reductions) then stays on
NVLink. That traffic is a smaller share ``c_outer`` (default 0.005) of a step; placed with segments of
``s`` nodes, the share of the preferred unit's rank pairs crossing domains is ``x_outer`` (at most
``1 - s / S``, every segment in a different domain), and the step takes

    slowdown = 1 + (c * x + c_outer * x_outer) * (R - 1)

e.g. segments of 8 for a job that prefers 16: at most 1 + 0.005 * 0.5 * 35 = 1.0875x. The cycle weighs that
worst case (`layout_factor`); the simulator charges the layout the job got.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SlowdownModel:
    nvlink_gbps: float = 1800.0
    scaleout_gbps: float = 50.0
    comm_share: float = 0.05
    outer_share: float = 0.005  # `c_outer`: a flexible job's traffic between its smaller segments

    @property
    def ratio(self) -> float:
        return self.nvlink_gbps / self.scaleout_gbps

    def cross_share(self, node_domains: Sequence[int], unit: int) -> float:
        """Mean over units of the share of rank pairs that cross domains (0: every unit local)."""
        if unit <= 1 or len(node_domains) <= 1:
            return 0.0
        total = 0.0
        units = 0
        for i in range(0, len(node_domains), unit):
            chunk = node_domains[i : i + unit]
            units += 1
            first = chunk[0]
            if all(d == first for d in chunk):
                continue
            n = len(chunk)
            counts: dict[int, int] = {}
            for d in chunk:
                counts[d] = counts.get(d, 0) + 1
            total += 1.0 - sum((c / n) ** 2 for c in counts.values())
        return total / units if units else 0.0

    def factor(self, cross: float, outer_cross: float = 0.0) -> float:
        return 1.0 + (self.comm_share * cross + self.outer_share * outer_cross) * (self.ratio - 1.0)

    def layout_factor(self, preferred: int, segment: int) -> float:
        """The most a flexible job placed with segments of `segment` nodes runs slower than with its
        `preferred` ones (every segment in a different domain)."""
        if segment >= preferred:
            return 1.0
        return self.factor(0.0, 1.0 - segment / preferred)
