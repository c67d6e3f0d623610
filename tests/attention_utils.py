"""Helpers shared by the FlashAttention tests: random inputs, layout conversions, varlen packing, the
references in each API's layout, and the error criterion (flash-attn's, plus a relative-error bound).

The error criterion, for the output and for every gradient x:

    max|x - ref| <= 2 * max|ref_lowprec - ref| + ATOL[dtype]       and       ||x - ref|| / ||ref|| <= REL[dtype]

``ref`` is the reference evaluated in float64 (CPU tier) or in float32 upcast (GPU tier, as flash-attn's
own tests do at S = 2048), ``ref_lowprec`` the same reference evaluated in the input dtype: the first
bound says the kernel may be at most twice as wrong as plain PyTorch in the input dtype is.
Gradients come from autograd through the reference on leaf copies of the inputs.
"""

from __future__ import annotations

import math
from typing import Callable

import pytest
import torch

from flashfuse.reference.attention import attention_ref

# atol: the absolute slack added to 2 x (low-precision reference error); it matters only where that error
# happens to be ~0 (e.g. S = 1, where out = v exactly). Values are O(1) (randn inputs; out, dq, dk, dv
# all have max |.| ~ 1..6 in these tests).
#   fp32: 1e-5 ~ 170 unit roundoffs (u = 6e-8) at magnitude 1: room for the kernel's different summation
#         order over <= 2048 terms (interpreter: exact fp32 numpy math; GPU: tf32x3 dots, ~fp32 accuracy).
#   fp16: 5e-4 = half an ulp at [1, 2): one extra final rounding of an O(1) value to fp16.
#   bf16: 4e-3 = half an ulp at [1, 2) in bf16 (8 mantissa bits).
ATOL = {torch.float32: 1e-5, torch.float16: 5e-4, torch.bfloat16: 4e-3}
# Relative (Frobenius) error bound, tiered by the unit roundoff u of the dtype. Kernels accumulate in
# fp32 and round only P (to feed the PV / dS dots) and the result, so they land near 1u..2u; the
# low-precision PyTorch reference measured ~3.5u (fp16: 1.7e-3, bf16: 1.4e-2) on these shapes.
#   fp32: 1e-5 (exact-fp32 interpreter ~4e-7 measured; tf32x3 on the GPU a few 1e-7); fp16: 2e-3 (~4u,
#   u = 4.9e-4); bf16: 1.6e-2 (~4u, u = 3.9e-3).
REL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
# Log-sum-exp (natural log, fp32 whatever the input dtype): kernel and fp32 reference each compute the
# scores in fp32, so both are off by a few fp32 ulps of the largest score, i.e. ~1e-6 * |lse|. ALiBi rows
# reach |lse| ~ 60 (measured on an H200: 1.2e-4 off at |lse| = 59, 2e-6 relative), so the bound scales with
# |lse|: 1e-4 + 4e-6 * |lse| still catches any scale, mask or base-2/base-e slip (those are >= 1e-2).
LSE_ATOL = 1e-4
LSE_RTOL = 4e-6


# ----------------------------------------------------------------------------------------------------
# Inputs and layouts
# ----------------------------------------------------------------------------------------------------

