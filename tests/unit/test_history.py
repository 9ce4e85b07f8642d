"""The history checker (tests/history.py) on hand-built histories: it passes a sound one and catches each
planted violation, naming the job, GPU or attempt."""

from __future__ import annotations

import pytest

from shared.schemas import JobEvent, JobState, NodeGpus, RankExited, RankStarted, StartRank
from tests.history import (
    ALL_NODES,
    OVERLAP_TOLERANCE_S,
    TRANSITION_S,
    Fault,
    History,
    Logged,
    Request,
    check,
    log_double_bookings,
    reruns,
)

T0 = 1_700_000_000.0  # a wall-clock instant; every time below is T0 + seconds


class Builder:
    """A history written as a test reads: a client's requests, the log, the agents' reports, the faults."""

    def __init__(self) -> None:
        self.requests: list[Request] = []
        self.events: list[Logged] = []
        self.ranks: list[RankStarted | RankExited] = []
        self.starts: list[StartRank] = []
        self.faults: list[Fault] = []

    def accept(self, job: str, at: float) -> Builder:
        self.requests.append(Request(T0 + at, T0 + at + 0.01, "POST", "/v1/jobs", 202, job))
        return self

    def read(self, job: str, at: float, status: int = 200, state: str = "succeeded") -> Builder:
        state = state if status == 200 else ""
        self.requests.append(Request(T0 + at, T0 + at + 0.01, "GET", f"/v1/jobs/{job}", status, job, state))
        return self

    def get(self, path: str, at: float, status: int) -> Builder:
        self.requests.append(Request(T0 + at, T0 + at + 0.01, "GET", path, status))
        return self

    def log(self, job: str, state: JobState, at: float, attempt: int = 1, nodes: dict[str, list[int]] | None = None):
        ng = [NodeGpus(n, g) for n, g in (nodes or {}).items()]
        ev = JobEvent(job_id=job, state=state, reason="", at=T0 + at, attempt=attempt, nodes=ng)
        self.events.append(Logged(len(self.events) + 1, T0 + at, ev))
        return self

    def rank(self, job: str, node: str, start: float, end: float | None, attempt: int = 1, rank: int = 0, pid: int = 1):
        self.ranks.append(RankStarted(job_id=job, attempt=attempt, node=node, rank=rank, pid=pid, at=T0 + start))
        if end is not None:
            ex = RankExited(
                job_id=job, attempt=attempt, node=node, rank=rank, exit_code=0, at=T0 + end + 0.05, ran_s=end - start
            )
            self.ranks.append(ex)
        return self

    def job(self, job: str, node: str, gpus: list[int], t: float, run_s: float = 1.0, attempt: int = 1) -> Builder:
        """A whole sound life: accepted, placed, running, succeeded, read back."""
        self.accept(job, t)
        self.log(job, JobState.PENDING, t + 0.1, attempt=0)
        self.log(job, JobState.PLACED, t + 0.2, attempt, {node: gpus})
        self.rank(job, node, t + 0.3, t + 0.3 + run_s, attempt)
        self.log(job, JobState.RUNNING, t + 0.35, attempt, {node: gpus})
        self.log(job, JobState.SUCCEEDED, t + 0.4 + run_s, attempt)
        return self

    def history(self, end: float = 100.0, tolerance_s: float = OVERLAP_TOLERANCE_S) -> History:
        for job in dict.fromkeys(r.job_id for r in self.requests if r.accepted):
            if not any(r.is_read and r.job_id == job for r in self.requests):
                last = [e.event for e in self.events if e.event.job_id == job]
                self.read(job, end - 1, state=last[-1].state.value if last else "pending")
        return History(self.requests, self.events, self.ranks, self.faults, T0 + end, self.starts, tolerance_s)


def only(violations: list[str], prefix: str) -> list[str]:
    assert violations, "expected a violation"
    assert all(v.startswith(prefix) for v in violations), violations
    return violations


def test_a_sound_history_has_no_violation() -> None:
    b = Builder().job("j1", "n1", [0, 1], 0).job("j2", "n1", [0, 1], 2).job("j3", "n2", [0, 1, 2, 3], 0)
    b.get("/v1/cluster", 5, 200)
    assert check(b.history()) == []


