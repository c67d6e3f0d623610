"""FlashAttention API, CPU tier: every option and every gradient against the float64 reference, on small
odd shapes (Triton's interpreter on CPU tensors; the same tests run compiled on a GPU machine).

Parametrizations are pairwise, not cartesian: each option appears with odd shapes (S in {1, 17, 77, 131},
D in {16, 40, 64, 96}, seqlen_q != seqlen_k both ways), with fp32 and at least once with fp16; bf16 where
cheap. The error criterion (attention_utils.check_attention) is flash-attn's, for out and dq, dk, dv.
"""

from functools import partial

import pytest
import torch

from attention_utils import (alibi_slopes, expand_options, assert_finite, assert_zero_rows, check_attention,
                             check_rows_past_last_sequence, cu_seqlens,
                             dropout_mask_for, flash_ref, no_key_rows_flash, no_key_rows_varlen, pack, rand,
                             rand_qkv, sdpa_ref, sdpa_to_flash, unpack, varlen_inputs, varlen_lens, varlen_ref)
from flashfuse import (flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func,
                       flash_attn_varlen_func, flash_attn_varlen_kvpacked_func,
                       flash_attn_varlen_qkvpacked_func, scaled_dot_product_attention)
from flashfuse.ops.attention import flash_fwd

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16


def _split_result(result, with_lse):
    """flash_attn_* returns out, or (out, softmax_lse, None) with return_attn_probs=True."""
    if not with_lse:
        assert isinstance(result, torch.Tensor), f"expected a tensor, got {type(result).__name__}"
        return result, None
    assert isinstance(result, tuple) and len(result) == 3, "return_attn_probs=True must give (out, lse, None)"
    assert result[2] is None, "the third element (attention probabilities) must be None"
    return result[0], result[1]


# ----------------------------------------------------------------------------------------------------
# flash_attn_func: every option, every gradient
# ----------------------------------------------------------------------------------------------------

# (batch, seqlen_q, seqlen_k, nheads_q, nheads_k, headdim, dtype, options, return_attn_probs)
FLASH_CASES = [
    pytest.param(1, 1, 1, 2, 2, 16, F32, {}, True, id="s1-fp32-d16"),
    pytest.param(2, 1, 77, 2, 1, 40, F16, {"causal": True}, True, id="sq1-causal-mqa-fp16-d40"),
    pytest.param(1, 17, 1, 2, 2, 64, F32, {"causal": True}, True, id="sk1-causal-nokey-fp32-d64"),
    pytest.param(2, 17, 17, 2, 2, 40, F16, {}, False, id="mha-fp16-d40"),
    pytest.param(1, 77, 131, 4, 1, 64, F32, {"causal": True}, False, id="causal-sq<sk-mqa-fp32-d64"),
    pytest.param(1, 131, 77, 4, 2, 96, F16, {"causal": True}, True, id="causal-sq>sk-gqa-fp16-d96"),
    pytest.param(2, 77, 77, 2, 2, 64, F16, {"window_size": (16, 8)}, False, id="window-fp16-d64"),
    pytest.param(1, 17, 131, 2, 2, 40, F32, {"window_size": (-1, 5)}, True, id="window-right-only-fp32-d40"),
    pytest.param(1, 131, 17, 2, 1, 16, F16, {"window_size": (7, -1)}, True, id="window-left-only-mqa-fp16-d16"),
    pytest.param(1, 77, 17, 2, 2, 96, F32, {"causal": True, "window_size": (9, -1)}, True,
                 id="window-causal-nokey-fp32-d96"),
    pytest.param(1, 77, 77, 2, 2, 40, F32, {"softcap": 2.5, "softmax_scale": 0.5}, False,
                 id="softcap-scale-fp32-d40"),
    pytest.param(2, 17, 77, 2, 2, 64, F16, {"softcap": 3.0, "softmax_scale": 0.4, "causal": True}, True,
                 id="softcap-causal-fp16-d64"),
    pytest.param(1, 131, 131, 4, 4, 16, F32, {"alibi": "h"}, True, id="alibi-h-fp32-d16"),
    pytest.param(2, 77, 131, 2, 1, 40, F16, {"alibi": "bh", "causal": True}, False,
                 id="alibi-bh-causal-mqa-fp16-d40"),
    pytest.param(1, 17, 17, 4, 2, 96, F16, {"alibi": "h", "window_size": (3, 3), "softcap": 4.0}, True,
                 id="alibi-window-softcap-gqa-fp16-d96"),
    pytest.param(1, 17, 77, 2, 1, 64, BF16, {"window_size": (20, 4)}, True, id="window-mqa-bf16-d64"),
    pytest.param(2, 131, 17, 2, 2, 40, BF16, {}, False, id="mha-bf16-d40"),
    # Head dims that need padding inside the kernel, and the ends of 1..256.
    pytest.param(1, 37, 113, 2, 2, 59, F16, {"causal": True}, True, id="causal-fp16-d59"),
    pytest.param(1, 113, 37, 2, 1, 111, F32, {"window_size": (10, 10)}, False, id="window-mqa-fp32-d111"),
    pytest.param(1, 17, 17, 2, 2, 1, F32, {"window_size": (0, 0)}, True, id="diagonal-window-fp32-d1"),
    pytest.param(1, 17, 37, 2, 1, 256, F16, {"softcap": 2.0, "alibi": "h"}, False, id="softcap-alibi-mqa-fp16-d256"),
]


@pytest.mark.parametrize("batch, seqlen_q, seqlen_k, nheads_q, nheads_k, headdim, dtype, opts, with_lse",
                         FLASH_CASES)
