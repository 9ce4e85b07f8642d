"""The Python client (clients/python) against the whole system: submit, get with its state, list, cancel, wait,
events and logs, sync and asyncio; bearer tokens from the argument and the environment; and its README's examples
run as they are.

The sync client blocks: each sync scenario runs in a thread (the stack shares the test's event loop)."""

from __future__ import annotations

import asyncio
import os
import re
import sys
from pathlib import Path

import pytest
from rackscale import (
    TERMINAL,
    Accepted,
    ApiError,
    AsyncClient,
    Client,
    JobBody,
    JobEvent,
    JobState,
    JobView,
    LogLine,
    TopologyBody,
)

from tests.e2e.conftest import WAIT_S, StackFactory

pytestmark = pytest.mark.asyncio

ROOT = Path(__file__).resolve().parents[2]
CLIENT = ROOT / "clients" / "python"
# Two ranks (8 GPUs, a process per node), three lines each.
TALKER = [sys.executable, "-c", "import os\nfor i in range(3): print(f'rank {os.environ[\"RANK\"]} line {i}')"]
TICKER = "import time\nfor i in range(5):\n    print(f'tick {i}', flush=True)\n    time.sleep(0.3)"


def sync_scenario(url: str, tmp: Path) -> None:
    client = Client(url)
    # submit → get with its state → wait (woken by events) → logs
    talk = client.submit({"name": "talk", "tenant": "alice", "gpus": 8, "command": TALKER})
    assert isinstance(talk, Accepted) and talk.state == "pending"
    seen = client.get(talk.id)  # a 503 until the queue records it is asked again
    assert isinstance(seen, JobView) and seen.id == talk.id and seen.state in set(JobState)
    done = client.wait(talk.id, timeout=WAIT_S)
    assert (done.state, done.end) == (JobState.SUCCEEDED, "completed") and done.state in TERMINAL
    assert len(done.allocation) == 2 and [(e.rank, e.exit_code) for e in done.exits] == [(0, 0), (1, 0)]
    lines = list(client.logs(talk.id))
    expected = {(r, f"rank {r} line {i}") for r in (0, 1) for i in range(3)}
    assert all(isinstance(x, LogLine) for x in lines) and {(x.rank, x.text) for x in lines} == expected
    assert [(x.rank, x.text) for x in client.logs(talk.id, rank=1, tail=1)] == [(1, "rank 1 line 2")]
    followed = list(client.logs(talk.id, follow=True, rank=0))  # an ended job's: what it wrote, then the end
    assert [x.text for x in followed] == [f"rank 0 line {i}" for i in range(3)]

    # a typed body and a file; an Idempotency-Key names the same job on a retry
    typed = client.submit(JobBody(name="typed", tenant="bob", gpus=4, duration_s=0.2, topology=TopologyBody()))
    again = client.submit(JobBody(name="typed", tenant="bob", gpus=4, duration_s=0.2), idempotency_key="k-1")
    retried = client.submit({"name": "typed", "tenant": "bob", "gpus": 4, "duration_s": 0.2}, idempotency_key="k-1")
    assert retried.id == again.id != typed.id
    spec = tmp / "job.json"
    spec.write_text('{"name": "from-file", "tenant": "bob", "gpus": 4, "duration_s": 0.2}')
    filed = client.submit_file(spec)
    assert client.wait(filed.id, timeout=WAIT_S, poll_s=0.1).name == "from-file"  # polled, not woken

    # list: filters, pages, every page (of the jobs the queue has recorded: a get waits for that)
    assert [client.get(j.id).name for j in (typed, again)] == ["typed", "typed"]
    assert {j.id for j in client.list(tenant="bob").jobs} == {typed.id, again.id, filed.id}
    page = client.list(tenant="bob", limit=1, offset=1)
    assert (page.total, page.limit, page.offset, len(page.jobs)) == (3, 1, 1, 1)
    assert [j.id for j in client.list_all(tenant="bob", page=1)] == [j.id for j in client.list(tenant="bob").jobs]
    assert client.list(tenant="alice", state=JobState.SUCCEEDED).jobs[0].id == talk.id

    # events: connected when events() returns, so the job's every event is heard
    with client.events() as events:
        short = client.submit({"name": "short", "tenant": "carol", "gpus": 4, "duration_s": 0.2})
        states = []
        for ev in events:
            if isinstance(ev, JobEvent) and ev.job_id == short.id:
                states.append(ev.state)
                if ev.state in TERMINAL:
                    break
    assert states[0] is JobState.PENDING and states[-1] is JobState.SUCCEEDED

    # cancel, and the errors: status, message, field
    long = client.submit({"name": "long", "tenant": "carol", "gpus": 4, "duration_s": 600})
    with pytest.raises(TimeoutError, match=long.id):
        client.wait(long.id, timeout=0.5)
    assert client.cancel(long.id) == Accepted(id=long.id, state="cancelling")
    assert client.wait(long.id, timeout=WAIT_S).state is JobState.CANCELLED
    with pytest.raises(ApiError) as ended:
        client.cancel(long.id)
    assert (ended.value.status, ended.value.field) == (409, "state")
    with pytest.raises(ApiError) as bad:
        client.submit({"name": "bad", "tenant": "carol", "gpus": 0})
    assert (bad.value.status, bad.value.field) == (422, "gpus") and "gpus" in bad.value.message
    with pytest.raises(ApiError) as unknown:
        client.get("no-such-job")
    assert unknown.value.status == 404
    assert sum(d.utilisation.total for d in client.cluster().domains) == 72


