"""Draft model: shapes, vocab maps, TTT attention == sequential decoding with a KV cache, masking."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import TINY, TINY_LAYERS

from eagle_batch.train.data import build_vocab_map
from eagle_batch.train.loss import CrossEntropyKernels, soft_cross_entropy, ttt_inputs, ttt_loss, ttt_plan
from eagle_batch.train.model import Eagle3Draft, draft_config_from_target, target_head, ttt_attention
from eagle_batch.train.target import TargetHead


def make_draft(target, vocab_size=128, seed=0, **options):
    """A draft of the tiny target; `options`: DraftConfig's norm options (norm_before_fc, ...)."""
    cfg = dataclasses.replace(draft_config_from_target(target, TINY_LAYERS[:3], TINY_LAYERS[3], vocab_size), **options)
    th = target_head(target)
    torch.manual_seed(seed)
    m = Eagle3Draft(cfg, th["embed"].float())
    stride = max(1, TINY["vocab"] // vocab_size)  # a non-identity map where there is room for one
    m.set_vocab_map(torch.arange(0, stride * vocab_size, stride))
    with torch.no_grad():  # non-trivial norms so a wrong norm placement would show
        for _n, p in m.named_parameters():
            if p.dim() == 1:
                p.uniform_(0.5, 1.5)
    return m, th


def test_forward_backward_shapes(fake_target):
    m, _ = make_draft(fake_target)
    b, t, h = 2, 12, TINY["hidden"]
    aux = torch.randn(b, t, 3 * h)
    ids = [torch.randint(0, TINY["vocab"], (b, t)) for _ in range(3)]
    out = m(aux, ids, torch.arange(t).expand(b, t))
    assert len(out) == 3 and all(o.shape == (b, t, 128) for o in out)
    sum(o.sum() for o in out).backward()
    assert m.fc.weight.grad is not None and m.fc.weight.grad.abs().sum() > 0
    assert m.midlayer.self_attn.q_proj.weight.shape == (TINY["heads"] * TINY["head_dim"], 2 * h)
    assert m.embed_tokens.requires_grad is False and "embed_tokens" not in m.state_dict()


def test_vocab_map_from_frequencies():
    freq = np.zeros(20, dtype=np.int64)
    freq[[3, 7, 11, 2]] = [50, 40, 40, 1]
    ids = build_vocab_map(freq, 3)
    assert ids.tolist() == [3, 7, 11]  # top-3 by count, sorted by id
    ids5 = build_vocab_map(freq, 5)
    assert ids5.tolist() == [0, 2, 3, 7, 11]  # padded with the lowest unused id
    cfg_ids = torch.tensor([3, 7, 11])
    # the maps the way vLLM reads them: target id = arange(draft_vocab) + d2t
    m = Eagle3Draft.__new__(Eagle3Draft)
    torch.nn.Module.__init__(m)
    m.cfg = type("cfg", (), {"draft_vocab_size": 3})
    m.register_buffer("d2t", torch.zeros(3, dtype=torch.long))
    m.register_buffer("t2d", torch.zeros(20, dtype=torch.bool))
    m.set_vocab_map(cfg_ids)
    assert (torch.arange(3) + m.d2t).tolist() == [3, 7, 11]
    assert m.d2t.tolist() == [3, 6, 9]
    assert m.t2d.nonzero().flatten().tolist() == [3, 7, 11]


def _sequential_reference(m: Eagle3Draft, aux, ids, root: int, steps: int):
    """Decode the chain rooted at `root` the way vLLM does: a KV cache, one new token per step,
    standard SDPA over the cache (an independent implementation of the TTT attention pattern)."""
    attn = m.midlayer.self_attn
    c = m.cfg
    t = aux.shape[0]
    pos = torch.arange(t)[None]
    # vLLM's options (llama_eagle3.py): the norm before fc, the residual after hidden_norm, the normed state
    # fed back.
    a = aux[None, : root + 1]
    g = m.fc(m.input_norm(a) if c.norm_before_fc else a)
    emb = m.embed(ids[1 : root + 2][None])
    gn = m.midlayer.hidden_norm(g)
    x = torch.cat([m.midlayer.input_layernorm(emb), gn], -1)
    g = gn if c.norm_before_residual else g
    # Step 0 over the prefix 0..root: causal attention, keys cached.
    q = attn.q_proj(x).view(1, -1, c.num_attention_heads, c.head_dim).transpose(1, 2)
    k = attn.k_proj(x).view(1, -1, c.num_key_value_heads, c.head_dim).transpose(1, 2)
    v = attn.v_proj(x).view(1, -1, c.num_key_value_heads, c.head_dim).transpose(1, 2)
    q, k = attn._rope(q, pos[:, : root + 1]), attn._rope(k, pos[:, : root + 1])
    rep = c.num_attention_heads // c.num_key_value_heads
    o = F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), is_causal=True)
    o = attn.o_proj(o.transpose(1, 2).reshape(1, root + 1, -1))
    r = o + g
    pre = m.midlayer.mlp(m.midlayer.post_attention_layernorm(r)) + r
    logits = [m.lm_head(m.norm(pre[0, root]))]
    kc, vc = k, v
    hidden = (m.norm(pre) if c.norm_output else pre)[:, root : root + 1]
    for s in range(1, steps):
        p = root + s
        emb = m.embed(ids[p + 1 : p + 2][None])
        hn = m.midlayer.hidden_norm(hidden)
        x = torch.cat([m.midlayer.input_layernorm(emb), hn], -1)
        q = attn.q_proj(x).view(1, 1, c.num_attention_heads, c.head_dim).transpose(1, 2)
        k = attn.k_proj(x).view(1, 1, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        v = attn.v_proj(x).view(1, 1, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        q, k = attn._rope(q, torch.tensor([[p]])), attn._rope(k, torch.tensor([[p]]))
        kc, vc = torch.cat([kc, k], 2), torch.cat([vc, v], 2)
        o = F.scaled_dot_product_attention(q, kc.repeat_interleave(rep, 1), vc.repeat_interleave(rep, 1))
        o = attn.o_proj(o.transpose(1, 2).reshape(1, 1, -1))
        r = o + (hn if c.norm_before_residual else hidden)
        pre = m.midlayer.mlp(m.midlayer.post_attention_layernorm(r)) + r
        logits.append(m.lm_head(m.norm(pre[0, 0])))
        hidden = m.norm(pre) if c.norm_output else pre
    return torch.stack(logits)


@pytest.mark.parametrize(
    "options",
    [{}, {"norm_before_fc": True, "norm_before_residual": True, "norm_output": True}, {"norm_output": True}],
    ids=["plain", "all-norms", "norm-output"],
)
def test_ttt_unroll_matches_sequential_decoding(fake_target, options):
    torch.manual_seed(1)
    m, _ = make_draft(fake_target, **options)
    m.eval()
    t, steps, h = 16, 4, TINY["hidden"]
    aux = torch.randn(t, 3 * h)
    ids = torch.randint(0, TINY["vocab"], (t + steps + 1,))
    ids_per_step = [ids[s + 1 : s + 1 + t][None] for s in range(steps)]
    with torch.no_grad():
        out = m(aux[None], ids_per_step, torch.arange(t)[None])
        for root in (0, 5, 11):
            ref = _sequential_reference(m, aux, ids, root, steps)
            got = torch.stack([out[s][0, root] for s in range(steps)])
            torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)


def test_ttt_is_causal(fake_target):
    m, _ = make_draft(fake_target)
    t, h = 10, TINY["hidden"]
    aux = torch.randn(1, t, 3 * h)
    ids = [torch.randint(0, TINY["vocab"], (1, t)) for _ in range(3)]
    pos = torch.arange(t)[None]
    with torch.no_grad():
        a = m(aux, ids, pos)
        aux2 = aux.clone()
        aux2[:, 6:] += 5.0  # change only rows >= 6
        b = m(aux2, ids, pos)
    for s in range(3):
        torch.testing.assert_close(a[s][:, :6], b[s][:, :6])
        assert not torch.allclose(a[s][:, 6:], b[s][:, 6:])


def _batch(t=20, b=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = TINY["hidden"]
    lm = torch.zeros(b, t, dtype=torch.uint8)
    lm[:, 10:15] = 1
    return {
        "input_ids": torch.randint(0, TINY["vocab"], (b, t), generator=g),
        "loss_mask": lm,
        "aux": torch.randn(b, t, 3 * h, generator=g),
        "last": torch.randn(b, t, h, generator=g),
    }


def test_loss_only_where_loss_mask(fake_target):
    m, th = make_draft(fake_target)
    head = TargetHead(th["norm"], th["lm_head"].float(), 1e-5, m.draft_to_target)
    batch = _batch()
    loss, st = ttt_loss(m, head, batch, 3, 0.8, autocast=False)
    # step s counts rows i with loss_mask[i+s+2] == 1: 5 positions per sample, all in range
    assert st["count"].tolist() == [10.0, 10.0, 10.0]
    # Changing states and tokens only where no loss looks (targets at p with loss_mask[p+1]=0; aux rows
    # after the last counted row of any step) leaves the loss unchanged.
    b2 = {k: v.clone() for k, v in batch.items()}
    b2["last"][:, :9] += 3.0
    b2["last"][:, 14:] += 3.0
    b2["aux"][:, 13:] += 3.0
    loss2, _ = ttt_loss(m, head, b2, 3, 0.8, autocast=False)
    torch.testing.assert_close(loss, loss2)
    # ... and where the loss does look, it changes
    b3 = {k: v.clone() for k, v in batch.items()}
    b3["last"][:, 11] += 3.0
    loss3, _ = ttt_loss(m, head, b3, 3, 0.8, autocast=False)
    assert not torch.allclose(loss, loss3)
    b4 = {k: v.clone() for k, v in batch.items()}
    b4["loss_mask"].zero_()
    loss4, st4 = ttt_loss(m, head, b4, 3, 0.8, autocast=False)
    assert float(loss4.detach()) == 0.0 and st4["count"].sum() == 0


def test_target_distribution_and_accuracy(fake_target):
    """A draft whose lm_head copies the target's rows scores 100% top-1 at step 0 when fed the right state."""
    m, th = make_draft(fake_target, vocab_size=TINY["vocab"])
    m.set_vocab_map(torch.arange(TINY["vocab"]))
    head = TargetHead(th["norm"], th["lm_head"].float(), 1e-5, m.draft_to_target)
    last = torch.randn(7, TINY["hidden"])
    logp, arg = head(last)
    full = F.rms_norm(last, (TINY["hidden"],), eps=1e-5) @ th["lm_head"].float().T
    torch.testing.assert_close(logp, torch.log_softmax(full, -1), atol=1e-4, rtol=1e-4)
    assert arg.tolist() == full.argmax(-1).tolist()


def test_target_head_draft_only_argmax(fake_target):
    """accuracy_vs=draft: same log-probs, argmax over the draft vocabulary (mapped to target ids)."""
    m, th = make_draft(fake_target, vocab_size=128)
    full = TargetHead(th["norm"], th["lm_head"].float(), 1e-5, m.draft_to_target)
    cheap = TargetHead(th["norm"], th["lm_head"].float(), 1e-5, m.draft_to_target, full_argmax=False)
    last = torch.randn(9, TINY["hidden"])
    (lp1, _), (lp2, a2) = full(last), cheap(last)
    torch.testing.assert_close(lp1, lp2)
    assert a2.tolist() == m.draft_to_target[lp1.argmax(-1)].tolist()


def _qkv_cache(b, heads, kv_heads, t, d, steps, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(b, heads, t, d, generator=g) * 2).to(dtype).requires_grad_()
    cache = [
        (
            (torch.randn(b, kv_heads, t, d, generator=g) * 2).to(dtype).requires_grad_(),
            torch.randn(b, kv_heads, t, d, generator=g).to(dtype).requires_grad_(),
        )
        for _ in range(steps)
    ]
    return q, cache


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-5), (torch.bfloat16, 3e-2)])
def test_merged_ttt_attention_equals_masked(dtype, tol):
    """The default attention (causal SDPA merged with the diagonal terms through a sink key) gives the
    masked reference's output and gradients at every TTT step, with grouped KV heads, in fp32 and bf16
    (the sink's log-weight goes in as hi + lo, so bf16 loses nothing beyond bf16 inputs)."""
    for steps in (1, 2, 4, 7):
        q, cache = _qkv_cache(2, 6, 2, 19, 16, steps, dtype, seed=steps)
        grad_out = torch.randn(2, 6, 19, 16).to(dtype)
        outs = {}
        for impl in ("merged", "masked"):
            for x in [q] + [t for kv in cache for t in kv]:
                x.grad = None
            out = ttt_attention(q, cache, impl)
            (out.float() * grad_out.float()).sum().backward()
            outs[impl] = [out.detach().float()] + [x.grad.float() for x in [q] + [t for kv in cache for t in kv]]
        for a, b in zip(outs["merged"], outs["masked"], strict=True):
            torch.testing.assert_close(a, b, atol=tol, rtol=tol)


