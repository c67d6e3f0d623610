"""The long-sequence forward kernel (flash_fwd._flash_fwd_fast_kernel: tensor-descriptor tiles, split row
halves), CPU tier: each knob against the float64 reference with the pointer kernel removed, and the host-side
plan that decides which kernel runs. GPU-tier counterparts: test_flash_attn_kernels_gpu.py."""

import math
from functools import partial

import pytest
import torch

from attention_utils import (assert_zero_rows, check_attention, flash_ref, no_key_rows_flash, rand, rand_qkv,
                             sdpa_ref)
from flashfuse import flash_attn_func, scaled_dot_product_attention
from flashfuse.ops._triton import tma_scratch
from flashfuse.ops.attention import flash_fwd

F32, F16 = torch.float32, torch.float16

# ----------------------------------------------------------------------------------------------------
# Fast forward path (flash_fwd.FAST_FORWARD): tensor-descriptor tiles, split rows
# ----------------------------------------------------------------------------------------------------

# Interpreter tiles (32 x 32) with each knob of the fast kernel.
FAST_VARIANTS = {"tma-split": dict(split=True), "tma": {}, "pointer": dict(tma=False),
                 "pointer-split": dict(split=True, tma=False)}


@pytest.mark.parametrize("variant, batch, seqlen_q, seqlen_k, nheads_q, nheads_k, headdim, dtype, opts", [
    pytest.param("tma-split", 1, 77, 131, 4, 1, 32, F32, {"causal": True}, id="tma-split-causal-sq<sk-mqa"),
    pytest.param("tma-split", 2, 131, 77, 2, 2, 16, F16, {"causal": True}, id="tma-split-causal-nokey-fp16"),
    pytest.param("tma", 1, 67, 96, 4, 2, 64, F32, {}, id="tma-even-keys-gqa"),
    pytest.param("pointer", 2, 131, 77, 2, 1, 16, F16, {"causal": True}, id="pointer-causal-nokey-fp16"),
    pytest.param("pointer-split", 1, 37, 77, 2, 2, 32, F32, {"window_size": (-1, 5), "softmax_scale": 0.3},
                 id="pointer-split-window-right-ragged"),
    pytest.param("tma", 1, 33, 17, 2, 2, 16, F16, {}, id="tma-one-ragged-key-block-fp16"),
    pytest.param("tma", 1, 45, 64, 2, 2, 16, F32, {}, id="tma-even-keys-unmasked"),
])
def test_fast_forward(device, monkeypatch, variant, batch, seqlen_q, seqlen_k, nheads_q, nheads_k, headdim,
                      dtype, opts):
    """The fast kernel alone (the pointer kernel removed) against the float64 reference: out, lse, every
    gradient (the backward consumes its lse), rows with no visible key exactly 0."""
    monkeypatch.setattr(flash_fwd, "FAST_FORWARD", True)
    config = flash_fwd._fast(32, 32, 4, 1, **FAST_VARIANTS[variant])
    monkeypatch.setattr(flash_fwd, "fast_forward_config", lambda *a: config)
    monkeypatch.setattr(flash_fwd, "_flash_fwd_kernel", None)
    q, k, v = rand_qkv(batch, seqlen_q, seqlen_k, nheads_q, nheads_k, headdim, dtype=dtype, device=device)
    out, lse, _ = flash_attn_func(q, k, v, return_attn_probs=True, **opts)
    grads, (_, ref_lse, _) = check_attention(partial(flash_ref, **opts), {"q": q, "k": k, "v": v}, out, lse=lse)
    empty = no_key_rows_flash(ref_lse)
    assert_zero_rows("out", out.detach(), empty)
    assert_zero_rows("dq", grads["q"], empty)


def test_fast_forward_sdpa_top_left_causal(device, monkeypatch):
    """torch SDPA's causal mask is top-left aligned (BOTTOM_RIGHT off) when seqlen_q != seqlen_k."""
    monkeypatch.setattr(flash_fwd, "FAST_FORWARD", True)
    monkeypatch.setattr(flash_fwd, "_flash_fwd_kernel", None)
    q, k, v = (rand(1, 2, s, 32, dtype=F32, device=device) for s in (45, 70, 70))
    out = scaled_dot_product_attention(q, k, v, is_causal=True)
    check_attention(partial(sdpa_ref, is_causal=True), {"query": q, "key": k, "value": v}, out)


