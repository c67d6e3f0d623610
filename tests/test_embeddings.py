"""timestep_embedding, CPU tier: the fused kernel (Triton's interpreter) against the float64 reference within fp32's
conditioning (an argument t * freq of size ~1000 carries ~6e-5 of rounding in any fp32 evaluation, diffusers'
included), against diffusers' get_timestep_embedding within the same bound, odd dims, flips, shifts, scales, integer
and floating timesteps, strided input, the gradient in t, torch.compile, errors. GPU tier: test_embeddings_gpu.py."""

import math

import pytest
import torch

from flashfuse.ops.embeddings import timestep_embedding
from flashfuse.reference.embeddings import timestep_embedding_ref

EPS32 = 2.0 ** -24


def conditioning_bound(arg, dim, shift, max_period):
    """Per-column bound on |fp32 embedding - exact|. fp32 carries the exponent e_j = -ln(max_period) j / (dim // 2 -
    shift) with an absolute error of ~3 |e_j| ulps (-ln(max_period) is rounded, then two products), so freq_j and the
    argument a = scale t freq_j with a relative one of (3 |e_j| + 8) ulps; sin / cos add ~1 ulp of their value. An odd
    dim's padding column: exactly 0."""
    half = dim // 2
    j = torch.arange(half, dtype=torch.float64, device=arg.device)
    e = math.log(max_period) * j / (half - shift)
    per_arg = ((3 * e[None, :] + 8) * arg.abs() + 2) * EPS32
    return torch.cat([per_arg, per_arg, per_arg.new_zeros(arg.shape[0], dim % 2)], dim=1)


def check(t, dim, flip=False, shift=1.0, scale=1.0, max_period=10000):
    out = timestep_embedding(t, dim, flip, shift, scale, max_period)
    ref, arg = timestep_embedding_ref(t, dim, flip, shift, scale, max_period)
    assert out.shape == (t.shape[0], dim) and out.dtype == torch.float32 and out.is_contiguous()
    assert torch.isfinite(out).all()
    err = (out.double() - ref).abs()
    bound = conditioning_bound(arg, dim, shift, max_period)
    ratio = (err / bound.clamp_min(1e-30)).max().item()
    assert (err <= bound).all(), f"max err {err.max().item():.3e}, worst err / bound {ratio:.2f}"
    return out, ref, bound


CASES = [  # (dim, flip_sin_to_cos, downscale_freq_shift, scale): DiT / SD (256 / 320 with flip, shift 1 / 0), odd
    pytest.param(256, True, 1.0, 1.0, id="dit-256-flip"),
    pytest.param(320, True, 0.0, 1.0, id="sd-320-flip-shift0"),
    pytest.param(7, False, 1.0, 2.5, id="odd-7-scale"),
    pytest.param(1, False, 1.0, 1.0, id="dim1"),
    pytest.param(300, False, 0.5, 1000.0, id="300-scale1000"),
]


@pytest.mark.parametrize("dim, flip, shift, scale", CASES)
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.float32, torch.float16, torch.float64])
def test_timestep_embedding(device, dim, flip, shift, scale, dtype):
    t = (torch.rand(37, device=device) * 1000).to(dtype)
    check(t, dim, flip, shift, scale)


def test_matches_diffusers_within_the_bound(device):
    """diffusers' own fp32 result obeys the same bound, and ours is as close to it as that allows."""
    from diffusers.models.embeddings import get_timestep_embedding
    t = torch.randint(0, 1000, (33,), device=device)
    for dim, flip, shift in ((256, True, 1), (320, True, 0), (1280, False, 1), (9, False, 1)):
        out, ref, bound = check(t, dim, flip, shift)
        theirs = get_timestep_embedding(t, dim, flip, shift)
        assert ((theirs.double() - ref).abs() <= bound).all()
        assert ((out - theirs).abs().double() <= 2 * bound).all()


def test_strided_and_empty(device):
    t = (torch.rand(40, device=device) * 1000)[::3]
    check(t, 64, True)
    assert timestep_embedding(t[:0], 64).shape == (0, 64)
    assert timestep_embedding(torch.tensor([500.0, 1.0], device=device), 256, max_period=100).shape == (2, 256)


def test_gradient(device):
    t = (torch.rand(5, dtype=torch.float64, device=device) * 100).requires_grad_()
    w = torch.randn(5, 65, dtype=torch.float64, device=device)
    for flip in (False, True):
        out = timestep_embedding(t, 65, flip, 1.0, 1.5)
        (g,) = torch.autograd.grad((out.double() * w).sum(), t)
        tr = t.detach().clone().requires_grad_()
        ref, _ = timestep_embedding_ref(tr, 65, flip, 1.0, 1.5)
        (gr,) = torch.autograd.grad((ref * w).sum(), tr)
        assert g.dtype == t.dtype and torch.allclose(g, gr, rtol=1e-4, atol=1e-4), (g, gr)


def test_compile_fullgraph(device):
    t = torch.randint(0, 1000, (8,), device=device)
    fn = torch.compile(lambda x: timestep_embedding(x, 256, True) * 2, fullgraph=True, backend="aot_eager")
    assert torch.equal(fn(t), timestep_embedding(t, 256, True) * 2)


def test_errors(device):
    t = torch.arange(4, device=device)
    with pytest.raises(ValueError, match="timesteps must have 1 dimensions"):
        timestep_embedding(t[None], 8)
    with pytest.raises(TypeError, match="timesteps has dtype torch.bool"):
        timestep_embedding(t > 1, 8)
    with pytest.raises(ValueError, match="dim is 0"):
        timestep_embedding(t, 0)
    with pytest.raises(ValueError, match="downscale_freq_shift is 4"):
        timestep_embedding(t, 8, downscale_freq_shift=4)
    with pytest.raises(ValueError, match="max_period is -1"):
        timestep_embedding(t, 8, max_period=-1)
    with pytest.raises(ValueError, match="scale is nan"):
        timestep_embedding(t, 8, scale=float("nan"))
    with pytest.raises(TypeError, match="timesteps must be a torch.Tensor"):
        timestep_embedding([1, 2], 8)
