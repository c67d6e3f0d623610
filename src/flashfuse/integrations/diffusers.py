"""One-line patching of diffusers models (UNets, DiT / Transformer2D, VAEs) with flashfuse kernels.

    unet = UNet2DConditionModel.from_pretrained(..., subfolder="unet", torch_dtype=torch.float16).cuda()
    patch_diffusers(unet)                     # in place, returns the model
    noise_pred = unet(latents, t, encoder_hidden_states=text).sample
    patch_summary(unet)                       # {"group_norm": 61, "resnet_block": 22, "attn_processor": 16, ...}
    unpatch_diffusers(unet)                   # the original modules, forwards and processors back

    with patched_diffusers(unet, attention=False):   # patch for a block, restore on exit
        ...

What the patch does (flags of `patch_diffusers`, all on by default):

- ``norms``:
  - every ``ResnetBlock2D`` gets one generic forward (``_resnet_block_forward``, the same for every instance) on
    the SAME submodules: norm1 + nonlinearity is one `group_norm(..., activation=...)` kernel, and conv1's bias
    + the time embedding add + norm2 + nonlinearity another (``residual=temb[:, :, None, None] + bias``: the sum
    is never written, and conv1 runs without its bias). Up/down-sampling blocks are handled (the activation
    comes before the resampling, so nothing changes). ``time_embedding_norm="scale_shift"`` fuses norm1 + act and runs norm2 as a plain `group_norm`,
    the modulation and the activation eagerly. Nonlinearities with a kernel: SiLU/swish, Mish, exact GELU;
    others (ReLU, tanh-GELU) keep diffusers' forward (ResnetBlockCondNorm2D with "ada_group"/"spatial" is a
    different class and is not touched).
  - GroupNorm + activation pairs a model's forward runs back to back (``conv_norm_out`` + ``conv_act`` of
    UNet2DModel, UNet2DConditionModel and the VAE Encoder/Decoder): the norm becomes a
    `flashfuse.nn.GroupNormAct` holding the same Parameters with the activation fused, the activation an
    ``nn.Identity``.
  - every other ``torch.nn.GroupNorm`` (attention ``group_norm``, Transformer2DModel's input norm, ...) becomes a
    `GroupNormAct` (no activation), every ``torch.nn.LayerNorm`` a `flashfuse.nn.LayerNorm`, same Parameters.
- ``attention``: every ``Attention`` whose processor is diffusers' ``AttnProcessor2_0`` or ``AttnProcessor``
  gets a `FlashfuseAttnProcessor` (set with ``model.set_attn_processor`` where the model has it, else per
  module) that does what the original does (spatial_norm, 4-D inputs, attention mask through
  ``prepare_attention_mask``, group_norm, cross attention with norm_cross, qk norms for AttnProcessor2_0,
  residual_connection, rescale_output_factor) with `flashfuse.flash_attn_func` (no mask: the (batch, seq,
  heads, head_dim) projections are read in place, no transposes) or `flashfuse.scaled_dot_product_attention`
  (a mask). Inputs no kernel takes (float64, head dim > 256, a boolean mask for AttnProcessor, the deprecated
  ``scale`` argument) run the original processor, which the flashfuse one keeps. Other processors (IP-adapter,
  added-KV, fused QKV, LoRA, ...) are left alone.
- ``geglu``: gated feed-forward activations get a generic forward on the same ``proj`` Linear: ``GEGLU``
  (diffusers' proj output is [hidden; gate], ``hidden * gelu(gate)``) is the cuBLAS projection followed by one
  fused `geglu` kernel reading the two halves in place, ``SwiGLU`` the same with `swiglu`. The non-gated
  ``GELU(approximate="tanh")`` ("gelu-approximate": DiT, PixArt, SD3, Flux feed-forwards) runs, on CUDA
  without autograd, as one cuBLASLt GEMM whose epilogue adds the bias and applies the tanh GELU
  (``torch._addmm_activation``): the projection's output is written once, activated, instead of written,
  read and written again by an elementwise GELU (DiT-XL/2's fc1 in fp16 on an H100: 161 us vs 199). With
  gradients, and for the exact GELU, diffusers' forward.
- ``adaln``: ``AdaLayerNormZero`` (DiT, SD3, ...) gets a forward whose LayerNorm + modulation is one
  `ada_layer_norm(x, scale_msa, shift_msa)` kernel (its FP32LayerNorm variant too); ``BasicTransformerBlock``
  with ``norm_type="ada_norm_zero"`` a forward where the gated residuals (``h + gate_msa * attn``,
  ``h + gate_mlp * ff``) are `ada_layer_norm_gate` and norm3 + (1 + scale_mlp) + shift_mlp is one kernel (an
  affine norm3 is folded into the modulation vectors: ``layer_norm_modulate``); without cross-attention or
  GLIGEN (DiT) the first gated residual and norm3's modulation are one kernel (``residual=``, ``gate=``).
  DiT's final ``norm_out`` modulation lives in the model's own forward and stays eager.
- ``layout``: ``Transformer2DModel`` (SD's spatial transformer) gets its own ``_operate_on_continuous_inputs``
  and ``_get_output_for_continuous_inputs`` for channels_last inputs: the (b, c, h, w) activation is read as
  (b, h * w, c) tokens in place, 1x1-conv projections run as Linears (cuBLAS with the bias in the epilogue,
  not cuDNN plus a broadcast bias add), and diffusers' ``.contiguous()`` before the output projection is left
  out, so the residual add and the blocks after it stay channels_last (diffusers' speed tip for UNets) instead
  of one NCHW copy, one strided add and mixed-layout convolutions per transformer block. NCHW inputs run
  diffusers' own methods.
- ``embeddings``: ``Timesteps`` (the sinusoidal embedding; DiT evaluates it in every block) is one kernel.

Generic forwards are bound per instance (``module.forward``); at call time an input no kernel takes (float64,
a CPU tensor outside the interpreter, the deprecated ``scale`` argument) runs the class's own forward. A
module that already has an instance-level forward (an accelerate / diffusers hook) is left alone. Modules
are matched by exact class, so subclasses someone customized are not touched. Only the tables below know
about diffusers classes; one routine applies them. Tested with diffusers 0.42.1.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import types
import warnings

import torch
from torch import nn

from ..nn.group_norm import GroupNormAct
from ..nn.norm import LayerNorm
from ..ops.group_norm import group_norm
from ..ops.modulation import ada_layer_norm_gate, ada_layer_norm_zero_forward, layer_norm_modulate
from .diffusers_attention import FlashfuseAttnProcessor, _kernel_ok, _rescale
from .diffusers_forwards import (_geglu_forward, _gelu_tanh_check, _gelu_tanh_forward, _proj_activation, _proj_check,
                                 _timesteps_check, _timesteps_forward)

__all__ = ["patch_diffusers", "unpatch_diffusers", "patched_diffusers", "patch_summary", "FlashfuseAttnProcessor"]

def _activation_name(act) -> str | None:
    """diffusers' get_activation(...) module -> group_norm's activation name (None: no kernel for it)."""
    if type(act) is nn.SiLU:
        return "silu"
    if type(act) is nn.Mish:
        return "mish"
    if type(act) is nn.GELU and act.approximate == "none":
        return "gelu"
    return None


def _gn(norm: nn.GroupNorm, x: torch.Tensor, activation=None, residual=None) -> torch.Tensor:
    """act(norm(x + residual)) in one kernel, with norm's parameters."""
    return group_norm(x, norm.num_groups, norm.weight, norm.bias, norm.eps, activation=activation, residual=residual)


