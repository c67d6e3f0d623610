"""Head dims 129..256 on Hopper's Gluon kernels, GPU tier (`pytest -m gpu`): the backward's two passes (flash_bwd_hopper
computes dK / dV, flash_bwd_dq_hopper dQ) add nothing across programs, so deterministic=True takes them too and must
give bit-identical gradients; both passes must run (the Triton backward removed) and match flash_bwd's grid. The
correctness cases at these head dims (ragged ends, causal, windows, GQA, rows with no key) are test_flash_attn_gpu.py's
HOPPER_BWD_CASES and HOPPER_GPU_CONFIGS."""

import pytest
import torch

from attention_utils import assert_finite, rand_qkv
from flashfuse import flash_attn_func
from flashfuse.ops.attention import flash_bwd, flash_bwd_dq_hopper, flash_fwd_hopper

pytestmark = pytest.mark.gpu

BF16 = torch.bfloat16


@pytest.mark.parametrize("headdim, causal, window", [(256, False, (-1, -1)), (160, True, (-1, 0)),
                                                     (192, True, (300, 0))])
def test_wide_backward_deterministic_gpu(monkeypatch, headdim, causal, window):
    """deterministic=True at a head dim padded to 256 takes the Gluon passes (both launched), two runs bit-identical,
    within bf16 rounding of flash_bwd's Triton grid (GQA, ragged lengths, causal / a sliding window)."""
    if not flash_fwd_hopper.available(torch.device("cuda")):
        pytest.skip("flash_bwd_hopper needs sm_90 and triton " + flash_fwd_hopper.GLUON_TRITON)
    q, k, v = rand_qkv(2, 1000, 1100, 8, 2, headdim, dtype=BF16, device="cuda")
    dout = torch.randn_like(q)
    calls = []
    launch = flash_bwd_dq_hopper.hopper_backward_dq
    monkeypatch.setattr(flash_bwd_dq_hopper, "hopper_backward_dq", lambda *a, **kw: calls.append(1) or launch(*a, **kw))

    def grads(deterministic):
        out = flash_attn_func(q, k, v, causal=causal, window_size=window, deterministic=deterministic)
        return torch.autograd.grad(out, (q, k, v), dout)

    first, second = grads(True), grads(True)
    assert len(calls) == 2, "deterministic=True did not take the dQ pass"
    monkeypatch.setattr(flash_bwd, "GLUON_BACKWARD", False)           # flash_bwd's deterministic Triton grid
    triton_grads = grads(True)
    assert len(calls) == 2
    for name, a, b, t in zip(("dq", "dk", "dv"), first, second, triton_grads):
        assert torch.equal(a, b), f"{name}: not bit-identical run to run"
        assert_finite(name, a)
        err = ((a.float() - t.float()).norm() / t.float().norm()).item()
        assert err < 1e-2, f"{name}: rel err {err:.2e} vs flash_bwd's grid"
