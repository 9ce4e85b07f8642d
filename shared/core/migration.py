"""The migration planner: which running jobs to move, and where, so failed hardware is evacuated and a
blocked job gets room. Pure: the state, the jobs and `now` come in; a plan comes out; the state is left
exactly as it was (every what-if goes through a `Statement` and is rolled back).

Two questions, one per entry point:

- `plan_evacuation`: jobs on failed (or degraded) hardware. A checkpointable job keeps its good ranks
  and gets the ranks on each bad node re-placed in place — on a spare node inside the same NVLink domain
  as the lost one, so every topology guarantee still holds. When the domain has no spare, the whole job
  is re-placed by the policy (required NVLink stays in one domain). When neither works, and for jobs that
  can't checkpoint, the job is requeued.
- `plan_defrag`: a pending job that fits the free total but no layout (free nodes scattered over
  domains in 1-2-node pieces). Per missing piece (a domain-sized run, or one segment), the domain that is
  cheapest to empty — fewest moves, then fewest GPU-seconds moved, then lowest index — has its
  checkpointable jobs moved out (re-placed by the policy, never into a domain the plan is emptying or
  already counts on). Jobs spanning several domains are not moved (with `MigrationBudget.segments`, their
  whole segments in the domain may be). Staged: when the whole plan needs more moves than the budget
  allows, the first whole domains are emptied now and the rest planned later; with
  `MigrationBudget.early`, domains are emptied ahead even while the free total is still short.
  A plan is returned only when its gain (the pending job's GPUs x the wait it saves, estimated from the
  running jobs' expected ends) exceeds its cost (checkpoint + restore time x GPUs of every moved job)
  and it fits the budget.

Ties are broken by index or id throughout, so the same input gives the same plan.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from shared.core.policies import Context, Placement, Policy
from shared.core.shape import JobSpec, Need, Request, ShapeError, request
from shared.core.state import INF, Allocation, ClusterState, mask_indices
from shared.core.statement import Statement
from shared.core.topology import Topology


@dataclass(frozen=True, slots=True)
class Movable:
    """A running job the planner may move: its shape (to re-place it under the same guarantees) and what
    a move costs it. Only checkpointable jobs belong here; the caller leaves out jobs already moving."""

    spec: JobSpec  # the rigid job of the layout it runs on now (`with_segment`)
    checkpoint_s: float  # time to write a checkpoint
    restore_s: float  # time to restore from it on the new GPUs
    # a flexible job running on a smaller segment than its first: that first one (`plan_consolidation`)
    preferred: int | None = None

    def cost_gpu_s(self, gpus: int) -> float:
        """GPU-seconds the job stands still while it moves."""
        return (self.checkpoint_s + self.restore_s) * gpus


@dataclass(frozen=True, slots=True)
class MigrationBudget:
    """Limits on how much moving a plan may start."""

    max_moves: int = 4  # moves in flight at once (this plan's plus `in_flight`)
    in_flight: int = 0  # moves already under way
    gpu_s_per_hour: float = 64 * 3600.0 * 4  # GPU-seconds of moving allowed per hour
    spent_gpu_s: float = 0.0  # GPU-seconds of moving started in the last hour
    min_gain_ratio: float = 1.0  # a plan needs gain > ratio x cost
    max_candidates: int = 4  # pending jobs tried per call, in the order given
    # also plan while the free total is still short of the job: empty whole domains now, so the job starts
    # as soon as enough nodes are free anywhere instead of when its domains drain (staged evacuation)
    early: bool = False
    # a segmented job spanning domains may have its whole segments in the domain being emptied moved
    # (each segment still inside one domain; the whole job pauses); off: multi-domain jobs never move
    segments: bool = False

    @property
    def moves_left(self) -> int:
        return max(0, self.max_moves - self.in_flight)

    @property
    def gpu_s_left(self) -> float:
        return max(0.0, self.gpu_s_per_hour - self.spent_gpu_s)


@dataclass(frozen=True, slots=True)
class Move:
    """Move one running job from `src` (its allocation now) to `dst` (nodes and GPU masks to hold)."""

    job_id: str
    src: Allocation
    dst: Placement
    reason: str
    cost_gpu_s: float
    segment: int | None = None  # the layout's segment after the move, when the move changes it (consolidation)
    expected_end: float | None = None  # after the move, when it changes (an elastic job's new size)

    @property
    def in_place(self) -> bool:
        """Only some ranks move (the others keep their GPUs)."""
        return bool(set(self.src.nodes) & set(self.dst.nodes))

    def gpus_by_node(self, topo: Topology) -> dict[str, tuple[int, ...]]:
        """Where the job runs after the move: node name -> GPU indices."""
        return {topo.node_names[n]: mask_indices(m) for n, m in zip(self.dst.nodes, self.dst.masks, strict=True)}

    def domains(self, topo: Topology) -> tuple[str, ...]:
        """NVLink domains of the destination, in first-use order."""
        dom = topo.domain
        seen: dict[str, None] = {}
        for n in self.dst.nodes:
            seen.setdefault(topo.group_names[dom][topo.node_group[dom][n]])
        return tuple(seen)

    def allocation(self) -> Allocation:
        """The job's allocation after the move (same job, priority, tenant and expected end)."""
        end = self.src.expected_end if self.expected_end is None else self.expected_end
        return replace(self.src, nodes=self.dst.nodes, masks=self.dst.masks, gpus=0, expected_end=end)


