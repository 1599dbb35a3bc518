"""extract.engine_process: where a TP=1 engine runs (decided before vLLM starts, so no engine here)."""

import pytest
import torch

from eagle_batch.capture.hooks import HooksBackend
from eagle_batch.capture.native import NativeBackend
from eagle_batch.capture.writer import CaptureError
from eagle_batch.config import load_config


def _backend(cls, mode):
    b = object.__new__(cls)  # the choice needs only the config; __init__ would start vLLM
    b.cfg = load_config(None, ["run_dir=/tmp/unused", "model.path=/tmp/unused", f"extract.engine_process={mode}"])
    return b


@pytest.mark.parametrize("cuda", [True, False])
def test_auto_runs_the_native_engine_in_the_background_on_cuda_only(monkeypatch, cuda):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    assert _backend(NativeBackend, "auto")._engine_in_background() is cuda
    # hooks' states would travel through vLLM's RPC from another process: in-process whatever the device
    assert _backend(HooksBackend, "auto")._engine_in_background() is False


def test_explicit_choice_wins_over_the_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert _backend(NativeBackend, "background")._engine_in_background() is True
    assert _backend(HooksBackend, "background")._engine_in_background() is True
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert _backend(NativeBackend, "in-process")._engine_in_background() is False


def test_unknown_choice_names_the_field_and_the_choices():
    with pytest.raises(CaptureError, match=r"extract\.engine_process='gpu'.*auto, in-process or background"):
        _backend(NativeBackend, "gpu")._engine_in_background()
