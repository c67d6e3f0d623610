"""One-line patching of Hugging Face transformers models with flashfuse kernels.

    model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-3.2-1B", torch_dtype=torch.bfloat16)
    patch_transformers(model)               # in place, returns the model
    loss = model(input_ids, labels=labels).loss
    unpatch_transformers(model)             # the original modules, function, attention and forward back

    with patched(model, attention=False):   # patch for a block, restore on exit
        ...

What the patch does (flags of `patch_transformers`, all on by default):

- ``norms``: every RMSNorm / LayerNorm module of the model is swapped in place for a
  `flashfuse.nn.RMSNorm` / `flashfuse.nn.LayerNorm` holding the SAME Parameter objects (an optimizer
  built before patching keeps working; state-dict keys are unchanged). Llama, Mistral, Qwen2, Qwen3 (incl.
  the per-head q_norm / k_norm) and Phi3 normalize in fp32, cast to the input dtype, then multiply by the
  weight (``casting_mode="llama"``, eps in ``variance_epsilon``); Gemma and Gemma2 multiply by
  ``1 + weight`` in fp32 and cast once at the end (``offset=1.0, casting_mode="gemma"``, eps in ``eps``);
  GPT-2 uses torch's ``nn.LayerNorm``. The decoder layers of Llama, Mistral, Qwen2, Qwen3, Gemma and Phi3
  also get a forward (one per class, bound on the instance) in which the residual add after attention and
  post_attention_layernorm are one kernel, forward and backward (``integrations/_decoder_layer.py``).
- ``mlp``: the MLP modules become fused ones sharing the HF child Linear modules: gate_proj/up_proj/down_proj
  MLPs (Llama, Mistral, Qwen2/3, Gemma/Gemma2) become `flashfuse.nn.SwiGLUMLP` or `GeGLUMLP` from the
  activation instance HF built from the config (``act_fn``: SiLU -> SwiGLU, gelu_pytorch_tanh -> tanh GeGLU);
  Phi3's fused ``gate_up_proj`` becomes `GateUpMLP` (one GEMM over the fused [gate; up] weight, then the
  gated activation on its two halves);
  GPT-2's Conv1D MLP becomes `Conv1DMLP` (weights stored (in, out), used through transposed views; gelu_new
  is the tanh GELU). An activation without a kernel, or a projection that is not a plain Linear / Conv1D (a
  LoRA or quantized layer, whose forward is more than its weight), leaves that MLP as it is, with a warning.
  Attach adapters before patching: the fused modules read the projections' weights directly.
- ``rope``: each family's module-level ``apply_rotary_pos_emb`` is rebound to flashfuse's drop-in (partial
  rotary passes the tail of the head dim through, as Phi3 needs). In transformers 5.x the function carries
  ``@use_kernel_forward_from_hub("rotary_pos_emb")`` and the attention class ``@use_kernelized_func(...)``:
  without the ``kernels`` package both are no-ops; with it the first only tags the same function object with
  ``kernel_layer_name`` and the second keeps a reference for ``kernelize``. The attention forward still calls
  the name from its module globals, so rebinding the module attribute reroutes every call. This is
  process-wide for that modeling module (reference counted: the original comes back when the last patched
  model of the family is unpatched); the drop-in computes the same function. GPT-2 has absolute positions.
- ``attention``: registers flashfuse with transformers' attention interface (`register_transformers_attention`)
  and sets the model's implementation to ``"flashfuse"`` with ``model.set_attn_implementation``; unpatch
  restores the previous one.
- ``cross_entropy``: the causal-LM instance gets one generic forward (the same for every family). In training
  mode with ``labels`` and transformers' default causal-LM loss, it runs the base model, slices the hidden
  states with ``logits_to_keep`` and computes `flashfuse.fused_linear_cross_entropy(hidden, lm_head.weight,
  shifted labels)` with HF's shift (labels padded with ``ignore_index`` on the right, or ``shift_labels``),
  ``ignore_index``, ``num_items_in_batch`` (sum / count) and Gemma2's ``final_logit_softcapping``. The
  (tokens, vocab) logits are never materialized, so the output has ``logits=None`` (as Liger does). Without
  labels, in eval mode, with a custom ``loss_function`` or an lm_head that is not a plain Linear, the original
  HF forward runs unchanged.

Only the table `_FAMILIES` below is per-model; one routine applies it. `unpatch_transformers` restores the
original module objects (re-attached to the current Parameters), the functions, the attention
implementation and the forward. Modules are matched by exact class, so subclasses someone customized are
left alone. Tested with transformers 5.17 and 5.23.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import importlib
import types
import warnings
import weakref

import torch
from torch import nn

from .._checks import FLOAT_DTYPES
from .._env import INTERPRET
from ..nn.mlp import GeGLUMLP, SwiGLUMLP, gated_activation
from ..nn.norm import LayerNorm, RMSNorm
from ..ops.matmul import fused_mlp
from ..ops.rope import apply_rotary_pos_emb as _flashfuse_apply_rotary_pos_emb
from ._causal_lm import _make_causal_lm_forward
from ._decoder_layer import make_fused_residual_forward

__all__ = ["patch_transformers", "unpatch_transformers", "patched", "GateUpMLP", "Conv1DMLP", "SUPPORTED_FAMILIES"]


# ----------------------------------------------------------------------------------------------------------
# The table: one row per model family. Norm/MLP keys are class names in transformers.models.<name>.modeling_<name>
# (or a dotted path for a torch class); values say how to build the flashfuse replacement.
# ----------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Norm:
    kind: str  # "rms" or "layer"
    eps_attr: str = "eps"  # where the HF module keeps its epsilon
    offset: float = 0.0  # Gemma scales by (1 + weight)
    casting_mode: str = "llama"


@dataclasses.dataclass(frozen=True)
class _Mlp:
    layout: str  # "gated" (gate_proj/up_proj/down_proj), "gate_up" (Phi3's fused gate_up_proj), "conv1d" (GPT-2)
    act_attr: str  # where the HF module keeps its ACT2FN activation instance


@dataclasses.dataclass(frozen=True)
class _Decoder:
    name: str  # decoder-layer class with the forward of _decoder_layer.py (checked by the patched-vs-HF tests)
    attn_dropout: str | None = None  # module applied to the attention output before the residual add (Phi-3)
    mlp_dropout: str | None = None


@dataclasses.dataclass(frozen=True)
class _Family:
    name: str
    norms: dict
    mlps: dict
    causal_lm: str
    rope: str | None = "apply_rotary_pos_emb"  # module-level function the attention forward calls
    logit_softcap: str | None = None  # config attribute of the final logit softcapping
    decoder: _Decoder | None = None  # a pre-norm decoder layer whose first residual add fuses into its norm

    @property
    def module(self) -> str:
        return f"transformers.models.{self.name}.modeling_{self.name}"


_LLAMA_NORM = _Norm("rms", eps_attr="variance_epsilon")
_GEMMA_NORM = _Norm("rms", eps_attr="eps", offset=1.0, casting_mode="gemma")
_GATED = _Mlp("gated", act_attr="act_fn")

_FAMILIES = (
    _Family("llama", {"LlamaRMSNorm": _LLAMA_NORM}, {"LlamaMLP": _GATED}, "LlamaForCausalLM",
            decoder=_Decoder("LlamaDecoderLayer")),
    _Family("mistral", {"MistralRMSNorm": _LLAMA_NORM}, {"MistralMLP": _GATED}, "MistralForCausalLM",
            decoder=_Decoder("MistralDecoderLayer")),
    _Family("qwen2", {"Qwen2RMSNorm": _LLAMA_NORM}, {"Qwen2MLP": _GATED}, "Qwen2ForCausalLM",
            decoder=_Decoder("Qwen2DecoderLayer")),
    _Family("qwen3", {"Qwen3RMSNorm": _LLAMA_NORM}, {"Qwen3MLP": _GATED}, "Qwen3ForCausalLM",
            decoder=_Decoder("Qwen3DecoderLayer")),
    _Family("gemma", {"GemmaRMSNorm": _GEMMA_NORM}, {"GemmaMLP": _GATED}, "GemmaForCausalLM",
            decoder=_Decoder("GemmaDecoderLayer")),
    _Family("gemma2", {"Gemma2RMSNorm": _GEMMA_NORM}, {"Gemma2MLP": _GATED}, "Gemma2ForCausalLM",
            logit_softcap="final_logit_softcapping"),  # its attention output is normed before the add
    _Family("phi3", {"Phi3RMSNorm": _LLAMA_NORM}, {"Phi3MLP": _Mlp("gate_up", "activation_fn")}, "Phi3ForCausalLM",
            decoder=_Decoder("Phi3DecoderLayer", "resid_attn_dropout", "resid_mlp_dropout")),
    _Family("gpt2", {"torch.nn.LayerNorm": _Norm("layer")}, {"GPT2MLP": _Mlp("conv1d", "act")}, "GPT2LMHeadModel",
            rope=None),  # absolute position embeddings
)
SUPPORTED_FAMILIES = tuple(f.name for f in _FAMILIES)


# ----------------------------------------------------------------------------------------------------------
# Replacement modules for the MLP layouts flashfuse.nn has no module for (they keep HF's child names, so the
# parameter names, and with them state dicts, do not change).
# ----------------------------------------------------------------------------------------------------------


class GateUpMLP(nn.Module):
    """Phi3-style MLP: down_proj(act(x W_gate^T) * (x W_up^T)) with W = gate_up_proj.weight = [W_gate; W_up].

    One cuBLAS GEMM over the fused (2 * intermediate, hidden) weight, then the gated activation as one
    kernel reading the two halves of its output in place (as ``flashfuse.nn.SwiGLUMLP``, whose docstring
    says why not an epilogue-fused GEMM). activation: "swiglu", "geglu" or "geglu_tanh".
    """

    def __init__(self, gate_up_proj: nn.Linear, down_proj: nn.Linear, activation: str = "swiglu"):
        super().__init__()
        self.gate_up_proj = gate_up_proj
        self.down_proj = down_proj
        self.activation = activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(gated_activation(gate, up, self.activation))

    def extra_repr(self) -> str:
        return f"activation={self.activation!r}"


class Conv1DMLP(nn.Module):
    """GPT-2-style MLP over transformers' Conv1D layers (weight stored (in, out)): dropout(fc2(act(fc1(x)))).

    The Conv1D weights are used through transposed views (no copy); fc1's bias and activation are fused into
    its GEMM epilogue. activation: "gelu_tanh" (GPT-2's gelu_new), "gelu", "relu" or "silu".
    """

    def __init__(self, c_fc: nn.Module, c_proj: nn.Module, dropout: nn.Module, activation: str = "gelu_tanh"):
        super().__init__()
        self.c_fc = c_fc
        self.c_proj = c_proj
        self.dropout = dropout
        self.activation = activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fc1, fc2 = self.c_fc, self.c_proj
        return self.dropout(fused_mlp(x, fc1.weight.t(), fc1.bias, fc2.weight.t(), fc2.bias, self.activation))

    def extra_repr(self) -> str:
        return f"activation={self.activation!r}"


def _rope_dropin(original):
    """transformers 5.x's ``apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)`` on flashfuse. The module
    attribute is rebound for the whole process, so unpatched models of the family call it too: inputs the
    kernel does not take (float64, a CPU tensor outside the interpreter) go to the family's own function."""
    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
        if (q.dtype in FLOAT_DTYPES and k.dtype == q.dtype and cos.dtype in FLOAT_DTYPES
                and sin.dtype == cos.dtype and not (cos.requires_grad or sin.requires_grad)
                and (q.is_cuda or INTERPRET)):
            return _flashfuse_apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
        return original(q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)
    apply_rotary_pos_emb.flashfuse_original = original
    return apply_rotary_pos_emb


# ----------------------------------------------------------------------------------------------------------
# Builders: HF module -> flashfuse module sharing its parameters (None when there is no kernel for it).
# ----------------------------------------------------------------------------------------------------------

# ACT2FN instantiates one class per config name; these are the ones flashfuse has kernels for. Matched by class
# name because transformers renamed some across versions (PytorchGELUTanh -> GELUTanh).
_ACTIVATIONS = {
    "SiLUActivation": "silu",
    "SiLU": "silu",
    "GELUTanh": "gelu_tanh",  # gelu_pytorch_tanh
    "PytorchGELUTanh": "gelu_tanh",
    "NewGELUActivation": "gelu_tanh",  # gelu_new (GPT-2): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
    "FastGELUActivation": "gelu_tanh",  # gelu_fast: the same formula with sqrt(2/pi) written out
    "GELUActivation": "gelu",  # exact erf GELU
    "ReLU": "relu",
}
_GATED_ACTIVATIONS = {"silu": "swiglu", "gelu_tanh": "geglu_tanh", "gelu": "geglu"}


def _activation(module: nn.Module, spec: _Mlp) -> str | None:
    act = getattr(module, spec.act_attr, None)
    if isinstance(act, nn.GELU):
        return "gelu_tanh" if act.approximate == "tanh" else "gelu"
    return _ACTIVATIONS.get(type(act).__name__)


def _build_norm(old: nn.Module, spec: _Norm) -> nn.Module:
    if spec.kind == "layer":
        new = LayerNorm(old.normalized_shape, eps=old.eps, elementwise_affine=old.elementwise_affine,
                        bias=getattr(old, "bias", None) is not None, device="meta")
    else:
        new = RMSNorm(old.weight.shape[-1], eps=getattr(old, spec.eps_attr), offset=spec.offset,
                      casting_mode=spec.casting_mode, device="meta")
    for name, param in old.named_parameters(recurse=False):
        setattr(new, name, param)
    return new


def _build_mlp(old: nn.Module, spec: _Mlp) -> nn.Module | str:
    """The fused MLP, or why there is none. The projections must be plain nn.Linear (Conv1D for GPT-2): the
    fused kernels read their .weight, which would silently skip a LoRA adapter or a quantized layer's own
    forward (such MLPs stay as they are; attach adapters before patching)."""
    from transformers.pytorch_utils import Conv1D

    layers = {"gated": ("gate_proj", "up_proj", "down_proj"), "gate_up": ("gate_up_proj", "down_proj"),
              "conv1d": ("c_fc", "c_proj")}[spec.layout]
    expected = Conv1D if spec.layout == "conv1d" else nn.Linear
    odd = [f"{n} is {type(getattr(old, n)).__name__}" for n in layers if type(getattr(old, n)) is not expected]
    if odd:
        return f"{', '.join(odd)}, not {expected.__name__}"
    act = _activation(old, spec)
    if act is None or (spec.layout != "conv1d" and act not in _GATED_ACTIVATIONS):
        return f"its activation {type(getattr(old, spec.act_attr, None)).__name__} has no flashfuse kernel"
    if spec.layout == "conv1d":
        return Conv1DMLP(old.c_fc, old.c_proj, old.dropout, activation=act)
    if spec.layout == "gate_up":
        return GateUpMLP(old.gate_up_proj, old.down_proj, activation=_GATED_ACTIVATIONS[act])
    gate = old.gate_proj
    kwargs = dict(bias=gate.bias is not None, device="meta")
    if act == "silu":
        new = SwiGLUMLP(gate.in_features, gate.out_features, **kwargs)
    else:
        approximate = "tanh" if act == "gelu_tanh" else "none"
        new = GeGLUMLP(gate.in_features, gate.out_features, approximate=approximate, **kwargs)
    new.gate_proj, new.up_proj, new.down_proj = old.gate_proj, old.up_proj, old.down_proj
    return new


# ----------------------------------------------------------------------------------------------------------
# The patch routine and its undo.
# ----------------------------------------------------------------------------------------------------------

_STATE = "_flashfuse_patch"
# (module name, attribute) -> [original function, number of patched models using the replacement]
_FUNCTION_PATCHES: dict[tuple[str, str], list] = {}


@dataclasses.dataclass
class _PatchState:
    flags: dict
    modules: list = dataclasses.field(default_factory=list)  # (parent, child name, original, replacement)
    functions: list = dataclasses.field(default_factory=list)  # keys of _FUNCTION_PATCHES this model holds
    attn_implementation: tuple | None = None  # (the implementation to restore,) when attention was patched
    forward: tuple | None = None  # (had an instance-level forward, that forward)
    decoders: list = dataclasses.field(default_factory=list)  # decoder layers given the fused-residual forward

    def __post_init__(self):
        # A patched model dropped without unpatch_transformers must not leave the family's function rebound
        # for the rest of the process: the state's collection releases what it still holds.
        weakref.finalize(self, _release_functions, self.functions)

    def __deepcopy__(self, memo):
        # copy.deepcopy(patched model): the copy's state refers to the copy's modules (through memo) and holds
        # the patched functions too, so it counts as one more user of them.
        fields = {f.name: copy.deepcopy(getattr(self, f.name), memo) for f in dataclasses.fields(self)}
        for key in fields["functions"]:
            _FUNCTION_PATCHES[key][1] += 1
        return _PatchState(**fields)


def _families_of(model: nn.Module) -> list[_Family]:
    present = {type(m).__module__ for m in model.modules()}
    return [family for family in _FAMILIES if family.module in present]


def _resolve(family: _Family, table: dict) -> dict:
    """Class name (or dotted torch path) -> class object, for the keys of a row's norm/MLP table."""
    resolved = {}
    for key, spec in table.items():
        path, _, name = key.rpartition(".") if "." in key else (family.module, "", key)
        cls = getattr(importlib.import_module(path), name, None)
        if cls is not None:  # a class this transformers version does not define is simply not patched
            resolved[cls] = spec
    return resolved


def _swap_modules(model: nn.Module, families: list[_Family], norms: bool, mlp: bool, state: _PatchState) -> None:
    builders = {}
    for family in families:
        if norms:
            builders.update({cls: (_build_norm, spec) for cls, spec in _resolve(family, family.norms).items()})
        if mlp:
            builders.update({cls: (_build_mlp, spec) for cls, spec in _resolve(family, family.mlps).items()})
    replaced: dict[int, nn.Module | None] = {}  # id(original) -> replacement, so a shared module is built once
    for parent in list(model.modules()):
        for name, child in list(parent._modules.items()):
            if child is None or type(child) not in builders:
                continue
            if id(child) not in replaced:
                build, spec = builders[type(child)]
                new = build(child, spec)
                if isinstance(new, str):
                    warnings.warn(f"patch_transformers: {type(child).__name__} left as it is: {new}", stacklevel=3)
                    new = None
                else:
                    _check_same_parameters(child, new)
                    new.train(child.training)
                replaced[id(child)] = new
            new = replaced[id(child)]
            if new is not None:
                setattr(parent, name, new)
                state.modules.append((parent, name, child, new))


def _check_same_parameters(old: nn.Module, new: nn.Module) -> None:
    """The replacement must hold exactly the original Parameter objects under the same names."""
    old_params, new_params = dict(old.named_parameters()), dict(new.named_parameters())
    if old_params.keys() != new_params.keys() or any(old_params[k] is not new_params[k] for k in old_params):
        raise RuntimeError(
            f"patch_transformers: the replacement {type(new).__name__} for {type(old).__name__} does not share its "
            f"parameters (original {sorted(old_params)}, replacement {sorted(new_params)}); this is a flashfuse bug"
        )


def _restore_module(parent: nn.Module, name: str, old: nn.Module, new: nn.Module) -> None:
    # model.to(...) / .half() may have given the replacement new Parameter objects; hand the current ones back.
    for pname, param in new.named_parameters():
        path, _, leaf = pname.rpartition(".")
        owner = old.get_submodule(path)
        if owner._parameters.get(leaf) is not param:
            owner._parameters[leaf] = param
    old.train(new.training)
    setattr(parent, name, old)


def _patch_decoders(model: nn.Module, families: list[_Family], state: _PatchState) -> None:
    """Layers of a table decoder class whose post_attention_layernorm is now flashfuse's get the forward of
    _decoder_layer.py (one per class, bound per layer); a layer with its own instance forward is left alone."""
    forwards = {}
    for family in families:
        if family.decoder is not None:
            cls = getattr(importlib.import_module(family.module), family.decoder.name, None)
            if cls is not None:
                d = family.decoder
                forwards[cls] = make_fused_residual_forward(cls.forward, d.attn_dropout, d.mlp_dropout)
    for layer in model.modules():
        forward = forwards.get(type(layer))
        if (forward is not None and "forward" not in layer.__dict__
                and isinstance(getattr(layer, "post_attention_layernorm", None), (RMSNorm, LayerNorm))):
            layer.forward = types.MethodType(forward, layer)
            state.decoders.append(layer)


def _patch_functions(families: list[_Family], state: _PatchState) -> None:
    for family in families:
        if family.rope is None:
            continue
        module = importlib.import_module(family.module)
        key = (family.module, family.rope)
        entry = _FUNCTION_PATCHES.get(key)
        if entry is None:
            entry = _FUNCTION_PATCHES[key] = [getattr(module, family.rope), 0]
            setattr(module, family.rope, _rope_dropin(entry[0]))
        entry[1] += 1
        state.functions.append(key)


def _release_functions(keys: list) -> None:
    """Give back this model's uses of the patched functions (the list is emptied: releasing is once only)."""
    while keys:
        _restore_function(keys.pop())


def _restore_function(key: tuple[str, str]) -> None:
    entry = _FUNCTION_PATCHES[key]
    entry[1] -= 1
    if entry[1] == 0:
        setattr(importlib.import_module(key[0]), key[1], entry[0])
        del _FUNCTION_PATCHES[key]


def _patch_attention(model: nn.Module, state: _PatchState) -> None:
    from .hf_attention import register_transformers_attention

    name = register_transformers_attention()
    previous = model.config._attn_implementation
    model.set_attn_implementation(name)
    state.attn_implementation = (previous,)


def _patch_forward(model: nn.Module, families: list[_Family], state: _PatchState) -> None:
    rows = {family.causal_lm: family for family in families}
    family = rows.get(type(model).__name__)
    if family is None or type(model).__module__ != family.module:
        return  # not a causal LM of the table (e.g. a bare LlamaModel): nothing to fuse
    from transformers.loss.loss_utils import LOSS_MAPPING

    forward = _make_causal_lm_forward(type(model).forward, family.logit_softcap, LOSS_MAPPING)
    state.forward = ("forward" in model.__dict__, model.__dict__.get("forward"))
    model.forward = types.MethodType(forward, model)


def _restore(model: nn.Module, state: _PatchState) -> None:
    for layer in state.decoders:
        layer.__dict__.pop("forward", None)
    if state.forward is not None:
        had_forward, forward = state.forward
        if had_forward:
            model.forward = forward
        else:
            model.__dict__.pop("forward", None)
    if state.attn_implementation is not None:
        model.set_attn_implementation(state.attn_implementation[0])
    _release_functions(state.functions)
    for parent, name, old, new in reversed(state.modules):
        _restore_module(parent, name, old, new)


def patch_transformers(
    model: nn.Module,
    *,
    norms: bool = True,
    rope: bool = True,
    mlp: bool = True,
    attention: bool = True,
    cross_entropy: bool = True,
) -> nn.Module:
    """Patch a built transformers model in place with flashfuse kernels; returns the same model.

    Args:
        model: a transformers model of a supported family (``SUPPORTED_FAMILIES``: llama, mistral, qwen2,
            qwen3, gemma, gemma2, phi3, gpt2), e.g. ``LlamaForCausalLM`` or a bare ``LlamaModel``.
        norms: swap RMSNorm / LayerNorm modules (same Parameter objects).
        rope: rebind the family's ``apply_rotary_pos_emb`` (process-wide, reference counted).
        mlp: swap MLP modules for fused ones (same child Linear / Conv1D modules).
        attention: set the attention implementation to ``"flashfuse"``.
        cross_entropy: training-mode causal-LM forward with labels uses the fused linear cross entropy and
            returns ``logits=None``; everything else runs HF's forward.

    Patching a patched model first undoes the previous patch. See the module docstring for the details of
    each flag. Example::

        model = patch_transformers(LlamaForCausalLM(config), attention=False)
        loss = model(input_ids, labels=input_ids).loss   # model.train(): logits is None
    """
    if not isinstance(model, nn.Module) or not hasattr(model, "config"):
        raise TypeError(
            f"patch_transformers: model must be a transformers PreTrainedModel (an nn.Module with a config), "
            f"got {type(model).__name__}"
        )
    _check_not_sharded(model, "patch_transformers")
    if _STATE in model.__dict__:
        unpatch_transformers(model)
    families = _families_of(model)
    if not families:
        raise ValueError(
            f"patch_transformers: {type(model).__name__} is not of a supported family; supported: "
            f"{', '.join(SUPPORTED_FAMILIES)}"
        )
    flags = dict(norms=norms, rope=rope, mlp=mlp, attention=attention, cross_entropy=cross_entropy)
    state = _PatchState(flags=flags)
    try:
        if norms or mlp:
            _swap_modules(model, families, norms, mlp, state)
        if norms:
            _patch_decoders(model, families, state)
        if rope:
            _patch_functions(families, state)
        if attention:
            _patch_attention(model, state)
        if cross_entropy:
            _patch_forward(model, families, state)
    except BaseException:
        _restore(model, state)
        raise
    model.__dict__[_STATE] = state
    return model


def unpatch_transformers(model: nn.Module) -> nn.Module:
    """Undo `patch_transformers`: the original module objects (holding the current Parameters), functions,
    attention implementation and forward come back. A model that is not patched is returned unchanged."""
    if _STATE in model.__dict__:
        _check_not_sharded(model, "unpatch_transformers")
    state = model.__dict__.pop(_STATE, None)
    if state is not None:
        _restore(model, state)
    return model


def _check_not_sharded(model: nn.Module, caller: str) -> None:
    """FSDP2 (fully_shard) re-points the modules it knows at their gathered weights before each forward; modules
    swapped in after sharding would keep the DTensor shards (docs/distributed.md): patch first, then shard."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a torch build without distributed
        return
    sharded = next((name for name, p in model.named_parameters() if isinstance(p, DTensor)), None)
    if sharded is not None:
        raise ValueError(f"{caller}: the model is already sharded (parameter {sharded!r} is a DTensor); call "
                         "patch_transformers before fully_shard, and unpatch only an unsharded model")


@contextlib.contextmanager
def patched(model: nn.Module, **flags):
    """``with patched(model, **flags): ...`` patches `model` for the block (flags as `patch_transformers`) and
    restores it on exit, re-applying an earlier patch with its own flags if there was one."""
    previous = model.__dict__.get(_STATE)
    patch_transformers(model, **flags)
    try:
        yield model
    finally:
        unpatch_transformers(model)
        if previous is not None:
            patch_transformers(model, **previous.flags)
