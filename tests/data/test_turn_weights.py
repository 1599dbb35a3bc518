"""Per-turn training marks (Axolotl's `weight: 0`, data.turn_train_field): a marked assistant turn stays in
the context but leaves the loss; a mark that is not 0/1 is a named bad row, never a guess."""

from __future__ import annotations

from dataclasses import replace

from tests.data.conftest import decode, masked_runs
from tests.data.test_chat_variants import _jsonl, all_samples, make_cfg, run_prepare

U1 = {"role": "user", "content": "Name a colour."}
U2 = {"role": "user", "content": "Another one?"}


def _sharegpt(w1, w2) -> dict:
    turns = [
        {"from": "human", "value": U1["content"]},
        {"from": "gpt", "value": "Red.", "weight": w1},
        {"from": "human", "value": U2["content"]},
        {"from": "gpt", "value": "Blue.", "weight": w2},
    ]
    return {"conversations": [{k: v for k, v in t.items() if v is not None} for t in turns]}


def test_weight_zero_turn_is_context_not_loss(tmp_path, smollm2_path, smollm2_tokenizer):
    rows = [
        _sharegpt(0, 1),  # ShareGPT with Axolotl weights
        {
            "messages": [
                U1,
                {"role": "assistant", "content": "Green.", "weight": 1},
                U2,
                {"role": "assistant", "content": "Pink.", "weight": False},
            ]
        },  # fmt: skip
        _sharegpt(None, None),  # no marks: every assistant turn trains
    ]
    summary, bad = run_prepare(
        make_cfg(tmp_path, smollm2_path, [_jsonl(tmp_path / "in.jsonl", rows)]), smollm2_tokenizer
    )
    assert bad == [] and summary["samples"] == 3 and summary["assistant_turns_not_trained"] == 2
    texts = {
        tuple(masked_runs(smollm2_tokenizer, s.input_ids, s.loss_mask)): decode(smollm2_tokenizer, s.input_ids)
        for s in all_samples(tmp_path / "run")
    }
    assert sorted(texts) == [("Blue.<|im_end|>",), ("Green.<|im_end|>",), ("Red.<|im_end|>", "Blue.<|im_end|>")]
    assert "Red." in texts[("Blue.<|im_end|>",)]  # the weight-0 answer is in the context, not the loss
    # The last turn has weight 0: it carries no loss, so the sample ends at the turn that does.
    assert "Pink." not in texts[("Green.<|im_end|>",)]


def test_all_turns_weight_zero_and_bad_marks_are_named_rows(tmp_path, smollm2_path, smollm2_tokenizer):
    rows = [_sharegpt(0, 0), _sharegpt(0.5, 1), _sharegpt("yes", 1), _sharegpt(1, 1)]
    path = _jsonl(tmp_path / "in.jsonl", rows)
    summary, bad = run_prepare(make_cfg(tmp_path, smollm2_path, [path]), smollm2_tokenizer)
    assert summary["samples"] == 1
    assert summary["skipped_by_reason"] == {"no_trained_turn": 1, "bad_turn_weight": 2}
    assert [(b["line"], b["reason"]) for b in bad] == [
        (1, "no_trained_turn"),
        (2, "bad_turn_weight"),
        (3, "bad_turn_weight"),
    ]
    assert "turn 1 has weight=0.5" in bad[1]["detail"] and "data.turn_train_field=''" in bad[1]["detail"]


def test_turn_train_field_names_the_mark_or_turns_it_off(tmp_path, smollm2_path, smollm2_tokenizer):
    row = _sharegpt(0, 0)
    path = _jsonl(tmp_path / "in.jsonl", [row])
    cfg = make_cfg(tmp_path, smollm2_path, [path], name="off")
    cfg = replace(cfg, data=replace(cfg.data, turn_train_field=""))  # weights ignored: both turns train
    summary, bad = run_prepare(cfg, smollm2_tokenizer)
    assert bad == [] and summary["assistant_turns_not_trained"] == 0
    (s,) = all_samples(tmp_path / "off")
    assert masked_runs(smollm2_tokenizer, s.input_ids, s.loss_mask) == ["Red.<|im_end|>", "Blue.<|im_end|>"]

    # Another field name (`train`, as Nemotron-style exports write it): `weight` is then an ordinary key.
    rows = [{"messages": [U1, {"role": "assistant", "content": "Red.", "train": False, "weight": 0.5}, U2,
                          {"role": "assistant", "content": "Blue.", "train": True}]}]  # fmt: skip
    cfg = make_cfg(tmp_path, smollm2_path, [_jsonl(tmp_path / "train.jsonl", rows)], name="train")
    cfg = replace(cfg, data=replace(cfg.data, turn_train_field="train"))
    summary, bad = run_prepare(cfg, smollm2_tokenizer)
    assert bad == [] and summary["assistant_turns_not_trained"] == 1
    (s,) = all_samples(tmp_path / "train")
    assert masked_runs(smollm2_tokenizer, s.input_ids, s.loss_mask) == ["Blue.<|im_end|>"]
