"""The store's identity attributes: N (num_hidden_layers, which layer_semantics refers to) and a tokenizer
identity that does not depend on where the tokenizer lies on the host."""

from __future__ import annotations

import json
import shutil

from eagle_batch.config import load_config, tokenizer_sha256
from eagle_batch.launch.capture_work import store_spec


def _model_folder(d, vocab: str = '{"a": 0}'):
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"num_hidden_layers": 6, "hidden_size": 32, "vocab_size": 300}))
    (d / "tokenizer.json").write_text(vocab)
    (d / "tokenizer_config.json").write_text('{"model_max_length": 512}')
    return d


def test_tokenizer_identity_is_the_files_not_the_path(tmp_path):
    a = _model_folder(tmp_path / "one" / "Model-1B")
    b = tmp_path / "elsewhere" / "copy"
    shutil.copytree(a, b)
    assert tokenizer_sha256(a) == tokenizer_sha256(b) != ""
    (b / "tokenizer.json").write_text('{"a": 1}')
    assert tokenizer_sha256(a) != tokenizer_sha256(b)
    assert tokenizer_sha256(tmp_path) == ""  # no tokenizer file there


def test_store_spec_records_n_and_a_portable_tokenizer(tmp_path):
    model = _model_folder(tmp_path / "models" / "Model-1B")
    cfg = load_config(None, [f"run_dir={tmp_path / 'run'}", f"model.path={model}", "model.layer_ids=[2,3,4,6]"])
    spec = store_spec(cfg)
    assert spec.num_hidden_layers == 6 and spec.layer_ids == [2, 3, 4, 6]
    assert spec.tokenizer == "Model-1B" and str(tmp_path) not in json.dumps(spec.attributes())
    assert spec.tokenizer_sha256 == tokenizer_sha256(model)
