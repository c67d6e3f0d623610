"""FlashAttention GPU tier (`pytest -m gpu`), the kernels behind the API: the fast Triton forward's table and every
config its tune script sweeps, and the Gluon forward and backward for Hopper (flash_fwd_hopper, flash_bwd_hopper):
their tables, the configs measured against them, the plans kept per call signature, padded head dims, fp32 partial
gradients. Error criterion and reference as test_flash_attn_gpu.py's (flash-attn's, fp32 reference on the GPU)."""

from functools import partial

import pytest
import torch
import triton

from attention_utils import (assert_finite, assert_zero_rows, check_attention,  # noqa: F401 (a fixture)
                             exact_fp32_reference, flash_ref, no_key_rows_flash, rand_qkv, with_alibi)
from flashfuse import flash_attn_func
from flashfuse.ops.attention import flash_bwd, flash_bwd_hopper, flash_fwd, flash_fwd_hopper

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("exact_fp32_reference")]

F16, BF16 = torch.float16, torch.bfloat16
MHA, GQA, MQA = (6, 6), (6, 2), (6, 1)                     # (nheads_q, nheads_k)
REF = torch.float32                                        # reference dtype on the GPU (test_flash_attn_gpu.py)


# ----------------------------------------------------------------------------------------------------
# Fast forward path (flash_fwd.FAST_FORWARD): its table and every knob of the tune script's sweep
# ----------------------------------------------------------------------------------------------------

def _fast_cfg(kind, bm, bn, warps, stages):
    return flash_fwd._fast(bm, bn, warps, stages, split=kind == "split", tma=kind != "ptr")


# benchmarks/tune_flash_fwd.py's candidates (all compile for sm_90 with triton 3.6); FAST_CONFIGS below.
FAST_GPU_CONFIGS = [
    (64, ("tma", 128, 128, 8, 3)), (64, ("tma", 128, 64, 8, 3)), (64, ("split", 128, 128, 4, 2)),
    (64, ("split", 256, 128, 8, 2)), (64, ("tma", 128, 64, 4, 3)), (64, ("ptr", 128, 128, 8, 3)),
    (128, ("tma", 128, 128, 8, 2)), (128, ("tma", 128, 64, 8, 3)), (128, ("tma", 128, 128, 8, 3)),
    (128, ("ptr", 128, 128, 8, 3)),
]


# (dtype, (seqlen_q, seqlen_k), heads, options): every config gets the first case and one of the others.
FAST_GPU_SHAPES = [
    (BF16, (1021, 1037), GQA, {"causal": True}),             # ragged ends, causal diagonal
    (F16, (2048, 2048), MHA, {}),                           # even key blocks (EVEN_K)
    (BF16, (1100, 1000), MQA, {"causal": True}),            # rows with no visible key
    (F16, (777, 1500), MHA, {"window_size": (-1, 64)}),     # a right window, ragged
]
FAST_GPU_CASES = [(d, spec, *FAST_GPU_SHAPES[j]) for i, (d, spec) in enumerate(FAST_GPU_CONFIGS)
                  for j in (0, 1 + i % 3)]


@pytest.mark.parametrize("headdim, spec, dtype, seqlens, heads, opts", FAST_GPU_CASES,
                         ids=["d{}-{}-{}x{}-w{}-s{}".format(c[0], *c[1]) + f"-{c[3][0]}x{c[3][1]}"
                              for c in FAST_GPU_CASES])
