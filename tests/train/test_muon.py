"""Float32Muon: torch's Muon update with the orthogonalization in float32 (the CPU's fast path)."""

import torch

from eagle_batch.train.muon import Float32Muon, orthogonalize


def test_float32_muon_takes_torch_muons_steps():
    """Same start, same gradients, three steps: the weights move as torch's Muon moves them (torch
    orthogonalizes in bfloat16, so they agree to its precision), and the state dicts load into each other."""
    torch.manual_seed(0)
    w0 = torch.randn(48, 80)
    grads = [torch.randn(48, 80) for _ in range(3)]
    kw = dict(lr=0.02, weight_decay=0.1, momentum=0.95, adjust_lr_fn="match_rms_adamw")
    moved = []
    for cls in (torch.optim.Muon, Float32Muon):
        w = torch.nn.Parameter(w0.clone())
        opt = cls([w], **kw)
        for g in grads:
            w.grad = g.clone()
            opt.step()
        moved.append((w.detach() - w0, opt))
    (ref, torch_opt), (ours, our_opt) = moved
    assert ref.abs().max() > 1e-3  # the step is not a no-op
    assert torch.allclose(ours, ref, atol=0.02 * ref.abs().max().item()), (ours - ref).abs().max()
    fresh = Float32Muon([torch.nn.Parameter(w0.clone())], **kw)
    fresh.load_state_dict(torch_opt.state_dict())
    assert torch.equal(
        fresh.state_dict()["state"][0]["momentum_buffer"], torch_opt.state_dict()["state"][0]["momentum_buffer"]
    )


def test_orthogonalize_gives_near_unit_singular_values_in_float32():
    """Newton-Schulz's quintic iteration leaves the singular values near 1 (about 0.7-1.2, by design)
    for tall and wide matrices alike, and returns float32 of the input's shape."""
    torch.manual_seed(1)
    for shape in ((64, 192), (192, 64)):
        g = torch.randn(*shape, dtype=torch.bfloat16)
        x = orthogonalize(g, (3.4445, -4.775, 2.0315), steps=5, eps=1e-7)
        assert x.shape == g.shape and x.dtype == torch.float32
        s = torch.linalg.svdvals(x)
        assert 0.5 < s.min() and s.max() < 1.3, s