def test_soft_cross_entropy_matches_autograd():
    """The loss function: same value and gradient as log_softmax autograd, target rows picked by index."""
    g = torch.Generator().manual_seed(0)
    lg = torch.randn(7, 50, generator=g, requires_grad=True)
    p_all = torch.softmax(torch.randn(12, 50, generator=g) * 3, -1)
    idx = torch.tensor([3, 0, 11, 3, 5, 7, 1])
    got = soft_cross_entropy(lg, p_all, idx)
    (grad_got,) = torch.autograd.grad(got * 1.7, lg)
    ref = -(p_all[idx] * torch.log_softmax(lg, -1)).sum()
    (grad_ref,) = torch.autograd.grad(ref * 1.7, lg)
    torch.testing.assert_close(got, ref)
    torch.testing.assert_close(grad_got, grad_ref)
    bf = soft_cross_entropy(lg.detach().to(torch.bfloat16), p_all, idx)  # bf16 logits (autocast)
    torch.testing.assert_close(bf, ref.detach(), atol=0.05, rtol=1e-2)


@pytest.mark.slow  # inductor's C++ compile: ~100 s on a busy 2-core machine
def test_compiled_loss_kernels_match_eager():
    """train.compile: the compiled forward/backward give the eager numbers (inductor's CPU backend here)."""
    g = torch.Generator().manual_seed(1)
    p_all = torch.softmax(torch.randn(10, 40, generator=g), -1)
    kernels = CrossEntropyKernels(compiled=True)
    for n in (7, 13):  # two sizes: the dynamic-shape graph serves both
        lg = torch.randn(n, 40, generator=g, requires_grad=True)
        idx = torch.randint(0, 10, (n,), generator=g)
        out = {}
        for name, k in (("eager", CrossEntropyKernels(compiled=False)), ("compiled", kernels)):
            loss = soft_cross_entropy(lg, p_all, idx, k)
            (grad,) = torch.autograd.grad(loss, lg)
            out[name] = (loss.detach(), grad)
        assert kernels._compiled, "compilation fell back to eager"
        torch.testing.assert_close(out["compiled"][0], out["eager"][0])
        torch.testing.assert_close(out["compiled"][1], out["eager"][1])


