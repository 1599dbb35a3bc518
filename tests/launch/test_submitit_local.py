"""The submitit internals eagle_batch/launch/submitit_local.py relies on exist, with the shapes it uses, in the
installed submitit: a submitit upgrade that changes them fails here, not in a user's local run."""

from __future__ import annotations

import importlib.util
import inspect
import re

import submitit
from submitit.local import local as submitit_local_impl

from eagle_batch.launch import submitit_local


def test_submit_command_is_still_the_hook_the_executor_overrides():
    params = list(inspect.signature(submitit.LocalExecutor._submit_command).parameters)
    assert params == ["self", "command"]
    ex = submitit_local.detached_executor(__import__("pathlib").Path("/nonexistent-folder"), 3.0)
    assert isinstance(ex, submitit.LocalExecutor) and ex.parameters["timeout_min"] == 3.0
    assert type(ex)._submit_command is not submitit.LocalExecutor._submit_command


def test_local_job_takes_the_arguments_given():
    params = inspect.signature(submitit_local_impl.LocalJob.__init__).parameters
    assert {"folder", "job_id", "process", "tasks"} <= set(params)


def test_the_controller_module_and_its_variables_are_unchanged():
    assert importlib.util.find_spec(submitit_local.CONTROLLER_MODULE) is not None
    # start_controller sets exactly these (and CUDA_VISIBLE_DEVICES, which each slot sets per task) ...
    started = set(re.findall(r"\b(SUBMITIT_\w+)=", inspect.getsource(submitit_local_impl.start_controller)))
    assert started == set(submitit_local.CONTROLLER_VARIABLES)
    # ... and the controller reads nothing else of them.
    read = set(re.findall(r"os\.environ\[\"(SUBMITIT_\w+)\"\]", inspect.getsource(submitit_local_impl.Controller)))
    assert read <= set(submitit_local.CONTROLLER_VARIABLES)


def test_controller_environment_holds_each_variable_and_no_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    env = submitit_local.controller_environment("python -m x", timeout_s=60, signal_delay_s=5)
    assert {k: env[k] for k in ("SUBMITIT_LOCAL_COMMAND", "SUBMITIT_LOCAL_TIMEOUT_S", "SUBMITIT_EXECUTOR")} == {
        "SUBMITIT_LOCAL_COMMAND": "python -m x",
        "SUBMITIT_LOCAL_TIMEOUT_S": "60",
        "SUBMITIT_EXECUTOR": "local",
    }
    assert set(submitit_local.CONTROLLER_VARIABLES) <= set(env) and "CUDA_VISIBLE_DEVICES" not in env
