"""``attn_implementation="flashfuse"`` for Hugging Face transformers.

    from flashfuse.integrations.hf_attention import register_transformers_attention
    register_transformers_attention()
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="flashfuse")

Two registrations, both under the name "flashfuse":

- ``AttentionInterface``: ``flashfuse_attention_forward``, with the contract of transformers' own
  ``sdpa_attention_forward`` / ``flash_attention_forward``: query (batch, nheads_q, seqlen_q, headdim), key /
  value (batch, nheads_k, seqlen_k, headdim) in the modules' layout, returns ``(attn_output (batch, seqlen_q,
  nheads_q, headdim), None)``.
- ``AttentionMaskInterface``: ``flashfuse_mask``. Without it transformers builds NO mask at all for an
  unknown implementation name (``_preprocess_mask_arguments`` exits early), so a padded batch would silently
  attend to padding. ``flashfuse_mask`` returns ``None`` exactly when the attention pattern is what the
  forward does by itself (causal or bidirectional, the layer's sliding window, no padding, queries aligned
  with the last keys) and otherwise the dense boolean (batch, 1, seqlen_q, seqlen_k) mask that transformers'
  ``sdpa_mask`` builds (padding, static caches, packed sequences, chunked or custom patterns).

A third, smaller hook: transformers treats every implementation name containing "flash" as a flash-attention
kernel to load from the hub when a model is built; for "flashfuse" it is handed flashfuse's
``flash_attn_func`` / ``flash_attn_varlen_func`` instead (see ``_flash_kernels_for``). The same name makes
transformers take its flash-attention side paths elsewhere (generation with static caches compiles without
fullgraph; models listing ``_compatible_flash_implementations`` switch to one of those).

The forward then runs one of flashfuse's kernels, GQA natively (key/value heads are never repeated):

- mask ``None``: ``flash_attn_func`` with ``causal`` (bottom-right aligned, right for KV caches) and
  ``window_size`` from the layer's ``sliding_window`` W: transformers' sliding layers attend to keys
  in (i - W, i], which is flash-attn's window_size=(W - 1, 0);
- a mask: ``scaled_dot_product_attention`` with ``attn_mask`` (the mask already holds causality and the
  window); with Gemma-2's ``softcap`` too, the same kernel through flashfuse's internal entry point
  (``scaled_dot_product_attention`` has no softcap argument, as torch's has none).

Semantics kept from transformers: ``is_causal`` kwarg, else ``module.is_causal`` (False for encoders);
``dropout`` (the modules pass their attention dropout only in training); ``scaling`` (None: 1/sqrt(headdim));
a value head dim smaller than the query's is zero-padded and the output cropped (as the flash-attention
integration does for MLA). Differences: a query row that may attend to no key (a left-padding row) gives 0,
where eager gives an average of all values; such rows are padding, which losses ignore.
"""

from __future__ import annotations

import math

import torch

from ..ops.attention.interface import (_check_options, _check_qkv, _mask_to_bias, _run, flash_attn_func,
                                       scaled_dot_product_attention)

NAME = "flashfuse"


# ----------------------------------------------------------------------------------------------------
# Mask function (AttentionMaskInterface)
# ----------------------------------------------------------------------------------------------------

def _is_traced(t) -> bool:
    """True while torch.compile / torch.export trace t: its values cannot be read without a graph break."""
    return isinstance(t, torch.Tensor) and (torch.compiler.is_compiling() or torch.jit.is_tracing())


def _can_skip_mask(batch_size, q_length, kv_length, q_offset, kv_offset, attention_mask, local_size,
                   config, allow_is_causal_skip, allow_is_bidirectional_skip) -> bool:
    """Whether no mask is needed: the forward's own pattern (causal or not, the layer's window) is exact."""
    if not (allow_is_causal_skip or allow_is_bidirectional_skip):
        return False                            # or/and mask functions, packed sequences, block overlays
    if local_size is not None:
        if allow_is_bidirectional_skip:
            return False                        # bidirectional windows: |i - j| <= W, built into the mask
        if kv_length >= local_size and local_size != getattr(config, "sliding_window", None):
            return False                        # chunked attention (Llama 4): not a window the forward knows
    if allow_is_causal_skip:
        # The forward aligns queries with the last keys (bottom-right): query i is at absolute position
        # q_offset + i, key j at kv_offset + j, so they agree when both ranges end together. A static cache
        # (kv_length = the cache size) does not, and needs the mask.
        if _is_traced(q_offset):
            return False
        if int(q_offset) + q_length != kv_offset + kv_length:
            return False
    if attention_mask is None:
        return True
    if _is_traced(attention_mask):
        return False                            # reading the mask would break the graph
    padding = attention_mask[:, kv_offset:kv_offset + kv_length]
    return padding.shape[-1] == kv_length and bool(padding.all())


