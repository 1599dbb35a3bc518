"""The batch step's entry: `python -m eagle_batch.launch.submitit_entry RUN/slurm/%j` checks that the job's
folder is the owner's own before submitit unpickles (and so runs) what it holds.

submitit's own entry (`python -m submitit.core._submit FOLDER`) loads FOLDER/<job>_submitted.pkl as it
finds it. A pickle is code: a job queued for hours would run, as its submitter, whatever another user put
there. RUN/slurm is created 0700 (eagle_batch.ownership) and RUN itself is not writable by the group, so
nobody else can reach the pickles; this entry refuses to start when that no longer holds (RUN, RUN/slurm
replaced or opened up, the job folder or pickle of another user, a symbolic link), in one line on the
job's stderr, and only then hands over to submitit.
"""

from __future__ import annotations

import sys
from pathlib import Path

from eagle_batch.ownership import ControlPlaneError, check_private


def check_job_folder(folder: Path, pickle: Path) -> None:
    """ControlPlaneError unless RUN and RUN/slurm are private and the job folder and its pickle are this
    user's own files (their mode is the umask's: the 0700 RUN/slurm above them keeps others out)."""
    slurm = folder.parent
    check_private(slurm.parent, "the run folder", follow=True)
    check_private(slurm, "the run's submitit jobs and slot files")
    check_private(folder, "the submitit job folder", mode=False)
    check_private(pickle, "the submitit job", mode=False)


def main(argv: list[str] | None = None) -> int:
    from submitit.core import job_environment, submission

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m eagle_batch.launch.submitit_entry FOLDER", file=sys.stderr)
        return 2
    from eagle_batch import environment

    environment.set_variables({"SUBMITIT_FOLDER": args[0]})  # what submitit's JobEnvironment reads
    paths = job_environment.JobEnvironment().paths
    try:
        check_job_folder(Path(paths.folder), Path(paths.submitted_pickle))
    except ControlPlaneError as e:
        print(f"eagle-batch: refusing to run this job: {e}", file=sys.stderr)
        return 3
    from eagle_batch.ownership import cache_warnings

    for line in cache_warnings(environment.code_caches()):
        print(f"eagle-batch: warning: {line}", file=sys.stderr)
    submission.process_job(args[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
