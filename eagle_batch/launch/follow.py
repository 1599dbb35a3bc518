"""`--wait`: follow a run until no task is pending/running, with one live progress line.

A follower reads the whole run once (`status`'s RunView: two directory reads and one open per state file),
then each poll reads only what changed since (`state_journal.JournalTail`: one stat when nothing did, one
open when tasks wrote their state) plus the tasks whose Slurm job changed state since the last poll (a task
killed before its journal line). Every `full_every_s` it reads every state file again, so that nothing the
journal missed stays wrong for longer.

On a parallel file system every metadata call is a round trip to a server all users share; the defaults
keep a follower's average load at or below `CALLS_PER_S` whatever the run's size: the poll interval grows
with the number of tasks (`default_interval_s`) unless the user sets one, and full reads come no more often
than their calls allow (`full_read_every_s`). docs/explanation/scale.md has the measured figures.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from eagle_batch.errors import UserError
from eagle_batch.ownership import check_run

from . import state as S
from .run_view import RunView, list_stores, read_one
from .slurm_query import never_starts
from .state_journal import JournalTail
from .status import progress_line, run_status

# The average metadata calls per second a follower may send (parallel file systems' administrators start to
# notice a user's job at a few thousand per second; the budget is 100).
CALLS_PER_S = 100.0
MIN_INTERVAL_S = 5.0  # the smallest default poll interval (a small run)
TASKS_PER_INTERVAL_S = 500  # the default interval grows by a second per this many tasks


class StoppedFollowing(UserError):
    """Ctrl-C while following a run: the jobs are not this command's children and go on; the message says
    where they run and how to follow or stop them."""

    exit_code = 130


def default_interval_s(num_tasks: int) -> float:
    """The poll interval when the user sets none: 5 s up to 2,500 tasks, then a second per 500 tasks (20 s
    at 10,000): an idle poll costs one stat, but each poll also asks Slurm once and redraws the line."""
    return max(MIN_INTERVAL_S, num_tasks / TASKS_PER_INTERVAL_S)


def full_read_every_s(num_tasks: int) -> float:
    """How often a follower reads every state file again: a full read costs about one call per task, so at
    most half of CALLS_PER_S goes to it (every 200 s at 10,000 tasks; at least a minute apart)."""
    return max(60.0, num_tasks / (CALLS_PER_S / 2))


class Follower:
    """Keeps a RunView of `run_dir` up to date between polls; `poll()` -> the run's status (as run_status)."""

    def __init__(self, run_dir, interval_s: float | None = None):
        self.run_dir = run_dir
        self.num_tasks = S.plan_num_tasks(run_dir)
        self.interval_s = float(interval_s) if interval_s else default_interval_s(self.num_tasks)
        self.full_every_s = full_read_every_s(self.num_tasks)
        self.tail = JournalTail(Path(run_dir) / S.STATE_DIR)
        self.view: RunView | None = None
        self.last_full = 0.0
        self.recheck: set[int] = set()  # tasks whose Slurm state changed at the last poll
        self.slurm_seen: dict[int, str] = {}

    def _full_read(self) -> None:
        check_run(self.run_dir)  # the run's control files are the owner's own (ownership.py), checked at each full read
        self.tail.mark()  # first: whatever is appended from here on is news at the next poll
        self.view = RunView.read(self.run_dir, self.num_tasks)
        self.last_full = time.monotonic()
        self.recheck.clear()

    def _apply_news(self) -> bool:
        """Bring the view up to date from the journal and the recheck list; False when a full read is due."""
        news = self.tail.news()
        if news is None:
            return False
        view = self.view
        for t, d in news.items():
            cur = view.states.get(t)
            if cur is None or float(d.get("updated", 0)) >= cur.updated:
                view.states[t] = S.TaskState.from_json(d)
                view.listing.states.add(t)
                if t in view.listing.repairs and not S.repair_path(self.run_dir, t).exists():
                    view.listing.repairs.discard(t)  # the task removed its repair request when it finished
                if view.listing.stores is not None:
                    view.listing.stores.add(t)  # a task that writes its state holds its store
        if news and view.listing.stores is None:  # RUN/stores absent at the last full read: it may exist now
            view.listing.stores = list_stores(self.run_dir)
        for t in sorted(self.recheck - set(news)):  # one open each (a task with no state file: one failed open)
            st = read_one(self.run_dir, t)
            if st is not None:
                view.states[t] = st
                view.listing.states.add(t)
        self.recheck.clear()
        return True

    def poll(self) -> dict:
        due = self.view is None or time.monotonic() - self.last_full >= self.full_every_s
        if due or not self._apply_news():
            self._full_read()
        else:  # one small file: a `resume` from another terminal shows at once
            self.view.submissions = S.read_submissions(self.run_dir)
        status = run_status(self.run_dir, self.view)
        seen = {r["task_id"]: r["slurm_state"] for r in status["tasks"]}
        self.recheck = {t for t, v in seen.items() if self.slurm_seen.get(t, v) != v}
        self.slurm_seen = seen
        return status


def follow(run_dir, interval_s: float | None = None, out=None, live: bool = True) -> dict:
    """Poll the run until nothing is queued or running, or a task's job is pending for a reason Slurm
    never lifts on its own (then its error says so and what to do); returns the final status.
    `interval_s`: seconds between polls (None: `default_interval_s` of the run's size); live=False
    (--no-progress): only the final progress line is printed."""
    # sys.stdout looked up per call, not bound at import: whoever replaced it since (pytest's capture,
    # a notebook) owns the stream now, and the import-time one may be closed.
    out = out if out is not None else sys.stdout
    try:
        return _follow(run_dir, interval_s, out, live)
    except KeyboardInterrupt:
        if out.isatty():
            out.write("\n")
            out.flush()
        raise StoppedFollowing(stopped_following(run_dir)) from None


def stopped_following(run_dir) -> str:
    """What Ctrl-C on `--wait` leaves behind, in the words of the executor that runs the tasks."""
    try:
        rows = run_status(run_dir)["tasks"]
        subs = S.read_submissions(run_dir)
    except (UserError, OSError):
        rows, subs = [], []
    active = [r for r in rows if r["state"] in ("pending", "requeued", "running")]
    last = subs[-1] if subs else None
    if not active:
        where = "no task of it is queued or running"
    elif last is not None and last.executor == "local":
        # launch.local starts each slot in a session of its own: the terminal's Ctrl-C never reaches it.
        where = f"its {len(active)} task(s) go on in the background on this machine (local job {last.job_id})"
    else:
        where = f"its {len(active)} task(s) go on in Slurm" + (f" (job {last.job_id})" if last else "")
    stop = f", stop them with `eagle-batch cancel {run_dir}`" if active else ""
    return f"stopped following {run_dir}: {where}; follow with `eagle-batch status {run_dir}`{stop}."


def _follow(run_dir, interval_s: float | None, out, live: bool) -> dict:
    tty = out.isatty() and live
    last = ""
    follower = Follower(run_dir, interval_s)
    while True:
        status = follower.poll()
        line = progress_line(status)
        if tty:
            out.write("\r\033[K" + line)
        elif line != last and live:
            out.write(line + "\n")
        out.flush()
        last = line
        stuck = [r for r in status["tasks"] if never_starts(r.get("pending_reason", ""))]
        if status["totals"]["active"] == 0 or stuck:
            if tty:
                out.write("\n")
            elif not live:
                out.write(line + "\n")
            if stuck:
                out.write(f"stopped following: task {stuck[0]['task_id']}: {stuck[0]['last_error']}\n")
            return status
        time.sleep(follower.interval_s)