def test_fast_forward_configs_gpu(monkeypatch, headdim, spec, dtype, seqlens, heads, opts):
    """Each swept config of the fast kernel (the pointer kernel removed), out / lse / every gradient against
    the fp32 reference; ragged last key blocks, rows with no visible key."""
    monkeypatch.setattr(flash_fwd, "FAST_FORWARD", True)
    monkeypatch.setattr(flash_fwd, "GLUON_FORWARD", False)
    monkeypatch.setattr(flash_fwd, "fast_forward_config", lambda *a: _fast_cfg(*spec))
    monkeypatch.setattr(flash_fwd, "_flash_fwd_kernel", None)
    q, k, v = rand_qkv(2, *seqlens, *heads, headdim, dtype=dtype, device="cuda")
    opts = with_alibi(opts, 2, heads[0])
    out, lse, _ = flash_attn_func(q, k, v, return_attn_probs=True, **opts)
    grads, (_, ref_lse, _) = check_attention(partial(flash_ref, **opts), {"q": q, "k": k, "v": v}, out, lse=lse,
                                             ref_dtype=REF)
    assert_zero_rows("out", out.detach(), no_key_rows_flash(ref_lse))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_fast_forward_table_gpu(monkeypatch, causal):
    """FAST_CONFIGS at a benchmark shape (16384 tokens, model dim 2048, hd 128, S = 4096): the launcher picks
    the fast kernel by itself (the pointer kernel removed) from its shortest key loop on; output within bf16
    rounding of SDPA's math backend in fp32."""
    monkeypatch.setattr(flash_fwd, "_flash_fwd_kernel", None)
    _check_benchmark_shape_forward(128, flash_fwd.FAST_MIN_SEQLEN_K[causal], causal, BF16)


def _check_benchmark_shape_forward(headdim, seqlen, causal, dtype):
    """flash_attn_func at a benchmark shape (16384 tokens, model dim 2048): output within 16-bit rounding of
    SDPA's math backend in fp32."""
    q, k, v = (torch.randn(16384 // seqlen, seqlen, 2048 // headdim, headdim, device="cuda", dtype=dtype)
               for _ in range(3))
    out = flash_attn_func(q, k, v, causal=causal)
    ref = torch.nn.functional.scaled_dot_product_attention(*(t.transpose(1, 2).float() for t in (q, k, v)),
                                                           is_causal=causal).transpose(1, 2)
    err = ((out.float() - ref).norm() / ref.norm()).item()
    assert err < 1e-2, f"rel err {err:.2e}"


@pytest.mark.parametrize("headdim, causal, gluon", [(128, True, False), (64, False, True), (128, False, True),
                                                    (128, True, True)],
                         ids=["triton-hd128-causal", "gluon-persistent-hd64", "gluon-persistent-hd128",
                              "gluon-paired-hd128-causal"])
def test_fast_forward_graph_compile_thread_gpu(monkeypatch, headdim, causal, gluon):
    """The fast kernels' device-side descriptors need triton's allocator: under CUDA-graph capture and
    replay, torch.compile(fullgraph=True), and in a new thread (the allocator is a context variable).
    The Triton fast kernel (Gluon switched off), and flash_fwd_hopper's kernel where HOPPER_CONFIGS sends
    these shapes (persistent; causal over paired row blocks); its host-side descriptors are encoded in the new
    thread too."""
    import threading

    monkeypatch.setattr(flash_fwd, "_flash_fwd_kernel", None)
    if gluon:
        _require_gluon()
        assert flash_fwd_hopper.hopper_forward_config(headdim, causal, 4096, 4096, 16, 132) is not None
        monkeypatch.setattr(flash_fwd, "_flash_fwd_fast_kernel", None)
    else:
        monkeypatch.setattr(flash_fwd, "GLUON_FORWARD", False)
    q, k, v = (torch.randn(1, 4096, 16, headdim, device="cuda", dtype=BF16) for _ in range(3))
    eager = flash_attn_func(q, k, v, causal=causal)
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    with torch.cuda.stream(stream):
        flash_attn_func(q, k, v, causal=causal)
        with torch.cuda.graph(graph, stream=stream):
            captured = flash_attn_func(q, k, v, causal=causal)
    captured.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, eager), "graph replay differs from eager"
    compiled = torch.compile(lambda a, b, c: flash_attn_func(a, b, c, causal=causal), fullgraph=True)(q, k, v)
    assert torch.equal(compiled, eager), "torch.compile differs from eager"
    result = {}
    thread = threading.Thread(target=lambda: result.update(out=flash_attn_func(q, k, v, causal=causal)))
    thread.start()
    thread.join()
    assert torch.equal(result["out"], eager), "a new thread's call differs from eager"


# ----------------------------------------------------------------------------------------------------
# Gluon forward (flash_fwd_hopper): the shipped table entry and the configs measured against it
# ----------------------------------------------------------------------------------------------------

