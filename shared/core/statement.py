"""Statement: tentative changes to a ClusterState with checkpoint/rollback and commit/discard.

Gangs are all-or-nothing (a job's nodes are allocated in one step and undone in one step), and
preemption, backfill and migration ask "what if" by changing the state through a statement and
rolling back what they don't keep. Same idea as KAI-Scheduler's Statement.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.core.state import Allocation, ClusterState


@dataclass(frozen=True, slots=True)
class _Op:
    kind: str  # "allocate" | "release" | "usable"
    alloc: Allocation | None = None
    node: int = -1
    was: bool = False


class Statement:
    __slots__ = ("_log", "state")

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self._log: list[_Op] = []

    def allocate(self, alloc: Allocation) -> None:
        self.state.allocate(alloc)
        self._log.append(_Op("allocate", alloc))

    def release(self, job_id: str) -> Allocation:
        alloc = self.state.release(job_id)
        self._log.append(_Op("release", alloc))
        return alloc

    def set_usable(self, node: int, usable: bool) -> None:
        was = self.state.usable[node]
        self.state.set_usable(node, usable)
        self._log.append(_Op("usable", node=node, was=was))

    def checkpoint(self) -> int:
        return len(self._log)

    def rollback(self, checkpoint: int) -> None:
        """Undo every change made since the checkpoint, newest first."""
        state = self.state
        while len(self._log) > checkpoint:
            op = self._log.pop()
            if op.kind == "allocate":
                assert op.alloc is not None
                state.release(op.alloc.job_id)
            elif op.kind == "release":
                assert op.alloc is not None
                state.allocate(op.alloc)
            else:
                state.set_usable(op.node, op.was)

    def changes(self, since: int = 0) -> list[tuple[str, Allocation | int]]:
        return [(op.kind, op.alloc if op.alloc is not None else op.node) for op in self._log[since:]]

    def commit(self) -> None:
        """Keep every change; the statement starts empty again."""
        self._log.clear()

    def discard(self) -> None:
        self.rollback(0)
