"""When silence means something: a service that judges others by the messages it gets can only judge the
time it could have heard them.

Inventory marks a node down when no heartbeat came for the node-down limit; migration rolls a move back when
the queue didn't take its next step in time. Both hear over NATS (and inventory records what it hears in
Redis). When the service's own link breaks — nats-server restarts on its store, a network cut, Redis gone
while heartbeats were being recorded — nobody could be heard, and that silence says nothing about them.

The rule, as pure functions of a `Hearing` and an injected `now`:

- while the link is down (`deaf`), nothing is judged;
- silence counts from max(the last message heard, the end of the last break): once the link is back,
  everyone gets a fresh grace of the whole limit before silence counts against them;
- a break is seen as a disconnection, or as a new link `epoch` (a reconnect counter, and whatever other
  breaks the caller counts): a disconnect and reconnect that both happened between two looks still count.

The end of a break is the first look that finds the link up again, never earlier than the reconnect, so the
grace is never shorter than promised. A service starts with `Hearing(since=start)`: a restarted service, too,
first listens for a whole limit.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True, slots=True)
class Hearing:
    """Since when a service has heard without a break. `deaf`: a break under way. `epoch`: the link's break
    counter as last seen (a reconnect counter), so a break that began and ended between two looks shows."""

    since: float
    deaf: bool = False
    epoch: int = 0


def observe(h: Hearing, *, connected: bool, epoch: int, now: float) -> Hearing:
    """The hearing after a look at the link at `now`: `connected` whether it is up now, `epoch` its break
    counter now. A break ends at the first look that finds the link up: silence counts from there."""
    if not connected:
        return h if h.deaf and h.epoch == epoch else replace(h, deaf=True, epoch=epoch)
    if h.deaf or epoch != h.epoch:
        return Hearing(since=max(h.since, now), deaf=False, epoch=epoch)
    return h


def lost(h: Hearing) -> Hearing:
    """A break noticed some other way than by looking at the link (a probe that got no answer)."""
    return h if h.deaf else replace(h, deaf=True)


def may_judge(h: Hearing, now: float, limit: float) -> bool:
    """Whether anyone can be overdue at all: the link is up and has been for longer than `limit`. A service
    may skip the work of judging otherwise."""
    return not h.deaf and now - h.since > limit


def silent_for(h: Hearing, last_heard: float, now: float) -> float:
    """How long the silence of someone last heard at `last_heard` counts at `now` (0 while deaf)."""
    if h.deaf:
        return 0.0
    return max(0.0, now - max(last_heard, h.since))


def overdue(h: Hearing, last_heard: float, now: float, limit: float) -> bool:
    """Someone last heard at `last_heard` has been silent for longer than `limit`, counting only the time
    this service could hear them."""
    return not h.deaf and now - max(last_heard, h.since) > limit
