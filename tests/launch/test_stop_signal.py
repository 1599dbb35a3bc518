"""The checkpoint signal (launch/job.py StopSignal): Slurm sends SIGUSR2 to every process of a job step.
Inside StopSignal it sets the task's flag and ends none of the processes the work started (vLLM's engine
processes, training ranks, data workers); a process started before it would die of the signal."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

from eagle_batch.launch.job import StopSignal

TASK = textwrap.dedent(
    """
    import json, multiprocessing, subprocess, sys, time
    from eagle_batch.launch.job import StopSignal

    def sleep():
        time.sleep(60)

    if __name__ == "__main__":
        sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
        before = subprocess.Popen(sleeper)
        with StopSignal("task 0") as stop:
            inside = subprocess.Popen(sleeper)
            spawned = multiprocessing.get_context("spawn").Process(target=sleep, daemon=True)
            spawned.start()
            time.sleep(1.0)  # the spawned interpreter is up
            print("ready", flush=True)
            deadline = time.time() + 30
            while not stop() and time.time() < deadline:
                time.sleep(0.05)
            time.sleep(0.5)  # a killed child has ended by now
            state = {
                "requested": stop(),
                "before": before.poll(),
                "inside": inside.poll(),
                "spawned": spawned.exitcode,
            }
        for p in (before, inside):
            p.kill()
        spawned.kill()
        print(json.dumps(state), flush=True)
    """
)


def test_a_signal_to_every_process_of_the_task_sets_the_flag_and_ends_none_of_its_children(tmp_path):
    script = tmp_path / "task.py"
    script.write_text(TASK)
    proc = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
        os.killpg(proc.pid, signal.SIGUSR2)  # as slurmstepd signals a step: every process in it
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    state = json.loads(out.strip().splitlines()[-1])
    assert state == {"requested": True, "before": -signal.SIGUSR2, "inside": None, "spawned": None}, err
    assert err.count("got SIGUSR2") == 1, err  # said once


def test_leaving_restores_the_handler_and_the_signal_mask():
    before = signal.getsignal(signal.SIGUSR2)
    with StopSignal("task 0") as stop:
        assert signal.SIGUSR2 in signal.pthread_sigmask(signal.SIG_BLOCK, set())
        os.kill(os.getpid(), signal.SIGUSR2)
        for _ in range(100):
            if stop():
                break
            time.sleep(0.02)
        assert stop.requested
    assert signal.SIGUSR2 not in signal.pthread_sigmask(signal.SIG_BLOCK, set())
    assert signal.getsignal(signal.SIGUSR2) is before
