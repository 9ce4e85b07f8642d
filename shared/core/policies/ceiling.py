"""`ceiling`: a yardstick, not a way to run a cluster. What any placement of these rigid jobs could reach.

First fit wherever GPUs are free (as `flat`), with no topology constraint, and the simulator charges it no
cross-domain cost (`yardstick`): the same queue, estimates, failures, reservations and lending as rackscale,
so the gap between `block` and it is all that placement can win, and (policy - block) / (ceiling - block)
is the share of it a policy captured (docs/evaluation.md).
"""

from __future__ import annotations

from shared.core.policies.flat import FlatPolicy


class CeilingPolicy(FlatPolicy):
    name = "ceiling"
    yardstick = True
    sticky_reservations = True
    lends_reserved = True
    resizes = True  # an upper bound: what rackscale may do with shapes, it may do too