def test_flash_attn_func(device, batch, seqlen_q, seqlen_k, nheads_q, nheads_k, headdim, dtype, opts, with_lse):
    q, k, v = rand_qkv(batch, seqlen_q, seqlen_k, nheads_q, nheads_k, headdim, dtype=dtype, device=device)
    opts = expand_options(opts, device, batch, nheads_q)
    out, lse = _split_result(flash_attn_func(q, k, v, return_attn_probs=with_lse, **opts), with_lse)
    assert out.shape == q.shape and out.dtype == dtype
    grads, (_, ref_lse, _) = check_attention(partial(flash_ref, **opts), {"q": q, "k": k, "v": v}, out, lse=lse)
    empty = no_key_rows_flash(ref_lse)
    assert_zero_rows("out", out.detach(), empty)
    assert_zero_rows("dq", grads["q"], empty)


@pytest.mark.parametrize("batch, seqlen_q, seqlen_k, nheads_q, nheads_k, headdim, dtype, opts", [
    pytest.param(1, 77, 17, 2, 2, 40, F32, {"window_size": (4, 2)}, id="window-fp32"),
    pytest.param(2, 131, 17, 2, 1, 16, F16, {"causal": True}, id="causal-sq>sk-mqa-fp16"),
    pytest.param(2, 77, 17, 4, 2, 64, F16, {"window_size": (2, 3), "alibi": "bh", "softcap": 3.0},
                 id="window-alibi-softcap-gqa-fp16"),
])
def test_rows_without_visible_key(device, batch, seqlen_q, seqlen_k, nheads_q, nheads_k, headdim, dtype, opts):
    """seqlen_q > seqlen_k with a bounded right edge: the first rows' windows end before key 0.
    Those rows: out exactly 0, lse +inf, dq exactly 0; no NaN anywhere (out and every gradient)."""
    q, k, v = rand_qkv(batch, seqlen_q, seqlen_k, nheads_q, nheads_k, headdim, dtype=dtype, device=device)
    opts = expand_options(opts, device, batch, nheads_q)
    out, lse, _ = flash_attn_func(q, k, v, return_attn_probs=True, **opts)
    grads, (_, ref_lse, _) = check_attention(partial(flash_ref, **opts), {"q": q, "k": k, "v": v}, out, lse=lse)
    empty = no_key_rows_flash(ref_lse)
    assert empty.any() and not empty.all(), "test set-up: some rows (not all) must see no key"
    assert torch.isposinf(lse.transpose(1, 2)[empty.to(lse.device)]).all()
    assert_zero_rows("out", out.detach(), empty)
    assert_zero_rows("dq", grads["q"], empty)
    for name, g in grads.items():
        assert_finite(f"d{name}", g)


# ----------------------------------------------------------------------------------------------------
# Dropout: the mask is rebuilt from the seed (the public function draws new_rng_state once per call)
# ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("batch, seqlen_q, seqlen_k, nheads_q, nheads_k, headdim, dtype, dropout_p, opts", [
    pytest.param(1, 77, 131, 2, 1, 40, F32, 0.17, {"causal": True}, id="causal-mqa-fp32"),
    pytest.param(2, 131, 77, 2, 2, 16, F16, 0.3, {}, id="sq>sk-fp16"),
    pytest.param(1, 37, 77, 2, 1, 72, F16, 0.2, {}, id="split-head-dim-d72-fp16"),
    pytest.param(1, 17, 17, 4, 2, 64, F16, 0.5, {"window_size": (4, 4), "alibi": "h", "softcap": 3.0},
                 id="window-alibi-softcap-gqa-fp16"),
])
def test_flash_attn_dropout(device, batch, seqlen_q, seqlen_k, nheads_q, nheads_k, headdim, dtype, dropout_p,
                            opts):
    """Forward and backward (which regenerates the mask) against the reference given the same mask; lse
    ignores dropout."""
    q, k, v = rand_qkv(batch, seqlen_q, seqlen_k, nheads_q, nheads_k, headdim, dtype=dtype, device=device)
    opts = expand_options(opts, device, batch, nheads_q)
    seed = 2024
    torch.manual_seed(seed)
    out, lse, _ = flash_attn_func(q, k, v, dropout_p=dropout_p, return_attn_probs=True, **opts)
    mask = dropout_mask_for(seed, device, batch, nheads_q, seqlen_q, seqlen_k, dropout_p)
    ref_fn = partial(flash_ref, dropout_p=dropout_p, dropout_mask=mask, **opts)
    check_attention(ref_fn, {"q": q, "k": k, "v": v}, out, lse=lse)


def test_dropout_rng_reproducible(device):
    """Same seed -> bit-identical output; the next call (generator advanced) -> a different mask."""
    q, k, v = rand_qkv(1, 17, 37, 2, 2, 16, dtype=F32, device=device, requires_grad=False)
    torch.manual_seed(5)
    first = flash_attn_func(q, k, v, dropout_p=0.5)
    second = flash_attn_func(q, k, v, dropout_p=0.5)
    torch.manual_seed(5)
    again = flash_attn_func(q, k, v, dropout_p=0.5)
    assert torch.equal(first, again), "same seed must give the same dropout mask"
    assert not torch.equal(first, second), "consecutive calls must draw new dropout masks"