def test_a_planted_double_booking_in_the_log_is_caught() -> None:
    # j2 is placed on n1 GPU 1 while j1 still holds it (no event of j1 freed it)
    b = Builder().accept("j1", 0).accept("j2", 0)
    b.log("j1", JobState.PLACED, 1, nodes={"n1": [0, 1]}).log("j1", JobState.RUNNING, 1.1, nodes={"n1": [0, 1]})
    b.log("j2", JobState.PLACED, 2, nodes={"n1": [1, 2]})
    b.log("j1", JobState.SUCCEEDED, 3).log("j2", JobState.SUCCEEDED, 4)
    b.rank("j1", "n1", 1.05, 2.9).rank("j2", "n1", 3.0, 3.9)  # on the nodes, one after the other
    violations = only(check(b.history()), "(c)")
    assert len(violations) == 1
    assert "n1 GPU 1 given to j2 (attempt 1) while j1 (attempt 1) holds it" in violations[0], violations
    assert "event #3" in violations[0]


def test_a_planted_double_booking_on_the_nodes_is_caught() -> None:
    # the log is clean, but j1's rank on n1 GPU 0 never stopped: j2's rank runs on the same GPU for 5 s
    b = Builder().job("j1", "n1", [0], 0, run_s=10).job("j2", "n1", [0], 20, run_s=5)
    b.events = [e for e in b.events if e.event.job_id != "j1"]  # j1's log says nothing of the GPU
    b.accept("j1", 0).log("j1", JobState.PLACED, 0.2, nodes={"n9": [0]}).log("j1", JobState.SUCCEEDED, 0.5)
    b.starts.append(
        StartRank(
            job_id="j1",
            attempt=1,
            node="n1",
            gpus=[0],
            rank=0,
            world_size=1,
            master_addr="n1",
            command=[],
            duration_s=1,
        )
    )
    b.ranks = [r for r in b.ranks if r.job_id != "j1"]
    b.rank("j1", "n1", 0.3, 25.3)
    violations = check(b.history())
    overlap = [v for v in violations if v.startswith("(c) n1 GPU 0")]
    assert len(overlap) == 1, violations
    assert "j1 attempt 1 rank 0 on n1" in overlap[0] and "j2 attempt 1 rank 0 on n1" in overlap[0]
    assert "overlap by 5.00s" in overlap[0]


def test_the_stop_start_overlap_within_the_tolerance_passes_beyond_it_fails() -> None:
    def history(overlap: float, tolerance: float = OVERLAP_TOLERANCE_S) -> History:
        # j1 is cancelled; its rank's exit is seen `overlap` s after j2's rank started on the same GPU
        b = Builder().accept("j1", 0).accept("j2", 0)
        b.log("j1", JobState.PLACED, 1, nodes={"n1": [0]}).log("j1", JobState.RUNNING, 1.2, nodes={"n1": [0]})
        b.rank("j1", "n1", 1.1, 5 + overlap)
        b.log("j1", JobState.CANCELLED, 4.9)
        b.log("j2", JobState.PLACED, 4.95, nodes={"n1": [0]})
        b.rank("j2", "n1", 5.0, 9.0, attempt=1)
        b.log("j2", JobState.RUNNING, 5.05, nodes={"n1": [0]}).log("j2", JobState.SUCCEEDED, 9.1)
        b.read("j1", 50, state="cancelled")
        return b.history(tolerance_s=tolerance)

    assert check(history(0.05)) == []
    assert check(history(OVERLAP_TOLERANCE_S * 0.9)) == []
    violations = only(check(history(OVERLAP_TOLERANCE_S + 0.5)), "(c)")
    assert "n1 GPU 0" in violations[0] and f"tolerance {OVERLAP_TOLERANCE_S:g}s" in violations[0]
    assert only(check(history(0.2, tolerance=0.1)), "(c)")


def test_an_attempt_running_on_two_allocations_at_once_is_caught() -> None:
    # attempt 1 on n1 is never stopped; attempt 2 starts on n2 while it still runs
    b = Builder().accept("j1", 0)
    b.log("j1", JobState.PLACED, 1, nodes={"n1": [0]}).log("j1", JobState.RUNNING, 1.2, nodes={"n1": [0]})
    b.rank("j1", "n1", 1.1, 9.0, attempt=1)
    b.log("j1", JobState.PENDING, 2, attempt=2)
    b.log("j1", JobState.PLACED, 3, attempt=2, nodes={"n2": [0]})
    b.rank("j1", "n2", 3.1, 6.0, attempt=2)
    b.log("j1", JobState.RUNNING, 3.2, attempt=2, nodes={"n2": [0]}).log("j1", JobState.SUCCEEDED, 6.1, attempt=2)
    violations = only(check(b.history()), "(b)")
    assert len(violations) == 1
    assert "j1 attempt 1 rank 0 on n1" in violations[0] and "j1 attempt 2 rank 0 on n2" in violations[0]
    assert "alive together for 2.90s" in violations[0]
    assert reruns(b.history(), ["j1"]) == ["j1 ran attempts [1, 2]"]