def test_fast_forward_plan(monkeypatch):
    """Host-side choice: the fast kernel only for what it implements, on TMA-compatible tensors, and
    only when FAST_FORWARD is set; everything else goes to the pointer kernel."""
    monkeypatch.setattr(flash_fwd, "FAST_FORWARD", True)
    x = torch.empty(2, 64, 4, 64, dtype=F16)

    def plan(q=x, k=x, **kw):
        args = dict(window_left=-1, window_right=-1, softcap=0.0, alibi_slopes=None, attn_bias=None,
                    dropout_p=0.0, is_varlen=False)
        args.update(kw)
        return flash_fwd._fast_forward_plan(q, k, k, torch.empty_like(q), q.shape[-1], *args.values(), q.shape[2])

    assert plan() is not None and plan(window_right=0) is not None and plan(window_right=9) is not None
    for kw in (dict(window_left=8), dict(softcap=1.0), dict(dropout_p=0.1), dict(is_varlen=True),
               dict(alibi_slopes=torch.ones(4)), dict(attn_bias=torch.zeros(1, 1, 64, 64))):
        assert plan(**kw) is None, kw
    assert plan(q=torch.empty(2, 64, 4, 40, dtype=F16)) is None                 # head dim not a power of two
    unaligned = torch.empty(2, 64, 4, 65, dtype=F16)[..., 1:]                    # rows 130 bytes apart
    assert not flash_fwd.tma_compatible(unaligned) and plan(q=unaligned) is None
    assert flash_fwd.tma_compatible(x, x.transpose(1, 2).contiguous().transpose(1, 2))
    assert not flash_fwd.tma_compatible(torch.empty(2, 1, 4, 64, dtype=F16).expand(2, 64, 4, 64))
    monkeypatch.setattr(flash_fwd, "INTERPRET", False)     # compiled: 16-bit, the head dims of its table
    monkeypatch.setattr(flash_fwd, "sm_count", lambda device: 132)
    assert plan(q=torch.empty(2, 64, 4, 32, dtype=F16)) is None and plan(q=x.float()) is None
    monkeypatch.setattr(flash_fwd, "FAST_FORWARD", False)
    assert plan() is None