def test_dropout_kept_fraction(device):
    """Read the kernel's own mask back: with q = 0 every probability is 1 / seqlen_k, and with v = the
    identity (headdim = seqlen_k) out[b, i, h, j] = keep[b, h, i, j] / ((1 - p) * seqlen_k). The mask
    equals dropout_mask(...) and keeps a fraction 1 - p of the 2 * 2 * 128 * 64 = 32768 entries."""
    batch, nheads, seqlen_q, seqlen_k, p = 2, 2, 128, 64, 0.3
    q = torch.zeros(batch, seqlen_q, nheads, seqlen_k, device=device)
    k = torch.randn(batch, seqlen_k, nheads, seqlen_k, device=device)
    v = torch.eye(seqlen_k, device=device)[None, :, None, :].expand(batch, seqlen_k, nheads, seqlen_k)
    torch.manual_seed(7)
    out = flash_attn_func(q, k, v, dropout_p=p)
    kept = out.transpose(1, 2) * ((1 - p) * seqlen_k)                         # (B, H, Sq, Sk), 0 or 1
    assert ((kept - kept.round()).abs() < 1e-4).all(), "out must be keep / ((1 - p) * seqlen_k)"
    keep = kept.round().bool()
    assert torch.equal(keep, dropout_mask_for(7, device, batch, nheads, seqlen_q, seqlen_k, p))
    fraction, n = keep.float().mean().item(), keep.numel()
    sigma = (p * (1 - p) / n) ** 0.5                                           # binomial std: 0.0025
    assert abs(fraction - (1 - p)) < 6 * sigma, f"kept fraction {fraction:.4f}, expected {1 - p} +- {6 * sigma:.4f}"
    # Masks differ between heads, batch entries and rows (the counters include b, h, i, j).
    assert not torch.equal(keep[0, 0], keep[0, 1]) and not torch.equal(keep[0, 0], keep[1, 0])
    assert not torch.equal(keep[0, 0, 0], keep[0, 0, 1])


@pytest.mark.parametrize("dropout_p", [0.1, 0.6])
def test_dropout_mask_fraction(device, dropout_p):
    """dropout_mask on 2 * 3 * 128 * 96 = 73728 entries keeps 1 - p of them (6 binomial sigmas: <= 0.011)."""
    mask = dropout_mask_for(11, device, 2, 3, 128, 96, dropout_p)
    assert mask.dtype == torch.bool and mask.shape == (2, 3, 128, 96)
    fraction, n = mask.float().mean().item(), mask.numel()
    sigma = (dropout_p * (1 - dropout_p) / n) ** 0.5
    assert abs(fraction - (1 - dropout_p)) < 6 * sigma, f"kept fraction {fraction:.4f}, expected {1 - dropout_p}"
    # No column or row pattern: the kept fraction of each (b, h) block is also near 1 - p.
    per_block = mask.float().mean(dim=(2, 3))
    block_sigma = (dropout_p * (1 - dropout_p) / (128 * 96)) ** 0.5
    assert ((per_block - (1 - dropout_p)).abs() < 6 * block_sigma).all()



@pytest.mark.parametrize("seed, batch, nheads, seqlen_q, seqlen_k, dropout_p", [
    (3, 1, 2, 77, 131, 0.1), (5, 2, 1, 17, 40, 0.6), (9, 1, 3, 130, 33, 0.999999)])
def test_dropout_mask_definition(device, seed, batch, nheads, seqlen_q, seqlen_k, dropout_p):
    """dropout_mask (the Triton kernels' per-score draw) is the definition in dropout.py's docstring, written in plain
    PyTorch (reference_dropout_mask): same groups, counters, words, bytes and threshold; dropout_p near 1 clamps to
    255 (a score is kept iff its 8 bits are all ones)."""
    from flashfuse.ops.attention.dropout import dropout_mask, new_rng_state, reference_dropout_mask

    torch.manual_seed(seed)
    rng = new_rng_state(device)
    got = dropout_mask(rng, batch, nheads, seqlen_q, seqlen_k, dropout_p)
    assert torch.equal(got, reference_dropout_mask(rng, batch, nheads, seqlen_q, seqlen_k, dropout_p))


def test_dropout_mask_group_independence(device):
    """The sixteen scores of a group come from one Philox call: neighbours within a group (j, j + 1), (j, j + 8),
    (i, i + 1) and (i, i + 8) agree as often as independent draws would, p^2 + (1 - p)^2 (6 sigmas over ~64K pairs
    each)."""
    p = 0.4
    mask = dropout_mask_for(13, device, 2, 4, 256, 128, p).float()
    expected = p * p + (1 - p) * (1 - p)
    pairs = {"j, j+1": (mask[..., 0::2], mask[..., 1::2]),
             "j, j+8": (mask[..., (torch.arange(128) % 16) < 8], mask[..., (torch.arange(128) % 16) >= 8]),
             "i, i+1": (mask[:, :, 0::2], mask[:, :, 1::2]),
             "i, i+8": (mask[:, :, (torch.arange(256) % 16) < 8], mask[:, :, (torch.arange(256) % 16) >= 8])}
    for name, (a, b) in pairs.items():
        agree, n = (a == b).float().mean().item(), a.numel()
        sigma = (expected * (1 - expected) / n) ** 0.5
        assert abs(agree - expected) < 6 * sigma, f"{name}: agree {agree:.4f}, expected {expected:.4f}"

# ----------------------------------------------------------------------------------------------------
# deterministic=True, strided inputs
# ----------------------------------------------------------------------------------------------------