def flashfuse_mask(batch_size: int, q_length: int, kv_length: int, q_offset=0, kv_offset: int = 0,
                   mask_function=None, attention_mask: torch.Tensor | None = None, local_size: int | None = None,
                   allow_is_causal_skip: bool = True, allow_is_bidirectional_skip: bool = False, config=None,
                   **kwargs):
    """transformers mask function for "flashfuse": None when the forward's own causal / window pattern is
    exact (no dense mask is built), else transformers' sdpa boolean mask (batch, 1, q_length, kv_length),
    True = may attend. Arguments as transformers' ``sdpa_mask``."""
    from transformers.masking_utils import causal_mask_function, sdpa_mask

    if _can_skip_mask(batch_size, q_length, kv_length, q_offset, kv_offset, attention_mask, local_size, config,
                      allow_is_causal_skip, allow_is_bidirectional_skip):
        return None
    kwargs.pop("dtype", None)                   # eager's mask dtype; sdpa's mask is boolean
    return sdpa_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                     kv_offset=kv_offset,
                     mask_function=causal_mask_function if mask_function is None else mask_function,
                     attention_mask=attention_mask, local_size=local_size, allow_is_causal_skip=False,
                     allow_is_bidirectional_skip=False, **kwargs)


# ----------------------------------------------------------------------------------------------------
# Attention function (AttentionInterface)
# ----------------------------------------------------------------------------------------------------

def _window(sliding_window, causal: bool) -> tuple[int, int]:
    """transformers' sliding_window W -> flash-attn window_size. Causal: keys in (i - W, i] = (W - 1, 0).
    Not causal (a mask-free encoder layer): (W - 1, W - 1), the symmetric window of transformers'
    flash-attention integration."""
    if sliding_window is None or sliding_window <= 0:
        return (-1, -1)
    return (int(sliding_window) - 1, 0 if causal else int(sliding_window) - 1)


def _padding_to_4d(padding: torch.Tensor, seqlen_q: int, seqlen_k: int, causal: bool, sliding_window):
    """(batch, >= seqlen_k) padding mask (nonzero = real token) -> bool (batch, 1, seqlen_q, seqlen_k):
    the last seqlen_k entries are the keys; queries align with the last keys (bottom-right)."""
    keep = padding[:, -seqlen_k:].bool()[:, None, None, :]
    i = torch.arange(seqlen_q, device=padding.device)[:, None] + (seqlen_k - seqlen_q)    # query positions
    j = torch.arange(seqlen_k, device=padding.device)[None, :]
    allowed = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=padding.device)
    left, right = _window(sliding_window, causal)
    if causal:
        allowed &= j <= i
    if left >= 0:
        allowed &= j >= i - left
    if right >= 0:
        allowed &= j <= i + right
    return keep & allowed


