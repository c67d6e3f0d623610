"""cuda_graph, GPU tier: replays equal eager calls (a plain function with nested arguments, a patched SD-like
UNet and DiT in fp16), fresh inputs are seen by every replay, outputs are not overwritten by the next replay,
and one graph is captured per call signature."""

import pytest
import torch

from flashfuse.cuda_graph import cuda_graph
from testing import rel_err

pytestmark = pytest.mark.gpu


def test_function_with_nested_arguments():
    def fn(x, pair, scale=1.0, bias=None):
        y = (x @ pair[0]).relu() * scale + pair[1]
        return {"y": y if bias is None else y + bias, "norm": y.norm()}

    graphed = cuda_graph(fn)
    w, b = torch.randn(64, 32, device="cuda"), torch.randn(32, device="cuda")
    first = None
    for step in range(3):
        x = torch.randn(16, 64, device="cuda")
        out = graphed(x, (w, b), scale=0.5)
        ref = fn(x, (w, b), scale=0.5)
        assert rel_err(out["y"], ref["y"]) < 1e-6 and rel_err(out["norm"], ref["norm"]) < 1e-6
        if first is None:
            first, first_ref = out, ref
    assert rel_err(first["y"], first_ref["y"]) < 1e-6      # clones: later replays did not overwrite it
    assert graphed.num_graphs == 1
    graphed(torch.randn(8, 64, device="cuda"), (w, b), scale=0.5)            # new shape
    graphed(torch.randn(16, 64, device="cuda"), (w, b), scale=2.0)           # new constant
    graphed(torch.randn(16, 64, device="cuda"), (w, b), scale=0.5, bias=b)   # new structure
    assert graphed.num_graphs == 4
    static = cuda_graph(fn, clone_outputs=False)
    a = static(torch.ones(16, 64, device="cuda"), (w, b))["y"]
    static(torch.zeros(16, 64, device="cuda"), (w, b))
    assert torch.equal(a, b.expand(16, 32))                  # documented: static outputs are overwritten


@pytest.mark.parametrize("which", ["unet", "dit"])
def test_patched_diffusers_model(which):
    from flashfuse.integrations.diffusers import patch_diffusers
    from test_patch_diffusers_gpu import cast, dit_s, sd_unet

    model, inputs = (sd_unet if which == "unet" else dit_s)()
    model = patch_diffusers(model.to("cuda", torch.float16))
    graphed = cuda_graph(model)
    assert graphed.config is model.config and graphed.dtype == torch.float16
    for seed in range(2):
        torch.manual_seed(seed)
        x = cast(inputs, torch.float16)
        key = "sample" if which == "unet" else "hidden_states"
        x[key] = torch.randn_like(x[key])
        with torch.no_grad():
            ref = model(**x).sample
        out = graphed(**x).sample
        assert rel_err(out, ref) < 1e-3, (seed, rel_err(out, ref))
    assert graphed.num_graphs == 1
