"""patch_diffusers, GPU tier: an SD-like UNet2DConditionModel (SD 1.5 widths 320/640, 8 heads, 768-d text,
32 groups, 32x32 latents) and a DiT-S-like transformer in fp16/bf16, patched vs unpatched against an fp32
reference of the unpatched model (output and every parameter gradient; the patched error may not exceed the
unpatched half-precision model's by much), and torch.compile(fullgraph=True) over the patched UNet."""

import copy

import pytest
import torch

diffusers = pytest.importorskip("diffusers")

from flashfuse.integrations.diffusers import patch_diffusers, patch_summary, unpatch_diffusers  # noqa: E402
from testing import rel_err  # noqa: E402

pytestmark = pytest.mark.gpu


def sd_unet():
    torch.manual_seed(0)
    model = diffusers.UNet2DConditionModel(
        sample_size=32, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(320, 640),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=768, attention_head_dim=8, norm_num_groups=32)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():  # away from the init: norm weights not all ones, zero-init convs not zero
            p.add_(0.02 * torch.randn(p.shape, generator=g))
    mask = torch.ones(2, 77)
    mask[1, 20:] = 0  # a padded prompt
    inputs = dict(sample=torch.randn(2, 4, 32, 32), timestep=torch.tensor([10, 500]),
                  encoder_hidden_states=torch.randn(2, 77, 768), encoder_attention_mask=mask)
    return model.eval(), inputs


def dit_s():
    torch.manual_seed(0)
    model = diffusers.DiTTransformer2DModel(num_attention_heads=6, attention_head_dim=64, in_channels=4,
                                            out_channels=8, num_layers=4, sample_size=32, patch_size=2,
                                            num_embeds_ada_norm=1000)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=g))
    inputs = dict(hidden_states=torch.randn(2, 4, 32, 32), timestep=torch.tensor([10, 500]),
                  class_labels=torch.tensor([3, 999]))
    return model.eval(), inputs


def cast(inputs, dtype):
    return {k: (v.to("cuda", dtype) if v.is_floating_point() else v.cuda()) for k, v in inputs.items()}


def forward_backward(model, inputs, weight, call=None):
    """Output and {name: parameter gradient} of sum(out * weight); `call` runs the model (e.g. compiled)."""
    model.zero_grad(set_to_none=True)
    out = (model if call is None else call)(**inputs).sample
    (out.float() * weight).sum().backward()
    return out.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def grad_errors(grads, ref_grads):
    """Per-parameter relative errors, each against max(own norm, 1e-3 of the largest): a key bias has an exactly
    zero gradient (softmax ignores a per-row shift)."""
    floor = 1e-3 * max(r.norm().item() for r in ref_grads.values())
    return {n: (g.double() - ref_grads[n].double()).norm().item() / max(ref_grads[n].norm().item(), floor)
            for n, g in grads.items()}


@pytest.mark.parametrize("build,dtype", [(sd_unet, torch.float16), (dit_s, torch.float16), (dit_s, torch.bfloat16)],
                         ids=["sd_unet-fp16", "dit-fp16", "dit-bf16"])
def test_patched_matches_unpatched(build, dtype):
    model, inputs = build()
    ref = copy.deepcopy(model).cuda().float()
    model = model.cuda().to(dtype)
    with torch.no_grad():
        shape = ref(**cast(inputs, torch.float32)).sample.shape
    weight = torch.randn(shape, device="cuda")
    ref_out, ref_grads = forward_backward(ref, cast(inputs, torch.float32), weight)
    eager_out, eager_grads = forward_backward(model, cast(inputs, dtype), weight)

    patch_diffusers(model)
    counts = patch_summary(model)
    assert counts["attn_processor"] > 0
    if build is sd_unet:
        assert counts["resnet_block"] == 8 and counts["geglu"] == 4 and counts["group_norm_act"] == 1
    else:
        assert counts["ada_norm_zero_block"] == 4 and counts["ada_layer_norm_zero"] == 4
    out, grads = forward_backward(model, cast(inputs, dtype), weight)
    assert torch.isfinite(out).all()

    eager_err, err = rel_err(eager_out, ref_out), rel_err(out, ref_out)
    tol = 2e-2 if dtype == torch.float16 else 6e-2
    assert err < tol and err < 2 * eager_err + 1e-3, (err, eager_err)
    eager_gerr, gerr = grad_errors(eager_grads, ref_grads), grad_errors(grads, ref_grads)
    assert all(torch.isfinite(g).all() for g in grads.values())
    worst = {n: (gerr[n], eager_gerr[n]) for n in gerr if gerr[n] > 2 * eager_gerr[n] + 2e-3}
    assert not worst, worst

    unpatch_diffusers(model)
    again, _ = forward_backward(model, cast(inputs, dtype), weight)
    assert torch.equal(again, eager_out)