def test_flash_attn_deterministic(device):
    """Two backward runs bit-identical (GQA: dk/dv reduced over the head group; dropout regenerated).
    deterministic=False: in the interpreter the same computation (no atomics); on Hopper the Gluon backward, whose dQ
    reduce-adds land in any order: out bit-identical (same mask), gradients normwise within a few fp16 ulps."""
    q, k, v = rand_qkv(1, 37, 77, 4, 2, 64, dtype=F16, device=device)
    dout = torch.randn_like(q)

    def run(deterministic):
        torch.manual_seed(3)
        out = flash_attn_func(q, k, v, dropout_p=0.2, causal=True, deterministic=deterministic)
        return (out,) + torch.autograd.grad(out, (q, k, v), dout)

    first, second, nondet = run(True), run(True), run(False)
    for name, a, b, c in zip(("out", "dq", "dk", "dv"), first, second, nondet):
        assert_finite(name, a)
        assert torch.equal(a, b), f"{name}: two runs with deterministic=True differ"
        if name == "out" or device == "cpu":
            assert torch.equal(a, c), f"{name}: deterministic=False differs from deterministic=True"
        else:
            rel = ((a.float() - c.float()).norm() / a.float().norm()).item()
            assert rel < 4e-3, f"{name}: deterministic=False differs from deterministic=True by {rel:.2e}"


@pytest.mark.parametrize("layout", ["qkv-packed-dim", "bhsd-memory", "fused-projection-gqa"])
def test_strided_inputs(device, layout):
    """q, k, v as strided views (last dim contiguous) of one buffer, passed without .contiguous();
    gradients flow back into the buffer."""
    batch, seqlen, headdim = 2, 37, 40
    if layout == "qkv-packed-dim":                 # (B, S, 3, H, D), the qkvpacked layout
        inputs = {"qkv": rand(batch, seqlen, 3, 2, headdim, dtype=F16, device=device)}

        def views(qkv):
            return qkv.unbind(2)
        opts = {"causal": True}
    elif layout == "bhsd-memory":                  # (B, H, S, D) tensors seen as (B, S, H, D)
        inputs = {n: rand(batch, 2, seqlen, headdim, dtype=F32, device=device) for n in "qkv"}

        def views(q, k, v):
            return sdpa_to_flash(q), sdpa_to_flash(k), sdpa_to_flash(v)
        opts = {"window_size": (5, 9)}
    else:                                          # one projection (B, S, Hq + 2 Hk, D), Hq = 4, Hk = 2
        inputs = {"qkv": rand(batch, seqlen, 8, headdim, dtype=F32, device=device)}

        def views(qkv):
            return qkv[:, :, :4], qkv[:, :, 4:6], qkv[:, :, 6:]
        opts = {"softcap": 2.0}
    q, k, v = views(**inputs)
    assert not q.is_contiguous() and not k.is_contiguous() and not v.is_contiguous()
    out = flash_attn_func(q, k, v, **opts)

    def ref_fn(**tensors):
        return flash_ref(*views(**tensors), **opts)
    check_attention(ref_fn, inputs, out)


@pytest.mark.parametrize("kind", ["transposed", "expanded"])
def test_noncontiguous_dout(device, kind):
    """The gradient of the output arrives with odd strides: transposed memory, or stride 0 everywhere
    (the gradient of out.sum())."""
    q, k, v = rand_qkv(2, 17, 37, 2, 2, 40, dtype=F16, device=device)
    out = flash_attn_func(q, k, v, causal=True)
    if kind == "transposed":
        dout = torch.randn(2, 2, 17, 40, device=device).to(F16).transpose(1, 2)
    else:
        dout = torch.ones((), device=device, dtype=F16).expand(out.shape)
    assert not dout.is_contiguous()
    check_attention(partial(flash_ref, causal=True), {"q": q, "k": k, "v": v}, out, dout=dout)


def test_expanded_batch_kv(device):
    """k, v shared by every batch entry through expand() (batch stride 0); their gradients sum over the batch."""
    q = rand(3, 17, 4, 64, dtype=F32, device=device)
    k0 = rand(1, 37, 2, 64, dtype=F32, device=device)
    v0 = rand(1, 37, 2, 64, dtype=F32, device=device)
    out = flash_attn_func(q, k0.expand(3, -1, -1, -1), v0.expand(3, -1, -1, -1), window_size=(-1, 8))

    def ref_fn(q, k0, v0):
        return flash_ref(q, k0.expand(3, -1, -1, -1), v0.expand(3, -1, -1, -1), window_size=(-1, 8))
    check_attention(ref_fn, {"q": q, "k0": k0, "v0": v0}, out)


def test_grad_for_some_inputs(device):
    """Only q requires grad (k, v frozen): dq is right; and under no_grad the forward alone is right."""
    q = rand(1, 37, 2, 16, dtype=F16, device=device)
    k, v = (rand(1, 17, 2, 16, dtype=F16, device=device, requires_grad=False) for _ in range(2))
    out = flash_attn_func(q, k, v, softcap=3.0)
    check_attention(lambda q: flash_ref(q, k, v, softcap=3.0), {"q": q}, out)
    with torch.no_grad():
        again = flash_attn_func(q, k, v, softcap=3.0)
    assert not again.requires_grad and torch.equal(again, out.detach())


# ----------------------------------------------------------------------------------------------------
# Varlen
# ----------------------------------------------------------------------------------------------------