def _require_gluon():
    """The Gluon kernel is written for triton 3.6 on sm_90 (flash_fwd_hopper.GLUON_TRITON); elsewhere
    flash_fwd never calls it and there is nothing of it to test."""
    if not flash_fwd_hopper.available(torch.device("cuda")):
        pytest.skip(f"flash_fwd_hopper needs sm_90 and triton {flash_fwd_hopper.GLUON_TRITON}x "
                    f"(here sm_{''.join(map(str, torch.cuda.get_device_capability()))}, triton {triton.__version__})")


def _hopper(persistent, bn=128, stages=2, consumers=2, q_stages=2, split_pv_wait=False, o_from_regs=False, tail=0):
    return dict(CONSUMERS=consumers, BLOCK_M=64 * consumers, BLOCK_N=bn, NUM_STAGES=stages, Q_STAGES=q_stages,
                num_warps=4, CONSUMER_REGS=240 if consumers == 2 else 160, PERSISTENT=persistent,
                SPLIT_PV_WAIT=split_pv_wait, O_FROM_REGS=o_from_regs, TAIL_DIM=tail)


def _hopper_id(headdim, config):
    return ("d{}-{BLOCK_M}x{BLOCK_N}-s{NUM_STAGES}-q{Q_STAGES}".format(headdim, **config)
            + ("-persistent" * config["PERSISTENT"]) + ("-split" * config["SPLIT_PV_WAIT"])
            + ("-oregs" * config["O_FROM_REGS"]) + (f"-tail{config['TAIL_DIM']}" * bool(config["TAIL_DIM"])))


# (head dim, config): HOPPER_CONFIGS's kinds (persistent or one tile per program) at both head dims, three consumer
# warpgroups at hd64 (session 16), then alternatives measured in session 15 (128 x 64 key tiles with 4 stages, 3
# stages at hd64), 16 (three consumers with 64-key tiles), 17 (one Q slot per consumer) and 23 (64-key tiles, where
# causal tiles end in a block the lower warpgroup releases unread); 29: the persistent kernel with 3 stages (hd64
# causal from 1K keys); 30: the P V wait after the softmax (hd128 causal from 2K keys).
HOPPER_GPU_CONFIGS = [(64, _hopper(True)), (64, _hopper(False)), (128, _hopper(True)), (128, _hopper(False)),
                      (64, _hopper(True, consumers=3)), (64, _hopper(False, bn=64, consumers=3)),
                      (128, _hopper(True, bn=64, stages=4)), (64, _hopper(False, stages=3)),
                      (128, _hopper(True, q_stages=1)), (64, _hopper(True, bn=64)),
                      (64, _hopper(False, bn=64, stages=3, q_stages=1)), (64, _hopper(True, stages=3)),
                      (128, _hopper(True, q_stages=1, split_pv_wait=True)),
                      # head dims between, padded to the kernel's by the TMA boxes (kernel_head_dim; session 36)
                      (40, _hopper(True, bn=64, stages=3)), (72, _hopper(False)), (96, _hopper(True, q_stages=1)),
                      # head dims padded to 256, O stored from registers (session 38)
                      (256, _hopper(True, bn=64, q_stages=1, o_from_regs=True)),
                      (160, _hopper(False, bn=64, q_stages=1, o_from_regs=True)),
                      (200, _hopper(True, bn=64, q_stages=1, o_from_regs=True)),
                      # 129..192 as 128 columns and a 32- / 64-column tail (session 43; 144 and 176: the tail's box
                      # zero-filled past the head dim)
                      (160, _hopper(True, q_stages=1, o_from_regs=True, tail=32)),
                      (144, _hopper(False, bn=128, q_stages=1, o_from_regs=True, tail=32)),
                      (192, _hopper(True, bn=64, stages=3, q_stages=1, o_from_regs=True, tail=64)),
                      (176, _hopper(False, bn=64, o_from_regs=True, tail=64))]
HOPPER_GPU_SHAPES = FAST_GPU_SHAPES + [(BF16, (1, 77), MHA, {}), (F16, (300, 100), GQA, {"causal": True}),
                                      (BF16, (1500, 777), GQA, {"window_size": (-1, 32)}),  # paired, rows with no key
                                      (BF16, (1024, 1024), MHA, {"causal": True}),          # aligned diagonal
                                      (F16, (700, 900), GQA, {"causal": True, "softcap": 2.0}),  # tanh saturating
                                      (BF16, (333, 517), GQA, {"alibi": "bh"}),                   # ALiBi both ways
                                      (F16, (1024, 1000), MHA, {"causal": True, "alibi": "h"})]