@dataclass(frozen=True, slots=True)
class Plan:
    """A defragmentation plan: the moves, whom they make room for, and the numbers behind the decision."""

    moves: tuple[Move, ...]
    beneficiary: str | None
    gain_gpu_s: float  # the beneficiary's GPUs x its estimated wait without the moves
    cost_gpu_s: float  # sum of the moves' costs (of the whole plan, when staged)
    why: str
    complete: bool = True  # False: staged; the beneficiary fits only after later moves too


@dataclass(frozen=True, slots=True)
class Evacuation:
    """What to do with the jobs on bad hardware: moves (checkpoint, re-place, restore) and requeues."""

    moves: tuple[Move, ...] = ()
    requeue: tuple[str, ...] = ()  # jobs to stop and requeue (not checkpointable, or nowhere to go)
    why: Mapping[str, str] = field(default_factory=dict)  # job id -> why it moves or is requeued


# -- evacuation ---------------------------------------------------------------------------------------------


def affected_jobs(state: ClusterState, bad: Mapping[int, int]) -> list[str]:
    """Jobs holding a GPU in `bad` (node -> bitmask of bad GPUs; a node's whole mask when it is down)."""
    out: set[str] = set()
    for node, mask in bad.items():
        for jid, held in state.node_jobs[node].items():
            if held & mask and not state.allocs[jid].hold:
                out.add(jid)
    return sorted(out)


def plan_evacuation(
    state: ClusterState,
    down: Mapping[int, int],
    movable: Mapping[str, Movable],
    policy: Policy,
    now: float,
    degraded: Mapping[int, int] | None = None,
) -> Evacuation:
    """Moves and requeues for the jobs on failed or degraded GPUs.

    `down`: node -> bitmask of GPUs that failed (every bit of the node when the node is down); those jobs
    must leave: moved when checkpointable and there is room, requeued otherwise. `degraded`: same shape,
    GPUs still working badly; their jobs move when there is room and keep running otherwise. Nodes with a
    failed GPU mask are never destinations; the state may already mark them unusable.

    Order: bigger jobs first (they are the hardest to re-place), ties by id. Each move is planned on the
    state left by the moves before it, so they can be applied in order.
    """
    degraded = degraded or {}
    stmt = Statement(state)
    moves: list[Move] = []
    requeue: list[str] = []
    why: dict[str, str] = {}
    bad_all: dict[int, int] = {n: m for n, m in degraded.items()}
    for n, m in down.items():
        bad_all[n] = bad_all.get(n, 0) | m
    must = set(affected_jobs(state, down))
    jobs = sorted(set(affected_jobs(state, bad_all)), key=lambda j: (-state.allocs[j].gpus, j))
    try:
        # bad nodes can't take ranks while we plan: a whole node is disabled, a node with a few bad GPUs is
        # disabled only for the planning too (its good GPUs stay in use by whoever holds them)
        for node in sorted(bad_all):
            if state.usable[node]:
                stmt.set_usable(node, False)
        for jid in jobs:
            alloc = state.allocs[jid]
            hurt = "failed" if jid in must else "degraded"
            mv = movable.get(jid)
            if mv is None or not mv.spec.checkpointable:
                if jid in must:
                    requeue.append(jid)
                    why[jid] = f"on {hurt} hardware and not checkpointable: requeued"
                continue
            try:
                req = request(mv.spec, state.topo)
            except ShapeError as e:
                if jid in must:
                    requeue.append(jid)
                    why[jid] = f"on {hurt} hardware; its shape can't be re-placed ({e}): requeued"
                continue
            cost = mv.cost_gpu_s(alloc.gpus)
            placed = _replace_in_place(state, stmt, alloc, req, bad_all)
            how = "in place: its ranks on the bad node went to a spare in the same domain"
            if placed is None:
                placed = _replace_whole(state, stmt, alloc, req, policy, now)
                how = "re-placed whole (no spare in its domain)"
            if placed is None:
                if jid in must:
                    requeue.append(jid)
                    why[jid] = f"on {hurt} hardware; no room to re-place it now: checkpointed and requeued"
                continue
            reason = f"on {hurt} hardware ({_bad_names(state.topo, alloc, bad_all)}); {how}"
            moves.append(Move(jid, alloc, placed, reason, cost))
            why[jid] = reason
    finally:
        stmt.discard()
    return Evacuation(tuple(moves), tuple(requeue), why)