# ----------------------------------------------------------------------------------------------------------
# Generic forwards (bound to instances; `type(self).forward` is diffusers' own, used as the fallback).
# ----------------------------------------------------------------------------------------------------------


def _resnet_block_forward(self, input_tensor, temb, *args, **kwargs):
    """diffusers.models.resnet.ResnetBlock2D.forward with norm1 + act and (h + temb) + norm2 + act fused."""
    act = _activation_name(self.nonlinearity)
    if args or kwargs.get("scale") is not None or not _kernel_ok(input_tensor) or input_tensor.ndim != 4:
        return type(self).forward(self, input_tensor, temb, *args, **kwargs)

    if self.time_emb_proj is not None:
        if not self.skip_time_act:
            temb = self.nonlinearity(temb)
        temb = self.time_emb_proj(temb)[:, :, None, None]
    # conv1's bias joins the time embedding as norm2's (N or 1, C, 1, 1) residual: the norm kernel adds it while
    # it reads, instead of a separate broadcast-add pass over the activation (torch adds a cuDNN convolution's
    # bias that way). Kept in the convolution when the sum would change dtype (diffusers promotes there).
    fold_bias = (_plain_conv(self.conv1) and self.conv1.bias is not None
                 and (temb is None or temb.dtype == self.conv1.bias.dtype))
    hidden_states = _gn(self.norm1, input_tensor, act)
    if self.upsample is not None:
        # as diffusers: upsample_nearest_nhwc fails with large batch sizes (diffusers issue 984)
        if hidden_states.shape[0] >= 64:
            input_tensor = input_tensor.contiguous()
            hidden_states = hidden_states.contiguous()
        input_tensor = self.upsample(input_tensor)
        hidden_states = self.upsample(hidden_states)
    elif self.downsample is not None:
        input_tensor = self.downsample(input_tensor)
        hidden_states = self.downsample(hidden_states)
    if fold_bias:
        hidden_states = self.conv1._conv_forward(hidden_states, self.conv1.weight, None)
        bias = self.conv1.bias[:, None, None]
    else:
        hidden_states = self.conv1(hidden_states)
        bias = None

    if self.time_embedding_norm == "default" and (temb is None or temb.dtype == hidden_states.dtype):
        if bias is not None:
            temb = bias if temb is None else temb + bias
        hidden_states = _gn(self.norm2, hidden_states, act, residual=temb)  # act(GN(h + bias + temb))
    elif self.time_embedding_norm == "default":
        # a time embedding in another dtype: torch's add promotes, as diffusers does; then one fused kernel
        hidden_states = _gn(self.norm2, hidden_states + temb, act)
    else:  # "scale_shift" (checked at patch time)
        if temb is None:
            raise ValueError(f" `temb` should not be None when `time_embedding_norm` is {self.time_embedding_norm}")
        time_scale, time_shift = torch.chunk(temb, 2, dim=1)
        hidden_states = _gn(self.norm2, hidden_states, residual=bias) * (1 + time_scale) + time_shift
        hidden_states = self.nonlinearity(hidden_states)

    hidden_states = self.dropout(hidden_states)
    hidden_states = self.conv2(hidden_states)
    if self.conv_shortcut is not None:
        if self.training:  # as diffusers: DDP gradient stride warning
            input_tensor = input_tensor.contiguous()
        input_tensor = self.conv_shortcut(input_tensor)
    return _rescale(input_tensor + hidden_states, self.output_scale_factor)