HOPPER_GPU_CASES = [(d, cfg, *shape) for d, cfg in HOPPER_GPU_CONFIGS for shape in HOPPER_GPU_SHAPES]


@pytest.mark.parametrize("headdim, config, dtype, seqlens, heads, opts", HOPPER_GPU_CASES,
                         ids=[_hopper_id(c[0], c[1]) + f"-{c[3][0]}x{c[3][1]}-{'-'.join(c[5]) or 'full'}"
                              for c in HOPPER_GPU_CASES])
def test_hopper_forward_gpu(monkeypatch, headdim, config, dtype, seqlens, heads, opts):
    """The Gluon kernel alone (the Triton forwards removed) against the fp32 reference: out, lse, every
    gradient (the backward consumes its lse); ragged ends, causal both ways, a right window, rows with no
    visible key exactly 0, GQA / MQA, one query row. Five "SMs", so that a persistent program walks
    several tiles of different heads and causal lengths, and the last round leaves some programs idle."""
    _require_gluon()
    monkeypatch.setattr(flash_fwd_hopper, "hopper_forward_config", lambda *a, **kw: dict(config))
    monkeypatch.setattr(flash_fwd_hopper, "sm_count", lambda device: 5)
    monkeypatch.setattr(flash_fwd, "_flash_fwd_kernel", None)
    monkeypatch.setattr(flash_fwd, "_flash_fwd_fast_kernel", None)
    q, k, v = rand_qkv(2, *seqlens, *heads, headdim, dtype=dtype, device="cuda")
    opts = with_alibi(opts, 2, heads[0])
    out, lse, _ = flash_attn_func(q, k, v, return_attn_probs=True, **opts)
    grads, (_, ref_lse, _) = check_attention(partial(flash_ref, **opts), {"q": q, "k": k, "v": v}, out, lse=lse,
                                             ref_dtype=REF)
    empty = no_key_rows_flash(ref_lse)
    assert_zero_rows("out", out.detach(), empty)
    assert_zero_rows("dq", grads["q"], empty)


def test_hopper_plans_gpu(monkeypatch):
    """Launch plans (ops/_triton.PlanCache), forward and backward: a repeated call signature reuses its plan (new data,
    same shapes and strides), other strides or another config make a new one, and every result, gradients included,
    matches the fp32 reference."""
    _require_gluon()
    from flashfuse.ops.attention import flash_bwd_preprocess

    config = {"value": _hopper(True)}
    monkeypatch.setattr(flash_fwd_hopper, "hopper_forward_config", lambda *a, **kw: dict(config["value"]))
    monkeypatch.setattr(flash_fwd, "_flash_fwd_kernel", None)
    monkeypatch.setattr(flash_bwd, "_flash_bwd_kernel", None)
    from flashfuse.ops._triton import PlanCache

    plans = []
    for module, name in ((flash_fwd_hopper, "_PLANS"), (flash_bwd_hopper, "_PLANS"),
                         (flash_bwd_preprocess, "_PREPROCESS_PLANS")):
        monkeypatch.setattr(module, name, PlanCache())                   # empty, and never cleared by other tests
        plans.append(getattr(module, name).plans)

    def check(q, k, v):
        out, lse, _ = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
        check_attention(partial(flash_ref, causal=True), {"q": q, "k": k, "v": v}, out, lse=lse, ref_dtype=REF)
        return [len(p) for p in plans]

    first = check(*rand_qkv(2, 384, 384, *GQA, 64, dtype=BF16, device="cuda"))
    assert check(*rand_qkv(2, 384, 384, *GQA, 64, dtype=BF16, device="cuda")) == first          # reused
    qkv = torch.randn(2, 384, 3, GQA[0], 64, device="cuda", dtype=BF16)                           # other strides
    sliced = [t.detach().requires_grad_() for t in (qkv[:, :, 0], qkv[:, :, 1, :GQA[1]], qkv[:, :, 2, :GQA[1]])]
    assert first == [1, 1, 1] and check(*sliced) == [2, 2, 1]        # (the preprocess reads out and dout only)
    config["value"] = _hopper(False, bn=64, q_stages=1)                                        # another config
    assert check(*rand_qkv(2, 384, 384, *GQA, 64, dtype=BF16, device="cuda")) == [3, 2, 1]