def _bad_names(topo: Topology, alloc: Allocation, bad: Mapping[int, int]) -> str:
    parts = []
    for n, m in zip(alloc.nodes, alloc.masks, strict=True):
        hit = m & bad.get(n, 0)
        if hit:
            parts.append(f"{topo.node_names[n]} GPUs {','.join(map(str, mask_indices(hit)))}")
    return "; ".join(parts)


def _replace_in_place(
    state: ClusterState, stmt: Statement, alloc: Allocation, req: Request, bad: Mapping[int, int]
) -> Placement | None:
    """Keep the good ranks; put each bad node's ranks on a spare node in the same domain. Leaves the job
    holding its new allocation in the statement when it works, changes nothing when it doesn't."""
    topo = state.topo
    dom = topo.domain
    cp = stmt.checkpoint()
    stmt.release(alloc.job_id)
    nodes = list(alloc.nodes)
    masks = list(alloc.masks)
    taken: set[int] = set(alloc.nodes)
    for i, (n, m) in enumerate(zip(alloc.nodes, alloc.masks, strict=True)):
        if not m & bad.get(n, 0):
            continue
        want = m.bit_count()
        spare = None
        group = topo.node_group[dom][n]
        for cand in topo.group_nodes[dom][group]:
            if cand in taken or not state.node_fits(cand, max(want, req.k if req.exclusive else want), req.exclusive):
                continue
            spare = cand
            break
        if spare is None:
            stmt.rollback(cp)
            return None
        taken.add(spare)
        nodes[i] = spare
        masks[i] = _take_gpus(state, spare, want, req.exclusive)
    placement = Placement(tuple(nodes), tuple(masks))
    stmt.allocate(replace(alloc, nodes=placement.nodes, masks=placement.masks, gpus=0))
    return placement


def _take_gpus(state: ClusterState, node: int, want: int, exclusive: bool) -> int:
    free = state.free[node]
    if exclusive:
        return free
    mask = 0
    for source in (free & ~state.degraded[node], free):
        bits = source & ~mask
        while bits and mask.bit_count() < want:
            low = bits & -bits
            mask |= low
            bits ^= low
    return mask


def _replace_whole(
    state: ClusterState, stmt: Statement, alloc: Allocation, req: Request, policy: Policy, now: float
) -> Placement | None:
    cp = stmt.checkpoint()
    stmt.release(alloc.job_id)
    placement = policy.place(state, req, Context(now=now, job_end=alloc.expected_end))
    if placement is None:
        stmt.rollback(cp)
        return None
    stmt.allocate(replace(alloc, nodes=placement.nodes, masks=placement.masks, gpus=0))
    return placement


# -- defragmentation ----------------------------------------------------------------------------------------


