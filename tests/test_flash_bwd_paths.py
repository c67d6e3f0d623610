"""The backward's alternative paths, CPU tier: the atomic-dQ path (deterministic=False with
flash_bwd.ATOMIC_DQ on: one program per key block, dQ added in fp32 by atomics) and the deterministic grid.
Every gradient against the float64 reference on odd shapes, and launcher-level agreement of the paths."""

from functools import partial

import pytest
import torch

from attention_utils import (assert_finite, assert_zero_rows, check_attention, dropout_mask_for, expand_options,
                             flash_ref, no_key_rows_flash, no_key_rows_varlen, rand_qkv, varlen_inputs,
                             varlen_lens, varlen_ref)
from flashfuse import flash_attn_func, flash_attn_varlen_func
from flashfuse.ops.attention import flash_bwd, flash_fwd

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16

# ----------------------------------------------------------------------------------------------------
# Backward: the atomic-dQ path (deterministic=False with flash_bwd.ATOMIC_DQ on) and the deterministic grid
# ----------------------------------------------------------------------------------------------------


# (batch, seqlen_q, seqlen_k, nheads_q, nheads_k, headdim, dtype, options): each feature the atomic
# path must keep, on odd shapes; several key blocks per row (the interpreter's tiles are 16 x 32), so dQ
# rows receive adds from several programs, and the unmasked loop runs rotated (STAGGER).
ATOMIC_CASES = [
    pytest.param(2, 37, 77, 4, 2, 40, F32, {"causal": True}, id="causal-sq<sk-gqa-fp32-d40"),
    pytest.param(1, 77, 37, 2, 1, 64, F16, {"window_size": (9, 5)}, id="window-mqa-fp16-d64"),
    pytest.param(1, 131, 77, 4, 2, 16, F32, {}, id="full-gqa-fp32-d16"),
    pytest.param(1, 33, 45, 2, 2, 59, F32, {"softcap": 2.5, "alibi": "h", "softmax_scale": 0.4},
                 id="softcap-alibi-fp32-d59"),
    pytest.param(2, 77, 17, 2, 2, 96, F16, {"window_size": (2, 3), "alibi": "bh"}, id="nokey-rows-fp16-d96"),
]


@pytest.mark.parametrize("batch, seqlen_q, seqlen_k, nheads_q, nheads_k, headdim, dtype, opts", ATOMIC_CASES)
def test_atomic_dq_backward(device, monkeypatch, batch, seqlen_q, seqlen_k, nheads_q, nheads_k, headdim,
                            dtype, opts):
    """Every gradient of the atomic path against the float64 reference; rows that see no key get dq 0."""
    monkeypatch.setattr(flash_bwd, "ATOMIC_DQ", True)
    q, k, v = rand_qkv(batch, seqlen_q, seqlen_k, nheads_q, nheads_k, headdim, dtype=dtype, device=device)
    opts = expand_options(opts, device, batch, nheads_q)
    out, lse, _ = flash_attn_func(q, k, v, return_attn_probs=True, **opts)
    grads, (_, ref_lse, _) = check_attention(partial(flash_ref, **opts), {"q": q, "k": k, "v": v}, out, lse=lse)
    assert_zero_rows("dq", grads["q"], no_key_rows_flash(ref_lse))
    for name, g in grads.items():
        assert_finite(f"d{name}", g)


def test_atomic_dq_dropout(device, monkeypatch):
    """Dropout: the atomic path regenerates the same mask (GQA, causal, odd sizes)."""
    monkeypatch.setattr(flash_bwd, "ATOMIC_DQ", True)
    batch, seqlen_q, seqlen_k, nheads_q, nheads_k, headdim, dropout_p = 1, 45, 77, 4, 2, 40, 0.25
    q, k, v = rand_qkv(batch, seqlen_q, seqlen_k, nheads_q, nheads_k, headdim, dtype=F32, device=device)
    seed = 7
    torch.manual_seed(seed)
    out = flash_attn_func(q, k, v, dropout_p=dropout_p, causal=True)
    mask = dropout_mask_for(seed, device, batch, nheads_q, seqlen_q, seqlen_k, dropout_p)
    check_attention(partial(flash_ref, dropout_p=dropout_p, dropout_mask=mask, causal=True),
                    {"q": q, "k": k, "v": v}, out)