def _plain_conv(conv) -> bool:
    """An nn.Conv2d itself (not a LoRA / quantized subclass), whose forward is _conv_forward(x, weight, bias)."""
    return type(conv) is nn.Conv2d


def _pointwise_conv(conv) -> bool:
    """A 1x1 nn.Conv2d that is a matrix product over channels (no stride, padding, dilation or groups)."""
    return (_plain_conv(conv) and conv.kernel_size == (1, 1) and conv.stride == (1, 1) and conv.padding == (0, 0)
            and conv.dilation == (1, 1) and conv.groups == 1)


def _pointwise(conv, tokens: torch.Tensor) -> torch.Tensor:
    """A 1x1 convolution on (..., C_in) tokens as a Linear (cuBLAS, bias in the GEMM's epilogue)."""
    return nn.functional.linear(tokens, conv.weight.flatten(1), conv.bias)


def _channels_last(t: torch.Tensor) -> bool:
    """4-D channels_last and not also NCHW-contiguous (C = 1 or 1 x 1 pixels are both)."""
    return t.ndim == 4 and t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous()


def _transformer_2d_input(self, hidden_states):
    """Transformer2DModel._operate_on_continuous_inputs for a channels_last input with a 1x1-conv proj_in: the
    normalized (b, c, h, w) activation is read as (b, h * w, c) tokens in place and proj_in runs as a Linear
    (cuBLAS with the bias in its epilogue instead of cuDNN then a broadcast bias add)."""
    if not (_channels_last(hidden_states) and not self.use_linear_projection and _pointwise_conv(self.proj_in)):
        return type(self)._operate_on_continuous_inputs(self, hidden_states)
    batch, channels, height, width = hidden_states.shape
    hidden_states = self.norm(hidden_states)
    tokens = hidden_states.permute(0, 2, 3, 1).reshape(batch, height * width, channels)   # a view
    hidden_states = _pointwise(self.proj_in, tokens)
    return hidden_states, hidden_states.shape[-1]