def plan_defrag(
    state: ClusterState,
    pending: Sequence[JobSpec],
    movable: Mapping[str, Movable],
    policy: Policy,
    budget: MigrationBudget,
    now: float,
    default_runtime_s: float = 24 * 3600.0,
    promised: Mapping[str, frozenset[int]] | None = None,
) -> Plan | None:
    """The cheapest set of moves that lets one of the first pending jobs start, or None.

    `pending` in the cycle's order (the first `budget.max_candidates` blocked ones are tried; the first
    that gets a plan wins). A job qualifies when it needs one domain-level layer (a domain-sized job or a
    segmented one), doesn't fit now, and the cluster has enough fitting nodes in total.

    `promised`: job id -> the NVLink domains its reservation holds (the scheduler's sticky reservations).
    Domains a job's reservation holds are emptied first: the cycle keeps backfill out of them, so the
    room made there stays for the job; room made elsewhere is open to anyone until the job starts.
    """
    if budget.moves_left < 1 or not movable:
        return None
    topo = state.topo
    reserved = frozenset().union(*promised.values()) if promised else frozenset()
    tried = 0
    ends: dict[int, float] = {}  # the candidates' waits read the same nodes' ends (each plan is undone)
    for job in pending:
        if tried >= budget.max_candidates:
            break
        try:
            req = request(job, topo)
        except ShapeError:
            continue
        if not _defraggable(state, req, budget.early):
            continue
        tried += 1
        ctx = Context(now=now, job_end=now + _runtime(job, default_runtime_s), demand=frozenset({req.slices[0][1]}))
        if policy.place(state, req, ctx) is not None:
            continue  # fits already: the cycle places it
        prefer = promised.get(job.id, frozenset()) if promised else frozenset()
        plan = _plan_for(state, req, movable, policy, budget, now, ctx, prefer, reserved, ends)
        if plan is not None:
            return plan
    return None


def _runtime(job: JobSpec, default: float) -> float:
    return job.expected_runtime_s if job.expected_runtime_s is not None else default


def _defraggable(state: ClusterState, req: Request, early: bool = False) -> bool:
    if req.need is Need.NONE or len(req.slices) != 1:
        return False
    level, size = req.slices[0]
    if level != state.topo.domain or size < 2:
        return False
    return early or state.count[0][0][req.k] >= req.nodes


def natural_wait(state: ClusterState, req: Request, now: float) -> float:
    """Estimated wait without moves: when running jobs' expected ends free enough pieces of the job's run
    size, domain by domain (a node is free once every job on it has ended; a job past its expected end is
    guessed to run `OVERDUE_SHARE` of its elapsed time more). INF when nothing ends."""
    return _waits(state, req, now)[0]


