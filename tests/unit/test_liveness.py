"""The fresh-grace rule (`shared.liveness`): silence counts only while a service could hear.

Time is an argument everywhere (an injected clock), so every case is a table of looks and judgements.
"""

from __future__ import annotations

import pytest

from shared.liveness import Hearing, lost, may_judge, observe, overdue, silent_for

LIMIT = 3.0


def test_a_started_service_listens_for_a_whole_limit_first() -> None:
    h = Hearing(since=100.0)
    assert not may_judge(h, 100.0 + LIMIT, LIMIT)
    assert may_judge(h, 100.0 + LIMIT + 0.01, LIMIT)
    # a node last heard long before the start is judged from the start
    assert not overdue(h, 10.0, 100.0 + LIMIT, LIMIT)
    assert overdue(h, 10.0, 100.0 + LIMIT + 0.01, LIMIT)
    assert silent_for(h, 10.0, 104.0) == pytest.approx(4.0)


def test_silence_counts_from_the_last_message_when_it_is_later() -> None:
    h = Hearing(since=0.0)
    assert not overdue(h, 50.0, 50.0 + LIMIT, LIMIT)
    assert overdue(h, 50.0, 50.0 + LIMIT + 0.01, LIMIT)
    assert silent_for(h, 50.0, 52.0) == pytest.approx(2.0)
    assert silent_for(h, 50.0, 49.0) == 0.0  # a message stamped after `now` is no silence


def test_while_the_link_is_down_nobody_is_judged() -> None:
    h = observe(Hearing(since=0.0), connected=False, epoch=0, now=10.0)
    assert h.deaf
    for now in (10.0, 100.0, 10_000.0):
        assert not may_judge(h, now, LIMIT)
        assert not overdue(h, 1.0, now, LIMIT)
        assert silent_for(h, 1.0, now) == 0.0


def test_after_a_reconnect_everyone_gets_the_whole_limit_again() -> None:
    h = Hearing(since=0.0, epoch=0)
    h = observe(h, connected=False, epoch=0, now=11.0)  # the server died at 11
    h = observe(h, connected=False, epoch=0, now=15.0)
    h = observe(h, connected=True, epoch=1, now=20.0)  # back at 20
    assert (h.deaf, h.since, h.epoch) == (False, 20.0, 1)
    last_heard = 10.0  # the node's last heartbeat before the outage
    assert not may_judge(h, 20.0 + LIMIT, LIMIT)
    assert not overdue(h, last_heard, 20.0 + LIMIT, LIMIT)
    assert overdue(h, last_heard, 20.0 + LIMIT + 0.01, LIMIT)  # still silent a whole limit after: judged
    assert not overdue(h, 21.0, 20.0 + LIMIT + 0.01, LIMIT)  # it beat again after the reconnect: fine


def test_a_break_between_two_looks_shows_in_the_epoch() -> None:
    h = Hearing(since=0.0, epoch=4)
    h = observe(h, connected=True, epoch=5, now=30.0)  # never seen down, but it reconnected meanwhile
    assert (h.deaf, h.since, h.epoch) == (False, 30.0, 5)
    assert not overdue(h, 1.0, 30.0 + LIMIT, LIMIT)


def test_a_look_that_finds_nothing_new_changes_nothing() -> None:
    h = Hearing(since=7.0, epoch=2)
    assert observe(h, connected=True, epoch=2, now=99.0) is h
    down = observe(h, connected=False, epoch=2, now=99.0)
    assert observe(down, connected=False, epoch=2, now=120.0) is down


def test_the_grace_never_starts_before_the_last_one() -> None:
    h = Hearing(since=50.0)
    h = observe(h, connected=False, epoch=0, now=51.0)
    h = observe(h, connected=True, epoch=1, now=40.0)  # a look with an older `now` (a test's explicit time)
    assert h.since == 50.0


def test_flapping_links_restart_the_grace_each_time() -> None:
    h = Hearing(since=0.0)
    judged = []
    t, epoch = 10.0, 0
    # down 1 s, up 2 s (less than the limit), five times: the node beat last at 9 and is never judged
    for _ in range(5):
        h = observe(h, connected=False, epoch=epoch, now=t)
        judged.append(overdue(h, 9.0, t, LIMIT))
        t, epoch = t + 1.0, epoch + 1
        h = observe(h, connected=True, epoch=epoch, now=t)
        judged.append(overdue(h, 9.0, t + 2.0, LIMIT))
        t += 2.0
    assert judged == [False] * 10
    assert overdue(h, 9.0, t + LIMIT, LIMIT)  # the link held after the last flap: a silent node is judged


def test_a_probe_that_got_no_answer_counts_as_a_break() -> None:
    h = lost(Hearing(since=0.0, epoch=3))
    assert h.deaf and not overdue(h, 0.0, 100.0, LIMIT)
    assert lost(h) is h
    # the link looked up all along (same epoch): the first look after the probe ends the break
    h = observe(h, connected=True, epoch=3, now=100.0)
    assert (h.deaf, h.since) == (False, 100.0)


@pytest.mark.parametrize(
    ("looks", "judged_at", "overdue_node"),
    [
        # (connected, epoch, now) looks; then is a node last heard at 10 overdue at `judged_at`?
        ([], 13.5, True),
        ([(False, 0, 12.0)], 100.0, False),
        ([(False, 0, 12.0), (True, 1, 50.0)], 52.0, False),
        ([(False, 0, 12.0), (True, 1, 50.0)], 53.5, True),
        ([(True, 1, 12.0)], 14.0, False),
        ([(True, 1, 12.0)], 15.5, True),
        ([(True, 0, 12.0)], 13.5, True),
    ],
)
def test_judgements_after_looks(looks: list[tuple[bool, int, float]], judged_at: float, overdue_node: bool) -> None:
    h = Hearing(since=0.0)
    for connected, epoch, now in looks:
        h = observe(h, connected=connected, epoch=epoch, now=now)
    assert overdue(h, 10.0, judged_at, LIMIT) is overdue_node