def test_atomic_dq_varlen(device, monkeypatch):
    """Packed sequences (lengths 1 and 0 among them): the atomic adds stay inside each sequence's rows."""
    monkeypatch.setattr(flash_bwd, "ATOMIC_DQ", True)
    lens_q, lens_k = varlen_lens(5)
    q, k, v, cu_q, cu_k = varlen_inputs(lens_q, lens_k, 4, 2, 40, F32, device)
    out, lse, _ = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=True,
                                         return_attn_probs=True)
    grads, (_, ref_lse, _) = check_attention(partial(varlen_ref, cu_q=cu_q, cu_k=cu_k, causal=True),
                                             {"q": q, "k": k, "v": v}, out, lse=lse)
    assert_zero_rows("dq", grads["q"], no_key_rows_varlen(ref_lse))


def _launcher_grads(q, k, v, dout, causal, **kw):
    scale = 0.3
    out, lse = flash_fwd.flash_attn_forward(q, k, v, softmax_scale=scale, window_right=0 if causal else -1)[:2]
    return flash_bwd.flash_attn_backward(dout, q, k, v, out, lse, softmax_scale=scale,
                                         window_right=0 if causal else -1, **kw)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_backward_paths_agree(device, monkeypatch, causal):
    """Launcher level: deterministic=True is bit-identical run to run and ignores ATOMIC_DQ (the same
    kernel either way); the atomic path (staggered loop or not, heads-first or key-block-major grid)
    matches it to fp32 rounding (only the summation order of dq differs)."""
    q, k, v = (torch.randn(2, s, h, 40, device=device) for s, h in ((53, 4), (70, 2), (70, 2)))
    dout = torch.randn_like(q)
    first = _launcher_grads(q, k, v, dout, causal, deterministic=True)
    monkeypatch.setattr(flash_bwd, "ATOMIC_DQ", True)
    second = _launcher_grads(q, k, v, dout, causal, deterministic=True)
    for name, a, b in zip(("dq", "dk", "dv"), first, second):
        assert_finite(name, a)
        assert torch.equal(a, b), f"{name}: deterministic=True changed with ATOMIC_DQ on"
    for stagger, heads_first in ((False, True), (True, False)):
        config = dict(BLOCK_M1=16, BLOCK_N1=32, num_warps=4, num_stages=1, STAGGER=stagger, HEADS_FIRST=heads_first)
        atomic = _launcher_grads(q, k, v, dout, causal, deterministic=False, config=config)
        for name, a, b in zip(("dq", "dk", "dv"), atomic, first):
            assert_finite(name, a)
            err = ((a - b).norm() / b.norm()).item()
            assert err < 1e-5, f"{name}: atomic path {config} rel err {err:.2e} vs deterministic"


def test_backward_takes_a_strided_lse_view(device):
    """lse as a slice of a longer sequence's lse (ring attention's query pieces): the same gradients as a
    dense copy (the delta buffer is dense, so the launcher densifies lse; writing delta with the view's
    strides once ran past its end)."""
    q, k, v = (torch.randn(2, s, h, 24, device=device) for s, h in ((37, 4), (41, 2), (41, 2)))
    dout = torch.randn_like(q)
    out, lse = flash_fwd.flash_attn_forward(q, k, v, softmax_scale=0.2, window_right=0)
    wide = torch.full((2, 4, 37 + 50), float("nan"), device=device)
    wide[:, :, 20:57] = lse
    view = wide[:, :, 20:57]
    assert not view.is_contiguous()
    dense = flash_bwd.flash_attn_backward(dout, q, k, v, out, lse, softmax_scale=0.2, window_right=0)
    strided = flash_bwd.flash_attn_backward(dout, q, k, v, out, view, softmax_scale=0.2, window_right=0)
    for name, a, b in zip(("dq", "dk", "dv"), strided, dense):
        assert_finite(name, a)
        assert torch.equal(a, b), name
    assert torch.isnan(wide[:, :, :20]).all() and torch.isnan(wide[:, :, 57:]).all()


