"""export-data on a real task store, read back with plain safetensors / pyarrow / torch.load (the peers' own
readers: test_peer_readers.py): values, layer order, the final norm, resume, refusals."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest
import torch
from interop_testlib import EPS, HIDDEN, LAYERS, N_LAYERS, write_store
from safetensors.torch import load_file

from eagle_batch.cli import main
from eagle_batch.interop.export import export
from eagle_batch.interop.layers import from_output_convention, peer_layers, to_output_convention
from eagle_batch.interop.manifest import DONE_NAME, MANIFEST_NAME
from eagle_batch.interop.specforge import SpecForgeFormat
from eagle_batch.interop.speculators import SpeculatorsFormat
from eagle_batch.store import open_dataset


def bf16(bits: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(bits)).view(torch.bfloat16)


def test_layer_id_shift_between_conventions():
    # eagle-batch/vLLM id k = input of decoder layer k; SpecForge/SGLang id = the producing layer = k - 1.
    assert to_output_convention([2, 16, 29, 32]) == [1, 15, 28, 31]
    assert from_output_convention(to_output_convention(LAYERS)) == LAYERS
    assert to_output_convention([0]) == [-1]  # the embeddings: SGLang's "output of layer -1"
    pl = peer_layers([6, 2, 4, 3], 6, "x")
    assert (pl.aux_ids, pl.last_id, pl.ids) == ([2, 3, 4], 6, [2, 3, 4, 6])
    with pytest.raises(Exception, match="not the last layer N=7"):
        peer_layers(LAYERS, 7, "x")
    with pytest.raises(Exception, match="--num-hidden-layers"):
        peer_layers(LAYERS, 0, "x")


def test_speculators_export_values_and_resume(tmp_path, store, samples):
    out = tmp_path / "spec"
    ds = open_dataset(store)
    r = export(ds, str(store), out, SpeculatorsFormat(peer_layers(ds.layer_ids, N_LAYERS, "s")), fsync=False)
    assert (r.written, r.skipped) == (len(samples), 0)
    for i, (_, ids, _, hs) in enumerate(samples):
        f = load_file(str(out / "hidden_states" / f"hs_{i}.safetensors"))
        assert f["hidden_states"].dtype == torch.bfloat16 and f["token_ids"].dtype == torch.int64
        assert f["hidden_states"].shape == (len(ids), 4, HIDDEN)  # aux ascending, then N (stored order here)
        assert torch.equal(f["hidden_states"].view(torch.int16), bf16(hs).view(torch.int16))
        assert f["token_ids"].tolist() == ids.tolist()
    with pa.memory_map(str(out / "data-00000-of-00001.arrow")) as src:
        table = pa.ipc.open_stream(src).read_all()
    assert table.column("input_ids").to_pylist() == [s[1].tolist() for s in samples]
    assert table.column("loss_mask").to_pylist() == [s[2].tolist() for s in samples]
    assert table.column("seq_len").to_pylist() == [len(s[1]) for s in samples]
    assert table.column("sample_id").to_pylist() == [s[0] for s in samples]
    assert json.loads((out / "state.json").read_text())["_format_type"] == "torch"
    freq = torch.load(out / "token_freq.pt", weights_only=True)
    expect: dict[int, int] = {}
    for _, ids, mask, _ in samples:
        for t in ids[mask == 1].tolist():
            expect[t] = expect.get(t, 0) + 1
    assert freq == expect
    assert json.loads((out / MANIFEST_NAME).read_text())["complete"] is True

    # A killed export: two samples' files gone, the done list torn mid-line, a temporary left behind.
    (out / "hidden_states" / "hs_3.safetensors").unlink()
    (out / "hidden_states" / "hs_7.safetensors.abc.partial").write_bytes(b"junk")
    done = (out / DONE_NAME).read_bytes().splitlines(keepends=True)
    (out / DONE_NAME).write_bytes(b"".join(done[:9]) + done[9][:5])
    before = (out / "hidden_states" / "hs_0.safetensors").stat().st_mtime_ns
    r2 = export(ds, str(store), out, SpeculatorsFormat(peer_layers(ds.layer_ids, N_LAYERS, "s")), fsync=False)
    assert (r2.written, r2.skipped) == (len(samples) - 8, 8)  # 9 listed, hs_3 missing -> 8 skipped
    assert (out / "hidden_states" / "hs_0.safetensors").stat().st_mtime_ns == before
    assert not list(out.rglob("*.partial"))
    f = load_file(str(out / "hidden_states" / "hs_3.safetensors"))
    assert torch.equal(f["hidden_states"].view(torch.int16), bf16(samples[3][3]).view(torch.int16))
    lines = [json.loads(x) for x in (out / DONE_NAME).read_text().splitlines()]
    assert {x["i"] for x in lines} == set(range(len(samples)))  # hs_3 listed twice: the later line wins


def test_specforge_export_applies_final_norm_and_groups(tmp_path, store, samples, target):
    from eagle_batch.train.target import final_norm_weight

    out = tmp_path / "sf"
    rc = main(["export-data", str(store), str(out), "--format", "specforge", "--target", str(target), "--no-fsync"])
    assert rc == 0
    w = final_norm_weight(target).float()
    files = sorted(out.rglob("*.ckpt"))
    assert [f.relative_to(out).as_posix() for f in files] == sorted(
        f"rows_0-5000/data_{i}.ckpt" for i in range(len(samples))
    )
    for i, (_, ids, mask, hs) in enumerate(samples):
        d = torch.load(out / f"rows_0-5000/data_{i}.ckpt", weights_only=True)
        t = len(ids)
        assert d["input_ids"].dtype == torch.int64 and d["input_ids"].tolist() == ids.tolist()
        assert d["loss_mask"].dtype == torch.int64 and d["loss_mask"].tolist() == mask.tolist()
        aux = bf16(hs[:, :3]).reshape(1, t, 3 * HIDDEN)  # layers 2, 3, 4 side by side
        assert d["aux_hidden_state"].shape == (1, t, 3 * HIDDEN)
        assert torch.equal(d["aux_hidden_state"].view(torch.int16), aux.view(torch.int16))
        last = bf16(hs[:, 3]).float()
        normed = (last * torch.rsqrt(last.pow(2).mean(-1, keepdim=True) + EPS) * w).to(torch.bfloat16)
        assert d["hidden_state"].shape == (1, t, HIDDEN) and d["hidden_state"].dtype == torch.bfloat16
        assert torch.equal(d["hidden_state"][0], normed)
        assert not torch.equal(d["hidden_state"][0], bf16(hs[:, 3]))  # the norm changed it
    m = json.loads((out / MANIFEST_NAME).read_text())
    assert m["peer_layer_ids"] == {"aux_hidden_state_layer_ids": [1, 2, 3], "last_layer_id": 5}


def test_specforge_group_folders():
    fmt = SpecForgeFormat(peer_layers(LAYERS, N_LAYERS, "x"), torch.ones(HIDDEN), EPS)
    assert fmt.sample_path(4999) == "rows_0-5000/data_4999.ckpt"
    assert fmt.sample_path(5000) == "rows_5000-10000/data_5000.ckpt"


def test_export_refusals_name_the_fix(tmp_path, store, samples, target, capsys):
    out = tmp_path / "o"
    assert main(["export-data", str(store), str(out), "--format", "specforge", "--no-progress"]) == 2
    assert "--target MODEL_DIR" in capsys.readouterr().err
    # A store without the num_hidden_layers attribute (written before it existed) needs N from somewhere.
    old = write_store(tmp_path / "old.zarr", samples[:2], num_hidden_layers=0)
    assert main(["export-data", str(old), str(out), "--format", "speculators"]) == 2
    assert "--num-hidden-layers N" in capsys.readouterr().err
    assert main(["export-data", str(old), str(out), "--format", "speculators", "--target", str(target)]) == 0
    capsys.readouterr()
    # OUT holds that export: another source's export there is refused, the same one resumes.
    assert main(["export-data", str(store), str(out), "--format", "speculators", "--json"]) == 2
    assert "export into an empty folder" in capsys.readouterr().err
    assert (
        main(["export-data", str(old), str(out), "--format", "speculators", "--num-hidden-layers", "6", "--json"]) == 0
    )
    assert json.loads(capsys.readouterr().out)["skipped"] == 2
    assert main(["export-data", str(old), str(out), "--format", "speculators", "--num-hidden-layers", "7"]) == 2
    assert "not the last layer N=7" in capsys.readouterr().err  # the store records no N: the given one is used
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "x").write_text("user file")
    assert main(["export-data", str(store), str(busy), "--format", "speculators"]) == 2
    assert "not empty" in capsys.readouterr().err


def test_export_of_an_aggregated_run_takes_the_target_from_its_config(tmp_path, samples, target):
    from eagle_batch.config import load_config, save_config
    from eagle_batch.store import aggregate

    run = tmp_path / "run"
    write_store(run / "stores" / "task-00000.zarr", samples[:5])
    write_store(run / "stores" / "task-00001.zarr", samples[5:])
    aggregate(run, fsync=False)
    save_config(load_config(None, [f"run_dir={run}", f"model.path={target}"]), run)
    out = tmp_path / "sf"
    assert main(["export-data", str(run), str(out), "--format", "specforge", "--no-fsync"]) == 0  # no --target
    for i, (_, ids, _, hs) in enumerate(samples):  # global sample index across the two stores
        d = torch.load(out / f"rows_0-5000/data_{i}.ckpt", weights_only=True)
        assert d["input_ids"].tolist() == ids.tolist()
        assert torch.equal(
            d["aux_hidden_state"][0].view(torch.int16), bf16(hs[:, :3]).reshape(len(ids), -1).view(torch.int16)
        )


def test_export_killed_midway_resumes_to_the_same_files(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    from interop_testlib import make_samples

    samples = make_samples(150, seed=5)
    store = write_store(tmp_path / "task-00000.zarr", samples)
    out = tmp_path / "spec"
    root = Path(__file__).resolve().parents[2]
    cmd = [sys.executable, "-m", "eagle_batch.cli", "export-data", str(store), str(out), "--format", "speculators"]
    p = subprocess.Popen(cmd, env={**os.environ, "PYTHONPATH": str(root)}, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and p.poll() is None:
        done = out / DONE_NAME
        if done.is_file() and done.read_bytes().count(b"\n") >= 20:
            break
        time.sleep(0.01)
    p.send_signal(signal.SIGKILL)
    p.wait()
    killed_at = (out / DONE_NAME).read_bytes().count(b"\n")
    assert 20 <= killed_at < len(samples), killed_at  # killed midway, not before or after
    assert not (out / "state.json").exists()  # the dataset index comes last: no reader takes a partial export
    assert main(["export-data", str(store), str(out), "--format", "speculators", "--json", "--no-fsync"]) == 0
    for i, (_, ids, _, hs) in enumerate(samples):
        f = load_file(str(out / "hidden_states" / f"hs_{i}.safetensors"))
        assert torch.equal(f["hidden_states"].view(torch.int16), bf16(hs).view(torch.int16)), i
        assert f["token_ids"].tolist() == ids.tolist()
    assert not list(out.rglob("*.partial")) and json.loads((out / MANIFEST_NAME).read_text())["complete"]
