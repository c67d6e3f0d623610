"""Session 37: sliding-window attention (a left window, causal) on the GPU: flashfuse (which kernel runs) vs
FlexAttention with a sliding-window block mask (compiled), beside flashfuse plain causal; bf16, 16384 tokens,
model dim 2048; TFLOP/s counted over the visible (query, key) pairs only (bwd 2.5x fwd)."""
import torch, triton
from torch.nn.attention.flex_attention import flex_attention, create_block_mask
from flashfuse import flash_attn_func
flex = torch.compile(flex_attention, dynamic=False)
rows = []
for hd in (128, 64):
    for S, W in ((4096, 1024), (8192, 1024), (8192, 4096), (4096, 4096)):
        B, H = 16384 // S, 2048 // hd
        q, k, v = (torch.randn(B, S, H, hd, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        pairs = sum(min(i + 1, W + 1) for i in range(S))
        flops = 4 * B * H * hd * pairs
        def run(fn):
            out = fn()
            g = torch.randn_like(out)
            f = triton.testing.do_bench(fn, rep=100)
            b = triton.testing.do_bench(lambda: torch.autograd.grad(out, (q, k, v), g, retain_graph=True), rep=100)
            return flops / f / 1e9, 2.5 * flops / b / 1e9, out
        ff_w = run(lambda: flash_attn_func(q, k, v, causal=True, window_size=(W, 0)))
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
        bm = create_block_mask(lambda b, h, qi, ki: (qi >= ki) & (qi - ki <= W), None, None, S, S)
        fx = run(lambda: flex(qt, kt, vt, block_mask=bm).transpose(1, 2))
        err = (ff_w[2].float() - fx[2].float()).abs().max().item()
        causal_flops = 4 * B * H * hd * S * (S + 1) / 2
        out_c = flash_attn_func(q, k, v, causal=True)
        gc = torch.randn_like(out_c)
        fc = causal_flops / triton.testing.do_bench(lambda: flash_attn_func(q, k, v, causal=True), rep=100) / 1e9
        bc = 2.5 * causal_flops / triton.testing.do_bench(lambda: torch.autograd.grad(out_c, (q, k, v), gc, retain_graph=True), rep=100) / 1e9
        line = (f"hd{hd} S={S} W={W}: flashfuse swa fwd {ff_w[0]:5.0f} bwd {ff_w[1]:5.0f} | flex swa fwd {fx[0]:5.0f} "
                f"bwd {fx[1]:5.0f} | flashfuse causal fwd {fc:5.0f} bwd {bc:5.0f} | max |diff| {err:.3g}")
        print(line, flush=True)
