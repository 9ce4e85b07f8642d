"""Arrays and dependencies beside the burst of a fault test (issue 25: "dependencies survive every fault the
log-is-truth issue tests").

`Workflows` submits, through the test's `Recorder` (so the history holds its requests, each array's submit as its
tasks'), an array capped at `%3`, a job that fails and one that succeeds, dependants of each kind on them and on
the array, and singletons of one name. Submitted as the burst starts, they straddle the fault: tasks run, and
dependants wait, while it lasts. `check` judges them on the history: no array over its cap, no dependant before
its condition held in the log, singletons one at a time in submit order (tests/history_rules.py), and each ended
as its dependency says (the one on the failed job cancelled with the reason, the others succeeded).
"""

from __future__ import annotations

import sys
from typing import Any

from tests.history import History, Recorder, array_tasks
from tests.history_rules import array_caps, dependencies

TENANT = "delta"
FAILS = [sys.executable, "-c", "import sys, time; time.sleep(1.0); sys.exit(3)"]
CAP = 3


class Workflows:
    def __init__(self, rec: Recorder) -> None:
        self.rec = rec
        self.array = ""
        self.tasks: list[str] = []
        self.failing = self.ok = ""
        self.depends: dict[str, str] = {}  # job → its dependency
        self.expect: dict[str, str] = {}  # job → the state it must end in
        self.singles: list[str] = []

    @property
    def jobs(self) -> list[str]:
        return [*self.tasks, self.failing, self.ok, *self.depends]

    async def _submit(self, body: dict[str, Any]) -> str:
        return await self.rec.submit({"tenant": TENANT, "gpus": 1, **body})

    async def submit(self) -> None:
        """Everything, in an order whose dependencies exist when named (a dependant's submit may be answered 503
        "not recorded yet" while the queue catches up: the recorder retries it, as a client would)."""
        body = {"name": "wf-sweep", "array": f"0-9%{CAP}", "duration_s": 1.0}
        self.array = await self._submit(body)
        self.tasks = array_tasks(body, self.array)
        self.failing = await self._submit({"name": "wf-fails", "command": FAILS})
        self.ok = await self._submit({"name": "wf-ok", "duration_s": 1.5})
        self.expect = dict.fromkeys(self.tasks, "succeeded") | {self.failing: "failed", self.ok: "succeeded"}
        for name, dependency, end in [
            ("wf-need-ok", f"afterok:{self.failing}", "cancelled"),
            ("wf-need-fail", f"afternotok:{self.failing}", "succeeded"),
            ("wf-after-sweep", f"afterany:{self.array}", "succeeded"),
            ("wf-after-both", f"afterok:{self.array},afterok:{self.ok}", "succeeded"),
            ("wf-never", f"afternotok:{self.ok}", "cancelled"),
        ]:
            job = await self._submit({"name": name, "dependency": dependency, "duration_s": 0.2})
            self.depends[job], self.expect[job] = dependency, end
        for _ in range(3):
            job = await self._submit({"name": "wf-single", "dependency": "singleton", "duration_s": 0.8})
            self.singles.append(job)
            self.depends[job], self.expect[job] = "singleton", "succeeded"

    def check(self, history: History, views: dict[str, dict[str, Any]]) -> list[str]:
        """Violations of (e)-(g) on the history, and jobs that ended otherwise than their dependency says."""
        out = array_caps(history.job_events, {self.array: CAP})
        out += dependencies(
            history.job_events,
            self.depends,
            {self.array: self.tasks},
            {f"{TENANT}/wf-single": self.singles},
        )
        for job, want in self.expect.items():
            view = views.get(job, {})
            if view.get("state") != want:
                out.append(f"workflow job {job} ({view.get('name')}) ended {view.get('state')}, not {want}")
            elif want == "cancelled" and not str(view.get("reason", "")).startswith("dependency can never be met: "):
                out.append(f"workflow job {job} cancelled without the reason: {view.get('reason')!r}")
        return out
