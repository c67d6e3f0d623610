"""Session 12 probe 5: channels_last routing. Small channels_last tensors: the default plan (per-group programs
up to CL_PER_GROUP_MAX_BYTES) vs CHUNKED forced, fwd and fwd+bwd, graph-timed, same run."""
import torch, triton, os, sys, json
import flashfuse.ops.group_norm as gn
out = os.environ.get("OUT", "/tmp")
rows = []
CAP = gn.CL_PER_GROUP_MAX_BYTES
for shape in ((2, 1280, 8, 8), (2, 1280, 16, 16), (2, 640, 32, 32), (1, 1280, 32, 32), (2, 960, 32, 32),
              (2, 320, 64, 64), (4, 640, 32, 32), (1, 320, 64, 64)):
    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last)
    C = shape[1]; w = torch.randn(C, device="cuda", dtype=torch.bfloat16); b = torch.randn_like(w)
    temb = torch.randn(shape[0], C, 1, 1, device="cuda", dtype=torch.bfloat16)
    dy = torch.randn_like(x)
    ref = torch.nn.functional.silu(torch.nn.functional.group_norm(x.float() + temb.float(), 32, w.float(), b.float(), 1e-5))
    res = {"shape": shape, "MB": x.numel() * 2 / 2**20}
    for name, cap in (("default", CAP), ("chunked", 0)):
        gn.CL_PER_GROUP_MAX_BYTES = cap
        fwd = lambda: gn.group_norm_forward(x, 32, w, b, 1e-5, "silu", temb)
        y, m, r = fwd()
        err = ((y.float() - ref).abs().max() / ref.abs().max()).item()
        def fb():
            y, m, r = fwd()
            return gn.group_norm_backward(dy, x, 32, w, b, m, r, "silu", temb)
        fb()
        res[name] = dict(err=err, fwd=triton.testing.do_bench_cudagraph(fwd, rep=20) * 1e3,
                         fwdbwd=triton.testing.do_bench_cudagraph(fb, rep=20) * 1e3)
    gn.CL_PER_GROUP_MAX_BYTES = CAP
    rows.append(res)
    d, c = res["default"], res["chunked"]
    print(f"{str(shape):18s} {res['MB']:5.1f} MB  fwd default {d['fwd']:6.1f} chunked {c['fwd']:6.1f} us | "
          f"fwd+bwd default {d['fwdbwd']:6.1f} chunked {c['fwdbwd']:6.1f} us | err {d['err']:.1e} {c['err']:.1e}", flush=True)
json.dump(rows, open(f"{out}/route_probe.json", "w"), indent=1)
