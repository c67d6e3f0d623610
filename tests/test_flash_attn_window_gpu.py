"""Attention windows on Hopper's Gluon kernels, GPU tier (`pytest -m gpu`): sliding (left) windows, alone or with
causal / a right window, at shapes the launch tables send to flash_fwd_hopper and flash_bwd_hopper, with flash_fwd's
and flash_bwd's Triton kernels removed so that only the Gluon kernels can have run; windows that hide no key
(interface.binding_window). out, lse and every gradient by flash-attn's criterion against the fp32 reference
(test_flash_attn_gpu.py's docstring)."""

from functools import partial

import pytest
import torch

from attention_utils import check_attention, flash_ref, rand_qkv
from flashfuse import flash_attn_func
from flashfuse.ops.attention import flash_bwd, flash_fwd, flash_fwd_hopper

pytestmark = pytest.mark.gpu

F16, BF16 = torch.float16, torch.bfloat16
REF = torch.float32


@pytest.fixture(autouse=True)
def _gluon_only(monkeypatch):
    """Skip off sm_90 / triton 3.6 (the kernels are never called there); remove the Triton forwards and backward;
    full fp32 matmuls for the reference."""
    if not flash_fwd_hopper.available(torch.device("cuda")):
        pytest.skip("flash_fwd_hopper needs sm_90 and triton " + flash_fwd_hopper.GLUON_TRITON)
    for name in ("_flash_fwd_kernel", "_flash_fwd_fast_kernel"):
        monkeypatch.setattr(flash_fwd, name, None)
    monkeypatch.setattr(flash_bwd, "_flash_bwd_kernel", None)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)


# (dtype, headdim, batch, (seqlen_q, seqlen_k), (nheads_q, nheads_k), options): each table entry's key tile
# (64-key tiles at 512 keys, 3 stages at hd64 1K, Q_STAGES / SPLIT_PV_WAIT at hd128 2K), windows on and off block
# boundaries, rows with no visible key, bottom-right alignment with seqlen_q != seqlen_k, GQA, a padded head dim.
WINDOW_CASES = [
    (BF16, 128, 4, (1024, 1024), (16, 8), {"causal": True, "window_size": (256, 0)}),
    (F16, 128, 4, (2048, 2048), (16, 16), {"causal": True, "window_size": (1000, 0)}),
    (F16, 64, 4, (2048, 2048), (16, 4), {"causal": True, "window_size": (100, 0)}),
    (BF16, 64, 4, (1024, 1024), (16, 16), {"causal": True, "window_size": (300, 0)}),
    (F16, 128, 4, (512, 512), (16, 16), {"causal": True, "window_size": (77, 0)}),
    (BF16, 64, 4, (512, 512), (16, 8), {"causal": True, "window_size": (0, 0)}),        # the diagonal alone
    (BF16, 128, 4, (1024, 1024), (16, 16), {"window_size": (200, -1)}),                 # left only
    (F16, 128, 4, (1024, 1024), (16, 16), {"window_size": (150, 40)}),
    (BF16, 64, 4, (1536, 1024), (16, 16), {"causal": True, "window_size": (128, 0)}),   # rows with no key
    (BF16, 128, 4, (512, 1536), (16, 16), {"causal": True, "window_size": (600, 0)}),
    (BF16, 96, 4, (1024, 1024), (16, 16), {"causal": True, "window_size": (64, 0)}),    # head dim padded to 128
    (BF16, 64, 1, (8192, 8192), (4, 4), {"window_size": (1000, -1)}),                   # 2 consumers, not 3
]


@pytest.mark.parametrize("dtype, headdim, batch, seqlens, heads, opts", WINDOW_CASES)
def test_left_window_gluon_forward_gpu(dtype, headdim, batch, seqlens, heads, opts):
    q, k, v = rand_qkv(batch, *seqlens, *heads, headdim, dtype=dtype, device="cuda")
    out, lse, _ = flash_attn_func(q, k, v, return_attn_probs=True, **opts)
    check_attention(partial(flash_ref, **opts), {"q": q, "k": k, "v": v}, out, lse=lse, ref_dtype=REF)


@pytest.mark.parametrize("window", [(1023, 0), (4096, 0), (1023, 1023)])
def test_non_binding_window_takes_gluon_gpu(window):
    """A window that hides no key (Mistral's 4096 over <= 4096 tokens) runs both Gluon kernels and passes the criterion
    against the reference of the windowed attention."""
    q, k, v = rand_qkv(4, 1024, 1024, 16, 8, 128, dtype=BF16, device="cuda")
    out, lse, _ = flash_attn_func(q, k, v, window_size=window, return_attn_probs=True)
    check_attention(partial(flash_ref, window_size=window), {"q": q, "k": k, "v": v}, out, lse=lse, ref_dtype=REF)