def test_backward_config_tables(monkeypatch):
    """Compiled-GPU tables: every head-dim block and dtype has tiles (256: larger ones with large_smem); the atomic
    path's key tile is a multiple of its query tile's rotation step and (16-bit, D <= 128) holds 128 keys (atomic
    traffic)."""
    monkeypatch.setattr(flash_bwd, "INTERPRET", False)
    for dtype in (F16, BF16, F32):
        for block_d in (16, 32, 64, 128, 256):
            det = flash_bwd.backward_config(block_d, dtype)
            assert set(det) - {"TMA_DKDV", "TMA_DQ"} == {"BLOCK_M1", "BLOCK_N1", "BLOCK_M2", "BLOCK_N2",
                                                        "num_warps", "num_stages"}, det
            # Wide head dims take larger tiles only where a block gets >= 200 KB of shared memory (Hopper).
            large = flash_bwd.backward_config(block_d, dtype, large_smem=True)
            assert large == det or (block_d == 256 and dtype != F32 and large["BLOCK_N1"] > det["BLOCK_N1"]), large
            # TMA tiles where measured faster (H200, session 9): 16-bit head dims <= 64, not 128.
            tma = dtype != F32 and block_d <= 64
            assert (det.get("TMA_DKDV", False), det.get("TMA_DQ", False)) == (tma, tma), det
            for extras in (False, True):
                c = flash_bwd.atomic_backward_config(block_d, dtype, extras)
                assert set(c) == {"BLOCK_M1", "BLOCK_N1", "num_warps", "num_stages", "STAGGER"}, c
                assert c["BLOCK_N1"] % 16 == 0 and c["BLOCK_M1"] % 16 == 0, c
                if dtype != F32 and block_d <= 128:
                    assert c["BLOCK_N1"] == 128, c
    assert flash_bwd.ATOMIC_DQ is False, "ATOMIC_DQ measured slower on the H200 (session 5): off by default"


@pytest.mark.parametrize("headdim", [16, 64])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_tma_backward_matches_pointer_loads(device, headdim, causal):
    """Tensor-descriptor tiles (TMA_DKDV / TMA_DQ: head dims with no column mask, not varlen) against the
    pointer loads, on both grids and in either kind of program alone, with odd lengths and GQA (TMA
    zero-fills the rows past each sequence's end where the pointer loads mask them): the same gradients,
    bit for bit on the deterministic grid."""
    q, k, v = (torch.randn(2, s, h, headdim, device=device) for s, h in ((53, 4), (70, 2), (70, 2)))
    dout = torch.randn_like(q)
    assert flash_bwd._tma_applies(q, k, v, dout, headdim, headdim, is_varlen=False)
    assert not flash_bwd._tma_applies(q, k, v, dout, headdim, headdim, is_varlen=True)
    det = dict(BLOCK_M1=16, BLOCK_N1=32, BLOCK_M2=32, BLOCK_N2=16, num_warps=4, num_stages=1)
    atomic = dict(BLOCK_M1=16, BLOCK_N1=32, num_warps=4, num_stages=1, STAGGER=True)
    runs = [(True, det, True, True), (True, det, True, False), (True, det, False, True), (False, atomic, True, False)]
    for deterministic, config, tma_dkdv, tma_dq in runs:
        tma = _launcher_grads(q, k, v, dout, causal, deterministic=deterministic, atomic_dq=True,
                              config=dict(config, TMA_DKDV=tma_dkdv, TMA_DQ=tma_dq))
        ptr = _launcher_grads(q, k, v, dout, causal, deterministic=deterministic, atomic_dq=True,
                              config=config)
        for name, a, b in zip(("dq", "dk", "dv"), tma, ptr):
            assert_finite(name, a)
            if deterministic:
                assert torch.equal(a, b), f"{name}: TMA tiles differ from pointer loads"
            else:
                err = ((a - b).norm() / b.norm()).item()
                assert err < 1e-6, f"{name}: atomic path, TMA tiles rel err {err:.2e} vs pointer loads"