def test_fast_forward_config_table(monkeypatch):
    """Compiled-GPU table: head dim 128 takes the fast kernel from FAST_MIN_SEQLEN_K[causal] keys on (2048
    without a mask, 4096 causal: measured); head dim 64, shorter key loops and small grids keep the pointer
    kernel (measured faster there)."""
    monkeypatch.setattr(flash_fwd, "INTERPRET", False)
    assert flash_fwd.FAST_MIN_SEQLEN_K == {False: 2048, True: 4096}
    for causal in (False, True):
        long = flash_fwd.FAST_MIN_SEQLEN_K[causal]
        c = flash_fwd.fast_forward_config(128, causal, long, long, 64, 132)
        assert set(c) == {"BLOCK_M", "BLOCK_N", "num_warps", "num_stages", "SPLIT_M", "USE_TMA"}, c
        assert flash_fwd.fast_forward_config(64, causal, long, long, 64, 132) is None
        assert flash_fwd.fast_forward_config(128, causal, long, long // 2, 64, 132) is None
        assert flash_fwd.fast_forward_config(128, causal, long, long, 4, 132) is None    # under 2 waves


def test_tma_allocator_set_once():
    """ensure_tma_allocator (ops/_triton.py, shared with the matmul) installs the scratch allocator only
    where none is set (per context)."""
    import contextvars

    from triton.runtime import _allocation

    def run():
        flash_fwd.ensure_tma_allocator()
        assert _allocation._allocator.get() is tma_scratch
        mine = lambda size, alignment, stream: None  # noqa: E731
        _allocation._allocator.set(mine)
        flash_fwd.ensure_tma_allocator()
        assert _allocation._allocator.get() is mine
    contextvars.copy_context().run(run)


def test_hopper_forward_plan():
    """flash_fwd_hopper's Gluon kernel: never in the interpreter (Gluon has none), and on the GPU only where its
    table says it measured faster: head dims 64 and 128 from 128 keys (causal from 256), persistent (hd64 with three
    consumer warpgroups from 8192 keys without a mask; hd64 causal with 64-key tiles below 1024 keys, hd128 causal
    below 1024; hd128 causal from there with one Q slot per consumer, from 2048 keys with the P V wait after the
    softmax; causal with an odd number of row blocks one tile per program, hd64 only from 4096 keys), grids of
    MIN_WAVE (0.9) waves of tiles or more, persistent where its units fill MIN_WAVE waves, else one tile per program.
    The kernel runs in the GPU tier (test_flash_attn_kernels_gpu.py)."""
    from flashfuse.ops.attention import flash_fwd_hopper as hopper

    assert not hopper.available(torch.device("cpu"))
    config = hopper.hopper_forward_config(64, False, 512, 512, 32 * 32, 132)
    assert config == hopper.HOPPER_CONFIGS[(64, False)][0][1] and config is not hopper.HOPPER_CONFIGS[(64, False)][0][1]
    assert config["PERSISTENT"] and config["CONSUMERS"] == 2
    config = hopper.hopper_forward_config(64, False, 8192, 8192, 2 * 32, 132)
    assert config["PERSISTENT"] and config["CONSUMERS"] == 3 and config["BLOCK_M"] == 192
    config = hopper.hopper_forward_config(64, False, 8192, 8192, 2 * 32, 132, left_window=True)   # 3 spill there
    assert config["PERSISTENT"] and config["CONSUMERS"] == 2 and config["BLOCK_M"] == 128
    config = hopper.hopper_forward_config(64, False, 8192, 8192, 2 * 32, 132, dropout=True)       # 3 were slower
    assert config["PERSISTENT"] and config["CONSUMERS"] == 2 and config["BLOCK_M"] == 128
    assert hopper.varlen_config(64, False, False, 8192, 8192, 2 * 32, 132, dropout=True)["CONSUMERS"] == 2
    assert hopper.hopper_forward_config(128, False, 512, 512, 32 * 16, 132)["PERSISTENT"]
    config = hopper.hopper_forward_config(128, True, 512, 512, 32 * 16, 132)        # short causal: 64-key tiles
    assert config["PERSISTENT"] and config["Q_STAGES"] == 2 and config["BLOCK_N"] == 64 and config["NUM_STAGES"] == 3
    config = hopper.hopper_forward_config(128, True, 1024, 1024, 16 * 16, 132)
    assert config["PERSISTENT"] and config["Q_STAGES"] == 1 and config["BLOCK_N"] == 128 and not config["SPLIT_PV_WAIT"]
    config = hopper.hopper_forward_config(128, True, 2048, 2048, 8 * 16, 132)        # the P V wait after the softmax
    assert config["PERSISTENT"] and config["Q_STAGES"] == 1 and config["SPLIT_PV_WAIT"]
    config = hopper.hopper_forward_config(64, True, 16384, 16384, 1 * 32, 132)
    assert config["PERSISTENT"] and config["Q_STAGES"] == 2 and config["CONSUMERS"] == 2 and config["BLOCK_N"] == 128
    config = hopper.hopper_forward_config(64, True, 512, 512, 32 * 32, 132)           # short causal: 64-key tiles
    assert config["PERSISTENT"] and config["BLOCK_N"] == 64 and config["NUM_STAGES"] == 3
    config = hopper.hopper_forward_config(64, True, 1024, 1024, 16 * 32, 132)         # then 128-key, a third stage
    assert config["PERSISTENT"] and config["BLOCK_N"] == 128 and config["NUM_STAGES"] == 3
    config = hopper.hopper_forward_config(64, True, 2048, 2048, 8 * 32, 132)
    assert config["BLOCK_N"] == 128 and config["NUM_STAGES"] == 2
    config = hopper.hopper_forward_config(64, True, 256, 256, 64 * 32, 132)           # from 256 keys (session 47)
    assert config["PERSISTENT"] and config["BLOCK_N"] == 64
    assert hopper.hopper_forward_config(64, True, 128, 128, 128 * 32, 132) is None        # short causal loop
    # causal with an odd number of row blocks (no pairs): one tile per program where that measured faster than Triton
    config = hopper.hopper_forward_config(128, True, 640, 640, 16 * 16, 132)
    assert not config["PERSISTENT"] and config["Q_STAGES"] == 1
    assert hopper.hopper_forward_config(64, True, 1100, 1100, 8 * 32, 132) is None
    assert not hopper.hopper_forward_config(64, True, 4224, 4224, 4 * 32, 132)["PERSISTENT"]
    # head dims between 32 and 256 take the 64 / 128 / 256 entries, padded by the TMA boxes (kernel_head_dim)
    assert [hopper.kernel_head_dim(d) for d in (16, 32, 33, 40, 64, 65, 96, 128, 129, 160, 256, 257)] == [
        None, None, 64, 64, 64, 128, 128, 128, 256, 256, 256, None]
    full_128 = hopper.HOPPER_CONFIGS[(128, False)][0][1]
    assert hopper.hopper_forward_config(112, False, 4096, 4096, 16 * 16, 132) == full_128
    assert hopper.hopper_forward_config(40, True, 1024, 1024, 16 * 32, 132) == hopper.HOPPER_CONFIGS[(64, True)][1][1]
    wide = hopper.hopper_forward_config(224, False, 4096, 4096, 16 * 16, 132)            # padded to 256
    assert wide == hopper.HOPPER_CONFIGS[(256, False)][0][1] and wide["O_FROM_REGS"] and wide["BLOCK_N"] == 64
    # 65..96: 64 columns and a 16- / 32-column tail, 129..192: 128 columns and a 32- / 64-column tail
    # (forward_head_dim); varlen pads them to 128 / 256
    assert [hopper.forward_head_dim(d) for d in (64, 65, 72, 80, 81, 96, 97, 128, 129, 160, 161, 192, 193, 256)] == [
        64, 80, 80, 80, 96, 96, 128, 128, 160, 160, 192, 192, 256, 256]
    for d, tail in ((72, 16), (80, 16), (88, 32), (96, 32), (144, 32), (160, 32), (176, 64), (192, 64)):
        for causal in (False, True):
            config = hopper.hopper_forward_config(d, causal, 4096, 4096, 16 * 16, 132)
            assert config["TAIL_DIM"] == tail and config["O_FROM_REGS"] == (d > 128), (d, causal)
    for d in (80, 160):
        assert hopper.hopper_forward_config(d, True, 4096, 4096, 16 * 16, 132, tail=False)["TAIL_DIM"] == 0
        assert hopper.varlen_config(d, True, False, 4096, 4096, 16 * 16, 132)["TAIL_DIM"] == 0
    assert hopper.hopper_forward_config(288, False, 4096, 4096, 16 * 16, 132) is None     # no entry
    assert hopper.hopper_forward_config(32, False, 4096, 4096, 16 * 16, 132) is None
    # key loops below 512 (session 47): 128 keys without a mask (hd160: 256), 256 causal (hd160: 512); odd causal
    # row-block counts at 384 for hd128 / hd160, 128 for hd192 / hd256, 512 at 65..96
    assert hopper.hopper_forward_config(64, False, 1024, 64, 16 * 32, 132) is None        # short key loop
    assert hopper.hopper_forward_config(72, False, 256, 256, 32 * 16, 132) == hopper.HOPPER_CONFIGS[(80, False)][0][1]
    for d, causal, shortest in ((64, False, 128), (72, True, 256), (96, False, 128), (128, True, 256),
                                (160, False, 256), (160, True, 512), (192, False, 128), (256, True, 256)):
        assert hopper.hopper_forward_config(d, causal, 1024, shortest, 64 * 16, 132) is not None, (d, causal)
        assert hopper.hopper_forward_config(d, causal, 1024, shortest - 1, 64 * 16, 132) is None, (d, causal)
    for d, shortest in ((80, 512), (128, 384), (160, 384), (192, 128), (256, 128)):            # odd: one 128-row block
        assert not hopper.hopper_forward_config(d, True, 128, shortest, 256 * 16, 132)["PERSISTENT"], d
        assert hopper.hopper_forward_config(d, True, 128, shortest - 1, 256 * 16, 132) is None, d
    assert hopper.hopper_forward_config(64, False, 2048, 2048, 4, 132) is None            # 64 tiles: under a wave
    assert hopper.hopper_forward_config(64, False, 512, 512, 16, 132) is None
    # batch 1: 128 or 256 tiles of 128 rows; causal units (pairs of tiles) under a wave run one tile per program
    assert hopper.hopper_forward_config(64, False, 1024, 1024, 16, 132)["PERSISTENT"]
    config = hopper.hopper_forward_config(128, True, 1024, 1024, 32, 132)
    assert config["PERSISTENT"] and config["Q_STAGES"] == 1
    config = hopper.hopper_forward_config(128, True, 512, 512, 32, 132)
    assert not config["PERSISTENT"] and config["Q_STAGES"] == 1
    config = hopper.hopper_forward_config(64, True, 512, 512, 2 * 16, 132)
    assert not config["PERSISTENT"] and config["Q_STAGES"] == 1 and config["BLOCK_N"] == 64
    q = torch.empty(2, 8, 4, 64)
    assert hopper.descriptor_compatible(q, q[:, :, :2])
    assert not hopper.descriptor_compatible(q, q[:, :, :1].expand(2, 8, 4, 64))      # K / V broadcast over heads


@pytest.mark.parametrize("option", ["softcap", "alibi"])
def test_score_mods_take_gluon(monkeypatch, option):
    """A softcap or ALiBi goes to the Gluon forward where it runs (16-bit; scores tanh(scale * x / softcap) by
    tanh.approx, the log2 scale softcap * log2(e): _flash_common.score_scales), never to the fast Triton kernel (not
    there): elsewhere the general Triton kernel takes it. Plans only (the kernels run in the GPU tier)."""
    from flashfuse.ops.attention import _flash_common, flash_fwd, flash_fwd_hopper as hopper

    q = torch.empty(2, 4096, 16, 128, dtype=torch.bfloat16)
    softcap, slopes = (30.0, None) if option == "softcap" else (0.0, torch.rand(16))
    plan = partial(flash_fwd._fast_forward_plan, q, q, q, q, 128, -1, 0, softcap, slopes, None, 0.0, False, 16)
    assert plan() is None                                            # the interpreter: the general kernel
    monkeypatch.setattr(flash_fwd, "INTERPRET", False)
    monkeypatch.setattr(hopper, "available", lambda device: True)
    monkeypatch.setattr(flash_fwd, "sm_count", lambda device: 132)
    assert plan() == dict(hopper.hopper_forward_config(128, True, 4096, 4096, 32, 132), GLUON=True)
    assert (plan(softmax_scale=0.0) is None) == (option == "alibi")       # (Gluon divides ALiBi's slope by the scale)
    monkeypatch.setattr(hopper, "available", lambda device: False)
    assert plan() is None                                            # no Gluon: not the fast Triton kernel either
    assert flash_fwd._fast_forward_plan(q, q, q, q, 128, -1, 0, 0.0, None, None, 0.0, False, 16) is not None
    log2e = math.log2(math.e)
    assert _flash_common.score_scales(0.125, 30.0) == (30.0 * log2e, 0.125 / 30.0)
    assert _flash_common.score_scales(0.125, 0.0) == (0.125 * log2e, 0.0)


def test_hopper_backward_plan(monkeypatch):
    """flash_bwd_hopper's Gluon backward: without bias / dropout (softcap and ALiBi are in), 16-bit (varlen's packed
    tensors too), at head dims 33..256 (computed at 64 / 128, 128 + 32 / 64, 256; varlen's 129..192 at 256), where the
    device can run it (never in the interpreter); deterministic=True only above 128, whose dQ pass adds nothing across
    programs (elsewhere dQ is added by TMA reduce-adds). The kernels run in the GPU tier
    (test_flash_attn_kernels_gpu.py, test_flash_attn_varlen_gpu.py)."""
    from flashfuse.ops.attention import flash_bwd, flash_bwd_hopper as hopper

    q = torch.empty(2, 256, 4, 128, dtype=torch.bfloat16)
    plan = partial(flash_bwd._hopper_plan, q, q, q, q, extras=False)
    assert plan(deterministic=False) is None                          # the interpreter: no Gluon
    monkeypatch.setattr(hopper, "available", lambda device: True)
    assert plan(deterministic=False) == hopper.HOPPER_BWD_CONFIGS[128]
    assert plan(deterministic=True) is None
    packed = q[0]                                                     # varlen: (total, heads, head_dim)
    assert flash_bwd._hopper_plan(packed, packed, packed, packed, deterministic=False, extras=False) == \
        hopper.HOPPER_BWD_CONFIGS[128]
    assert flash_bwd._hopper_plan(q, q, q, q, deterministic=False, extras=True) is None
    configs = hopper.HOPPER_BWD_CONFIGS
    # softcap and ALiBi are in the kernel (session 48); at head dim 64 in the transposed layout (the row layout spills)
    assert plan(deterministic=False, score_mod=True) == configs[128]
    q64 = torch.empty(2, 256, 4, 64, dtype=torch.bfloat16)
    assert flash_bwd._hopper_plan(q64, q64, q64, q64, deterministic=False, extras=False, score_mod=True) == \
        hopper.HOPPER_BWD_SCORE_MOD_CONFIGS[64]
    assert hopper.HOPPER_BWD_SCORE_MOD_CONFIGS[64]["SCORES_T"] and not configs[64]["SCORES_T"]
    for head_dim, config, packed_config in (
            (40, configs[64], configs[64]), (72, configs[80], configs[128]), (96, configs[128], configs[128]),
            (112, configs[128], configs[128]), (136, configs[160], configs[256]),
            (160, configs[160], configs[256]), (168, configs[192], configs[256]), (192, configs[192], configs[256]),
            (200, configs[256], configs[256]), (256, configs[256], configs[256]), (24, None, None)):
        qd = torch.empty(2, 256, 4, head_dim, dtype=torch.bfloat16)
        assert flash_bwd._hopper_plan(qd, qd, qd, qd, deterministic=False, extras=False) == config
        deterministic = flash_bwd._hopper_plan(qd, qd, qd, qd, deterministic=True, extras=False)
        assert deterministic == (config if head_dim > 128 else None)
        packed = qd[0]                  # varlen: 129..192 padded to 256 (the producers' zeroing takes one box)
        assert flash_bwd._hopper_plan(packed, packed, packed, packed, deterministic=False, extras=False) == \
            packed_config
    assert all(configs[d]["DQ_PASS"] for d in (160, 192, 256)) and not configs[128]["DQ_PASS"]
    # lse2 / delta rows rounded to the largest query block reading them: the dQ pass's 128 rows above 128
    assert [hopper.vector_block(configs[d]) for d in (64, 128, 160, 192, 256)] == [128, 64, 128, 128, 128]
    assert [configs[d]["TAIL_DIM"] for d in (64, 80, 96, 128, 160, 192, 256)] == [0, 16, 0, 0, 32, 64, 0]
    assert configs[80]["SCORES_T"]                                  # 64 + 16 columns in hd128's layout
    q32 = q.float()
    assert flash_bwd._hopper_plan(q32, q32, q32, q32, deterministic=False, extras=False) is None
    assert flash_bwd._hopper_plan(q.float(), q, q, q, deterministic=False, extras=False) is None
    kv = q[:, :, :1].expand(q.shape)                                  # broadcast over heads: no descriptor
    assert flash_bwd._hopper_plan(q, q, kv, kv, deterministic=False, extras=False) is None


@pytest.mark.parametrize("seqlen_q, block_m", [(77, 64), (128, 64), (1, 32)])
@pytest.mark.parametrize("rows_block", [0, 128])
def test_hopper_backward_inputs(monkeypatch, seqlen_q, block_m, rows_block):
    """The preprocess in flash_bwd_hopper's layout: delta = rowsum(dO * O) and lse2 = lse * log2(e) as
    [batch * nheads, seqlen_q rounded up to block_m (or rows_block: the dQ pass's 128-row blocks)] rows, exactly 0
    in the padding (a whole query block is read; +inf lse of rows with no key stays +inf), and the fp32 dQ buffer
    zeroed (it is filled with NaN first)."""
    from flashfuse.ops.attention import flash_bwd_preprocess

    out, dout = torch.randn(2, seqlen_q, 3, 40), torch.randn(2, seqlen_q, 3, 40)
    lse = torch.randn(2, 3, seqlen_q)
    lse[0, 1, 0] = float("inf")
    empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **kw: empty(*a, **kw).fill_(float("nan")))  # no zero by accident
    delta, lse2, dq_acc = flash_bwd_preprocess.hopper_backward_inputs(out, dout, lse, block_m, rows_block=rows_block)
    monkeypatch.undo()
    assert dq_acc.shape == out.shape and dq_acc.dtype == torch.float32 and (dq_acc == 0).all()
    rows = -(-seqlen_q // (rows_block or block_m)) * (rows_block or block_m)
    assert delta.shape == lse2.shape == (6, rows)
    ref_delta = (out.double() * dout.double()).sum(-1).transpose(1, 2).reshape(6, seqlen_q)
    torch.testing.assert_close(delta[:, :seqlen_q].double(), ref_delta, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse2[:, :seqlen_q], lse.reshape(6, seqlen_q) * 1.4426950408889634)
    assert (delta[:, seqlen_q:] == 0).all() and (lse2[:, seqlen_q:] == 0).all()


@pytest.mark.parametrize("softcap", [False, True])
@pytest.mark.parametrize("varlen", [False, True])
@pytest.mark.parametrize("head_dim", [64, 80, 96, 128, 160, 192, 256])
def test_hopper_backward_vector_descriptors(head_dim, varlen, softcap):
    """The Gluon backward's plans (built on the CPU; nothing launched) read lse2 / delta through descriptors over the
    rows the preprocess made with rows_block=vector_block(config): whole boxes of each kernel's query block; a
    softcap is a constexpr of both kernels' plans."""
    from flashfuse.ops.attention import flash_bwd_dq_hopper, flash_bwd_preprocess
    from flashfuse.ops.attention import flash_bwd_hopper as hopper
    from flashfuse.ops.attention.flash_fwd_hopper import forward_head_dim, kernel_head_dim

    config = hopper.hopper_backward_config(head_dim, varlen, softcap)     # (softcap: ALiBi too, in the plans)
    x = torch.randn(2, 77, 3, head_dim, dtype=torch.bfloat16)
    lse = torch.randn(2, 3, 77)
    extra, shape = {}, None
    if varlen:
        cu = torch.tensor([0, 77, 154], dtype=torch.int32)
        x, lse, extra, shape = x.flatten(0, 1), lse.transpose(0, 1).flatten(1), \
            dict(cu_seqlens_q=cu, max_seqlen_q=77), (cu.numel(), 77, 77)
    delta, lse2, _ = flash_bwd_preprocess.hopper_backward_inputs(x, x, lse, config["BLOCK_M"], **extra,
                                                                 rows_block=hopper.vector_block(config))
    plan = hopper._BackwardPlan(x, x, x, x, torch.empty_like(x), lse2, -1, -1, True, config, shape, softcap, softcap)
    assert plan.launch.constexprs["HAS_SOFTCAP"] == plan.launch.constexprs["HAS_ALIBI"] == softcap
    assert plan.descriptors[4] == plan.descriptors[5] and plan.descriptors[4][0] == list(lse2.shape)
    assert plan.descriptors[4][2] == [1, config["BLOCK_M"]]
    # the tail's boxes (q, k, v, dout, then the fp32 dQ buffer's) start at the main width's column
    tail = 0 if varlen else config["TAIL_DIM"]
    width = plan.descriptors[0][2][3]
    assert width == (kernel_head_dim(head_dim) if not tail else forward_head_dim(head_dim) - tail)
    assert [d[2][3] for d in plan.descriptors[9:]] == [tail or width] * 5 and len(plan.descriptors) == 14
    if config["DQ_PASS"]:
        dq_plan = flash_bwd_dq_hopper._DqPlan(x, x, x, x, torch.empty_like(x), lse2, -1, -1, True,
                                              config["TAIL_DIM"], shape, softcap, softcap)
        assert dq_plan.launch.constexprs["HAS_SOFTCAP"] == dq_plan.launch.constexprs["HAS_ALIBI"] == softcap
        block = flash_bwd_dq_hopper.dq_config(config["TAIL_DIM"])["BLOCK_M"]
        assert dq_plan.descriptors[4][0] == list(lse2.shape) and dq_plan.descriptors[4][2] == [1, block]
        assert lse2.shape[1] % block == 0


def test_hopper_backward_inputs_rows_block():
    """Rows rounded to a rows_block that is no multiple of the preprocess's block would leave rows unwritten."""
    from flashfuse.ops.attention import flash_bwd_preprocess

    out = torch.randn(1, 70, 2, 40)
    with pytest.raises(ValueError, match="rows_block=96 must be a multiple of block_m=64"):
        flash_bwd_preprocess.hopper_backward_inputs(out, out, torch.randn(1, 2, 70), 64, rows_block=96)


def test_hopper_backward_inputs_varlen(monkeypatch):
    """Varlen (packed (total, heads, head_dim), lse (heads, total)): delta and lse2 [nheads, vector_rows], sequence
    b's rows from column cu_seqlens[b] rounded up to 4, plus 4 b (TMA boxes of fp32 start 16-byte aligned; an empty
    sequence, rows past the last sequence), 0 in every other column (the Gluon kernels read whole query blocks over
    a sequence's end), the dQ buffer zeroed (its rows past the last sequence too: they are dQ's)."""
    from flashfuse.ops.attention import flash_bwd_preprocess

    cu = torch.tensor([0, 5, 5, 77, 80], dtype=torch.int32)
    total = 83                                        # rows 80..82 are in no sequence
    out, dout, lse = torch.randn(total, 3, 40), torch.randn(total, 3, 40), torch.randn(3, total)
    empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **kw: empty(*a, **kw).fill_(float("nan")))  # no zero by accident
    delta, lse2, dq_acc = flash_bwd_preprocess.hopper_backward_inputs(out, dout, lse, 64, cu_seqlens_q=cu,
                                                                      max_seqlen_q=72)
    monkeypatch.undo()
    assert delta.shape == lse2.shape == (3, flash_bwd_preprocess.vector_rows(total, 64, 4)) == (3, 128)
    assert dq_acc.shape == out.shape and (dq_acc == 0).all()
    ref_delta = (out.double() * dout.double()).sum(-1).T
    columns = torch.zeros(128, dtype=torch.bool)
    for b, (start, end) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        vec0 = (start + 3) // 4 * 4 + 4 * b
        assert vec0 % 4 == 0 and not columns[vec0:vec0 + end - start].any()
        columns[vec0:vec0 + end - start] = True
        torch.testing.assert_close(delta[:, vec0:vec0 + end - start].double(), ref_delta[:, start:end], rtol=1e-5,
                                   atol=1e-5)
        torch.testing.assert_close(lse2[:, vec0:vec0 + end - start], lse[:, start:end] * 1.4426950408889634)
    assert columns.sum() == 80 and (delta[:, ~columns] == 0).all() and (lse2[:, ~columns] == 0).all()