# (seed for the lengths, nheads_q, nheads_k, headdim, dtype, options, extra max_seqlen, return_attn_probs)
@pytest.mark.parametrize("seed, nheads_q, nheads_k, headdim, dtype, opts, extra_max, with_lse", [
    pytest.param(1, 4, 2, 40, F32, {"causal": True}, 0, True, id="causal-gqa-fp32-d40"),
    pytest.param(2, 2, 2, 64, F16, {"window_size": (8, 4), "alibi": "bh"}, 0, False, id="window-alibi-bh-fp16-d64"),
    pytest.param(3, 4, 1, 16, F16, {"softcap": 2.0, "softmax_scale": 0.6}, 7, True,
                 id="softcap-mqa-maxbound-fp16-d16"),
    pytest.param(4, 2, 2, 96, BF16, {"alibi": "h", "causal": True}, 0, True, id="alibi-causal-bf16-d96"),
])
def test_flash_attn_varlen_func(device, seed, nheads_q, nheads_k, headdim, dtype, opts, extra_max, with_lse):
    """Packed sequences of random lengths (incl. 1 and 0; q and k lengths differ); per-sequence causal /
    window alignment and ALiBi (nseq, nheads_q). extra_max > 0 passes max_seqlen as an upper bound, not
    the exact maximum (flash-attn allows that)."""
    lens_q, lens_k = varlen_lens(seed)
    q, k, v, cu_q, cu_k = varlen_inputs(lens_q, lens_k, nheads_q, nheads_k, headdim, dtype, device)
    opts = expand_options(opts, device, len(lens_q), nheads_q)
    result = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q) + extra_max, max(lens_k) + extra_max,
                                    return_attn_probs=with_lse, **opts)
    out, lse = _split_result(result, with_lse)
    assert out.shape == q.shape and out.dtype == dtype
    if with_lse:
        assert lse.shape == (nheads_q, sum(lens_q)), f"varlen lse shape {tuple(lse.shape)}"
    ref_fn = partial(varlen_ref, cu_q=cu_q, cu_k=cu_k, **opts)
    grads, (_, ref_lse, _) = check_attention(ref_fn, {"q": q, "k": k, "v": v}, out, lse=lse)
    empty = no_key_rows_varlen(ref_lse)
    assert_zero_rows("out", out.detach(), empty)
    assert_zero_rows("dq", grads["q"], empty)


def test_varlen_empty_sides(device):
    """Sequences with no keys (len_k = 0, len_q > 0: out 0, lse +inf, dq 0) and no queries (len_q = 0,
    len_k > 0: dk = dv = 0 there), next to ordinary ones."""
    lens_q, lens_k = [9, 5, 0, 12], [14, 0, 6, 3]
    q, k, v, cu_q, cu_k = varlen_inputs(lens_q, lens_k, 2, 2, 40, F32, device)
    out, lse, _ = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=True,
                                         return_attn_probs=True)
    ref_fn = partial(varlen_ref, cu_q=cu_q, cu_k=cu_k, causal=True)
    grads, (_, ref_lse, _) = check_attention(ref_fn, {"q": q, "k": k, "v": v}, out, lse=lse)
    assert torch.isposinf(lse[:, 9:14]).all()
    assert (out[9:14] == 0).all() and (grads["q"][9:14] == 0).all()
    assert (grads["k"][14:20] == 0).all() and (grads["v"][14:20] == 0).all()


def test_flash_attn_varlen_dropout(device):
    """Varlen dropout: the mask of sequence b is dropout_mask(rng, nseq, Hq, max_q, max_k, p)[b, :, :len_q, :len_k]."""
    lens_q, lens_k = varlen_lens(5)
    q, k, v, cu_q, cu_k = varlen_inputs(lens_q, lens_k, 2, 1, 40, F16, device)
    max_q, max_k, p, seed = max(lens_q), max(lens_k), 0.25, 99
    torch.manual_seed(seed)
    out = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, dropout_p=p, causal=True)
    mask = dropout_mask_for(seed, device, len(lens_q), 2, max_q, max_k, p)
    ref_fn = partial(varlen_ref, cu_q=cu_q, cu_k=cu_k, causal=True, dropout_p=p, dropout_mask=mask)
    check_attention(ref_fn, {"q": q, "k": k, "v": v}, out)


def test_varlen_strided_views(device):
    """Varlen on strided views q, k, v = qkv.unbind(1) of a packed (total, 3, H, D) buffer (built with
    pack() from a padded batch); gradients land in the buffer."""
    lens = [23, 9, 31]
    padded = torch.randn(3, 31, 3, 2, 64, device=device).to(F16)               # (nseq, max_len, 3, H, D)
    qkv = pack(padded, lens).requires_grad_(True)                              # (total, 3, H, D)
    assert torch.equal(unpack(qkv.detach(), cu_seqlens(lens, device), 31)[0, :23], padded[0, :23])
    cu = cu_seqlens(lens, device)
    q, k, v = qkv.unbind(1)
    out = flash_attn_varlen_func(q, k, v, cu, cu, 31, 31, window_size=(6, 2))
    check_attention(lambda qkv: varlen_ref(*qkv.unbind(1), cu, cu, window_size=(6, 2)), {"qkv": qkv}, out)


# ----------------------------------------------------------------------------------------------------
# Packed variants
# ----------------------------------------------------------------------------------------------------

def test_flash_attn_qkvpacked_func(device):
    qkv = rand(2, 77, 3, 2, 40, dtype=F16, device=device)                     # (B, S, 3, H, D)
    out, lse, _ = flash_attn_qkvpacked_func(qkv, causal=True, return_attn_probs=True)
    assert out.shape == (2, 77, 2, 40)
    check_attention(lambda qkv: flash_ref(*qkv.unbind(2), causal=True), {"qkv": qkv}, out, lse=lse)