HOPPER_TABLE_CASES = [(d, causal, min_seqlen_k, dtype) for (d, causal), entries in flash_fwd_hopper.HOPPER_CONFIGS.items()
                      for min_seqlen_k, _ in entries for dtype in (BF16, F16)]


@pytest.mark.parametrize("headdim, causal, seqlen, dtype", HOPPER_TABLE_CASES,
                         ids=[f"d{c[0]}-{'causal' if c[1] else 'full'}-s{c[2]}-{str(c[3])[6:]}" for c in HOPPER_TABLE_CASES])
def test_hopper_forward_table_gpu(monkeypatch, headdim, causal, seqlen, dtype):
    """Each HOPPER_CONFIGS entry at a benchmark shape (16384 tokens, model dim 2048, S = the entry's
    shortest key loop): the launcher picks the Gluon kernels by itself (the Triton forwards removed);
    output within 16-bit rounding of SDPA's math backend in fp32."""
    _require_gluon()
    monkeypatch.setattr(flash_fwd, "_flash_fwd_kernel", None)
    monkeypatch.setattr(flash_fwd, "_flash_fwd_fast_kernel", None)
    _check_benchmark_shape_forward(headdim, seqlen, causal, dtype)


@pytest.mark.parametrize("headdim", [40, 56, 72, 80, 96, 112, 160, 192, 224, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_padded_head_dims_take_gluon_gpu(monkeypatch, headdim, causal):
    """Head dims between 32 and 256 at a shape the tables send to the Gluon kernels: flash_attn_func takes both of them
    by itself (every Triton kernel removed), computing at 64 / 128 / 256 with the padding done by the TMA boxes (the
    forward: 65..96 and 129..192 as a main part plus a tail, forward_head_dim), and
    out, lse and every gradient pass flash-attn's criterion against the fp32 reference."""
    _require_gluon()
    assert flash_fwd_hopper.kernel_head_dim(headdim) == (64 if headdim <= 64 else 128 if headdim <= 128 else 256)
    widths = ((64, 80, 80), (80, 96, 96), (128, 160, 160), (160, 192, 192))     # (above, up to, computed width)
    assert flash_fwd_hopper.forward_head_dim(headdim) == next(
        (w for lo, hi, w in widths if lo < headdim <= hi), flash_fwd_hopper.kernel_head_dim(headdim))
    for name in ("_flash_fwd_kernel", "_flash_fwd_fast_kernel"):
        monkeypatch.setattr(flash_fwd, name, None)
    monkeypatch.setattr(flash_bwd, "_flash_bwd_kernel", None)
    q, k, v = rand_qkv(4, 1024, 1024, 16, 8, headdim, dtype=BF16, device="cuda")
    out, lse, _ = flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    check_attention(partial(flash_ref, causal=causal), {"q": q, "k": k, "v": v}, out, lse=lse, ref_dtype=REF)


@pytest.mark.parametrize("headdim", [72, 96, 144, 192])
def test_odd_causal_tails_take_gluon_gpu(monkeypatch, headdim):
    """Causal with an odd number of 128-row blocks (HOPPER_ODD_CAUSAL_CONFIGS: one tile per program) at the head dims
    the forward computes as a main part plus a tail: the Gluon forward by itself, out, lse and every gradient by
    flash-attn's criterion against the fp32 reference."""
    _require_gluon()
    assert flash_fwd_hopper.hopper_forward_config(headdim, True, 1152, 1152, 4 * 16, 132)["TAIL_DIM"] > 0
    for name in ("_flash_fwd_kernel", "_flash_fwd_fast_kernel"):
        monkeypatch.setattr(flash_fwd, name, None)
    q, k, v = rand_qkv(4, 1152, 1152, 16, 8, headdim, dtype=BF16, device="cuda")
    out, lse, _ = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    check_attention(partial(flash_ref, causal=True), {"q": q, "k": k, "v": v}, out, lse=lse, ref_dtype=REF)


SHORT_LOOP_CASES = [(72, 256, False), (72, 256, True), (64, 128, False), (64, 256, True), (96, 128, False),
                    (128, 384, True), (160, 384, True), (160, 256, False), (192, 128, True), (256, 128, False)]


@pytest.mark.parametrize("headdim, seqlen, causal", SHORT_LOOP_CASES,
                         ids=[f"d{d}-s{s}-{'causal' if c else 'full'}" for d, s, c in SHORT_LOOP_CASES])
def test_short_key_loops_take_gluon_gpu(monkeypatch, headdim, seqlen, causal):
    """Key loops of 128..384 keys (session 47; DiT-XL/2 attends over 256 tokens at hd72), batch 8 x 16 heads: the
    Gluon forward by itself where the tables send them (persistent, and one tile per program for odd causal row-block
    counts at 128 / 384), out, lse and every gradient by flash-attn's criterion against the fp32 reference."""
    _require_gluon()
    config = flash_fwd_hopper.hopper_forward_config(headdim, causal, seqlen, seqlen, 8 * 16, 132)
    assert config is not None and config["PERSISTENT"] == (not causal or seqlen // 128 % 2 == 0)
    for name in ("_flash_fwd_kernel", "_flash_fwd_fast_kernel"):
        monkeypatch.setattr(flash_fwd, name, None)
    q, k, v = rand_qkv(8, seqlen, seqlen, 16, 8, headdim, dtype=F16, device="cuda")
    out, lse, _ = flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    check_attention(partial(flash_ref, causal=causal), {"q": q, "k": k, "v": v}, out, lse=lse, ref_dtype=REF)



# ----------------------------------------------------------------------------------------------------
# Gluon backward (flash_bwd_hopper): deterministic=False on Hopper
# ----------------------------------------------------------------------------------------------------

HOPPER_BWD_SHAPES = [
    (BF16, (113, 203), MHA, {}),                                  # ragged ends in both sequences
    (F16, (256, 512), GQA, {"causal": True}),                     # bottom-right causal, GQA group loop
    (BF16, (512, 256), GQA, {"causal": True}),                    # rows with no visible key
    (F16, (1023, 1024), MQA, {}),
    (BF16, (1024, 1023), MHA, {"causal": True}),
    (BF16, (2048, 2048), GQA, {"causal": True}),
    (F16, (300, 100), MHA, {"window_size": (-1, 17)}),            # a right window only
    (BF16, (1, 77), MHA, {}),                                     # one query row
    (F16, (77, 1), GQA, {"causal": True}),                        # one key
    (BF16, (700, 900), GQA, {"causal": True, "window_size": (150, 0)}),   # a sliding window
    (F16, (333, 517), GQA, {"causal": True, "softcap": 2.0}),             # softcap (session 48)
    (BF16, (1024, 1024), MHA, {"softcap": 3.0, "softmax_scale": 0.5}),   # softcap, scores deep in the tanh's tails
    (F16, (700, 900), GQA, {"causal": True, "alibi": "h"}),               # ALiBi (session 48)
    (BF16, (300, 257), MQA, {"alibi": "bh", "softcap": 4.0}),             # ALiBi both ways, with a softcap
]
# 72 / 80: 64 columns plus a 16-column tail; 144 / 160 and 176 / 192: 128 columns plus a 32- / 64-column tail
# (TAIL_DIM), 72, 144 and 176 with zero-filled columns
HOPPER_BWD_CASES = [(d, *shape) for d in (64, 128, 40, 72, 80, 96, 144, 160, 176, 192, 256)
                    for shape in HOPPER_BWD_SHAPES]


@pytest.mark.parametrize("headdim, dtype, seqlens, heads, opts", HOPPER_BWD_CASES,
                         ids=[f"d{c[0]}-{str(c[1])[6:]}-{c[2][0]}x{c[2][1]}-{'-'.join(c[4]) or 'full'}"
                              for c in HOPPER_BWD_CASES])
def test_hopper_backward_gpu(monkeypatch, headdim, dtype, seqlens, heads, opts):
    """The Gluon backward alone (flash_bwd's grid removed) against the fp32 reference by flash-attn's
    criterion: every gradient, ragged ends, causal both ways, a right window, rows with no visible key
    (their dq exactly 0), GQA / MQA (dk, dv summed over the group), softcap, ALiBi; head dims 65..80 and 129..192 in
    the tail configs."""
    _require_gluon()
    monkeypatch.setattr(flash_bwd, "_flash_bwd_kernel", None)
    q, k, v = rand_qkv(2, *seqlens, *heads, headdim, dtype=dtype, device="cuda")
    plan = flash_bwd._hopper_plan(q, q, k, v, deterministic=False, extras=False,
                                  score_mod="softcap" in opts or "alibi" in opts)
    assert plan["TAIL_DIM"] == (16 if 64 < headdim <= 80 else 32 if 128 < headdim <= 160 else
                                64 if 160 < headdim <= 192 else 0)
    opts = with_alibi(opts, 2, heads[0])
    out, lse, _ = flash_attn_func(q, k, v, return_attn_probs=True, **opts)
    grads, (_, ref_lse, _) = check_attention(partial(flash_ref, **opts), {"q": q, "k": k, "v": v}, out, lse=lse,
                                             ref_dtype=REF)
    assert_zero_rows("dq", grads["q"], no_key_rows_flash(ref_lse))


@pytest.mark.parametrize("headdim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_hopper_backward_matches_deterministic_gpu(monkeypatch, headdim, causal):
    """A benchmark shape (16384 tokens, model dim 2048, S = 4096) through flash_attn_func: deterministic=False
    (the Gluon kernel; it must be taken) within bf16 rounding of deterministic=True (flash_bwd's grid, never
    the Gluon kernel: two runs bit-identical)."""
    _require_gluon()
    q, k, v = (torch.randn(4, 4096, 2048 // headdim, headdim, device="cuda", dtype=BF16, requires_grad=True)
               for _ in range(3))
    dout = torch.randn_like(q)
    calls = []
    launch = flash_bwd_hopper.hopper_backward
    monkeypatch.setattr(flash_bwd_hopper, "hopper_backward", lambda *a, **kw: calls.append(1) or launch(*a, **kw))

    def grads(deterministic):
        out = flash_attn_func(q, k, v, causal=causal, deterministic=deterministic)
        return torch.autograd.grad(out, (q, k, v), dout)

    det, det2 = grads(True), grads(True)
    assert not calls, "deterministic=True took the Gluon (atomic) backward"
    gluon_grads = grads(False)
    assert calls, "deterministic=False did not take the Gluon backward"
    for name, a, b, c in zip(("dq", "dk", "dv"), det, det2, gluon_grads):
        assert torch.equal(a, b), f"{name}: deterministic=True not bit-identical"
        assert_finite(name, c)
        err = ((c.float() - a.float()).norm() / a.float().norm()).item()
        assert err < 1e-2, f"{name}: Gluon backward rel err {err:.2e} vs deterministic"


@pytest.mark.parametrize("headdim", [64, 128, 80, 160, 192, 256])
def test_hopper_backward_fp32_grads_gpu(headdim):
    """fp32_grads=True on the Gluon backward (ring attention's partial gradients): float32 dk, dv that round to
    exactly the default call's (their sums run in a fixed order inside a program), dq within atomics' reordering
    of the default call's fp32 sums."""
    _require_gluon()
    from flashfuse.ops.attention.flash_fwd import flash_attn_forward

    q, k, v = rand_qkv(2, 1000, 777, 8, 2, headdim, dtype=BF16, device="cuda", requires_grad=False)
    dout = torch.randn_like(q)
    opts = dict(softmax_scale=headdim ** -0.5, window_right=100, bottom_right=False)
    out, lse = flash_attn_forward(q, k, v, **opts)
    assert flash_bwd._hopper_plan(dout, q, k, v, deterministic=False, extras=False) is not None
    dq16, dk16, dv16 = flash_bwd.flash_attn_backward(dout, q, k, v, out, lse, **opts)
    dq32, dk32, dv32 = flash_bwd.flash_attn_backward(dout, q, k, v, out, lse, fp32_grads=True, **opts)
    assert dq32.dtype == dk32.dtype == dv32.dtype == torch.float32
    assert torch.equal(dk32.to(BF16), dk16) and torch.equal(dv32.to(BF16), dv16)
    assert_finite("dq", dq32)
    err = ((dq32 - dq16.float()).norm() / dq16.float().norm()).item()
    assert err < 4e-3, f"dq rel err {err:.2e} vs the default call"