def test_backward_fp32_grads():
    """flash_attn_backward(fp32_grads=True) (ring attention sums partial gradients in fp32): float32 dq, dk, dv
    that round to exactly the default call's 16-bit gradients (one rounding, at the end)."""
    from flashfuse.ops.attention import flash_bwd
    from flashfuse.ops.attention.flash_fwd import flash_attn_forward

    q, k, v = rand_qkv(1, 45, 70, 4, 2, 32, dtype=F16, device="cpu", requires_grad=False)
    dout = rand(1, 45, 4, 32, dtype=F16, device="cpu", requires_grad=False)
    opts = dict(softmax_scale=32 ** -0.5, window_right=3, bottom_right=False)
    out, lse = flash_attn_forward(q, k, v, **opts)
    grads16 = flash_bwd.flash_attn_backward(dout, q, k, v, out, lse, **opts)
    grads32 = flash_bwd.flash_attn_backward(dout, q, k, v, out, lse, fp32_grads=True, **opts)
    for name, g16, g32 in zip(("dq", "dk", "dv"), grads16, grads32):
        assert g32.dtype == torch.float32 and g16.dtype == F16, name
        assert torch.equal(g32.to(F16), g16), name


# ----------------------------------------------------------------------------------------------------
# Windows that hide no key (interface.binding_window): run as unwindowed attention
# ----------------------------------------------------------------------------------------------------