def _transformer_2d_output(self, hidden_states, residual, batch_size, height, width, inner_dim):
    """Transformer2DModel._get_output_for_continuous_inputs for a channels_last input: the tokens (b, h * w, c)
    viewed as (b, c, h, w) are channels_last already, so proj_out (1x1 conv or Linear) and the residual add
    run in the input's layout. diffusers' ``.contiguous()`` there copies them to NCHW, and a channels_last UNet
    then flips layouts at every transformer block (a copy, a strided add, convolutions on mixed layouts)."""
    if not _channels_last(residual):
        return type(self)._get_output_for_continuous_inputs(self, hidden_states, residual, batch_size, height,
                                                            width, inner_dim)
    if self.use_linear_projection or _pointwise_conv(self.proj_out):   # on the tokens (a 1x1 conv as a Linear)
        hidden_states = (self.proj_out(hidden_states) if self.use_linear_projection
                         else _pointwise(self.proj_out, hidden_states))
        hidden_states = hidden_states.reshape(batch_size, height, width, -1).permute(0, 3, 1, 2)   # channels_last
    else:   # another conv, on the channels_last view
        hidden_states = self.proj_out(hidden_states.reshape(batch_size, height, width, inner_dim).permute(0, 3, 1, 2))
    return hidden_states + residual


def _resnet_block_check(module) -> str | None:
    if _activation_name(module.nonlinearity) is None:
        return f"nonlinearity {module.nonlinearity!r} has no group_norm kernel (silu, mish, gelu)"
    if module.time_embedding_norm not in ("default", "scale_shift"):
        return f"time_embedding_norm {module.time_embedding_norm!r}"
    if not (isinstance(module.norm1, nn.GroupNorm) and isinstance(module.norm2, nn.GroupNorm)):
        return "norm1/norm2 are not GroupNorm"
    if module.time_emb_proj is None and module.time_embedding_norm != "default":
        return "scale_shift without a time embedding projection"
    return None


def _ada_norm_zero_forward(self, x, timestep=None, class_labels=None, hidden_dtype=None, emb=None):
    """AdaLayerNormZero: LN(x) * (1 + scale_msa) + shift_msa in one kernel (flashfuse.ops.modulation's drop-in)."""
    if not _kernel_ok(x) or x.ndim != 3:
        return type(self).forward(self, x, timestep, class_labels, hidden_dtype, emb)
    return ada_layer_norm_zero_forward(self, x, timestep, class_labels, hidden_dtype, emb)


def _last_dim_layer_norm(norm) -> bool:
    return isinstance(norm, nn.LayerNorm) and len(norm.normalized_shape) == 1


def _ada_norm_zero_check(module) -> str | None:
    if not _last_dim_layer_norm(module.norm):
        return f"its norm {module.norm!r} is not a LayerNorm over the last dim"
    return None


