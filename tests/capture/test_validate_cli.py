"""`eagle-batch validate RUN`: run_capture (hf backend) into a real task store, then compare it back."""

from __future__ import annotations

import argparse

import pytest
import torch

from eagle_batch.capture.engine import run_capture
from eagle_batch.capture.validate import LayerAccumulator
from eagle_batch.cli import validate as cli_validate
from eagle_batch.config import load_config, save_config


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli_validate.add_arguments(parser)
    return parser.parse_args(argv)


def test_layer_accumulator_metrics():
    acc = LayerAccumulator([2, 6])
    ref = torch.randn(10, 2, 16, dtype=torch.float64)
    got = ref.clone()
    got[:, 1] += 0.5  # layer 6 off by a constant
    acc.add("a", got, ref)
    rep = acc.report(0.999, 0.05)
    assert [l.layer_id for l in rep.layers] == [2, 6] and rep.tokens == 10
    assert rep.layers[0].cos_mean == pytest.approx(1.0) and rep.layers[0].max_rel == 0 and rep.layers[0].passed
    assert rep.layers[1].max_rel == pytest.approx(0.5 / float(ref[:, 1].abs().max()))
    assert not rep.layers[1].passed and not rep.passed and "FAIL" in rep.table()
    with pytest.raises(ValueError, match="sample b: captured shape"):
        acc.add("b", got[:3], ref)


def test_validate_run_passes_on_good_store_and_fails_on_corrupted(tmp_path, tiny_model, samples_factory, capsys):
    from eagle_batch.store import StoreSpec, TaskStoreWriter

    path = tiny_model("llama")
    run = tmp_path / "run"
    cfg = load_config(
        None,
        [
            f"run_dir={run}",
            f"model.path={path}",
            "model.dtype=float32",
            "extract.backend=hf",
            "extract.batch_samples=2",
            "extract.commit_interval_s=0",
        ],
    )
    save_config(cfg, run)
    samples = samples_factory([12, 30, 7, 21], vocab=40000, seed=5)
    spec = StoreSpec.from_config(cfg, [2, 3, 6], 256)
    w = TaskStoreWriter.open(run / "stores" / "task-00000.zarr", spec, cfg.store)
    try:
        stats = run_capture(cfg, samples, w)  # hf backend, real store, commits per batch
    finally:
        w.close()
    assert stats.samples == 4 and stats.backend == "hf"

    assert cli_validate.run(_parse([str(run), "--samples", "3", "--device", "cpu"])) == 0
    out = capsys.readouterr().out
    assert "3 samples" in out and "PASS" in out

    # Same store, a different model: every layer must fail.
    other = tiny_model("qwen3")
    save_config(load_config(run / "config.yaml", [f"model.path={other}"]), run)
    rep = cli_validate.validate_run(run, 2, device="cpu")
    assert not rep.passed and all(not l.passed for l in rep.layers)
