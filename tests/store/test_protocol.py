"""StoreWriterProtocol: what the capture calls on a store writer, which TaskStoreWriter provides."""

from __future__ import annotations

import inspect

import pytest
from store_testlib import make_sample

from eagle_batch.store import StoreWriterProtocol, TaskStoreWriter


def test_task_store_writer_satisfies_the_capture_protocol(tmp_path, spec, small_cfg):
    with TaskStoreWriter.open(tmp_path / "s.zarr", spec, small_cfg) as w:
        assert isinstance(w, StoreWriterProtocol)
        checked: StoreWriterProtocol = w  # the static form of the same claim
        checked.append(*make_sample(0))
        checked.commit()
        assert checked.committed_sample_ids == {make_sample(0)[0]}
    assert not isinstance(object(), StoreWriterProtocol)


@pytest.mark.parametrize("name", ["append", "append_block", "commit"])
def test_protocol_methods_have_the_writers_signatures(name):
    """isinstance only checks that the members exist: the parameters must match too (names, order, defaults)."""
    want = inspect.signature(getattr(StoreWriterProtocol, name))
    got = inspect.signature(getattr(TaskStoreWriter, name))
    assert [(p.name, p.kind, p.default) for p in got.parameters.values()] == [
        (p.name, p.kind, p.default) for p in want.parameters.values()
    ]


def test_protocol_names_what_the_capture_calls():
    members = {n for n in vars(StoreWriterProtocol) if not n.startswith("_")}
    assert members == {"append", "append_block", "commit", "committed_sample_ids"}
    assert isinstance(inspect.getattr_static(StoreWriterProtocol, "committed_sample_ids"), property)
