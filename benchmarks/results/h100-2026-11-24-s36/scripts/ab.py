"""Session 36 A/B (from session 31's): the committed Gluon forward (old_ffh.py) vs the working tree's (per-warp K / V
releases) vs wait_ffh.py (those plus per-thread inline-asm K / V ready waits),
CUDA-graph timed beside cuDNN, rounds alternating; outputs / gradients checked against each other and fp32 math."""
import os, sys, json, statistics, collections, importlib.util, torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
from triton.testing import do_bench_cudagraph
from flashfuse.ops.attention import flash_fwd, flash_bwd
from flashfuse.ops.attention import flash_fwd_hopper as NEW_F, flash_bwd_hopper as NEW_B

def load(name, path):
    spec = importlib.util.spec_from_file_location(f"flashfuse.ops.attention.{name}", path)
    m = importlib.util.module_from_spec(spec); sys.modules[spec.name] = m; spec.loader.exec_module(m); return m
HERE = os.path.dirname(__file__)
OLD_F = load("_old_ffh", os.path.join(HERE, "old_ffh.py"))
WAIT_F = load("_wait_ffh", os.path.join(HERE, "wait_ffh.py"))
VARIANTS = {"old": (OLD_F, NEW_B), "new": (NEW_F, NEW_B), "wait": (WAIT_F, NEW_B)}
NAMES = list(VARIANTS)
REP = int(os.environ.get("REP", "80"))

def use(v):
    flash_fwd.flash_fwd_hopper, flash_bwd.flash_bwd_hopper = VARIANTS[v]

def bench(fn):
    fn(); torch.cuda.synchronize()
    return do_bench_cudagraph(fn, rep=REP, return_mode="median")

def case(hd, causal, S, mode, rnd, rows):
    Hh, B = 2048 // hd, 16384 // S
    g = torch.Generator(device="cuda").manual_seed(hd * 7 + S)
    q, k, v, do = (torch.randn(B, S, Hh, hd, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
    flops = 4 * B * Hh * S * S * hd * (0.5 if causal else 1) * (2.5 if mode == "bwd" else 1)
    wr = 0 if causal else -1
    qt, kt, vt, dot = (x.transpose(1, 2) for x in (q, k, v, do))
    if mode == "fwd":
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            t_c = bench(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal))
    else:
        qr, kr, vr = (x.detach().requires_grad_() for x in (qt, kt, vt))
        side = torch.cuda.Stream()      # the forward off the legacy stream, so its backward can be captured
        side.wait_stream(torch.cuda.current_stream())
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION), torch.cuda.stream(side):
            o = F.scaled_dot_product_attention(qr, kr, vr, is_causal=causal)
        torch.cuda.current_stream().wait_stream(side)
        t_c = bench(lambda: torch.autograd.grad(o, (qr, kr, vr), dot, retain_graph=True))
    line = f"r{rnd} {mode} hd{hd} {'causal' if causal else 'full  '} S={S:5d} cudnn {flops / t_c / 1e9:6.1f}"
    outs = {}
    for vname in (NAMES if rnd % 2 == 0 else NAMES[::-1]):
        use(vname)
        out, lse = flash_fwd.flash_attn_forward(q, k, v, softmax_scale=hd ** -0.5, window_right=wr)
        if mode == "fwd":
            call = lambda: flash_fwd.flash_attn_forward(q, k, v, softmax_scale=hd ** -0.5, window_right=wr)
            outs[vname] = out
        else:
            call = lambda: flash_bwd.flash_attn_backward(do, q, k, v, out, lse, softmax_scale=hd ** -0.5,
                                                         window_right=wr)
            outs[vname] = call()
        t = bench(call)
        rows.append(dict(round=rnd, mode=mode, hd=hd, causal=causal, S=S, variant=vname, tflops=flops / t / 1e9,
                         cudnn=flops / t_c / 1e9))
        line += f" | {vname} {flops / t / 1e9:6.1f}"
    a = outs["old"]
    same = all(torch.equal(a, b) for b in outs.values())
    use("new")
    print(line + ("" if same else " DIFFERS"), flush=True)

def main():
    which = sys.argv[1] if len(sys.argv) > 1 else "all"
    fwd = [(64, True, 512), (64, True, 1024), (64, True, 2048), (64, True, 8192), (128, True, 512), (128, True, 1024),
           (128, True, 4096), (64, False, 1024), (64, False, 4096), (128, False, 1024), (128, False, 4096)]
    bwd = [(64, False, 1024), (64, False, 2048), (64, False, 8192), (64, True, 1024), (64, True, 4096),
           (128, False, 2048), (128, True, 1024), (128, True, 4096)]
    rows = []
    for rnd in range(int(os.environ.get("ROUNDS", "2"))):
        if which in ("all", "fwd"):
            for c in fwd: case(*c, "fwd", rnd, rows)
        if which in ("all", "bwd"):
            for c in bwd: case(*c, "bwd", rnd, rows)
    json.dump(rows, open(os.path.join(os.environ.get("OUT", "/tmp"), f"ab_{which}.json"), "w"), indent=1)
    agg = collections.defaultdict(list)
    for r in rows:
        agg[(r["mode"], r["hd"], r["causal"], r["S"], r["variant"])].append(r["tflops"])
        agg[(r["mode"], r["hd"], r["causal"], r["S"], "cudnn")].append(r["cudnn"])
    print("medians:")
    for key in sorted({k[:4] for k in agg}):
        m = {v: statistics.median(agg[(*key, v)]) for v in ["cudnn"] + NAMES}
        print(f"  {key[0]} hd{key[1]} {'causal' if key[2] else 'full  '} S={key[3]:5d} cudnn {m['cudnn']:6.1f} "
              + " ".join(f"{v} {m[v]:6.1f}" for v in NAMES)
              + "  " + " ".join(f"{v}/old {m[v] / m['old']:.3f}" for v in NAMES[1:])
              + "  " + " ".join(f"{v}/cudnn {m[v] / m['cudnn']:.3f}" for v in NAMES[1:]))

if __name__ == "__main__":
    main()
