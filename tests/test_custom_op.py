"""FlashfuseOp: eager calls take the direct path, traced calls the torch.library op, and neither silently
drops gradients (second-order gradients through an op with no double backward raise)."""

import pytest
import torch

import flashfuse
from flashfuse.ops.norm import _rms_norm_fwd
from flashfuse.reference.rope import apply_rotary_emb_ref
from testing import rel_err


def test_vmap_and_dispatch_modes_take_the_custom_op(device):
    """vmap's batched tensors and Python dispatch modes go through the torch.library op (its vmap fallback,
    its name for FlopCounterMode / checkpoint policies); the kernels never see a wrapped tensor."""
    from torch.utils.flop_counter import FlopCounterMode

    w = torch.randn(8, device=device)
    xb = torch.randn(3, 4, 8, device=device)
    assert torch.equal(torch.vmap(lambda x: flashfuse.rms_norm(x, w))(xb), flashfuse.rms_norm(xb, w))
    with FlopCounterMode(display=False):
        assert torch.equal(flashfuse.rms_norm(xb, w), flashfuse.rms_norm(xb, w))


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


@pytest.mark.parametrize("op", ["rms_norm", "flash_attn", "flce"])
def test_double_backward_raises_instead_of_dropping_terms(device, op):
    if op == "flce":
        x = torch.randn(5, 8, device=device, requires_grad=True)
        weight, labels = torch.randn(11, 8, device=device), torch.randint(0, 11, (5,), device=device)
        with pytest.raises(RuntimeError, match="no double backward"):
            torch.autograd.grad(flashfuse.fused_linear_cross_entropy(x, weight, labels), x, create_graph=True)
        return
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
    """The rotary backward is the op itself (the conjugate rotation), so it differentiates again; the second
    derivative matches the float64 reference's."""
    x = torch.randn(1, 4, 2, 8, device=device, requires_grad=True)
    cos, sin = torch.rand(4, 4, device=device), torch.rand(4, 4, device=device)
    (g,) = torch.autograd.grad(flashfuse.apply_rotary_emb(x, cos, sin).square().sum(), x, create_graph=True)
    (gg,) = torch.autograd.grad(g.square().sum(), x)
    x64 = x.detach().double().requires_grad_(True)
    out64 = apply_rotary_emb_ref(x64, cos.double(), sin.double())
    (g64,) = torch.autograd.grad(out64.square().sum(), x64, create_graph=True)
    (gg64,) = torch.autograd.grad(g64.square().sum(), x64)
    assert rel_err(gg, gg64) < 1e-5
