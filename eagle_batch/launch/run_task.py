"""`python -m eagle_batch.launch.run_task RUN TASK JOB_ID LOG`: one attempt of one task of a run's array.

What a local slot (launch.local) runs in a child process per task: the same `ArrayTask` a Slurm array task
runs, named by the slot (job id, log path) since the child is no submitit or Slurm job.
"""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    run_dir, task_id, job_id, log = argv[0], int(argv[1]), argv[2], argv[3]
    from .task import ArrayTask

    ArrayTask(run_dir, task_id, job_id=job_id, log=log)()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