def test_flash_attn_kvpacked_func(device):
    q = rand(1, 17, 4, 64, dtype=F32, device=device)
    kv = rand(1, 131, 2, 2, 64, dtype=F32, device=device)                     # (B, Sk, 2, Hk, D), GQA
    out, lse, _ = flash_attn_kvpacked_func(q, kv, window_size=(-1, 3), return_attn_probs=True)
    check_attention(lambda q, kv: flash_ref(q, *kv.unbind(2), window_size=(-1, 3)), {"q": q, "kv": kv}, out,
                    lse=lse)


def test_flash_attn_varlen_qkvpacked_func(device):
    lens = [17, 1, 40, 0]
    qkv = rand(sum(lens), 3, 2, 16, dtype=F16, device=device)                 # (total, 3, H, D)
    cu = cu_seqlens(lens, device)
    out, lse, _ = flash_attn_varlen_qkvpacked_func(qkv, cu, max(lens), causal=True, return_attn_probs=True)
    assert lse.shape == (2, sum(lens))
    check_attention(lambda qkv: varlen_ref(*qkv.unbind(1), cu, cu, causal=True), {"qkv": qkv}, out, lse=lse)


def test_flash_attn_varlen_kvpacked_func(device):
    lens_q, lens_k = [5, 0, 33, 1], [20, 3, 33, 9]
    q = rand(sum(lens_q), 4, 40, dtype=F32, device=device)
    kv = rand(sum(lens_k), 2, 2, 40, dtype=F32, device=device)               # (total_k, 2, Hk, D), GQA
    cu_q, cu_k = cu_seqlens(lens_q, device), cu_seqlens(lens_k, device)
    slopes = alibi_slopes((4,), device)
    out = flash_attn_varlen_kvpacked_func(q, kv, cu_q, cu_k, max(lens_q), max(lens_k), alibi_slopes=slopes)
    check_attention(lambda q, kv: varlen_ref(q, *kv.unbind(1), cu_q, cu_k, alibi_slopes=slopes),
                    {"q": q, "kv": kv}, out)


def test_flash_attn_varlen_rows_past_last_sequence(device):
    """A packed buffer longer than its sequences (cu_seqlens[-1] < total, as static-shape training pads it): the rows
    past the last sequence belong to none: out 0, lse +inf and their gradients 0 (not whatever torch.empty held), and
    the sequences' results are those of the trimmed buffers, with NaN in q, k, v and dout there (the Hopper kernels:
    test_flash_attn_varlen_gpu.py)."""
    check_rows_past_last_sequence(device, float("nan"), F16, 32)


# ----------------------------------------------------------------------------------------------------
# scaled_dot_product_attention (torch SDPA semantics, layout (B, H, S, D), causal top-left)
# ----------------------------------------------------------------------------------------------------

def _sdpa_mask(kind, shape, dtype, device):
    """bool (True = attend, ~80% True, row 3 of every (b, h) fully masked when the mask has rows) or
    float (additive, randn with ~10% -inf)."""
    if kind == "bool":
        mask = torch.rand(shape, device=device) < 0.8
        if len(shape) >= 2 and shape[-2] > 3:
            mask[..., 3, :] = False
        return mask
    mask = torch.randn(shape, device=device)
    mask = mask.masked_fill(torch.rand(shape, device=device) < 0.1, float("-inf"))
    return mask.to(dtype)


# (batch or None for 3-D, nheads_q, nheads_k, seqlen_q, seqlen_k, headdim, dtype, mask kind, mask shape
#  (symbols B, H, Q, K), is_causal, scale, dropout_p)
SDPA_CASES = [
    pytest.param(2, 2, 2, 17, 77, 40, F32, None, None, False, 0.3, 0.0, id="scale-fp32"),
    pytest.param(1, 2, 2, 77, 131, 64, F16, None, None, True, None, 0.0, id="causal-topleft-sq<sk-fp16"),
    pytest.param(1, 2, 2, 131, 17, 16, F32, None, None, True, None, 0.0, id="causal-topleft-sq>sk-fp32"),
    pytest.param(2, 2, 2, 17, 17, 96, F32, "bool", "QK", False, None, 0.0, id="bool-QK-fullrow-fp32"),
    pytest.param(2, 4, 2, 77, 77, 40, F16, "bool", "B1QK", False, None, 0.0, id="bool-B1QK-gqa-fp16"),
    pytest.param(1, 2, 2, 17, 131, 64, F16, "float", "1H1K", False, 0.2, 0.0, id="float-1H1K-scale-fp16"),
    pytest.param(2, 2, 2, 77, 17, 16, F32, "float", "BHQK", False, None, 0.0, id="float-BHQK-neginf-fp32"),
    pytest.param(1, 2, 2, 17, 77, 64, BF16, "float", "K", False, None, 0.0, id="float-K-bf16"),
    pytest.param(None, 2, 2, 77, 77, 40, F32, None, None, True, None, 0.0, id="3d-causal-fp32"),
    pytest.param(None, 2, 2, 17, 37, 16, F16, "bool", "QK", False, None, 0.0, id="3d-bool-fp16"),
    pytest.param(1, 4, 1, 17, 131, 96, F32, None, None, False, None, 0.0, id="mqa-fp32"),
    pytest.param(2, 2, 2, 77, 77, 16, F16, None, None, True, None, 0.25, id="dropout-causal-fp16"),
]


@pytest.mark.parametrize("batch, nheads_q, nheads_k, seqlen_q, seqlen_k, headdim, dtype, mask_kind, mask_shape, "
                         "is_causal, scale, dropout_p", SDPA_CASES)