def _basic_block_forward(self, hidden_states, attention_mask=None, encoder_hidden_states=None,
                         encoder_attention_mask=None, timestep=None, cross_attention_kwargs=None, class_labels=None,
                         added_cond_kwargs=None):
    """BasicTransformerBlock.forward for norm_type="ada_norm_zero": gated residuals and norm3's modulation fused."""
    if (not _kernel_ok(hidden_states) or hidden_states.ndim != 3
            or (cross_attention_kwargs is not None and cross_attention_kwargs.get("scale") is not None)):
        return type(self).forward(self, hidden_states, attention_mask, encoder_hidden_states, encoder_attention_mask,
                                  timestep, cross_attention_kwargs, class_labels, added_cond_kwargs)
    norm_hidden_states, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.norm1(
        hidden_states, timestep, class_labels, hidden_dtype=hidden_states.dtype
    )
    if self.pos_embed is not None:
        norm_hidden_states = self.pos_embed(norm_hidden_states)
    cross_attention_kwargs = cross_attention_kwargs.copy() if cross_attention_kwargs is not None else {}
    gligen_kwargs = cross_attention_kwargs.pop("gligen", None)
    attn_output = self.attn1(
        norm_hidden_states,
        encoder_hidden_states=encoder_hidden_states if self.only_cross_attention else None,
        attention_mask=attention_mask,
        **cross_attention_kwargs,
    )
    if gligen_kwargs is None and self.attn2 is None:
        # h + gate_msa * attn, then norm3(h) * (1 + scale_mlp) + shift_mlp (an affine norm3 folded into the
        # modulation vectors): one kernel, the new h written once and not read back (DiT, PixArt without text)
        norm_hidden_states, hidden_states = layer_norm_modulate(self.norm3, attn_output, scale_mlp, shift_mlp,
                                                                residual=hidden_states, gate=gate_msa)
        return _ff_gate(self, norm_hidden_states, hidden_states, gate_mlp)
    hidden_states = ada_layer_norm_gate(hidden_states, gate_msa, attn_output)  # h + gate_msa * attn
    if gligen_kwargs is not None:
        hidden_states = self.fuser(hidden_states, gligen_kwargs["objs"])
    if self.attn2 is not None:
        norm_hidden_states = self.norm2(hidden_states)
        if self.pos_embed is not None:
            norm_hidden_states = self.pos_embed(norm_hidden_states)
        attn_output = self.attn2(
            norm_hidden_states,
            encoder_hidden_states=encoder_hidden_states,
            attention_mask=encoder_attention_mask,
            **cross_attention_kwargs,
        )
        hidden_states = attn_output + hidden_states
    # norm3(h) * (1 + scale_mlp) + shift_mlp; an affine norm3 is folded into the modulation vectors
    norm_hidden_states = layer_norm_modulate(self.norm3, hidden_states, scale_mlp, shift_mlp)
    return _ff_gate(self, norm_hidden_states, hidden_states, gate_mlp)


def _ff_gate(self, norm_hidden_states, hidden_states, gate_mlp):
    """The block's feed-forward and its gated residual h + gate_mlp * ff."""
    if self._chunk_size is not None:
        from diffusers.models.attention import _chunked_feed_forward

        ff_output = _chunked_feed_forward(self.ff, norm_hidden_states, self._chunk_dim, self._chunk_size)
    else:
        ff_output = self.ff(norm_hidden_states)
    return ada_layer_norm_gate(hidden_states, gate_mlp, ff_output)


def _basic_block_check(module) -> str | None:
    if module.norm_type != "ada_norm_zero":
        return f"norm_type {module.norm_type!r} (only ada_norm_zero has a fused forward)"
    if not _last_dim_layer_norm(module.norm3):
        return f"norm3 {module.norm3!r} is not a LayerNorm over the last dim"
    return None


# ----------------------------------------------------------------------------------------------------------
# The tables.
# ----------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Forward:
    """A diffusers class whose instances get a generic forward."""
    flag: str  # the patch_diffusers flag that enables it
    module: str  # diffusers module defining the class
    cls: str
    forward: object  # function(self, ...) bound to each instance
    check: object  # module -> None, or why this instance keeps diffusers' forward
    count: str  # key in patch_summary
    setup: object = None  # module -> {attribute: value} stored on the instance for the forward
    method: str = "forward"  # the method bound per instance
    quiet: str = ""  # a check's reason containing this keeps diffusers' forward without a warning (the usual case)


