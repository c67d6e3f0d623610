"""patch_diffusers on tiny random diffusers models (CPU tier, fp32; kernels in Triton's interpreter).

A UNet2DModel (self-attention blocks), a UNet2DConditionModel (cross attention, GEGLU, a padding mask on the
text) and a DiT (adaLN-Zero blocks, tanh-GELU MLPs): patched output, input gradient and EVERY parameter
gradient against the unpatched model run in float64; the patch counts exactly the modules of each kind;
unpatch restores the module objects, forwards, processors and bit-identical outputs. Plus single blocks in
the configurations the generic forwards branch on (ResnetBlock2D up/down/scale_shift/no temb/mish/relu,
Attention options, AttnProcessor, GEGLU/SwiGLU/GELU, affine norm3 + cross attention), flags, fallbacks to
diffusers' code, the context manager and errors.
"""

import copy
import warnings

import pytest
import torch
from torch import nn

diffusers = pytest.importorskip("diffusers")  # an optional extra; CI installs it with the dev extra

from diffusers.models.activations import GEGLU, GELU, SwiGLU  # noqa: E402
from diffusers.models.attention import BasicTransformerBlock  # noqa: E402
from diffusers.models.attention_processor import Attention, AttnProcessor, AttnProcessor2_0  # noqa: E402
from diffusers.models.embeddings import Timesteps  # noqa: E402
from diffusers.models.normalization import AdaLayerNormZero  # noqa: E402
from diffusers.models.resnet import ResnetBlock2D  # noqa: E402
from diffusers.models.transformers.transformer_2d import Transformer2DModel  # noqa: E402

import flashfuse.nn as ffnn  # noqa: E402
from flashfuse.integrations.diffusers import (FlashfuseAttnProcessor, patch_diffusers, patch_summary,  # noqa: E402
                                              patched_diffusers, unpatch_diffusers)
from flashfuse.nn.group_norm import GroupNormAct  # noqa: E402
from testing import rel_err  # noqa: E402

FP32_TOL = 1e-4  # fp32 kernels vs a float64 reference: observed ~1e-6, the unpatched fp32 model is at ~5e-7