async def test_the_sync_client_against_the_system(open_stack: StackFactory, tmp_path: Path) -> None:
    e2e = await open_stack(domains=1)
    await asyncio.to_thread(sync_scenario, e2e.url, tmp_path)


async def test_the_async_client_against_the_system(open_stack: StackFactory) -> None:
    e2e = await open_stack(domains=1)
    client = AsyncClient(e2e.url)
    async with client.events() as events:  # connected before the submit
        ticker = await client.submit(
            {"name": "ticker", "tenant": "alice", "gpus": 4, "command": [sys.executable, "-c", TICKER]}
        )
        seen = await client.get(ticker.id)
        assert seen.id == ticker.id and seen.state in set(JobState)
        async for ev in events:
            if isinstance(ev, JobEvent) and ev.job_id == ticker.id and ev.state in {JobState.RUNNING, *TERMINAL}:
                break  # (its lines are followed from here, while it writes them)
    # followed while it writes: each line once, in order, until the job has ended
    lines = [(x.rank, x.text) async for x in client.logs(ticker.id, follow=True)]
    assert lines == [(0, f"tick {i}") for i in range(5)]
    done = await client.wait(ticker.id, timeout=WAIT_S)
    assert (done.state, done.end) == (JobState.SUCCEEDED, "completed")
    assert [x.text async for x in client.logs(ticker.id, tail=2)] == ["tick 3", "tick 4"]

    ids = [
        (await client.submit({"name": f"n{i}", "tenant": "dave", "gpus": 4, "duration_s": 600})).id for i in range(3)
    ]
    assert [(await client.get(i)).id for i in ids] == ids  # recorded by the queue: listed from here on
    assert [j.id async for j in client.list_all(tenant="dave", page=2)] == ids
    assert (await client.list(tenant="dave", limit=2)).total == 3
    with pytest.raises(TimeoutError, match=ids[0]):
        await client.wait(ids[0], timeout=0.5)
    for job_id in ids:
        assert (await client.cancel(job_id)).state == "cancelling"
    ended = await asyncio.gather(*(client.wait(i, timeout=WAIT_S) for i in ids[:2]), client.wait(ids[2], poll_s=0.1))
    assert {j.state for j in ended} == {JobState.CANCELLED}
    with pytest.raises(ApiError) as again:
        await client.cancel(ids[0])
    assert (again.value.status, again.value.field) == (409, "state")
    with pytest.raises(ApiError) as bad:
        await client.submit({"name": "bad", "tenant": "dave", "gpus": 4, "topology": {"nvlink": "always"}})
    assert (bad.value.status, bad.value.field) == (422, "topology.nvlink")
    assert len((await client.cluster()).domains) == 1