_FORWARDS = (
    _Forward("norms", "diffusers.models.resnet", "ResnetBlock2D", _resnet_block_forward, _resnet_block_check,
             "resnet_block"),
    _Forward("geglu", "diffusers.models.activations", "GEGLU", _geglu_forward, _proj_check, "geglu",
             lambda m: {"_flashfuse_act": _proj_activation(m)}),
    _Forward("geglu", "diffusers.models.activations", "SwiGLU", _geglu_forward, _proj_check, "geglu",
             lambda m: {"_flashfuse_act": _proj_activation(m)}),
    _Forward("geglu", "diffusers.models.activations", "GELU", _gelu_tanh_forward, _gelu_tanh_check, "gelu_tanh",
             quiet="approximate="),  # exact-GELU feed-forwards keep a Linear and one elementwise GELU
    _Forward("embeddings", "diffusers.models.embeddings", "Timesteps", _timesteps_forward, _timesteps_check,
             "timesteps"),
    _Forward("adaln", "diffusers.models.normalization", "AdaLayerNormZero", _ada_norm_zero_forward,
             _ada_norm_zero_check, "ada_layer_norm_zero"),
    _Forward("adaln", "diffusers.models.attention", "BasicTransformerBlock", _basic_block_forward,
             _basic_block_check, "ada_norm_zero_block", quiet="norm_type"),  # most blocks are not adaLN-Zero
    _Forward("layout", "diffusers.models.transformers.transformer_2d", "Transformer2DModel", _transformer_2d_input,
             lambda m: None, "transformer_2d_input", method="_operate_on_continuous_inputs"),
    _Forward("layout", "diffusers.models.transformers.transformer_2d", "Transformer2DModel", _transformer_2d_output,
             lambda m: None, "transformer_2d_output", method="_get_output_for_continuous_inputs"),
)

# (module, class, norm attribute, activation attribute): GroupNorm then activation, back to back in the forward.
_NORM_ACT_PAIRS = (
    ("diffusers.models.unets.unet_2d", "UNet2DModel", "conv_norm_out", "conv_act"),
    ("diffusers.models.unets.unet_2d_condition", "UNet2DConditionModel", "conv_norm_out", "conv_act"),
    ("diffusers.models.autoencoders.vae", "Encoder", "conv_norm_out", "conv_act"),
    ("diffusers.models.autoencoders.vae", "Decoder", "conv_norm_out", "conv_act"),
)

# processor class name (diffusers.models.attention_processor) -> legacy flag of FlashfuseAttnProcessor
_PROCESSORS = {"AttnProcessor2_0": False, "AttnProcessor": True}


def _class(module: str, name: str):
    try:
        return getattr(importlib.import_module(module), name, None)
    except ImportError:  # a diffusers version without that module
        return None


# ----------------------------------------------------------------------------------------------------------
# The patch routine and its undo.
# ----------------------------------------------------------------------------------------------------------

_STATE = "_flashfuse_diffusers_patch"
_COUNT_KEYS = ("group_norm_act", "group_norm", "layer_norm", "resnet_block", "attn_processor", "geglu",
               "gelu_tanh", "timesteps", "ada_layer_norm_zero", "ada_norm_zero_block", "transformer_2d_input",
               "transformer_2d_output")


@dataclasses.dataclass
class _PatchState:
    flags: dict
    counts: dict = dataclasses.field(default_factory=lambda: dict.fromkeys(_COUNT_KEYS, 0))
    modules: list = dataclasses.field(default_factory=list)  # (parent, child name, original, replacement)
    forwards: list = dataclasses.field(default_factory=list)  # (module, method, attribute names set for it)
    processors: list = dataclasses.field(default_factory=list)  # (attention module, original processor)
    processors_dict: dict | None = None  # model.attn_processors before the patch (models with set_attn_processor)


def _build_group_norm(old: nn.GroupNorm, activation: str | None) -> nn.Module:
    with torch.device("meta"):
        new = GroupNormAct(old.num_groups, old.num_channels, eps=old.eps, affine=old.affine, activation=activation)
    for name, param in old.named_parameters(recurse=False):
        setattr(new, name, param)
    return new


def _build_layer_norm(old: nn.LayerNorm) -> nn.Module:
    new = LayerNorm(old.normalized_shape, eps=old.eps, elementwise_affine=old.elementwise_affine,
                    bias=getattr(old, "bias", None) is not None, device="meta")
    for name, param in old.named_parameters(recurse=False):
        setattr(new, name, param)
    return new


def _swap(parent: nn.Module, name: str, new: nn.Module, state: _PatchState) -> None:
    old = parent._modules[name]
    new.train(old.training)
    setattr(parent, name, new)
    state.modules.append((parent, name, old, new))