def test_scaled_dot_product_attention(device, batch, nheads_q, nheads_k, seqlen_q, seqlen_k, headdim, dtype,
                                      mask_kind, mask_shape, is_causal, scale, dropout_p):
    lead = () if batch is None else (batch,)
    query = rand(*lead, nheads_q, seqlen_q, headdim, dtype=dtype, device=device)
    key = rand(*lead, nheads_k, seqlen_k, headdim, dtype=dtype, device=device)
    value = rand(*lead, nheads_k, seqlen_k, headdim, dtype=dtype, device=device)
    attn_mask = None
    if mask_kind is not None:
        sizes = {"B": batch, "H": nheads_q, "Q": seqlen_q, "K": seqlen_k, "1": 1}
        attn_mask = _sdpa_mask(mask_kind, tuple(sizes[c] for c in mask_shape), dtype, device)
    enable_gqa = nheads_q != nheads_k
    seed = 31
    torch.manual_seed(seed)
    out = scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                                       is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
    assert out.shape == query.shape and out.dtype == dtype
    mask = None
    if dropout_p > 0:
        mask = dropout_mask_for(seed, device, batch, nheads_q, seqlen_q, seqlen_k, dropout_p)
    ref_fn = partial(sdpa_ref, attn_mask=attn_mask, is_causal=is_causal, scale=scale, dropout_p=dropout_p,
                     dropout_mask=mask)
    grads, (_, ref_lse, _) = check_attention(ref_fn, {"query": query, "key": key, "value": value}, out)
    empty = torch.isposinf(ref_lse)                # (B, H, Sq) or (H, Sq): rows with no visible key -> 0
    assert_zero_rows("out", out.detach(), empty)
    assert_zero_rows("dquery", grads["query"], empty)


# ----------------------------------------------------------------------------------------------------
# torch.compile (the GPU tier checks it at real size; here it also runs through the interpreter)
# ----------------------------------------------------------------------------------------------------

def test_torch_compile_fullgraph_small(device):
    """fullgraph=True (a graph break raises) over flash_attn_func, forward and backward: the compiled graph
    calls the same custom ops on the same inputs as eager, so out, lse and the gradients are bit-identical."""
    torch._dynamo.reset()
    q, k, v = rand_qkv(1, 37, 33, 4, 2, 32, dtype=F16, device=device)

    def fn(q, k, v):
        out, lse, _ = flash_attn_func(q, k, v, causal=True, window_size=(12, -1), return_attn_probs=True)
        return out, lse

    dout = torch.randn_like(q)
    results = []
    for f in (fn, torch.compile(fn, fullgraph=True)):
        out, lse = f(q, k, v)
        results.append((out, lse) + torch.autograd.grad(out, (q, k, v), dout))
    for name, eager, compiled in zip(("out", "lse", "dq", "dk", "dv"), *results):
        assert torch.equal(compiled, eager), f"{name}: compiled differs from eager"


def test_torch_compile_dynamic_head_dim(device):
    """dynamic=True traces the head dim symbolically, and with it the default softmax scale 1 / sqrt(d)
    (and automatic dynamic shapes do the same after a recompile for a second head dim): the option checks
    must trace without a graph break. Two head dims through one compiled function, each equal to eager."""
    torch._dynamo.reset()
    fn = torch.compile(lambda q, k, v: flash_attn_func(q, k, v, causal=True), fullgraph=True, dynamic=True,
                       backend="eager")
    for headdim in (16, 32):
        q, k, v = rand_qkv(1, 17, 17, 2, 2, headdim, dtype=F16, device=device)
        assert torch.equal(fn(q, k, v), flash_attn_func(q, k, v, causal=True)), f"d={headdim}"


# ----------------------------------------------------------------------------------------------------
# Forward launch plan: head-dim split or padding, vector width, tile table
# ----------------------------------------------------------------------------------------------------

def test_head_dim_split_table():
    """Split only where a power-of-two main part + tail is narrower than padding; both parts are tl.dot
    sized (powers of two >= 16) and cover the head dim."""
    assert flash_fwd.SPLIT_HEAD_DIM
    expected = {40: (32, 16), 72: (64, 16), 80: (64, 16), 96: (64, 32), 160: (128, 32), 59: (64, 0),
                111: (128, 0), 224: (256, 0), 64: (64, 0), 128: (128, 0), 1: (16, 0), 17: (32, 0), 24: (32, 0)}
    for head_dim, split in expected.items():
        assert flash_fwd.head_dim_split(head_dim) == split, head_dim
        assert flash_fwd.head_dim_split(head_dim, BF16) == split, head_dim
        assert flash_fwd.head_dim_split(head_dim, F32) == (flash_fwd.head_dim_block(head_dim), 0), head_dim
    for head_dim in range(1, 257):
        main, tail = flash_fwd.head_dim_split(head_dim)
        padded = flash_fwd.head_dim_block(head_dim)
        assert main >= 16 and main & (main - 1) == 0, (head_dim, main)
        if tail:
            assert tail >= 16 and tail & (tail - 1) == 0, (head_dim, tail)
            assert main < head_dim <= main + tail < padded, (head_dim, main, tail)
        else:
            assert main == padded, (head_dim, main)


