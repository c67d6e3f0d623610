"""Session 28: what the A/B scripts share: SD-shaped GroupNorm inputs, and rounds of graph-timed calls alternating
between kernel modules (the order reversed every other round), keeping each one's outputs and its best time."""
import torch, triton


def timed(fn):
    return triton.testing.do_bench_cudagraph(fn, rep=40) * 1e3


def gn_inputs(shape, temb):
    """x (bf16, mean 1, std 2), weight ~1, bias ~0 and, with temb, an (N, C, 1, 1) time embedding."""
    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16) * 2 + 1
    c = shape[1]
    w = (1 + 0.1 * torch.randn(c, device="cuda")).bfloat16()
    b = (0.1 * torch.randn(c, device="cuda")).bfloat16()
    r = torch.randn(shape[0], c, 1, 1, device="cuda", dtype=torch.bfloat16) if temb else None
    return x, w, b, r


def alternate(mods, install, fn, rounds):
    """{name: outputs of fn (cloned)}, {name: best time in us}: install(module) before each module's calls."""
    outs, t = {}, {k: [] for k in mods}
    for rnd in range(rounds):
        for name, m in (list(mods.items()) if rnd % 2 == 0 else list(reversed(mods.items()))):
            install(m)
            outs[name] = [v.clone() for v in fn() if v is not None]
            t[name].append(timed(fn))
    return outs, {k: min(v) for k, v in t.items()}


def same(a, b):
    return all(torch.equal(u, v) for u, v in zip(a, b))