def _patch_norms(model: nn.Module, state: _PatchState) -> None:
    pairs = {}
    for module, cls, norm_attr, act_attr in _NORM_ACT_PAIRS:
        cls = _class(module, cls)
        if cls is not None:
            pairs[cls] = (norm_attr, act_attr)
    fused: set[int] = set()  # ids of the norms fused with their activation (not to be swapped again elsewhere)
    done: dict[int, nn.Module] = {}  # id(original) -> replacement: a shared module is replaced once
    for parent in list(model.modules()):
        if type(parent) in pairs:
            norm_attr, act_attr = pairs[type(parent)]
            norm, act = getattr(parent, norm_attr, None), getattr(parent, act_attr, None)
            activation = _activation_name(act)
            if type(norm) is nn.GroupNorm and activation is not None and id(norm) not in fused:
                fused.add(id(norm))
                _swap(parent, norm_attr, _build_group_norm(norm, activation), state)
                _swap(parent, act_attr, nn.Identity(), state)
                state.counts["group_norm_act"] += 1
    for parent in list(model.modules()):
        for name, child in list(parent._modules.items()):
            if id(child) in fused:
                continue  # shared with a fused pair elsewhere: this use keeps the plain GroupNorm
            if type(child) is nn.GroupNorm:
                key = "group_norm"
                new = done.get(id(child)) or _build_group_norm(child, None)
            elif type(child) is nn.LayerNorm:
                key = "layer_norm"
                new = done.get(id(child)) or _build_layer_norm(child)
            else:
                continue
            if id(child) not in done:
                state.counts[key] += 1
                done[id(child)] = new
            _swap(parent, name, new, state)


def _patch_forwards(model: nn.Module, flags: dict, state: _PatchState) -> None:
    rows: dict[type, list] = {}
    for row in _FORWARDS:
        cls = _class(row.module, row.cls) if flags[row.flag] else None
        if cls is not None:
            rows.setdefault(cls, []).append(row)
    kept: dict[tuple, int] = {}
    for module, row in [(m, r) for m in model.modules() for r in rows.get(type(m), ())]:
        reason = row.check(module)
        if reason is None and row.method in module.__dict__:
            reason = f"it already has an instance-level {row.method} (a hook?)"
        if reason is not None:
            if not row.quiet or row.quiet not in reason:
                kept[(row.cls, reason)] = kept.get((row.cls, reason), 0) + 1
            continue
        extra = row.setup(module) if row.setup is not None else {}
        for name, value in extra.items():
            setattr(module, name, value)
        setattr(module, row.method, types.MethodType(row.forward, module))
        state.forwards.append((module, row.method, tuple(extra)))
        state.counts[row.count] += 1
    for (cls, reason), n in kept.items():
        warnings.warn(f"patch_diffusers: {n} {cls} module(s) keep diffusers' forward: {reason}", stacklevel=3)


def _patch_attention(model: nn.Module, state: _PatchState) -> None:
    classes = {}
    for name, legacy in _PROCESSORS.items():
        cls = _class("diffusers.models.attention_processor", name)
        if cls is not None:
            classes[cls] = legacy

    def replacement(processor):
        legacy = classes.get(type(processor))
        return processor if legacy is None else FlashfuseAttnProcessor(processor, legacy=legacy)

    if hasattr(model, "set_attn_processor") and hasattr(model, "attn_processors"):
        previous = model.attn_processors
        new = {name: replacement(p) for name, p in previous.items()}
        state.counts["attn_processor"] += sum(new[k] is not previous[k] for k in new)
        state.processors_dict = previous
        model.set_attn_processor(dict(new))
        return
    for module in model.modules():
        if hasattr(module, "get_processor") and hasattr(module, "set_processor"):
            old = module.get_processor()
            new = replacement(old)
            if new is not old:
                state.processors.append((module, old))
                module.set_processor(new)
                state.counts["attn_processor"] += 1


def _restore(model: nn.Module, state: _PatchState) -> None:
    if state.processors_dict is not None:
        model.set_attn_processor(dict(state.processors_dict))
    for module, old in reversed(state.processors):
        module.set_processor(old)
    for module, method, names in reversed(state.forwards):
        module.__dict__.pop(method, None)
        for name in names:
            module.__dict__.pop(name, None)
    for parent, name, old, new in reversed(state.modules):
        # model.to(...) / .half() may have given the replacement new Parameter objects; hand the current ones back.
        for pname, param in new.named_parameters(recurse=False):
            if old._parameters.get(pname) is not param:
                old._parameters[pname] = param
        old.train(new.training)
        setattr(parent, name, old)