def test_ttt_loss_equals_the_dense_definition(fake_target):
    """The compacted loss (lm_head and CE on the counted rows only, via ttt_plan) equals the loss written
    out densely: every row's logits, the target at position i+s+1, counted where loss_mask[i+s+2] == 1."""
    m, th = make_draft(fake_target)
    head = TargetHead(th["norm"], th["lm_head"].float(), 1e-5, m.draft_to_target)
    batch = _batch(t=23, b=3, seed=4)
    batch["loss_mask"][1, 3:8] = 1  # rows with different masks
    batch["loss_mask"][2, 17:] = 1
    loss, st = ttt_loss(m, head, batch, 4, 0.7, autocast=False)
    ids, lm = batch["input_ids"], batch["loss_mask"].bool()
    b, t = ids.shape
    logits = m(batch["aux"], ttt_inputs(ids, 4), torch.arange(t).expand(b, t))
    logp, arg = head(batch["last"].reshape(b * t, -1))
    logp, arg = logp.view(b, t, -1), arg.view(b, t)
    ref, sums, counts, hits, chains = 0.0, [], [], [], []
    chain = torch.ones(b, t, dtype=torch.bool)  # row i's steps so far all right (and counted)
    for s in range(4):
        n = t - s - 2
        valid = lm[:, s + 2 :]
        lq = torch.log_softmax(logits[s][:, :n], -1)
        ce = -(logp[:, s + 1 : t - 1].exp() * lq).sum(-1)
        sums.append(float(ce[valid].sum().detach()))
        counts.append(int(valid.sum()))
        right = m.draft_to_target[logits[s][:, :n].argmax(-1)] == arg[:, s + 1 : t - 1]
        hits.append(int(right[valid].sum()))
        chain = chain[:, :n] & right & valid
        chains.append(int(chain.sum()))
        ref = ref + 0.7**s * ce[valid].mean()
    torch.testing.assert_close(loss, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(st["loss_sum"], torch.tensor(sums), atol=1e-4, rtol=1e-5)
    assert st["count"].tolist() == counts and st["correct"].tolist() == hits
    assert st["chain"].tolist() == chains and all(c <= h for c, h in zip(chains, hits))


def test_ttt_loss_has_no_host_sync(fake_target):
    """A training step reads nothing back to the host: no .item()/bool() (aten._local_scalar_dense), no
    boolean-mask indexing (aten.nonzero). On a GPU each of those stalls the device queue."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Record(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.add(str(func.overloadpacket))
            return func(*args, **(kwargs or {}))

    m, th = make_draft(fake_target)
    head = TargetHead(th["norm"], th["lm_head"].float(), 1e-5, m.draft_to_target)
    batch = _batch()
    plan = ttt_plan(batch["loss_mask"], 3)  # the trainer builds it from the CPU batch, before the step
    with Record() as rec:
        loss, st = ttt_loss(m, head, batch, 3, 0.8, autocast=False, plan=plan)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(m.parameters()), 0.5)
    syncs = {op for op in rec.ops if "_local_scalar_dense" in op or "nonzero" in op or "is_nonzero" in op}
    assert not syncs, syncs
    assert st["count"].tolist() == [10.0, 10.0, 10.0]


def test_batch_without_loss_tokens_still_steps(fake_target):
    """A batch with no loss token (e.g. samples whose answer max_length cut off) gives loss 0 and zero
    gradients instead of failing in backward (the loss used to be a constant without a graph)."""
    m, th = make_draft(fake_target)
    head = TargetHead(th["norm"], th["lm_head"].float(), 1e-5, m.draft_to_target)
    batch = _batch()
    batch["loss_mask"].zero_()
    loss, st = ttt_loss(m, head, batch, 3, 0.8, autocast=False)
    loss.backward()
    assert float(loss.detach()) == 0.0 and st["count"].sum() == 0
    assert all(p.grad is None or p.grad.abs().max() == 0 for p in m.parameters())
    short = {k: v[:, :2].clone() for k, v in _batch().items()}  # 2 tokens: no step has a row in range
    loss, _ = ttt_loss(m, head, short, 3, 0.8, autocast=False)
    loss.backward()


def test_lm_head_init_from_target(fake_target):
    m, th = make_draft(fake_target, vocab_size=64)
    m.init_head_from_target(th["lm_head"], th["norm"])
    ids = m.draft_to_target
    torch.testing.assert_close(m.lm_head.weight, th["lm_head"][ids].float())
    torch.testing.assert_close(m.norm.weight, th["norm"].float())


def test_draft_activation_is_silu_whatever_the_target(tmp_path):
    """vLLM serves the draft with LlamaMLP, which accepts only silu (and the training MLP is silu): a target
    with another activation (Gemma's gelu) must not leak its hidden_act into the exported config."""
    import json

    from conftest import write_fake_target

    from eagle_batch.train.model import export_draft

    target = write_fake_target(tmp_path / "t")
    conf = json.loads((target / "config.json").read_text())
    conf["hidden_act"] = "gelu_pytorch_tanh"
    (target / "config.json").write_text(json.dumps(conf))
    cfg = draft_config_from_target(target, TINY_LAYERS[:3], TINY_LAYERS[3], 64)
    m = Eagle3Draft(cfg, target_head(target)["embed"])
    m.set_vocab_map(torch.arange(64))
    out = export_draft(m, tmp_path / "export")
    assert json.loads((out / "config.json").read_text())["hidden_act"] == "silu"


def test_a_yarn_target_draft_is_served_with_the_attention_factor_it_was_trained_with(tmp_path):
    """DeepSeek-V3 / Kimi-K2.5 rope: transformers trains the draft with mscale(1)/mscale_all_dim(1) = 1.0;
    vLLM's Llama draft layer would multiply yarn_get_mscale(64) = 1.42 unless told (0.26: attn_factor with
    apply_yarn_scaling false; 0.32: attention_factor)."""
    import json

    from eagle_batch.train.model import _rope_inv_freq, draft_config_from_target, served_rope

    yarn = {"rope_type": "yarn", "factor": 64.0, "original_max_position_embeddings": 4096, "beta_fast": 32,
            "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0, "rope_theta": 50000.0}  # fmt: skip
    target = tmp_path / "t"
    target.mkdir()
    shape = {"hidden_size": 256, "num_attention_heads": 4, "num_hidden_layers": 4, "vocab_size": 1000}
    (target / "config.json").write_text(json.dumps({**shape, "max_position_embeddings": 262144, "rope_scaling": yarn}))
    cfg = draft_config_from_target(target, [1, 2, 3], 4, 512)
    _, trained = _rope_inv_freq(cfg)
    served = served_rope(cfg)["rope_scaling"]
    assert trained == 1.0 and served["attn_factor"] == served["attention_factor"] == trained
    assert served["apply_yarn_scaling"] is False and served["factor"] == 64.0
    assert "attn_factor" not in cfg.rope["rope_scaling"]  # the training config is left as the target's
    (target / "config.json").write_text(json.dumps({**shape, "rope_theta": 10000.0}))
    plain = draft_config_from_target(target, [1, 2, 3], 4, 512)
    assert served_rope(plain) == plain.rope  # other rope types pass through unchanged


def test_ttt_loss_chain_counts_rows_right_at_every_step_so_far():
    """stats["chain"][s] counts the rows whose steps 0..s all give the target's top token (what a server
    accepts up to draft position s+1), against a dense count, with predictions right on a random half of
    the rows at each step (a row whose token at some step is not a loss token ends its chain there)."""
    g = torch.Generator().manual_seed(7)
    b, t, v, k = 3, 17, 11, 3
    target = torch.randint(0, v, (b, t), generator=g)  # the target's top token at position p: token p+1
    lm = (torch.rand(b, t, generator=g) < 0.8).to(torch.uint8)
    right = [torch.rand(b, t, generator=g) < 0.6 for _ in range(k)]  # is step s right at row i?

    class Head:
        def probs(self, x):
            arg = x[:, 0].long()
            return torch.nn.functional.one_hot(arg, v).float(), arg

    class Model:
        draft_to_target = torch.arange(v)

        def __call__(self, aux, ids_per_step, positions, rows):
            out = []
            for s, r in enumerate(rows):
                want = torch.zeros(b, t, dtype=torch.long)
                want[:, : t - s - 1] = target[:, s + 1 :]  # row i, step s predicts token i+s+2
                pred = torch.where(right[s], want, (want + 1) % v).flatten()[r]
                out.append(torch.nn.functional.one_hot(pred, v).float() * 10)
            return out

    last = torch.zeros(b, t, 2)
    last[..., 0] = target.float()
    batch = {
        "input_ids": torch.zeros(b, t, dtype=torch.long),
        "loss_mask": lm,
        "aux": torch.zeros(b, t, 6),
        "last": last,
    }
    _, st = ttt_loss(Model(), Head(), batch, k, 0.8, autocast=False)
    chain, counted, expect, judged = torch.ones(b, t, dtype=torch.bool), torch.ones(b, t, dtype=torch.bool), [], []
    for s in range(k):
        n = t - s - 2
        counted = counted[:, :n] & lm[:, s + 2 :].bool()
        chain = chain[:, :n] & right[s][:, :n] & counted
        expect.append(int(chain.sum()))
        judged.append(int(counted.sum()))
    assert st["chain"].tolist() == expect and expect[0] > expect[-1] > 0
    assert st["chain_count"].tolist() == judged and judged[-1] < st["count"][-1]
    assert st["correct"][0] == expect[0]
