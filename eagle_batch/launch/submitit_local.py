"""submitit's local executor, its job controller started detached: the one place eagle-batch relies on
submitit's internals (tests/launch/test_submitit_local.py fails when an installed submitit changes them).

Like a Slurm job, a local job must outlive the command that submitted it: Ctrl-C on `extract --wait` stops
following, not the tasks, and `eagle-batch extract ... | tee log` returns when the command is done, not when
the job is (a controller that inherits the pipe holds it open). submitit 1.5.4's `start_controller` inherits
stdio and the process group, and has no option to do otherwise, so this executor overrides the private
`LocalExecutor._submit_command` to start the same controller (`python -m submitit.local._local FOLDER`), with
the environment variables that controller reads, in a session of its own with no stdio.

What it relies on (checked by the test against the installed submitit):
- `submitit.LocalExecutor._submit_command(self, command) -> LocalJob` and its `parameters` dict;
- `submitit.local.local.LocalJob(folder=, job_id=, process=, tasks=)`;
- the module `submitit.local._local`, run with the folder as its one argument;
- the controller's variables: CONTROLLER_VARIABLES, the set `submitit.local.local.start_controller` sets.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from eagle_batch import environment

CONTROLLER_MODULE = "submitit.local._local"
# What the controller reads from its environment (submitit.local.local.Controller); the values are those
# start_controller would give one task without shell setup lines.
CONTROLLER_VARIABLES = (
    "SUBMITIT_LOCAL_NTASKS",
    "SUBMITIT_LOCAL_COMMAND",
    "SUBMITIT_LOCAL_TIMEOUT_S",
    "SUBMITIT_LOCAL_SIGNAL_DELAY_S",
    "SUBMITIT_LOCAL_NODEID",
    "SUBMITIT_LOCAL_JOB_NUM_NODES",
    "SUBMITIT_STDERR_TO_STDOUT",
    "SUBMITIT_EXECUTOR",
    "SUBMITIT_LOCAL_WITH_SHELL",
)


def controller_environment(command: str, timeout_s: int, signal_delay_s: int) -> dict[str, str]:
    values = dict(
        zip(CONTROLLER_VARIABLES, ["1", command, str(timeout_s), str(signal_delay_s), "0", "1", "", "local", ""])
    )
    env = environment.child_environment(values)
    env.pop("CUDA_VISIBLE_DEVICES", None)  # the slot hands each task its devices (launch/local.run_slot)
    return env


def detached_executor(folder: Path, timeout_min: float):
    """A submitit LocalExecutor whose job controller runs in a session of its own, without the caller's
    terminal or pipes."""
    import submitit
    from submitit.local.local import LocalJob

    class DetachedLocalExecutor(submitit.LocalExecutor):
        def _submit_command(self, command: str):
            env = controller_environment(
                command,
                timeout_s=int(60 * self.parameters.get("timeout_min", timeout_min)),
                signal_delay_s=int(self.parameters.get("signal_delay_s", 30)),
            )
            process = subprocess.Popen(
                [sys.executable, "-m", CONTROLLER_MODULE, str(self.folder)],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            return LocalJob(folder=self.folder, job_id=str(process.pid), process=process, tasks=[0])

    ex = DetachedLocalExecutor(folder=folder)
    ex.update_parameters(timeout_min=timeout_min)
    return ex