TOKENS = """
tokens:
  - {token: "alice-client-token-0001", tenant: alice, role: user}
  - {token: "admin-client-token-0001", tenant: ops, role: admin}
"""


async def test_tokens_come_from_the_argument_or_the_environment(
    open_stack: StackFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(TOKENS)
    e2e = await open_stack(domains=1, settings={"tokens_file": str(tokens)}, token="admin-client-token-0001")
    monkeypatch.setenv("RACKSCALE_URL", e2e.url)
    monkeypatch.setenv("RACKSCALE_TOKEN", "alice-client-token-0001")

    def as_alice() -> None:
        alice = Client()  # both from the environment
        job = alice.submit({"name": "mine", "tenant": "alice", "gpus": 4, "duration_s": 0.2})
        assert alice.wait(job.id, timeout=WAIT_S).state is JobState.SUCCEEDED
        with pytest.raises(ApiError) as other:
            alice.submit({"name": "theirs", "tenant": "bob", "gpus": 4})
        assert (other.value.status, other.value.field) == (403, "tenant")
        with pytest.raises(ApiError) as nobody:
            Client(token="not-a-token-at-all-000").list()
        assert nobody.value.status == 401
        admin = Client(token="admin-client-token-0001")  # the argument wins
        assert [j.id for j in admin.list(tenant="alice").jobs] == [job.id]

    await asyncio.to_thread(as_alice)
    async with AsyncClient().events() as events:  # a user's events: its tenant's jobs
        job = await AsyncClient().submit({"name": "mine2", "tenant": "alice", "gpus": 4, "duration_s": 0.2})
        async for ev in events:
            if isinstance(ev, JobEvent) and ev.job_id == job.id and ev.state in TERMINAL:
                break


def readme_examples() -> list[str]:
    return re.findall(r"```python\n(.*?)```", (CLIENT / "README.md").read_text(), re.S)


async def test_the_readme_examples_run_as_they_are(open_stack: StackFactory, tmp_path: Path) -> None:
    e2e = await open_stack(domains=1)
    examples = readme_examples()
    assert len(examples) == 2
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RACKSCALE_TOKEN")}
    env |= {"RACKSCALE_URL": e2e.url, "PYTHONPATH": str(CLIENT)}  # the client alone, as a user has it
    outputs = []
    for i, code in enumerate(examples):
        script = tmp_path / f"example{i}.py"
        script.write_text(code)
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(script),
            env=env,
            cwd=tmp_path,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await asyncio.wait_for(proc.communicate(), 4 * WAIT_S)
        assert proc.returncode == 0, out.decode()
        outputs.append(out.decode().splitlines())
    sync, async_ = outputs
    assert sync[1].startswith("succeeded [('d00-n")  # the job ended, and where it ran
    assert sorted(sync[2:4]) == ["0 hi from 0", "1 hi from 1"]
    assert sync[4:] == ["['hello', 'sleeper']", "cancelled"]
    assert async_[0].startswith("pending") and async_[-1].startswith("succeeded")


async def test_a_dry_run_says_when_a_job_would_start_and_submits_nothing(open_stack: StackFactory) -> None:
    e2e = await open_stack(domains=1)
    client = AsyncClient(e2e.url)
    view = await client.dry_run({"name": "probe", "tenant": "alice", "gpus": 8})  # on an idle domain
    assert view.start == "now" and len(view.allocation) == 2
    assert (await client.dry_run(JobBody(name="probe", tenant="alice", gpus=4))).start == "now"
    assert (await client.list()).total == 0  # nothing was submitted


async def test_usage_counts_the_gpu_hours_of_a_tenants_jobs(open_stack: StackFactory) -> None:
    e2e = await open_stack(domains=1)
    client = AsyncClient(e2e.url)
    job = await client.submit({"name": "used", "tenant": "alice", "gpus": 4, "duration_s": 0.5})
    await client.wait(job.id, timeout=WAIT_S)
    report = await client.usage(tenant="alice", by="day")
    assert report is not None
    text = await client.usage(tenant="alice", by="day", csv=True)
    assert isinstance(text, str) and "alice" in text