def test_a_rank_started_twice_and_a_rank_outliving_its_job_are_caught() -> None:
    b = Builder().job("j1", "n1", [0], 0)
    b.rank("j1", "n3", 0.5, 0.9, pid=7)  # the same attempt and rank again, elsewhere
    b.accept("j2", 0).log("j2", JobState.PLACED, 1, nodes={"n2": [0]})
    b.log("j2", JobState.RUNNING, 1.2, nodes={"n2": [0]})
    b.rank("j2", "n2", 1.1, None)  # never exits
    b.log("j2", JobState.CANCELLED, 2)
    violations = only(check(b.history()), "(b)")
    assert any("j1 attempt 1 rank 0 started twice: on n1 (pid 1)" in v and "on n3 (pid 7)" in v for v in violations)
    alive = [v for v in violations if "j2 attempt 1 rank 0 on n2" in v and "still alive at the end" in v]
    assert len(alive) == 1 and "cancelled" in alive[0], violations


def test_an_accepted_job_that_vanished_is_caught() -> None:
    b = Builder().job("j1", "n1", [0], 0)
    b.read("j1", 5, state="running").read("j1", 60, status=404)  # read once, then gone (Redis came back empty)
    b.accept("j2", 10)  # accepted, then nothing: no event in the log, never readable
    b.read("j2", 61, status=404)
    b.job("j3", "n2", [0], 0).read("j3", 62, status=503)  # the view never came back
    b.faults.append(Fault("valkey restarted empty", T0 + 58, T0 + 59))  # the 503 is in its recovery: no (d)
    violations = only(check(b.history()), "(a)")
    assert any(v.startswith("(a) job j1") and "then 404 at" in v for v in violations), violations
    assert any(v.startswith("(a) job j1") and "reads HTTP 404 at the end" in v for v in violations)
    assert any(v.startswith("(a) job j2") and "has no event in the job log" in v for v in violations)
    assert any(v.startswith("(a) job j2") and "reads HTTP 404 at the end" in v for v in violations)
    assert any(v.startswith("(a) job j3") and "reads HTTP 503 at the end" in v for v in violations)


def test_a_job_never_read_back_and_a_read_that_contradicts_the_log_are_caught() -> None:
    b = Builder().job("j1", "n1", [0], 0).job("j2", "n2", [0], 0)
    b.read("j1", 50, state="running")  # the API says running, the log says succeeded
    h = b.history()
    h.requests = [r for r in h.requests if not (r.is_read and r.job_id == "j2")]
    violations = only(check(h), "(a)")
    assert any("job j1 reads running" in v and "last logged event is succeeded" in v for v in violations)
    assert any("job j2" in v and "never read back" in v for v in violations)


def test_running_with_no_live_rank_is_caught_and_a_killed_agent_kills_its_ranks() -> None:
    # the agent of n1 was SIGKILLed at 5 s: its rank died unreported; the job stays running forever
    b = Builder().accept("j1", 0)
    b.log("j1", JobState.PLACED, 1, nodes={"n1": [0]}).log("j1", JobState.RUNNING, 1.2, nodes={"n1": [0]})
    b.rank("j1", "n1", 1.1, None)
    b.read("j1", 50, state="running")
    alive = b.history()
    assert check(alive) == []  # no fault: the rank is alive, running is legitimate
    b.faults.append(Fault("sigkill agents", T0 + 5, T0 + 6, kills_ranks=ALL_NODES))
    violations = only(check(b.history()), "(a)")
    assert "job j1 is running (attempt 1" in violations[0] and "rank 0 on n1 died with sigkill agents" in violations[0]
    # a kill of another node's agent leaves it alive
    b.faults[-1] = Fault("sigkill agent", T0 + 5, T0 + 6, kills_ranks=frozenset({"n2"}))
    assert check(b.history()) == []


def test_pending_is_legitimate_placed_only_for_a_while() -> None:
    b = Builder().accept("j1", 0).log("j1", JobState.PENDING, 0.1, attempt=0)
    b.accept("j2", 0).log("j2", JobState.PLACED, 1, nodes={"n1": [0]})
    b.read("j1", 50, state="pending").read("j2", 50, state="placed")
    violations = only(check(b.history(end=1 + TRANSITION_S + 5)), "(a)")
    assert len(violations) == 1 and "job j2 stuck placed" in violations[0], violations
    assert check(b.history(end=1 + TRANSITION_S / 2)) == []