def compiled_vs_eager(model, inputs, weight):
    """Errors of torch.compile(model, fullgraph=True) against eager: output (no_grad), then output and every
    parameter gradient of a training step."""
    with torch.no_grad():
        eager = model(**inputs).sample
        compiled = torch.compile(model, fullgraph=True)
        out = compiled(**inputs).sample
    assert torch.isfinite(out).all()
    eager_out, eager_grads = forward_backward(model, inputs, weight)
    train_out, grads = forward_backward(model, inputs, weight, call=compiled)
    errs = grad_errors(grads, eager_grads)
    return rel_err(out, eager), rel_err(train_out, eager_out), max(errs.items(), key=lambda kv: kv[1])


def test_compiled_patched_unet_matches_eager():
    model, inputs = sd_unet()
    model = model.cuda().half()
    inputs = cast(inputs, torch.float16)
    weight = torch.randn(2, 4, 32, 32, device="cuda")
    # torch's own compile of the unpatched UNet first: on the CPU (inductor + Triton interpreter) its parameter
    # gradients below the first upsampler already differ from eager's, so a failure here is torch's, not ours
    torch._dynamo.reset()
    out_err, train_err, (name, grad_err) = compiled_vs_eager(model, inputs, weight)
    assert out_err < 5e-3 and train_err < 5e-3 and grad_err < 2e-2, ("unpatched", out_err, train_err, name, grad_err)
    torch._dynamo.reset()
    patch_diffusers(model)
    out_err, train_err, (name, grad_err) = compiled_vs_eager(model, inputs, weight)
    assert out_err < 5e-3 and train_err < 5e-3 and grad_err < 2e-2, ("patched", out_err, train_err, name, grad_err)
    unpatch_diffusers(model)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=["fp16", "bf16", "fp32"])
def test_gelu_tanh_epilogue_gpu(monkeypatch, dtype):
    """diffusers' GELU(approximate="tanh") at DiT-XL's width (rows 2 x 37, a ragged count): without autograd one
    torch._addmm_activation call (the GEMM's bias + tanh-GELU epilogue), within the dtype's rounding of the fp64
    reference (fp32 with TF32 off: nearer the tanh GELU than the exact one by 10x or more); with autograd diffusers'
    forward, every gradient equal to the unpatched module's."""
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    calls = []
    epilogue = torch._addmm_activation
    monkeypatch.setattr(torch, "_addmm_activation", lambda *a, **kw: calls.append(1) or epilogue(*a, **kw))
    torch.manual_seed(0)
    from diffusers.models.activations import GELU  # diffusers' lazy modules: not an attribute before this import

    module = GELU(1152, 4608, approximate="tanh").cuda().to(dtype)
    x = torch.randn(2, 37, 1152, device="cuda", dtype=dtype)
    with torch.no_grad():
        want = module(x)
        pre = torch.nn.functional.linear(x.double(), module.proj.weight.double(), module.proj.bias.double())
        ref, exact = (torch.nn.functional.gelu(pre, approximate=a) for a in ("tanh", "none"))
    patch_diffusers(module)
    assert patch_summary(module)["gelu_tanh"] == 1
    with torch.no_grad():
        out = module(x)
    assert len(calls) == 1 and out.shape == want.shape and out.dtype == dtype
    err, eager_err = rel_err(out, ref), rel_err(want, ref)
    if dtype == torch.float32:  # the epilogue's tanh is an approximation (2.6e-6 on an H100), the exact GELU 1e-4 away
        assert err < 1e-5 and rel_err(out, exact) > 10 * err, (err, eager_err, rel_err(out, exact))
    else:
        tol = {torch.float16: 2e-3, torch.bfloat16: 1e-2}[dtype]
        assert err < tol and err < 2 * eager_err + 1e-6, (err, eager_err)
    xg = x.clone().requires_grad_()
    out = module(xg)
    out.float().square().sum().backward()
    grads = [t.grad.clone() for t in (xg, module.proj.weight, module.proj.bias)]
    assert len(calls) == 1                                     # autograd: diffusers' forward
    unpatch_diffusers(module)
    for t in (xg, module.proj.weight, module.proj.bias):
        t.grad = None
    module(xg).float().square().sum().backward()
    for g, t in zip(grads, (xg, module.proj.weight, module.proj.bias)):
        assert torch.equal(g, t.grad)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_patched_dit_inference_gpu(dtype):
    """The DiT-S-like model under torch.no_grad (the inference paths: the GELU epilogue, the Gluon forward at 256
    tokens): patched output within 2x the unpatched half-precision model's error against the fp32 reference."""
    model, inputs = dit_s()
    ref = copy.deepcopy(model).cuda().float()
    model = model.cuda().to(dtype)
    with torch.no_grad():
        ref_out = ref(**cast(inputs, torch.float32)).sample
        eager_out = model(**cast(inputs, dtype)).sample
        patch_diffusers(model)
        assert patch_summary(model)["gelu_tanh"] == 4
        out = model(**cast(inputs, dtype)).sample
    unpatch_diffusers(model)
    assert torch.isfinite(out).all()
    err, eager_err = rel_err(out, ref_out), rel_err(eager_out, ref_out)
    assert err < 2 * eager_err + 1e-3, (err, eager_err)