@pytest.fixture
def exact_fp32_reference():
    """For the GPU files' fp32 references (``pytestmark = pytest.mark.usefixtures("exact_fp32_reference")``, the
    fixture imported into the module): full fp32 matmuls, not TF32."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def rand(*shape, dtype, device, requires_grad=True, scale=1.0):
    """Standard-normal leaf tensor (times ``scale``)."""
    t = torch.randn(*shape, device=device, dtype=torch.float32) * scale
    return t.to(dtype).requires_grad_(requires_grad)


def rand_qkv(batch, seqlen_q, seqlen_k, nheads_q, nheads_k, headdim, *, dtype, device, requires_grad=True):
    """q (batch, seqlen_q, nheads_q, headdim); k, v (batch, seqlen_k, nheads_k, headdim): flash layout leaves."""
    q = rand(batch, seqlen_q, nheads_q, headdim, dtype=dtype, device=device, requires_grad=requires_grad)
    k = rand(batch, seqlen_k, nheads_k, headdim, dtype=dtype, device=device, requires_grad=requires_grad)
    v = rand(batch, seqlen_k, nheads_k, headdim, dtype=dtype, device=device, requires_grad=requires_grad)
    return q, k, v


def alibi_slopes(shape, device):
    """fp32 ALiBi slopes in [0.05, 1): from almost flat to very local attention."""
    return (torch.rand(*shape, device=device) * 0.95 + 0.05).float()


def with_alibi(opts, batch, nheads_q, device="cuda"):
    """Test-case options with ``"alibi": "h"`` / ``"bh"`` replaced by random slopes (nheads_q,) / (batch, nheads_q)."""
    opts = dict(opts)
    alibi = opts.pop("alibi", None)
    if alibi is not None:
        opts["alibi_slopes"] = alibi_slopes((nheads_q,) if alibi == "h" else (batch, nheads_q), device)
    return opts


def flash_to_sdpa(x):
    """(batch, seqlen, nheads, headdim) -> (batch, nheads, seqlen, headdim) (a view)."""
    return x.transpose(1, 2)


def sdpa_to_flash(x):
    """(batch, nheads, seqlen, headdim) -> (batch, seqlen, nheads, headdim) (a view)."""
    return x.transpose(1, 2)


# ----------------------------------------------------------------------------------------------------
# Varlen packing
# ----------------------------------------------------------------------------------------------------

def cu_seqlens(lens, device):
    """int32 (nseq + 1,) prefix sums [0, l0, l0 + l1, ...]."""
    out = torch.zeros(len(lens) + 1, dtype=torch.int32)
    out[1:] = torch.tensor(list(lens), dtype=torch.int64).cumsum(0).to(torch.int32)
    return out.to(device)


def random_lens(n, low, high, *, extra=(), generator=None):
    """n random lengths in [low, high) followed by ``extra`` (e.g. (1, 0) for the edge cases)."""
    lens = torch.randint(low, high, (n,), generator=generator).tolist()
    return lens + list(extra)


def pack(padded, lens):
    """(batch, max_len, ...) padded -> (sum(lens), ...) packed, keeping the first lens[b] rows of each b."""
    return torch.cat([padded[b, :n] for b, n in enumerate(lens)], dim=0)


def unpack(packed, cu, max_len):
    """(total, ...) packed -> (nseq, max_len, ...) zero padded."""
    cu = cu.tolist()
    out = packed.new_zeros(len(cu) - 1, max_len, *packed.shape[1:])
    for b in range(len(cu) - 1):
        out[b, : cu[b + 1] - cu[b]] = packed[cu[b]: cu[b + 1]]
    return out


# ----------------------------------------------------------------------------------------------------
# References, in each API's layout. Each computes in the dtype of its tensor arguments (compute_dtype=None),
# so the caller decides: float64 / float32 copies for the exact reference, the input dtype for ref_lowprec.
# Each returns (out, lse).
# ----------------------------------------------------------------------------------------------------

def flash_ref(q, k, v, **opts):
    """flash_attn_func semantics: (batch, seqlen, nheads, headdim) -> (out, lse (batch, nheads_q, seqlen_q))."""
    return attention_ref(q, k, v, compute_dtype=None, **opts)


def varlen_ref(q, k, v, cu_q, cu_k, *, alibi_slopes=None, dropout_mask=None, **opts):
    """flash_attn_varlen_func semantics, one attention_ref per sequence (options apply per sequence: causal
    and window bottom-right aligned with that sequence's own lengths).

    q: (total_q, nheads_q, headdim); k, v: (total_k, nheads_k, headdim); alibi_slopes (nheads_q,) or
    (nseq, nheads_q); dropout_mask (nseq, nheads_q, >= max len_q, >= max len_k).
    Returns out (total_q, nheads_q, headdim) and lse (nheads_q, total_q).
    """
    cu_q, cu_k = cu_q.tolist(), cu_k.tolist()
    outs, lses = [], []
    for b in range(len(cu_q) - 1):
        len_q, len_k = cu_q[b + 1] - cu_q[b], cu_k[b + 1] - cu_k[b]
        slopes = alibi_slopes if alibi_slopes is None or alibi_slopes.dim() == 1 else alibi_slopes[b: b + 1]
        mask = None if dropout_mask is None else dropout_mask[b: b + 1, :, :len_q, :len_k]
        out, lse = attention_ref(q[None, cu_q[b]: cu_q[b + 1]], k[None, cu_k[b]: cu_k[b + 1]],
                                 v[None, cu_k[b]: cu_k[b + 1]], alibi_slopes=slopes, dropout_mask=mask,
                                 compute_dtype=None, **opts)
        outs.append(out[0])
        lses.append(lse[0])
    return torch.cat(outs, dim=0), torch.cat(lses, dim=1)


def check_rows_past_last_sequence(device, padding, dtype, headdim, causal=True):
    """flash_attn_varlen_func over packed buffers with rows past cu_seqlens[-1] (q, k, v and dout filled with
    ``padding`` there): out 0 and lse +inf there, dq / dk / dv 0 there, and every sequence's out, lse and gradients
    free of NaN and equal to those of a call on the trimmed buffers (dq within one rounding: on Hopper it is summed by
    reduce-adds in no fixed order)."""
    from flashfuse import flash_attn_varlen_func

    lens_q, lens_k, pad_q, pad_k = [17, 1, 140], [20, 133, 9], 6, 75
    cu_q, cu_k = cu_seqlens(lens_q, device), cu_seqlens(lens_k, device)
    last_q, last_k = sum(lens_q), sum(lens_k)
    q = rand(last_q + pad_q, 4, headdim, dtype=dtype, device=device, requires_grad=False)
    k, v = (rand(last_k + pad_k, 2, headdim, dtype=dtype, device=device, requires_grad=False) for _ in range(2))
    dout = rand(*q.shape, dtype=dtype, device=device, requires_grad=False)
    for t, last in ((q, last_q), (k, last_k), (v, last_k), (dout, last_q)):
        t[last:] = padding

    def run(q, k, v, dout):
        q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
        out, lse, _ = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal,
                                             return_attn_probs=True)
        out.backward(dout)
        return out.detach(), lse, q.grad, k.grad, v.grad

    out, lse, dq, dk, dv = run(q, k, v, dout)
    assert (out[last_q:] == 0).all() and torch.isposinf(lse[:, last_q:]).all()
    assert (dq[last_q:] == 0).all() and (dk[last_k:] == 0).all() and (dv[last_k:] == 0).all()
    trimmed = run(q[:last_q], k[:last_k], v[:last_k], dout[:last_q])
    sequences = (out[:last_q], lse[:, :last_q], dq[:last_q], dk[:last_k], dv[:last_k])
    for name, full, part in zip(("out", "lse", "dq", "dk", "dv"), sequences, trimmed):
        assert not full.isnan().any(), name
        if name == "dq":
            torch.testing.assert_close(full, part, msg=name)
        else:
            assert torch.equal(full, part), name


def sdpa_ref(query, key, value, attn_mask=None, is_causal=False, scale=None, dropout_p=0.0, dropout_mask=None):
    """torch SDPA semantics (causal top-left) for (batch, nheads, seqlen, headdim) or (nheads, seqlen, headdim).
    Returns (out in the input layout, lse (batch, nheads, seqlen_q) or (nheads, seqlen_q))."""
    three_d = query.dim() == 3
    if three_d:
        query, key, value = query[None], key[None], value[None]
        dropout_mask = None if dropout_mask is None else dropout_mask[None]
    out, lse = attention_ref(sdpa_to_flash(query), sdpa_to_flash(key), sdpa_to_flash(value),
                             softmax_scale=scale, causal=is_causal, attn_bias=attn_mask, dropout_p=dropout_p,
                             dropout_mask=dropout_mask, bottom_right=False, compute_dtype=None)
    out = flash_to_sdpa(out)
    return (out[0], lse[0]) if three_d else (out, lse)


# ----------------------------------------------------------------------------------------------------
# The error criterion
# ----------------------------------------------------------------------------------------------------

def _where(x, flat_index):
    return tuple(int(i) for i in torch.unravel_index(torch.tensor(flat_index), x.shape))


def assert_finite(name, x):
    bad = ~torch.isfinite(x)
    if bad.any():
        first = _where(x, int(bad.flatten().nonzero()[0]))
        raise AssertionError(f"{name}: {int(bad.sum())} NaN/Inf values of {x.numel()} (first at {first}: "
                             f"{x[first].item()})")


def assert_close_to_ref(name, x, ref, ref_lowprec, *, atol=None, rel=None):
    """flash-attn's criterion max|x - ref| <= 2 * max|ref_lowprec - ref| + atol, and the relative error
    ||x - ref|| / ||ref|| <= rel (atol and rel default to ATOL / REL for x's dtype). ``name`` says which
    tensor failed. x and ref_lowprec have the input dtype; ref is float64 (or fp32 upcast)."""
    atol = ATOL[x.dtype] if atol is None else atol
    rel = REL[x.dtype] if rel is None else rel
    assert x.shape == ref.shape, f"{name}: shape {tuple(x.shape)}, reference {tuple(ref.shape)}"
    assert x.dtype == ref_lowprec.dtype, f"{name}: dtype {x.dtype}, expected the input dtype {ref_lowprec.dtype}"
    assert_finite(name, x)
    if x.numel() == 0:
        return
    err = (x.to(ref.dtype) - ref).abs()
    err_low = (ref_lowprec.to(ref.dtype) - ref).abs().max().item()
    bound = 2 * err_low + atol
    worst = int(err.flatten().argmax())
    where = _where(err, worst)
    max_err = err.flatten()[worst].item()
    assert max_err <= bound, (
        f"{name}: max|{name} - ref| = {max_err:.3e} > 2 * max|ref_lowprec - ref| + atol = "
        f"2 * {err_low:.3e} + {atol:.1e} = {bound:.3e}; worst at {where}: got {x[where].item():.6g}, "
        f"ref {ref[where].item():.6g}, ref_lowprec {ref_lowprec[where].item():.6g}")
    # The relative error of a tensor that is ~0 everywhere (e.g. dq where each row sees one key, so the
    # softmax has no gradient) is rounding noise over zero: the max-abs bound above covers those.
    ref_norm = ref.norm().item()
    if ref_norm <= atol * math.sqrt(ref.numel()):
        return
    rel_err = err.norm().item() / ref_norm
    assert rel_err <= rel, (f"{name}: relative error ||{name} - ref|| / ||ref|| = {rel_err:.3e} > {rel:.1e} "
                            f"({x.dtype}); max abs error {max_err:.3e} at {where}")


def assert_lse_close(lse, ref_lse, *, atol=LSE_ATOL):
    """lse: fp32 natural log, +inf exactly where the reference row sees no key."""
    assert lse.dtype == torch.float32, f"softmax_lse: dtype {lse.dtype}, expected torch.float32"
    assert lse.shape == ref_lse.shape, f"softmax_lse: shape {tuple(lse.shape)}, expected {tuple(ref_lse.shape)}"
    assert not torch.isnan(lse).any(), "softmax_lse: NaN"
    ref_lse = ref_lse.to(lse.device)
    empty = torch.isposinf(ref_lse)
    assert torch.equal(torch.isposinf(lse), empty), (
        f"softmax_lse: +inf at {int(torch.isposinf(lse).sum())} rows, expected exactly at the "
        f"{int(empty.sum())} rows with no visible key")
    if (~empty).any():
        ref_seen = ref_lse[~empty].double()
        excess = (lse[~empty].double() - ref_seen).abs() - (atol + LSE_RTOL * ref_seen.abs())
        worst = int(excess.argmax())
        err = (lse[~empty].double() - ref_seen).abs()[worst].item()
        assert excess[worst] <= 0, (f"softmax_lse: |lse - ref| = {err:.3e} at |ref| = {ref_seen[worst].abs():.1f} "
                                    f"> {atol:.1e} + {LSE_RTOL:.0e} * |ref|")


def assert_zero_rows(name, x, empty):
    """x[empty] (rows with no visible key) must be exactly 0. empty: bool, x.shape[:empty.dim()]."""
    if empty.any():
        vals = x[empty.to(x.device)]
        assert torch.all(vals == 0), (f"{name}: rows with no visible key must be exactly 0, max |.| = "
                                      f"{vals.abs().max().item():.3e} over {int(empty.sum())} rows")


# ----------------------------------------------------------------------------------------------------
# Running a kernel and its references
# ----------------------------------------------------------------------------------------------------

def grads_of(out, inputs: dict, dout):
    """{name: d(sum(out * dout)) / d inputs[name]}."""
    grads = torch.autograd.grad(out, list(inputs.values()), dout)
    return dict(zip(inputs, grads))


def reference_run(ref_fn: Callable, inputs: dict, dout, dtype):
    """ref_fn(**copies) on leaf copies of ``inputs`` cast to ``dtype`` (None: the inputs' own dtype);
    returns (out, lse, {name: grad})."""
    leaves = {n: t.detach().to(dtype or t.dtype).requires_grad_(True) for n, t in inputs.items()}
    out, lse = ref_fn(**leaves)
    grads = grads_of(out, leaves, dout.to(out.dtype))
    return out.detach(), lse.detach(), {n: g.detach() for n, g in grads.items()}


def check_attention(ref_fn: Callable, inputs: dict, out, *, lse=None, ref_dtype=torch.float64, dout=None):
    """The whole check for one call: ``out`` = kernel(**inputs) (inputs: leaves that require grad) against
    ref_fn(**inputs) (a (out, lse) reference that computes in its arguments' dtype): out and every gradient
    by the error criterion, lse (if given) by assert_lse_close, no NaN/Inf anywhere.
    Returns (kernel grads, exact reference (out, lse, grads))."""
    if dout is None:
        dout = torch.randn_like(out)
    grads = grads_of(out, inputs, dout)
    exact = reference_run(ref_fn, inputs, dout, ref_dtype)
    low = reference_run(ref_fn, inputs, dout, None)
    assert_close_to_ref("out", out.detach(), exact[0], low[0])
    for name in inputs:
        assert grads[name].dtype == inputs[name].dtype, f"d{name}: dtype {grads[name].dtype}"
        assert_close_to_ref(f"d{name}", grads[name], exact[2][name], low[2][name])
    if lse is not None:
        assert_lse_close(lse, exact[1])
    return grads, exact


def no_key_rows_flash(ref_lse):
    """(batch, nheads, seqlen_q) reference lse -> bool (batch, seqlen_q, nheads): rows that see no key."""
    return torch.isposinf(ref_lse).transpose(1, 2)


def no_key_rows_varlen(ref_lse):
    """(nheads, total_q) reference lse -> bool (total_q, nheads)."""
    return torch.isposinf(ref_lse).t()


def dropout_mask_for(seed, device, batch, nheads_q, seqlen_q, seqlen_k, dropout_p):
    """The keep-mask (batch, nheads_q, seqlen_q, seqlen_k) of a call made right after torch.manual_seed(seed):
    the public functions draw new_rng_state(device) exactly once per call (the contract)."""
    from flashfuse.ops.attention.dropout import dropout_mask, new_rng_state

    torch.manual_seed(seed)
    rng = new_rng_state(device)
    return dropout_mask(rng, batch, nheads_q, seqlen_q, seqlen_k, dropout_p)


def causal_window(window_size, causal):
    """The (left, right) window flash-attn uses: causal forces right = 0."""
    return (window_size[0], 0) if causal else tuple(window_size)


def default_scale(headdim):
    return 1.0 / math.sqrt(headdim)


def varlen_lens(seed):
    """Five sequences with random lengths in [2, 60) except: a query of length 1 (random keys), keys of
    length 1 (random queries), and an empty sequence (0, 0). q and k lengths differ per sequence."""
    g = torch.Generator().manual_seed(seed)
    rq = torch.randint(2, 60, (3,), generator=g).tolist()
    rk = torch.randint(2, 60, (4,), generator=g).tolist()
    return [rq[0], 1, rq[1], 0, rq[2]], [rk[0], rk[1], 1, 0, rk[2]]


def varlen_inputs(lens_q, lens_k, nheads_q, nheads_k, headdim, dtype, device):
    """Packed varlen q, k, v (total, heads, headdim) and their int32 cu_seqlens."""
    q = rand(sum(lens_q), nheads_q, headdim, dtype=dtype, device=device)
    k = rand(sum(lens_k), nheads_k, headdim, dtype=dtype, device=device)
    v = rand(sum(lens_k), nheads_k, headdim, dtype=dtype, device=device)
    return q, k, v, cu_seqlens(lens_q, device), cu_seqlens(lens_k, device)


def expand_options(opts, device, batch, nheads_q):
    """Test-case options -> keyword arguments shared by the kernel and the reference ("alibi": "h" gives
    slopes (nheads_q,), "bh" gives (batch, nheads_q))."""
    opts = dict(opts)
    alibi = opts.pop("alibi", None)
    if alibi is not None:
        opts["alibi_slopes"] = alibi_slopes((nheads_q,) if alibi == "h" else (batch, nheads_q), device)
    return opts