def test_binding_window_matches_the_mask():
    """binding_window drops a side exactly when the mask it describes hides no key, for every length pair and
    window side up to 6, both alignments (brute force over query / key pairs)."""
    from flashfuse.ops.attention.interface import binding_window
    for sq in range(0, 6):
        for sk in range(0, 6):
            for bottom_right in (True, False):
                off = sk - sq if bottom_right else 0
                for w in range(-1, 7):
                    pairs = [(i, j) for i in range(sq) for j in range(sk)]
                    hides_left = w >= 0 and any(j < i + off - w for i, j in pairs)
                    hides_right = w >= 0 and any(j > i + off + w for i, j in pairs)
                    left, right = binding_window(sq, sk, w, w, bottom_right)
                    assert (left >= 0) == hides_left, (sq, sk, bottom_right, w)
                    assert (right >= 0) == hides_right, (sq, sk, bottom_right, w)
                    if left >= 0:
                        assert left == w
                    if right >= 0:
                        assert right == w


def test_non_binding_window_equals_unwindowed(device):
    """A left window as wide as the keys (Mistral's 4096 over 4096 tokens, here 76 over 77) with causal gives the
    bits of plain causal attention, in the forward and every gradient: the same kernels run."""
    q, k, v = rand_qkv(1, 77, 77, 2, 1, 32, dtype=F16, device=device)
    outs = []
    for window in ((76, 0), (-1, -1)):
        qq, kk, vv = (t.detach().clone().requires_grad_() for t in (q, k, v))
        out = flash_attn_func(qq, kk, vv, causal=True, window_size=window)
        out.float().square().sum().backward()
        outs.append((out, qq.grad, kk.grad, vv.grad))
    for a, b in zip(*outs):
        assert torch.equal(a, b)