def flashfuse_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                                value: torch.Tensor, attention_mask: torch.Tensor | None,
                                scaling: float | None = None, dropout: float = 0.0,
                                sliding_window: int | None = None, softcap: float | None = None,
                                **kwargs) -> tuple[torch.Tensor, None]:
    """Attention for transformers' modules on flashfuse's kernels (registered as "flashfuse").

    query: (batch, nheads_q, seqlen_q, headdim); key, value: (batch, nheads_k, seqlen_k, headdim_v) with
    nheads_q a multiple of nheads_k and headdim_v <= headdim. attention_mask: None (the pattern is causal
    when ``is_causal`` / ``module.is_causal`` says so, plus the sliding window), or a 4-D mask broadcastable
    to (batch, nheads_q, seqlen_q, seqlen_k), boolean (True = attend) or additive float. scaling: the
    softmax scale (None: 1/sqrt(headdim)); dropout: probability on the attention weights; sliding_window:
    keys in (i - W, i]; softcap: scores become softcap * tanh(scores / softcap) (Gemma 2).

    Returns ``(attn_output, None)``, attn_output (batch, seqlen_q, nheads_q, headdim_v), contiguous.

    Example (what the modules do)::

        out, _ = flashfuse_attention_forward(self, q, k, v, mask, scaling=self.scaling, dropout=0.0,
                                             sliding_window=self.sliding_window)
    """
    if kwargs.get("output_attentions", False):
        raise NotImplementedError("attn_implementation='flashfuse' does not return attention weights "
                                  "(output_attentions=True); use attn_implementation='eager' for them")
    for name in ("position_bias", "s_aux"):
        if kwargs.get(name) is not None:
            raise NotImplementedError(f"attn_implementation='flashfuse' does not support {name} (this model "
                                      "needs it); use 'eager' or 'sdpa'")
    cache = kwargs.get("cache")
    if cache is not None and type(cache).__name__ == "PagedAttentionCache":
        raise NotImplementedError("attn_implementation='flashfuse' does not support paged caches "
                                  "(continuous batching); use 'sdpa' or 'paged|eager'")
    is_causal = kwargs.get("is_causal")
    if is_causal is None:
        is_causal = getattr(module, "is_causal", True)
    if sliding_window is None:          # some models (Qwen2-MoE) set it on the module and leave it to the mask
        sliding_window = getattr(module, "sliding_window", None)
    seqlen_q = query.shape[2]
    head_dim, v_head_dim = query.shape[-1], value.shape[-1]
    if v_head_dim > head_dim:
        raise NotImplementedError(f"value head dim {v_head_dim} > query head dim {head_dim}: flashfuse "
                                  "attention needs value's head dim <= query's")
    if v_head_dim != head_dim:                  # MLA-style: pad value, crop the output (no effect on the math)
        value = torch.nn.functional.pad(value, [0, head_dim - v_head_dim])
    scale = 1.0 / math.sqrt(head_dim) if scaling is None else float(scaling)
    softcap = 0.0 if softcap is None else float(softcap)
    dropout = float(dropout)

    if attention_mask is not None and attention_mask.dim() == 2:
        # A flash-attention style (batch, seqlen_k) padding mask (some models hand it over as is to every
        # implementation whose name contains "flash"): add causality and the window, as the pattern.
        attention_mask = _padding_to_4d(attention_mask, seqlen_q, key.shape[2], bool(is_causal),
                                        sliding_window)
    # (batch, nheads, seqlen, headdim) -> flash layout (batch, seqlen, nheads, headdim): views, no copies.
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    deterministic = torch.are_deterministic_algorithms_enabled()       # what SDPA's backward honours too
    if attention_mask is None:
        causal = bool(is_causal)                # bottom-right: right for seqlen_q == 1 and for KV caches too
        out = flash_attn_func(q, k, v, dropout_p=dropout, softmax_scale=scale, causal=causal,
                              window_size=_window(sliding_window, causal), softcap=softcap, deterministic=deterministic)
    elif softcap == 0.0:
        out = scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                           scale=scale, enable_gqa=True).transpose(1, 2)
    else:
        # scaled_dot_product_attention's kernel, reached below its public function to add the softcap.
        _check_qkv(q, k, v, varlen=False)
        _check_options(q, batch=q.shape[0], dropout_p=dropout, softmax_scale=scale, causal=False,
                       window_size=(-1, -1), softcap=softcap, alibi_slopes=None)
        bias = _mask_to_bias(attention_mask, q, k, False)
        out, _ = _run(q, k, v, softmax_scale=scale, window_left=-1, window_right=-1, bottom_right=False,
                      softcap=softcap, attn_bias=bias, dropout_p=dropout, deterministic=deterministic)
    if v_head_dim != head_dim:
        out = out[..., :v_head_dim]
    return out.contiguous(), None


# ----------------------------------------------------------------------------------------------------
# Registration
# ----------------------------------------------------------------------------------------------------

def _flash_kernels_for(name: str):
    """transformers treats every implementation whose name contains "flash" as a flash-attention kernel and
    loads its functions when a model is built (``lazy_import_flash_attention``, which for an unknown name
    asks the hub's ``kernels`` and fails). This hands it flashfuse's flash-attn compatible functions for
    ``name`` instead (it only preloads them: the modules call ``flashfuse_attention_forward``)."""
    import transformers.modeling_flash_attention_utils as fa_utils

    lazy_imports = fa_utils._lazy_imports
    names = getattr(lazy_imports, "flashfuse_names", None)
    if names is None:                           # first registration: wrap transformers' loader once
        from ..ops.attention.interface import flash_attn_varlen_func

        original, names = lazy_imports, set()

        def _lazy_imports(implementation, *args, **kwargs):
            if implementation in names:
                return (flash_attn_func, flash_attn_varlen_func, None, getattr(fa_utils, "_pad_input", None),
                        getattr(fa_utils, "_unpad_input", None))
            return original(implementation, *args, **kwargs)

        _lazy_imports.flashfuse_names = names
        fa_utils._lazy_imports = _lazy_imports
    names.add(name)


def register_transformers_attention(name: str = NAME) -> str:
    """Register ``flashfuse_attention_forward`` and ``flashfuse_mask`` under ``name`` in transformers'
    global AttentionInterface / AttentionMaskInterface, so ``from_config`` / ``from_pretrained(...,
    attn_implementation=name)`` and ``model.set_attn_implementation(name)`` work. Idempotent. Returns the
    name."""
    from transformers.masking_utils import AttentionMaskInterface
    from transformers.modeling_utils import AttentionInterface

    AttentionInterface.register(name, flashfuse_attention_forward)
    AttentionMaskInterface.register(name, flashfuse_mask)
    if "flash" in name:
        _flash_kernels_for(name)
    return name
