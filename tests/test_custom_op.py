"""FlashfuseOp: eager calls take the direct path, traced calls the torch.library op, and neither silently
drops gradients (second-order gradients through an op with no double backward raise)."""

import pytest
import torch

import flashfuse
from flashfuse.ops.norm import _rms_norm_fwd


def test_eager_calls_skip_the_dispatcher(device):
    x = torch.randn(3, 8, device=device, requires_grad=True)
    w = torch.randn(8, device=device, requires_grad=True)
    y = flashfuse.rms_norm(x, w)
    node = y.grad_fn.next_functions[0][0]          # rms_norm returns a view of the op's (rows, hidden) output
    assert type(node).__name__.endswith("_eagerBackward")     # the plain autograd.Function
    with torch.no_grad():
        assert flashfuse.rms_norm(x, w).grad_fn is None
    # The registered custom op is the same computation.
    y_op, _, _ = torch.ops.flashfuse.rms_norm_fwd(x, None, w, 1e-6, 0.0, True)
    assert torch.equal(y, y_op)
    assert _rms_norm_fwd.custom_op is not None


@pytest.mark.parametrize("op", ["rms_norm", "flash_attn"])
def test_double_backward_raises_instead_of_dropping_terms(device, op):
    if op == "rms_norm":
        x = torch.randn(3, 8, device=device, requires_grad=True)
        out = flashfuse.rms_norm(x, torch.ones(8, device=device))
    else:
        x = torch.randn(1, 5, 2, 16, device=device, requires_grad=True)
        out = flashfuse.flash_attn_func(x, x, x)
    (g,) = torch.autograd.grad(out.square().sum(), x, create_graph=True)
    with pytest.raises(RuntimeError):
        g.square().sum().backward()


def test_rope_double_backward_is_supported(device):
    """The rotary backward is the op itself (the conjugate rotation), so it differentiates again."""
    x = torch.randn(1, 4, 2, 8, device=device, dtype=torch.float64 if device == "cpu" else torch.float32)
    x = x.float().requires_grad_(True)
    cos, sin = torch.rand(4, 4, device=device), torch.rand(4, 4, device=device)
    out = flashfuse.apply_rotary_emb(x, cos, sin)
    (g,) = torch.autograd.grad(out.square().sum(), x, create_graph=True)
    (gg,) = torch.autograd.grad(g.sum(), x)
    assert torch.isfinite(gg).all() and gg.abs().sum() > 0
