"""Varlen on Hopper's Gluon kernels, GPU tier (`pytest -m gpu`): packed sequences of random lengths (an empty one, a
length-1 one, lengths q != k, rows that see no key) through flash_attn_varlen_func must launch the Gluon forward
(flash_fwd_hopper, O stored from registers so no row of the next sequence is overwritten) and backward
(flash_bwd_hopper: rows past a sequence's end masked, its last dK / dV block stored from registers; at 256 the dQ
pass) and match flash-attn's semantics per sequence (out, lse and every gradient against an fp32 reference), softcap
and ALiBi too. The other varlen cases (dropout: the Triton kernels) are test_flash_attn_gpu.py's VARLEN_CASES."""

from functools import partial

import pytest
import torch

from attention_utils import (assert_zero_rows, check_attention, check_rows_past_last_sequence, cu_seqlens,
                             exact_fp32_reference, no_key_rows_varlen, rand, varlen_ref, with_alibi)  # noqa: F401
from flashfuse import flash_attn_varlen_func
from flashfuse.ops.attention import flash_bwd_hopper, flash_fwd_hopper

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("exact_fp32_reference")]

F16, BF16 = torch.float16, torch.bfloat16


# (seed, dtype, headdim, (nheads_q, nheads_k), max length, same lengths for q and k, options): each a config of the
# Gluon table at its max length (64-key tiles below 1K keys, paired row blocks, an odd row-block count, 256 columns,
# three consumer warpgroups).
CASES = [
    pytest.param(1, BF16, 128, (16, 16), 2048, True, {"causal": True}, id="causal-bf16-d128-paired"),
    pytest.param(2, F16, 64, (8, 2), 4096, True, {}, id="gqa-fp16-d64-4k"),        # (hd64 unmasked: from 4K keys)
    pytest.param(3, BF16, 80, (16, 2), 1300, False, {"causal": True, "window_size": (256, 0)},
                 id="window-gqa-bf16-d80"),
    pytest.param(4, BF16, 128, (16, 16), 1150, False, {"causal": True}, id="causal-odd-blocks-bf16-d128"),
    pytest.param(5, F16, 64, (24, 8), 900, True, {"causal": True}, id="causal-64-key-tiles-fp16-d64"),
    pytest.param(6, BF16, 256, (16, 8), 1100, False, {"causal": True}, id="causal-gqa-bf16-d256"),
    pytest.param(7, BF16, 160, (16, 16), 1024, False, {}, id="bf16-d160"),
    pytest.param(8, BF16, 64, (8, 2), 8192, True, {}, id="gqa-bf16-d64-8k-three-consumers"),
    pytest.param(9, F16, 128, (16, 4), 1500, False, {"causal": True, "softcap": 2.5}, id="softcap-causal-fp16-d128"),
    pytest.param(10, BF16, 64, (8, 8), 4096, True, {"softcap": 3.0}, id="softcap-bf16-d64-4k"),
    pytest.param(11, BF16, 128, (16, 4), 1300, False, {"causal": True, "alibi": "bh"}, id="alibi-causal-bf16-d128"),
    pytest.param(12, F16, 256, (8, 8), 1000, True, {"alibi": "h"}, id="alibi-fp16-d256"),
]