def patch_diffusers(model: nn.Module, *, norms: bool = True, attention: bool = True, geglu: bool = True,
                    adaln: bool = True, layout: bool = True, embeddings: bool = True) -> nn.Module:
    """Patch a built diffusers model (or any nn.Module holding diffusers blocks) in place with flashfuse kernels;
    returns the same model.

    Args:
        model: e.g. ``UNet2DModel``, ``UNet2DConditionModel``, ``Transformer2DModel``, ``DiTTransformer2DModel``,
            ``AutoencoderKL``.
        norms: ResnetBlock2D forwards with fused GroupNorm + activation (+ time embedding); GroupNorm +
            activation pairs fused; other GroupNorm / LayerNorm modules swapped for flashfuse ones (same
            Parameter objects, same state dict).
        attention: ``AttnProcessor2_0`` / ``AttnProcessor`` -> `FlashfuseAttnProcessor`.
        geglu: GEGLU / SwiGLU feed-forwards: the projection, then one fused gated-activation kernel;
            GELU(approximate="tanh") ones as one GEMM with a bias + GELU epilogue (CUDA, inference).
        adaln: AdaLayerNormZero and adaLN-Zero BasicTransformerBlocks with fused modulation and gated residuals.
        layout: Transformer2DModel keeps a channels_last input channels_last through its output projection and
            residual add (diffusers copies it to NCHW there).
        embeddings: the sinusoidal ``Timesteps`` embedding as one kernel (`flashfuse.ops.embeddings`).

    `patch_summary(model)` says how many modules of each kind were patched. Patching a patched model first
    undoes the previous patch. See the module docstring for the details. Example::

        unet = patch_diffusers(UNet2DConditionModel(**config).cuda().half())
        out = unet(sample, timestep, encoder_hidden_states=text).sample
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"patch_diffusers: model must be an nn.Module (a diffusers model), got {type(model).__name__}")
    if not any(type(m).__module__.startswith("diffusers.") for m in model.modules()):
        raise ValueError(
            f"patch_diffusers: {type(model).__name__} holds no diffusers module; expected a diffusers model such "
            "as UNet2DModel, UNet2DConditionModel, Transformer2DModel or DiTTransformer2DModel"
        )
    if _STATE in model.__dict__:
        unpatch_diffusers(model)
    flags = dict(norms=norms, attention=attention, geglu=geglu, adaln=adaln, layout=layout, embeddings=embeddings)
    state = _PatchState(flags=flags)
    try:
        _patch_forwards(model, flags, state)  # before the norm swaps: the checks see diffusers' own modules
        if norms:
            _patch_norms(model, state)
        if attention:
            _patch_attention(model, state)
    except BaseException:
        _restore(model, state)
        raise
    model.__dict__[_STATE] = state
    return model


def unpatch_diffusers(model: nn.Module) -> nn.Module:
    """Undo `patch_diffusers`: the original module objects (holding the current Parameters), forwards and
    attention processors come back. A model that is not patched is returned unchanged."""
    state = model.__dict__.pop(_STATE, None)
    if state is not None:
        _restore(model, state)
    return model


def patch_summary(model: nn.Module) -> dict:
    """How many modules `patch_diffusers` patched, by kind (all zeros for a model that is not patched):
    group_norm_act (GroupNorm + activation pairs), group_norm, layer_norm (swapped modules), resnet_block,
    geglu (GEGLU / SwiGLU), gelu_tanh (GELU(approximate="tanh") feed-forwards), timesteps, ada_layer_norm_zero,
    ada_norm_zero_block (generic forwards), attn_processor, transformer_2d_input, transformer_2d_output
    (Transformer2DModel's channels_last paths)."""
    state = model.__dict__.get(_STATE)
    return dict(state.counts) if state is not None else dict.fromkeys(_COUNT_KEYS, 0)


@contextlib.contextmanager
def patched_diffusers(model: nn.Module, **flags):
    """``with patched_diffusers(model, **flags): ...`` patches `model` for the block (flags as
    `patch_diffusers`) and restores it on exit, re-applying an earlier patch with its own flags if there was one."""
    previous = model.__dict__.get(_STATE)
    patch_diffusers(model, **flags)
    try:
        yield model
    finally:
        unpatch_diffusers(model)
        if previous is not None:
            patch_diffusers(model, **previous.flags)