def _waits(state: ClusterState, req: Request, now: float, ends: dict[int, float] | None = None) -> tuple[float, float]:
    """(natural wait, wait until enough fitting nodes are free anywhere): the wait a plan can at best
    shorten to the second when it consolidates free nodes as they come. `ends`: node -> when its last job is
    expected to end, filled as nodes are looked at and shared by callers looking at the same state and time."""
    ends = {} if ends is None else ends
    topo = state.topo
    level, size = req.slices[0]
    pieces = req.nodes // size
    k, excl = req.k, req.exclusive
    times: list[float] = []
    every: list[float] = []
    for group_nodes in topo.group_nodes[level]:
        free_at: list[float] = []
        for n in group_nodes:
            if not state.usable[n]:
                continue
            if state.node_fits(n, k, excl):
                free_at.append(now)
                continue
            end = ends.get(n)
            if end is None:
                end = ends[n] = max((expected_end(state.allocs[j], now) for j in state.node_jobs[n]), default=now)
            free_at.append(end)
        free_at.sort()
        every += free_at
        for p in range(1, len(free_at) // size + 1):
            times.append(free_at[p * size - 1])
    if len(times) < pieces:
        return INF, INF
    times.sort()
    every.sort()
    return max(0.0, times[pieces - 1] - now), max(0.0, every[req.nodes - 1] - now)


OVERDUE_SHARE = 0.25  # a job past its expected end is guessed to need this share of its elapsed time more


def unreserved_domains(topo: Topology, promised: Mapping[str, frozenset[int]] | None) -> frozenset[int] | None:
    """The NVLink domains no reservation holds (`Context.within` for a move's target); None: every domain."""
    reserved = frozenset().union(*promised.values()) if promised else frozenset()
    return frozenset(range(len(topo.group_nodes[topo.domain]))) - reserved if reserved else None


def expected_end(alloc: Allocation, now: float) -> float:
    """The allocation's expected end; for a job already past it (estimates run short), a guess further on."""
    if alloc.expected_end > now:
        return alloc.expected_end
    return now + OVERDUE_SHARE * max(now - alloc.start, 0.0)


@dataclass(slots=True)
class _Step:
    group: int
    victims: list[str]
    cost: float


def _plan_for(
    state: ClusterState,
    req: Request,
    movable: Mapping[str, Movable],
    policy: Policy,
    budget: MigrationBudget,
    now: float,
    ctx: Context,
    prefer: frozenset[int] = frozenset(),
    avoid: frozenset[int] = frozenset(),
    ends: dict[int, float] | None = None,
) -> Plan | None:
    topo = state.topo
    level, size = req.slices[0]
    pieces = req.nodes // size
    k = req.k
    natural, anywhere = _waits(state, req, now, ends)
    gain = req.gpus * (natural - anywhere if natural < INF else natural)
    if gain <= 0:
        return None
    row = state.count[level]
    # domains the plan counts on as they are: most pieces first, then lowest index
    hosts: list[int] = []
    have = 0
    for g in sorted(range(len(row)), key=lambda g: (-(row[g][k] // size), g not in prefer, g)):
        if have >= pieces or row[g][k] < size:
            break
        hosts.append(g)
        have += row[g][k] // size
    stmt = Statement(state)
    steps: list[_Step] = []
    moves: list[Move] = []
    moved: set[str] = set()
    total_cost = 0.0
    try:
        while have < pieces:
            step = _cheapest_step(
                state, stmt, req, movable, policy, now, set(hosts), moved, ctx, budget.segments, prefer, avoid
            )
            if step is None:
                if budget.early and steps:
                    break  # staged: these domains now, the rest as nodes free up
                return None
            steps.append(step[0])
            moves.extend(step[1])
            moved.update(m.job_id for m in step[1])
            total_cost += step[0].cost
            hosts.append(step[0].group)
            have = sum(row[g][k] // size for g in hosts)
            if total_cost * budget.min_gain_ratio >= gain:
                return None
        fits = have >= pieces and policy.place(state, req, ctx) is not None
        if not fits and not (budget.early and have < pieces):
            return None
    finally:
        stmt.discard()
    if not moves or total_cost * budget.min_gain_ratio >= gain:
        return None
    # staged: whole domains only, within the moves and GPU-seconds left
    kept: list[Move] = []
    kept_cost = 0.0
    done_steps = 0
    i = 0
    for st in steps:
        n = len(st.victims)
        if len(kept) + n > budget.moves_left or kept_cost + st.cost > budget.gpu_s_left:
            break
        kept.extend(moves[i : i + n])
        kept_cost += st.cost
        done_steps += 1
        i += n
    if not kept:
        return None
    complete = fits and done_steps == len(steps)
    names = topo.group_names[level]
    emptied = ", ".join(names[st.group] for st in steps[:done_steps])
    later = (
        "" if complete else f"; later: {', '.join(names[st.group] for st in steps[done_steps:]) or 'as nodes free up'}"
    )
    short = state.count[0][0][k] < req.nodes
    situation = "needs more nodes than are free; consolidating ahead" if short else "fits the free total but no layout"
    why = (
        f"job {req.job.id} ({req.nodes} nodes in runs of {size}) {situation}; "
        f"{len(kept)} move(s) free room in {emptied}{later}; gain {gain / 3600:.1f} GPU-h waiting vs "
        f"cost {total_cost / 3600:.2f} GPU-h moving"
    )
    return Plan(tuple(kept), req.job.id, gain, total_cost, why, complete)


def _cheapest_step(
    state: ClusterState,
    stmt: Statement,
    req: Request,
    movable: Mapping[str, Movable],
    policy: Policy,
    now: float,
    protected: set[int],
    moved: set[str],
    ctx: Context,
    segments: bool = False,
    prefer: frozenset[int] = frozenset(),
    avoid: frozenset[int] = frozenset(),
) -> tuple[_Step, list[Move]] | None:
    """Empty one more piece in the domain cheapest to empty (a `prefer` domain first); applied to the
    statement when found."""
    topo = state.topo
    level, size = req.slices[0]
    k = req.k
    cands: list[tuple[tuple[bool, int, float, int], _Step]] = []
    for g in range(len(topo.group_nodes[level])):
        if g in protected:
            continue
        cap = state.count[level][g][k]
        target = (cap // size + 1) * size
        usable = sum(1 for n in topo.group_nodes[level][g] if state.usable[n])
        if target > usable:
            continue
        victims = _victims(state, req, g, target - cap, movable, moved, segments)
        if victims is None:
            continue
        cost = sum(movable[j].cost_gpu_s(state.allocs[j].gpus) for j in victims)
        cands.append(((g not in prefer, len(victims), cost, g), _Step(g, victims, cost)))
    cands.sort(key=lambda c: c[0])
    for _, step in cands:
        cp = stmt.checkpoint()
        out = _move_out(state, stmt, step, movable, policy, now, protected | {step.group}, ctx, req.job.id, avoid)
        if out is not None:
            return step, out
        stmt.rollback(cp)
    return None


def _victims(
    state: ClusterState,
    req: Request,
    group: int,
    deficit: int,
    movable: Mapping[str, Movable],
    moved: set[str],
    segments: bool = False,
) -> list[str] | None:
    """Fewest movable jobs of one domain whose leaving makes `deficit` more of its nodes fit the job.

    Greedy over nodes: a node that can be made to fit costs the movable jobs on it not chosen yet; the
    option that alone covers what is left with fewest new jobs wins, otherwise the most nodes per new job.
    Jobs not movable are never chosen; a job with ranks outside the domain only when its part here is whole
    segments (`segment_part`), and with `segments` off never.
    """
    topo = state.topo
    dom_of = topo.node_group[topo.domain]
    k, excl = req.k, req.exclusive
    level = topo.domain
    allocs = state.allocs

    def can_move(j: str) -> bool:
        a = allocs[j]
        if a.hold or j not in movable or j in moved:
            return False
        if all(dom_of[n] == group for n in a.nodes):
            return True
        return segments and segment_part(a, movable[j].spec, group, dom_of) is not None

    nodes = [n for n in topo.group_nodes[level][group] if state.usable[n] and not state.node_fits(n, k, excl)]
    # per node: the jobs that must leave for it to fit (all of them for whole nodes), or None
    need: dict[int, frozenset[str]] = {}
    for n in nodes:
        jobs = state.node_jobs[n]
        if excl or k == state.full[n].bit_count():
            if all(can_move(j) for j in jobs):
                need[n] = frozenset(jobs)
            continue
        # partial: the movable jobs with the most GPUs here first, until k are free
        free = state.free[n]
        chosen: list[str] = []
        for j in sorted(jobs, key=lambda j: (-jobs[j].bit_count(), j)):
            if (free & state.full[n]).bit_count() >= k:
                break
            if can_move(j):
                chosen.append(j)
                free |= jobs[j]
        if (free & state.full[n]).bit_count() >= k:
            need[n] = frozenset(chosen)
    if len(need) < deficit:
        return None
    chosen_jobs: set[str] = set()
    freed = 0
    while freed < deficit:
        options: list[tuple[tuple[object, ...], frozenset[str]]] = []
        for n, js in need.items():
            new = js - chosen_jobs
            after = chosen_jobs | new
            fit = sum(1 for ms in need.values() if ms <= after)  # nodes that fit once `new` leaves too
            cost = sum(allocs[j].gpus for j in new)
            covers = fit >= deficit - freed
            options.append(((not covers, len(new) if covers else -fit / max(len(new), 1), cost, n), new))
        if not options:
            return None
        pick = min(options, key=lambda o: o[0])[1]
        chosen_jobs |= pick
        done = [n for n, ms in need.items() if ms <= chosen_jobs]
        freed += len(done)
        for n in done:
            del need[n]
    return sorted(chosen_jobs, key=lambda j: (-allocs[j].gpus, j))


KEEP = "#keep"  # suffix of the what-if hold on the ranks of a partly moved job that stay


def segment_part(alloc: Allocation, spec: JobSpec, group: int, dom_of: Sequence[int]) -> tuple[int, ...] | None:
    """Positions of the job's ranks in domain `group` when they are whole segments (the allocation's
    nodes in order, `spec.segment` at a time, each chunk one segment); None when a segment straddles the
    domain's edge or the job has no segments."""
    seg = spec.segment
    if not seg or len(alloc.nodes) % seg:
        return None
    out: list[int] = []
    for i in range(0, len(alloc.nodes), seg):
        inside = [dom_of[n] == group for n in alloc.nodes[i : i + seg]]
        if all(inside):
            out += range(i, i + seg)
        elif any(inside):
            return None
    return tuple(out) if out else None


def _move_out(
    state: ClusterState,
    stmt: Statement,
    step: _Step,
    movable: Mapping[str, Movable],
    policy: Policy,
    now: float,
    protected: Iterable[int],
    ctx: Context,
    ctx_job: str,
    avoid: frozenset[int] = frozenset(),
) -> list[Move] | None:
    """Release the step's victims and re-place each outside the protected domains (biggest first), and
    outside the `avoid` domains (what reservations hold) when they fit elsewhere: a job moved into a
    reservation's free nodes would hold them past its start."""
    topo = state.topo
    dom = topo.domain
    srcs = [stmt.release(j) for j in step.victims]
    dom_of = topo.node_group[dom]
    # ranks of partly moved jobs that stay where they are stay held, so no other victim lands on them
    for src in srcs:
        keep = [i for i, n in enumerate(src.nodes) if dom_of[n] != step.group]
        if keep:
            nodes, masks = tuple(src.nodes[i] for i in keep), tuple(src.masks[i] for i in keep)
            stmt.allocate(Allocation(src.job_id + KEEP, nodes, masks, hold=True))
    off = [n for g in sorted(set(protected)) for n in topo.group_nodes[dom][g] if state.usable[n]]
    elsewhere = frozenset(range(len(topo.group_nodes[dom]))) - avoid - set(protected) if avoid else None
    for n in off:
        stmt.set_usable(n, False)
    moves: list[Move] = []
    placed: list[Allocation] = []
    ok = True
    for src in srcs:
        mv = movable[src.job_id]
        vctx = Context(now=now, job_end=src.expected_end, demand=ctx.demand)
        where = topo.group_names[dom][step.group]
        if all(dom_of[n] == step.group for n in src.nodes):
            try:
                vreq = request(mv.spec, topo)
            except ShapeError:
                ok = False
                break
            placement = None
            if elsewhere:
                placement = policy.place(state, vreq, Context(now, src.expected_end, ctx.demand, elsewhere))
            if placement is None:
                placement = policy.place(state, vreq, vctx)
            reason = f"moved out of {where} to make room for job {ctx_job}"
        else:
            placement = _move_segments(state, stmt, src, mv.spec, step.group, policy, vctx)
            reason = f"its segments in {where} moved out to make room for job {ctx_job} (the rest stay)"
        if placement is None:
            ok = False
            break
        dst = replace(src, nodes=placement.nodes, masks=placement.masks, gpus=0)
        if src.job_id + KEEP in state.allocs:
            stmt.release(src.job_id + KEEP)
        stmt.allocate(dst)
        placed.append(dst)
        moves.append(Move(src.job_id, src, placement, reason, mv.cost_gpu_s(src.gpus)))
    if not ok:
        return None
    # the protected nodes come back; the moved jobs keep their new places
    for n in off:
        stmt.set_usable(n, True)
    return moves


def _move_segments(
    state: ClusterState,
    stmt: Statement,
    src: Allocation,
    spec: JobSpec,
    group: int,
    policy: Policy,
    ctx: Context,
) -> Placement | None:
    """New places for the job's whole segments in `group` (each one segment-sized run, each inside one
    domain, as the policy places a job of that size); the ranks elsewhere keep their GPUs. The job itself
    is released in the statement; the caller holds its other ranks meanwhile so nothing lands on them."""
    topo = state.topo
    part = segment_part(src, spec, group, topo.node_group[topo.domain])
    seg = spec.segment
    if part is None or not seg:
        return None
    nodes, masks = list(src.nodes), list(src.masks)
    cp = stmt.checkpoint()
    tmp: list[str] = []
    per_node = max(m.bit_count() for m in src.masks)
    for c, start in enumerate(range(0, len(part), seg)):
        pos = part[start : start + seg]
        chunk = JobSpec(f"{src.job_id}#seg{c}", seg * per_node, gpus_per_node=per_node, exclusive=spec.exclusive)
        try:
            creq = request(chunk, topo)
        except ShapeError:
            stmt.rollback(cp)
            return None
        placement = policy.place(state, creq, ctx)
        if placement is None:
            stmt.rollback(cp)
            return None
        stmt.allocate(Allocation(chunk.id, placement.nodes, placement.masks, hold=True))
        tmp.append(chunk.id)
        for i, n, m in zip(pos, placement.nodes, placement.masks, strict=True):
            nodes[i], masks[i] = n, m
    for t in reversed(tmp):
        stmt.release(t)
    return Placement(tuple(nodes), tuple(masks))