def test_5xx_inside_a_fault_window_or_its_recovery_pass_outside_fail() -> None:
    b = Builder().job("j1", "n1", [0], 0)
    b.faults.append(Fault("sigkill gateway", T0 + 10, T0 + 12, recovery_s=3))
    b.get("/v1/jobs/x", 11, 503).get("/v1/cluster", 14.5, 0).get("/v1/cluster", 9.995, 502)  # inside
    assert check(b.history()) == []
    b.get("/v1/cluster", 20, 503).get("/v1/jobs", 5, 500)  # after the recovery, before the fault
    violations = only(check(b.history()), "(d)")
    assert len(violations) == 2
    assert any("GET /v1/cluster → HTTP 503" in v and "sigkill gateway" in v for v in violations), violations
    assert any("GET /v1/jobs → HTTP 500" in v for v in violations)
    without = Builder().job("j1", "n1", [0], 0).get("/v1/cluster", 3, 0)
    assert only(check(without.history()), "(d) GET /v1/cluster → no answer")
    # "not recorded yet" (the queue had submits to handle) is an answer to retry, with no fault needed
    told = Builder().job("j1", "n1", [0], 0)
    told.requests.append(Request(T0 + 0.05, T0 + 0.06, "GET", "/v1/jobs/j1", 503, "j1", "", not_yet=True))
    told.read("j1", 50)
    assert check(told.history()) == []


def test_the_log_check_takes_plain_events_and_flags_running_before_placed() -> None:
    ev = [
        JobEvent(job_id="a", state=JobState.RUNNING, reason="", at=1, attempt=1, nodes=[NodeGpus("n1", [0])]),
        JobEvent(job_id="a", state=JobState.PLACED, reason="", at=2, attempt=1, nodes=[NodeGpus("n1", [0])]),
        JobEvent(job_id="b", state=JobState.PLACED, reason="", at=3, attempt=1, nodes=[NodeGpus("n1", [0])]),
        JobEvent(job_id="a", state=JobState.SUCCEEDED, reason="", at=4, attempt=1),
        JobEvent(job_id="c", state=JobState.PLACED, reason="", at=5, attempt=1, nodes=[NodeGpus("n1", [0])]),
    ]
    problems = log_double_bookings(ev)
    assert len(problems) == 3, problems
    assert problems[0] == "event #0: a running (attempt 1) before any placed event (its placed event comes later)"
    assert "n1 GPU 0 given to b (attempt 1) while a (attempt 1) holds it" in problems[1]
    assert "n1 GPU 0 given to c (attempt 1) while b (attempt 1) holds it" in problems[2]


def test_the_log_check_names_the_event_that_let_go_before_a_running_one() -> None:
    # an array task's pending event logged after its placed one (the queue announced tasks late): running then
    # finds the job holding nothing
    on = [NodeGpus("n1", [0])]
    ev = [
        JobEvent(job_id="a_0", state=JobState.PLACED, reason="", at=1, attempt=1, nodes=on),
        JobEvent(job_id="a_0", state=JobState.PENDING, reason="", at=0, attempt=0),
        JobEvent(job_id="a_0", state=JobState.RUNNING, reason="", at=2, attempt=1, nodes=on),
    ]
    assert log_double_bookings(ev) == [
        "event #2: a_0 running (attempt 1) while holding nothing: its last event was pending (attempt 0) at #1"
        " (no placed event after it)"
    ]


@pytest.mark.parametrize("state", [JobState.SUCCEEDED, JobState.PENDING])
def test_the_log_frees_gpus_on_any_event_that_does_not_hold(state: JobState) -> None:
    ev = [
        JobEvent(job_id="a", state=JobState.PLACED, reason="", at=1, attempt=1, nodes=[NodeGpus("n1", [0])]),
        JobEvent(job_id="a", state=state, reason="", at=2, attempt=2),
        JobEvent(job_id="b", state=JobState.PLACED, reason="", at=3, attempt=1, nodes=[NodeGpus("n1", [0])]),
    ]
    assert log_double_bookings(ev) == []


def test_a_job_the_log_says_succeeded_ran_every_rank_of_its_last_attempt_to_exit_0() -> None:
    b = Builder().accept("j1", 0)
    b.log("j1", JobState.PLACED, 1, nodes={"n1": [0], "n2": [0], "n3": [0]})
    b.rank("j1", "n1", 1.1, 2.0, rank=0).rank("j1", "n2", 1.1, None, rank=1)
    b.log("j1", JobState.SUCCEEDED, 2.5)
    violations = only(check(b.history()), "(")
    assert any("job j1 succeeded (attempt 1" in v and "its rank 2 never started" in v for v in violations), violations
    assert any(v.startswith("(a)") and "its rank 1 never exited" in v for v in violations), violations
    assert any(v.startswith("(b)") and "j1 attempt 1 rank 1 on n2" in v for v in violations), violations  # still alive