def perturb(model, scale=0.05):
    """Random weights away from their init (norm weights not all ones, zero-init layers not zero)."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))
    return model


def unet2d():
    model = diffusers.UNet2DModel(
        sample_size=8, in_channels=3, out_channels=3, block_out_channels=(8, 16), layers_per_block=1,
        down_block_types=("DownBlock2D", "AttnDownBlock2D"), up_block_types=("AttnUpBlock2D", "UpBlock2D"),
        attention_head_dim=8, norm_num_groups=4)
    x = torch.randn(2, 3, 8, 8)
    return perturb(model).eval(), dict(sample=x, timestep=torch.tensor([3, 7])), "sample"


def unet2d_condition():
    model = diffusers.UNet2DConditionModel(
        sample_size=8, in_channels=4, out_channels=4, block_out_channels=(16, 32), layers_per_block=1,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=16, attention_head_dim=8, norm_num_groups=4)
    mask = torch.ones(2, 5)
    mask[1, 3:] = 0  # padded text tokens of the second sample: an additive mask through the processor
    inputs = dict(sample=torch.randn(2, 4, 8, 8), timestep=torch.tensor([3, 7]),
                  encoder_hidden_states=torch.randn(2, 5, 16), encoder_attention_mask=mask)
    return perturb(model).eval(), inputs, "sample"


def dit():
    model = diffusers.DiTTransformer2DModel(num_attention_heads=2, attention_head_dim=8, in_channels=4,
                                            out_channels=4, num_layers=2, sample_size=8, patch_size=2,
                                            num_embeds_ada_norm=10)
    inputs = dict(hidden_states=torch.randn(2, 4, 8, 8), timestep=torch.tensor([3, 7]),
                  class_labels=torch.tensor([1, 4]))
    return perturb(model).eval(), inputs, "hidden_states"  # eval: no random class-label dropout


MODELS = {"unet2d": unet2d, "unet2d_condition": unet2d_condition, "dit": dit}


def to64(inputs):
    return {k: v.double() if v.is_floating_point() else v for k, v in inputs.items()}


def run(model, inputs, grad_input, out_weight):
    """Output, d(loss)/d(input) and {name: parameter gradient} of loss = sum(out * out_weight)."""
    inputs = {k: v.clone().requires_grad_(k == grad_input) for k, v in inputs.items()}
    model.zero_grad(set_to_none=True)
    out = model(**inputs)
    out = out.sample if hasattr(out, "sample") else out
    (out * out_weight.to(out.dtype)).sum().backward()
    return out.detach(), inputs[grad_input].grad, {n: p.grad for n, p in model.named_parameters()}


def check_grads(grads, ref_grads, tol=FP32_TOL):
    assert grads.keys() == ref_grads.keys()
    # Some gradients are exactly zero in exact arithmetic (a key bias: softmax ignores a per-row shift), so
    # each error is taken relative to the larger of its own norm and 1e-3 of the largest gradient norm.
    floor = 1e-3 * max(r.norm().item() for r in ref_grads.values())
    for name, g in grads.items():
        r = ref_grads[name]
        assert g is not None and r is not None, name
        assert torch.isfinite(g).all(), name
        err = (g.double() - r.double()).norm().item() / max(r.norm().item(), floor)
        assert err < tol, (name, err)


def structure(model):
    """Everything unpatch must restore: module objects and classes, instance forwards, processors, parameters."""
    return ([(n, id(m), type(m), m.__dict__.get("forward")) for n, m in model.named_modules()],
            [(n, id(m.processor)) for n, m in model.named_modules() if hasattr(m, "processor")],
            [(n, id(p)) for n, p in model.named_parameters()])


def expected_counts(model):
    """What patch_diffusers should swap, counted independently from the unpatched model."""
    mods = list(model.modules())
    pairs = sum(type(getattr(m, "conv_norm_out", None)) is nn.GroupNorm
                and type(getattr(m, "conv_act", None)) is nn.SiLU for m in mods)
    return {
        "group_norm_act": pairs,
        "group_norm": sum(type(m) is nn.GroupNorm for m in mods) - pairs,
        "layer_norm": sum(type(m) is nn.LayerNorm for m in mods),
        "resnet_block": sum(type(m) is ResnetBlock2D for m in mods),
        "attn_processor": sum(type(m) is Attention and type(m.processor) in (AttnProcessor2_0, AttnProcessor)
                              for m in mods),
        "geglu": sum(type(m) in (GEGLU, SwiGLU) for m in mods),
        "gelu_tanh": sum(type(m) is GELU and m.approximate == "tanh" for m in mods),
        "timesteps": sum(type(m) is Timesteps for m in mods),
        "ada_layer_norm_zero": sum(type(m) is AdaLayerNormZero for m in mods),
        "ada_norm_zero_block": sum(type(m) is BasicTransformerBlock and m.norm_type == "ada_norm_zero" for m in mods),
        "transformer_2d_input": sum(type(m) is Transformer2DModel for m in mods),
        "transformer_2d_output": sum(type(m) is Transformer2DModel for m in mods),
    }


@pytest.mark.parametrize("name", list(MODELS))
def test_model_patched_matches_unpatched(name, device):
    model, inputs, grad_input = MODELS[name]()
    model = model.to(device)
    inputs = {k: v.to(device) for k, v in inputs.items()}
    ref = copy.deepcopy(model).double()
    with torch.no_grad():
        shape = model(**inputs)[0].shape
    weight = torch.randn(shape, device=device)  # a loss that weights every output element differently
    ref_out, ref_dx, ref_grads = run(ref, to64(inputs), grad_input, weight.double())
    before_out, _, before_grads = run(model, inputs, grad_input, weight)

    expected = expected_counts(model)
    before = structure(model)
    state_keys = list(model.state_dict())
    assert patch_diffusers(model) is model
    counts = patch_summary(model)
    assert counts == expected
    assert counts["resnet_block"] + counts["attn_processor"] + counts["ada_norm_zero_block"] > 0
    # swapped in place with the same Parameter objects under the same names; state dict unchanged
    assert structure(model)[2] == before[2]
    assert list(model.state_dict()) == state_keys
    assert not any(type(m) in (nn.GroupNorm, nn.LayerNorm) for m in model.modules())
    assert all(type(m.processor) is FlashfuseAttnProcessor for m in model.modules() if type(m) is Attention)

    out, dx, grads = run(model, inputs, grad_input, weight)
    assert torch.isfinite(out).all()
    assert rel_err(out, ref_out) < FP32_TOL
    assert rel_err(dx, ref_dx) < FP32_TOL
    check_grads(grads, ref_grads)

    assert unpatch_diffusers(model) is model
    assert structure(model) == before
    assert patch_summary(model) == dict.fromkeys(expected, 0)
    again, _, again_grads = run(model, inputs, grad_input, weight)
    assert torch.equal(again, before_out)
    assert all(torch.equal(again_grads[k], before_grads[k]) for k in before_grads)


@pytest.mark.parametrize("linear_projection", [False, True], ids=["conv-proj", "linear-proj"])
def test_channels_last_unet_stays_channels_last(device, linear_projection):
    """A channels_last UNet2DConditionModel: every Transformer2DModel reads its input as tokens in place, runs 1x1-conv
    projections as Linears and returns channels_last (diffusers copies to NCHW before proj_out); the output
    matches the unpatched model."""
    model, inputs, _ = unet2d_condition()
    if linear_projection:   # SD-2 / SDXL's Linear proj_in / proj_out
        model = diffusers.UNet2DConditionModel(**{**model.config, "use_linear_projection": True})
        model = perturb(model).eval()
    model = model.to(device).to(memory_format=torch.channels_last)
    inputs = {k: v.to(device) for k, v in inputs.items()}
    inputs["sample"] = inputs["sample"].contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        ref = model(**inputs).sample
    patch_diffusers(model)
    blocks = [m for m in model.modules() if type(m) is Transformer2DModel]
    assert blocks and patch_summary(model)["transformer_2d_output"] == len(blocks)
    assert patch_summary(model)["transformer_2d_input"] == len(blocks)
    cl = torch.channels_last
    seen, proj_inputs = [], []   # every block's output layout; the inputs of proj_in / proj_out modules
    hooks = [m.register_forward_hook(lambda mod, args, out: seen.append(out[0].is_contiguous(memory_format=cl)))
             for m in blocks]
    hooks += [p.register_forward_hook(lambda mod, args, out: proj_inputs.append(args[0].ndim))
              for m in blocks for p in (m.proj_in, m.proj_out)]
    with torch.no_grad():
        out = model(**inputs).sample
    for h in hooks:
        h.remove()
    assert seen == [True] * len(blocks)
    # 1x1-conv projections run as Linears on the tokens (the modules are not called); Linear ones on 3-D tokens
    assert proj_inputs == ([3] * 2 * len(blocks) if linear_projection else [])
    assert rel_err(out, ref) < FP32_TOL
    unpatch_diffusers(model)
    assert not any({"_get_output_for_continuous_inputs", "_operate_on_continuous_inputs"} & m.__dict__.keys()
                   for m in blocks)


def test_unet_group_norm_act_pair_fused(device):
    model, inputs, _ = unet2d()
    model = model.to(device)
    silu = model.conv_act
    patch_diffusers(model, attention=False, geglu=False, adaln=False)
    assert type(model.conv_norm_out) is GroupNormAct and model.conv_norm_out.activation == "silu"
    assert type(model.conv_act) is nn.Identity
    assert type(model.up_blocks[0].attentions[0].group_norm) is GroupNormAct
    assert model.up_blocks[0].attentions[0].group_norm.activation is None
    unpatch_diffusers(model)
    assert model.conv_act is silu and type(model.conv_norm_out) is nn.GroupNorm


# ----------------------------------------------------------------------------------------------------------
# Single blocks in the configurations the generic forwards branch on.
# ----------------------------------------------------------------------------------------------------------


def check_block(module, args, kwargs=None, grad_args=(0,), counts=None, device="cpu", **flags):
    """Patched fp32 block vs the unpatched block in float64: output, gradients of the chosen args and of every
    parameter; then unpatch restores it exactly."""
    kwargs = kwargs or {}
    module = perturb(module).to(device)
    args = [a.to(device) if torch.is_tensor(a) else a for a in args]
    ref = copy.deepcopy(module).double()

    def go(m, dtype):
        xs = [a.to(dtype).requires_grad_(i in grad_args) if torch.is_tensor(a) and a.is_floating_point() else a
              for i, a in enumerate(args)]
        kws = {k: v.to(device, dtype) if torch.is_tensor(v) and v.is_floating_point() else v
               for k, v in kwargs.items()}
        m.zero_grad(set_to_none=True)
        out = m(*xs, **kws)
        out = out[0] if isinstance(out, tuple) else out
        out.square().sum().backward()
        return out.detach(), [xs[i].grad for i in grad_args], {n: p.grad for n, p in m.named_parameters()}

    ref_out, ref_dxs, ref_grads = go(ref, torch.float64)
    before = structure(module)
    patch_diffusers(module, **flags)
    if counts is not None:
        assert {k: v for k, v in patch_summary(module).items() if v} == counts
    out, dxs, grads = go(module, torch.float32)
    assert rel_err(out, ref_out) < FP32_TOL
    for dx, ref_dx in zip(dxs, ref_dxs):
        assert rel_err(dx, ref_dx) < FP32_TOL
    check_grads({k: v for k, v in grads.items() if v is not None},
                {k: v for k, v in ref_grads.items() if v is not None})
    unpatch_diffusers(module)
    assert structure(module) == before


RESNETS = {
    "default": (dict(in_channels=8, out_channels=12, temb_channels=6, groups=4), True),  # conv_shortcut
    "up": (dict(in_channels=8, temb_channels=6, groups=4, up=True), True),
    "down": (dict(in_channels=8, temb_channels=6, groups=2, groups_out=4, down=True, output_scale_factor=2.0), True),
    "scale_shift": (dict(in_channels=8, temb_channels=6, groups=4, time_embedding_norm="scale_shift"), True),
    "no_temb": (dict(in_channels=8, temb_channels=None, groups=4, skip_time_act=True), False),  # VAE blocks
    "mish": (dict(in_channels=8, temb_channels=6, groups=4, non_linearity="mish"), True),
}


@pytest.mark.parametrize("config", list(RESNETS))
def test_resnet_block(config, device):
    kwargs, has_temb = RESNETS[config]
    block = ResnetBlock2D(**kwargs)
    x = torch.randn(2, 8, 5, 6)  # odd spatial sizes
    temb = torch.randn(2, 6) if has_temb else None
    check_block(block, [x, temb], grad_args=(0, 1) if has_temb else (0,), device=device,
                counts={"resnet_block": 1, "group_norm": 2}, attention=False)


def test_resnet_block_without_kernel_keeps_diffusers_forward(device):
    block = ResnetBlock2D(in_channels=8, temb_channels=6, groups=4, non_linearity="relu")
    with pytest.warns(UserWarning, match="ResnetBlock2D module.*keep diffusers' forward.*ReLU"):
        patch_diffusers(block)
    assert "forward" not in block.__dict__ and patch_summary(block)["resnet_block"] == 0
    assert patch_summary(block)["group_norm"] == 2  # the norms are still swapped
    unpatch_diffusers(block)


ATTENTIONS = {
    # UNet mid-block style: 4-D input, group_norm, residual connection, rescaled output
    "spatial": (dict(query_dim=8, heads=2, dim_head=4, norm_num_groups=4, residual_connection=True,
                     rescale_output_factor=2.0, bias=True), (2, 8, 3, 5), None, None),
    # cross attention with a LayerNorm on the text and per-head LayerNorm qk norms, float additive mask
    "cross": (dict(query_dim=12, cross_attention_dim=10, heads=3, dim_head=4, cross_attention_norm="layer_norm",
                   qk_norm="layer_norm"), (2, 7, 12), (2, 5, 10), "float"),
    # self attention with a boolean key-padding mask, fewer mask rows than heads * batch
    "bool_mask": (dict(query_dim=12, heads=2, dim_head=6), (2, 7, 12), None, "bool"),
}


# AttnProcessor adds the mask to the scores: a boolean mask is no input for it (its fallback is tested below)
PROCESSOR_CASES = [(c, legacy) for c in ATTENTIONS for legacy in (False, True)
                   if not (legacy and ATTENTIONS[c][3] == "bool")]


@pytest.mark.parametrize("config,legacy", PROCESSOR_CASES,
                         ids=[f"{c}-{'AttnProcessor' if lg else 'AttnProcessor2_0'}" for c, lg in PROCESSOR_CASES])
def test_attention_processor(config, legacy, device):
    kwargs, shape, text_shape, mask = ATTENTIONS[config]
    attn = Attention(**kwargs, processor=AttnProcessor() if legacy else AttnProcessor2_0())
    x = torch.randn(*shape)
    text = torch.randn(*text_shape) if text_shape else None
    seq_k = text_shape[1] if text_shape else shape[1]
    attention_mask = None
    if mask is not None:
        keep = torch.ones(2, 1, seq_k, dtype=torch.bool)
        keep[1, :, seq_k - 2:] = False
        attention_mask = keep if mask == "bool" else (~keep).float() * -10000.0
    call_kwargs = dict(encoder_hidden_states=text, attention_mask=attention_mask)
    original = attn.processor
    check_block(attn, [x], call_kwargs, grad_args=(0,), device=device, counts={"attn_processor": 1}, norms=False)
    assert attn.processor is original


def test_attention_processor_falls_back():
    attn = perturb(Attention(query_dim=8, heads=2, dim_head=4)).double()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    want = attn(x)
    patch_diffusers(attn)
    assert type(attn.processor) is FlashfuseAttnProcessor
    assert torch.equal(attn(x), want)  # float64: no kernel, the original processor ran
    unpatch_diffusers(attn)


@pytest.mark.parametrize("cls,kwargs", [(GEGLU, {}), (SwiGLU, {}), (GELU, dict(approximate="tanh")),
                                        (GELU, dict(approximate="none")), (GEGLU, dict(bias=False))],
                         ids=["geglu", "swiglu", "gelu_tanh", "gelu", "geglu_nobias"])
def test_feed_forward_activation(cls, kwargs, device):
    """Gated ones are patched (cuBLAS projection + one fused kernel); the tanh GELU too (one GEMM with a GELU epilogue
    on CUDA without autograd: test_patch_diffusers_gpu.py; here diffusers' forward runs under it), the exact GELU
    keeps diffusers' forward (and no warning says so)."""
    module = cls(12, 20, **kwargs)
    counts = {"geglu": 1} if cls is not GELU else {"gelu_tanh": 1} if kwargs["approximate"] == "tanh" else {}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_block(module, [torch.randn(2, 7, 12)], device=device, counts=counts)
    assert "forward" not in module.__dict__


def test_basic_transformer_block_ada_norm_zero_with_cross_attention(device):
    # affine norm3 (folded into the modulation) and a cross-attention attn2 with its LayerNorm norm2
    block = BasicTransformerBlock(16, 2, 8, cross_attention_dim=10, num_embeds_ada_norm=10,
                                  norm_type="ada_norm_zero", norm_elementwise_affine=True,
                                  activation_fn="gelu-approximate").eval()
    x, text = torch.randn(2, 9, 16), torch.randn(2, 5, 10)
    kwargs = dict(encoder_hidden_states=text, timestep=torch.tensor([2, 5]), class_labels=torch.tensor([1, 3]))
    check_block(block, [x], kwargs, device=device,
                counts={"ada_norm_zero_block": 1, "ada_layer_norm_zero": 1, "attn_processor": 2,
                        "layer_norm": 3, "gelu_tanh": 1, "timesteps": 1})


def test_layer_norm_block_is_not_an_adaln_block():
    block = BasicTransformerBlock(16, 2, 8, norm_type="layer_norm")
    patch_diffusers(block, norms=False, attention=False)
    assert "forward" not in block.__dict__
    assert patch_summary(block)["geglu"] == 1  # its GEGLU is patched
    unpatch_diffusers(block)


# ----------------------------------------------------------------------------------------------------------
# Flags, fallbacks, the context manager, errors.
# ----------------------------------------------------------------------------------------------------------


def test_flags_select_what_is_patched():
    model, _, _ = dit()
    patch_diffusers(model, norms=False, attention=True, geglu=False, adaln=False, embeddings=False)
    assert {k for k, v in patch_summary(model).items() if v} == {"attn_processor"}
    assert not any("forward" in m.__dict__ for m in model.modules())
    assert sum(type(m) is nn.LayerNorm for m in model.modules()) == expected_counts(model)["layer_norm"] > 0
    patch_diffusers(model, norms=True, attention=False, geglu=True, adaln=True)  # re-patch: the first undone
    assert patch_summary(model)["attn_processor"] == 0
    assert all(type(m.processor) is AttnProcessor2_0 for m in model.modules() if type(m) is Attention)
    assert patch_summary(model)["ada_norm_zero_block"] == 2 and patch_summary(model)["timesteps"] == 2
    unpatch_diffusers(model)


def test_generic_forwards_fall_back_for_float64():
    model, inputs, _ = dit()
    model = model.double()
    inputs = to64(inputs)
    with torch.no_grad():
        want = model(**inputs).sample
        # swapped norm modules have no float64 path; forwards do. Timesteps embeds in fp32 whatever the model's
        # dtype, in torch's CUDA op order (on the CPU diffusers divides where CUDA multiplies by the reciprocal)
        patch_diffusers(model, norms=False, embeddings=False)
        assert patch_summary(model)["ada_norm_zero_block"] == 2
        assert torch.equal(model(**inputs).sample, want)
    unpatch_diffusers(model)


def test_context_manager_restores_and_reapplies():
    model, inputs, _ = unet2d()
    before = structure(model)
    with patched_diffusers(model, norms=False) as m:
        assert m is model and patch_summary(model)["attn_processor"] == 4 and patch_summary(model)["resnet_block"] == 0
    assert structure(model) == before
    patch_diffusers(model, attention=False)
    patched_structure = structure(model)
    with patched_diffusers(model, norms=False):
        assert patch_summary(model)["resnet_block"] == 0
    assert patch_summary(model)["resnet_block"] == 8 and patch_summary(model)["attn_processor"] == 0
    assert [s[:3] for s in structure(model)[0]] != [s[:3] for s in before[0]]
    assert len(structure(model)[0]) == len(patched_structure[0])
    unpatch_diffusers(model)
    assert structure(model) == before


def test_instance_forward_hook_is_left_alone():
    block = GEGLU(12, 20)
    hook = block.forward
    block.forward = hook  # an instance-level forward, as accelerate / diffusers hooks install
    with pytest.warns(UserWarning, match="already has an instance-level forward"):
        patch_diffusers(block)
    assert block.forward is hook and patch_summary(block)["geglu"] == 0
    unpatch_diffusers(block)
    assert block.forward is hook


def test_deepcopy_of_patched_model_is_independent():
    model, inputs, _ = unet2d()
    patch_diffusers(model)
    twin = copy.deepcopy(model)
    unpatch_diffusers(twin)
    assert type(twin.conv_norm_out) is nn.GroupNorm and type(model.conv_norm_out) is GroupNormAct
    assert patch_summary(model)["resnet_block"] == 8
    with torch.no_grad():
        assert torch.allclose(model(**inputs).sample, twin(**inputs).sample, rtol=1e-4, atol=1e-5)
    unpatch_diffusers(model)


def test_patched_parameters_follow_dtype_changes():
    block = perturb(ResnetBlock2D(in_channels=8, temb_channels=6, groups=4))
    patch_diffusers(block)
    block.double()  # new Parameter objects on the swapped norms
    unpatch_diffusers(block)
    assert all(p.dtype == torch.float64 for p in block.parameters())
    assert type(block.norm1) is nn.GroupNorm


def test_errors():
    with pytest.raises(TypeError, match="model must be an nn.Module.*got str"):
        patch_diffusers("unet")
    with pytest.raises(ValueError, match="Linear holds no diffusers module"):
        patch_diffusers(nn.Linear(3, 4))
    with pytest.raises(TypeError, match="unexpected keyword argument 'mlp'"):
        patch_diffusers(GEGLU(4, 4), mlp=True)
    assert unpatch_diffusers(nn.Linear(3, 4)) is not None  # not patched: returned unchanged
    assert patch_summary(nn.Linear(3, 4))["resnet_block"] == 0


def test_flashfuse_nn_layer_norm_used():
    block = BasicTransformerBlock(16, 2, 8, norm_type="layer_norm")
    patch_diffusers(block, attention=False, geglu=False)
    assert type(block.norm1) is ffnn.LayerNorm and patch_summary(block)["layer_norm"] == 2  # norm1, norm3 (no attn2)
    unpatch_diffusers(block)
    assert type(block.norm1) is nn.LayerNorm
