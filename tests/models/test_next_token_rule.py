"""A random Kimi-K2.5 with a next-token rule (models/next_token_rule.py): its greedy next token is the rule's,
by a wide margin, at every position of a real chat, while its decoder layers stay random.

The reference is transformers' DeepSeek-V3 built from the checkpoint's language-model weights (as `validate`
uses it), in float32 on the CPU; the layers add their random share to every hidden state.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from eagle_batch.models import kimi
from eagle_batch.models.next_token_rule import NextTokenRule, most_frequent_tokens

DEMO_CHATS = Path(kimi.__file__).resolve().parents[1] / "demo_data" / "chat.jsonl"
SHAPE = dict(hidden_size=512, num_hidden_layers=4, n_routed_experts=8, num_experts_per_tok=2)


def test_the_target_follows_its_rule_by_a_wide_margin_and_its_layers_still_count(tmp_path):
    from eagle_batch.capture import hf

    tok = kimi.kimi_tokenizer()
    outputs = most_frequent_tokens(DEMO_CHATS, tok, 32)
    assert len(set(outputs)) == 32 and all(t < len(tok) for t in outputs)
    rule = NextTokenRule(outputs, seed=3, std=1.0)  # the layers of this narrow model add less than at 7168
    path = kimi.build_kimi_model(tmp_path / "ruled", text=SHAPE, next_token_rule=rule, device="cpu")
    assert json.loads((path / kimi.RULE_FILE).read_text()) == rule.to_json()

    model = hf.load_hf_model(str(path), "float32", "cpu")
    chat = json.loads(DEMO_CHATS.read_text().splitlines()[0])["messages"]
    ids = tok(tok.apply_chat_template(chat, tokenize=False), add_special_tokens=False)["input_ids"]
    x = torch.tensor([ids])
    with torch.no_grad():
        out = model(x, output_hidden_states=True)
    logits = out.logits[0]
    expected = rule.greedy_next(x[0], logits.shape[-1])
    assert torch.equal(logits.argmax(-1), expected), (logits.argmax(-1) != expected).sum()
    top2 = logits.topk(2, dim=-1).values
    losers = logits[:, torch.tensor(outputs)].sort(dim=-1).values[:, :-1]
    spread = losers.std(dim=-1)
    # The winner is ahead of the runner-up by many standard deviations of the other outputs' logits.
    assert ((top2[:, 0] - top2[:, 1]) / spread).min() > 4, ((top2[:, 0] - top2[:, 1]) / spread).min()
    # The layers are not bypassed: what they add to the embedding by the last layer's input is a sizeable share
    # of it (hidden_states[-1] is after the final norm).
    emb, before_last = out.hidden_states[0][0], out.hidden_states[-2][0]
    added = (before_last - emb).norm(dim=-1) / emb.norm(dim=-1)
    print(f"margin / spread >= {((top2[:, 0] - top2[:, 1]) / spread).min():.2f}; layers add {added.mean():.3f} x E")
    assert added.mean() > 0.05, added.mean()