@pytest.mark.parametrize("seed, dtype, headdim, heads, max_len, same, opts", CASES)
def test_varlen_gluon_forward_gpu(monkeypatch, seed, dtype, headdim, heads, max_len, same, opts):
    """Eight random lengths in [1, max_len] plus max_len itself, a length-1 query and an empty sequence; with
    separate key lengths some queries (causal, bottom-right) see no key: their rows are 0, lse +inf."""
    if not flash_fwd_hopper.available(torch.device("cuda")):
        pytest.skip("flash_fwd_hopper needs sm_90 and triton " + flash_fwd_hopper.GLUON_TRITON)
    calls = []
    for module, name in ((flash_fwd_hopper, "hopper_forward"), (flash_bwd_hopper, "hopper_backward")):
        monkeypatch.setattr(module, name, lambda *a, _launch=getattr(module, name), _name=name, **kw: calls.append(
            (_name, kw.get("cu_seqlens_q") is not None)) or _launch(*a, **kw))
    g = torch.Generator().manual_seed(seed)
    lens_q = torch.randint(1, max_len + 1, (8,), generator=g).tolist() + [max_len, 1, 0]
    lens_k = lens_q if same else torch.randint(1, max_len + 1, (8,), generator=g).tolist() + [max_len // 3, 700, 0]
    (nheads_q, nheads_k), total_q, total_k = heads, sum(lens_q), sum(lens_k)
    q = rand(total_q, nheads_q, headdim, dtype=dtype, device="cuda")
    k = rand(total_k, nheads_k, headdim, dtype=dtype, device="cuda")
    v = rand(total_k, nheads_k, headdim, dtype=dtype, device="cuda")
    cu_q, cu_k = cu_seqlens(lens_q, "cuda"), cu_seqlens(lens_k, "cuda")
    opts = with_alibi(opts, len(lens_q), nheads_q)
    out, lse, _ = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), return_attn_probs=True,
                                         **opts)
    assert calls == [("hopper_forward", True)], "the varlen forward did not take the Gluon kernel"
    assert lse.shape == (nheads_q, total_q)
    grads, (_, ref_lse, _) = check_attention(partial(varlen_ref, cu_q=cu_q, cu_k=cu_k, **opts),
                                             {"q": q, "k": k, "v": v}, out, lse=lse, ref_dtype=torch.float32)
    assert calls[1:] and set(calls[1:]) == {("hopper_backward", True)}, "the varlen backward took another kernel"
    empty = no_key_rows_varlen(ref_lse)
    if not same and opts.get("causal"):
        assert empty.any()                # the max_len query over max_len // 3 keys
    assert_zero_rows("out", out.detach(), empty)
    assert_zero_rows("dq", grads["q"], empty)


@pytest.mark.parametrize("headdim", [64, 128, 256])
def test_varlen_gluon_repeats_gpu(headdim):
    """Programs write only their own sequence's rows: two calls over the same packed batch give the same output and
    dK / dV bits, and a sequence's output and gradients do not change when its neighbours' inputs and output
    gradients do (rows past a sequence's end are the next one's: a TMA store of a whole box there would overwrite
    them, an unmasked row would add into them). dQ is summed by reduce-adds in no fixed order below 256: equal within
    one rounding there."""
    if not flash_fwd_hopper.available(torch.device("cuda")):
        pytest.skip("flash_fwd_hopper needs sm_90 and triton " + flash_fwd_hopper.GLUON_TRITON)
    lens = [1000, 37, 1500, 129, 2048, 1, 700, 64, 1999]
    cu = cu_seqlens(lens, "cuda")
    q, k, v, dout = (rand(sum(lens), 16, headdim, dtype=BF16, device="cuda", requires_grad=False) for _ in range(4))

    def run(q, k, v, dout):
        q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
        out = flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=True)
        out.backward(dout)
        return out.detach(), q.grad, k.grad, v.grad

    first = run(q, k, v, dout)
    again = run(q, k, v, dout)
    for name, a, b in zip(("out", "dq", "dk", "dv"), first, again):
        if name == "dq" and headdim < 256:
            torch.testing.assert_close(a, b, msg=name)
        else:
            assert torch.equal(a, b), name
    start, end = cu[2].item(), cu[3].item()            # the third sequence, its neighbours' inputs changed
    changed = [t.clone() for t in (q, k, v, dout)]
    for t in changed:
        t[:start] = torch.randn_like(t[:start])
        t[end:] = torch.randn_like(t[end:])
    second = run(*changed)
    for name, a, b in zip(("out", "dq", "dk", "dv"), first, second):
        if name == "dq" and headdim < 256:
            torch.testing.assert_close(a[start:end], b[start:end], msg=name)
        else:
            assert torch.equal(a[start:end], b[start:end]), name


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("headdim", [64, 128, 256])
def test_varlen_gluon_rows_past_last_sequence_gpu(headdim, causal):
    """Packed buffers longer than their sequences (cu_seqlens[-1] < total) with NaN in q, k, v and dout there: out 0,
    lse +inf and gradients 0 in those rows, every sequence's results those of the trimmed buffers. The Gluon kernels'
    TMA boxes at the last sequence's end hold those rows; they are zeroed in shared memory (0 * NaN in the products
    would reach the last sequence)."""
    if not flash_fwd_hopper.available(torch.device("cuda")):
        pytest.skip("flash_fwd_hopper needs sm_90 and triton " + flash_fwd_hopper.GLUON_TRITON)
    check_rows_past_last_sequence("cuda", float("nan"), BF16, headdim, causal)