def test_vector_width():
    """16-byte vectors asserted only where head_dim and every stride but the last are multiples of them."""
    def vec(head_dim, *tensors):
        return flash_fwd.vector_width(head_dim, tensors[0].element_size(), tensors)

    x16 = torch.empty(2, 5, 3, 72, dtype=F16)
    assert vec(72, x16) == 8                                    # 144-byte rows: 16-byte aligned
    assert vec(72, x16.float()) == 4
    assert vec(40, torch.empty(2, 5, 3, 40, dtype=F16)) == 8
    assert vec(59, torch.empty(2, 5, 3, 59, dtype=F16)) == 1
    packed = torch.empty(2, 5, 3, 41, dtype=F16)[..., :40]     # head stride 41: rows start anywhere
    assert vec(40, packed) == 1
    assert vec(40, torch.empty(2, 5, 3, 40, dtype=F16), packed) == 1
    assert vec(36, torch.empty(2, 5, 3, 36, dtype=F16)) == 4
    expanded = torch.empty(1, 5, 1, 72, dtype=F16).expand(4, 5, 3, 72)   # stride 0 divides anything
    assert vec(72, expanded) == 8
    # Multiples of 16 everywhere: Triton's argument specialization knows already, no assertion (VEC 1)
    assert vec(64, torch.empty(2, 5, 3, 64, dtype=F16)) == 1
    assert vec(80, torch.empty(2, 5, 8, 80, dtype=F16)) == 1


@pytest.mark.parametrize("split", [True, False], ids=["split", "pad"])
@pytest.mark.parametrize("headdim, dtype, opts", [
    pytest.param(72, F16, {}, id="d72-fp16"),
    pytest.param(80, F16, {"causal": True}, id="d80-causal-fp16"),
    pytest.param(40, BF16, {"window_size": (20, -1)}, id="d40-window-bf16"),
    pytest.param(160, F16, {"window_size": (9, 3), "softcap": 3.0}, id="d160-window-softcap-fp16"),
])
def test_head_dim_split_or_pad(device, monkeypatch, split, headdim, dtype, opts):
    """The diffusion head dims (DiT 72, SD 40 / 80 / 160) through both forward plans: main part + masked
    tail (64 + 8 of 16 for 72), or one padded, masked block; cross-attention-like seqlen_k = 77. 16-bit
    only: fp32 always pads (test_head_dim_split_table)."""
    monkeypatch.setattr(flash_fwd, "SPLIT_HEAD_DIM", split)
    assert (flash_fwd.head_dim_split(headdim, dtype)[1] > 0) == split
    q, k, v = rand_qkv(2, 37, 77, 2, 1, headdim, dtype=dtype, device=device)
    out = flash_attn_func(q, k, v, **opts)
    check_attention(partial(flash_ref, **opts), {"q": q, "k": k, "v": v}, out)


def test_head_dim_split_strided_unaligned(device):
    """Split head dim on views whose rows are not 16-byte aligned (head stride 73): vector width 1."""
    buf = rand(1, 37, 3, 73, dtype=F16, device=device)

    def views(buf):
        return buf[:, :, 0, :72].unsqueeze(2), buf[:, :17, 1, 1:].unsqueeze(2), buf[:, :17, 2, :72].unsqueeze(2)
    q, k, v = views(buf)
    assert flash_fwd.vector_width(72, 2, (q, k, v)) == 1
    out = flash_attn_func(q, k, v)

    def ref_fn(buf):
        return flash_ref(*views(buf))
    check_attention(ref_fn, {"buf": buf}, out)


def test_forward_config_table(monkeypatch):
    """The compiled-GPU tile table (the interpreter always takes 32 x 32): tuned long-sequence configs
    unchanged; short key loops and small grids get 64-row (or smaller) tiles that fill the SMs; wide
    heads on small tiles stay on key tiles that ptxas showed spill-free."""
    monkeypatch.setattr(flash_fwd, "INTERPRET", False)

    def config(width, seqlen_q, seqlen_k, batch_heads, windowed=False, has_bias=False):
        return flash_fwd.forward_config(width, F16, windowed, has_bias, seqlen_q, seqlen_k, batch_heads, 132)

    def tiles(c):
        return c["BLOCK_M"], c["BLOCK_N"], c["num_warps"], c["num_stages"]

    assert tiles(config(64, 4096, 4096, 128)) == (128, 64, 8, 3)            # benchmarks/NOTES.md
    assert tiles(config(128, 4096, 4096, 128)) == (128, 128, 8, 3)
    assert tiles(config(128, 4096, 4096, 128, windowed=True)) == (128, 64, 8, 3)
    assert tiles(config(48, 4096, 4096, 16)) == (128, 64, 8, 3)             # SD 64x64 latents, head dim 40
    assert tiles(config(160, 4096, 4096, 16)) == (128, 64, 8, 2)            # head dim 160 = 128 + 32
    assert tiles(config(160, 4096, 4096, 16, has_bias=True)) == (128, 32, 8, 2)
    assert tiles(config(80, 256, 256, 512)) == (64, 64, 4, 2)               # DiT-XL/2: 4 key tiles of 64 (H200: 57 vs 65 us)
    assert tiles(config(48, 4096, 77, 16)) == (64, 64, 4, 2)                # cross-attention (H200: 13.7 vs 17.9 us)
    assert tiles(config(160, 256, 256, 16)) == (64, 64, 4, 2)               # SD 256 tokens, hd 160: 7.9 vs 14.4 us
    for width, seqlen, batch_heads in ((80, 1024, 16), (160, 256, 16), (160, 64, 16), (64, 17, 1)):
        c = config(width, seqlen, seqlen, batch_heads)
        programs = -(-seqlen // c["BLOCK_M"]) * batch_heads
        assert programs >= 33 or c["BLOCK_M"] == 16, (width, seqlen, c)      # a quarter of 132 SMs
        if width > 128 and c["BLOCK_M"] < 64:
            assert c["BLOCK_N"] <= 32, c
