"""The pre-norm decoder-layer forward that ``patch_transformers(norms=True)`` installs on the layers of the
families whose HF forward is exactly

    residual = x
    h, _ = self_attn(hidden_states=input_layernorm(x), **every other argument)
    h = residual + dropout_attn(h)                  # dropout_attn: Phi-3's resid_attn_dropout, else none
    y = post_attention_layernorm(h)
    return h + dropout_mlp(mlp(y))

(transformers 5.x: Llama, Mistral, Qwen2, Qwen3, Gemma, Phi-3). The one change: the first residual add and
post_attention_layernorm become one kernel, ``post_attention_layernorm(attn, residual)`` -> (norm(attn +
residual), attn + residual) with the sum rounded to the model's dtype before it is normalized, as HF does.
Forward: one pass over the rows instead of an add (read 2, write 1) and a norm (read 1, write 1). Backward:
the norm's backward adds the gradient arriving at the sum through the residual path, which autograd would
otherwise sum in a separate (tokens, hidden) pass. The second add feeds the next layer's input_layernorm
outside this layer, so it stays.
"""

from __future__ import annotations

import functools
import inspect


def make_fused_residual_forward(original, attn_dropout: str | None, mlp_dropout: str | None):
    """The forward above for a decoder class whose HF forward is ``original``, to bind to each layer as a
    method. Arguments are bound against ``original``'s signature (read once here) and handed to self_attn by
    keyword, all of them, as HF's forward does."""
    signature = inspect.signature(original)
    names = list(signature.parameters)[2:]                      # after self, hidden_states
    var_kw = [n for n in names if signature.parameters[n].kind is inspect.Parameter.VAR_KEYWORD]
    positional = [n for n in names if signature.parameters[n].kind in (
        inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    defaults = {n: signature.parameters[n].default for n in positional
                if signature.parameters[n].default is not inspect.Parameter.empty}

    def fused(self, hidden_states, *args, **kwargs):
        if len(args) > len(positional):
            raise TypeError(f"{type(self).__name__}.forward takes {len(positional) + 1} positional arguments "
                            f"after self but {len(args) + 1} were given")
        arguments = dict(defaults)
        arguments.update(zip(positional, args))
        if not var_kw:
            unknown = kwargs.keys() - set(positional)
            if unknown:
                raise TypeError(f"{type(self).__name__}.forward got unexpected arguments {sorted(unknown)}")
        arguments.update(kwargs)
        residual = hidden_states
        attn, _ = self.self_attn(hidden_states=self.input_layernorm(hidden_states), **arguments)
        if attn_dropout is not None:
            attn = getattr(self, attn_dropout)(attn)
        normed, hidden_states = self.post_attention_layernorm(attn, residual)
        out = self.mlp(normed)
        if mlp_dropout is not None:
            out = getattr(self, mlp_dropout)(out)
        return hidden_states + out

    def forward(self, hidden_states, *args, **kwargs):
        if getattr(self, "gradient_checkpointing", False) and self.training and _checkpoints_in_forward():
            return self._gradient_checkpointing_func(functools.partial(fused, self, **_no_cache(self, kwargs)),
                                                     hidden_states, *args)
        return fused(self, hidden_states, *args, **kwargs)

    forward.__doc__ = original.__doc__
    forward.__signature__ = signature
    forward.__name__ = original.__name__
    return forward


# Gradient checkpointing. transformers 5.x checkpoints a layer inside its class's ``forward`` (a wrapper that
# GradientCheckpointingLayer.__init_subclass__ installs), so the instance forward bound above, which shadows the
# class's, must checkpoint itself or HF's gradient_checkpointing_enable() would silently keep every activation.
# Earlier versions checkpointed in GradientCheckpointingLayer.__call__, around any forward: then this one must
# not (it would checkpoint twice).
@functools.lru_cache(maxsize=None)
def _checkpoints_in_forward() -> bool:
    from transformers.modeling_layers import GradientCheckpointingLayer
    return "__call__" not in vars(GradientCheckpointingLayer)


def _no_cache(layer, kwargs: dict) -> dict:
    """What HF's checkpointing wrapper does to the arguments: a recomputed layer must not write its KV cache
    twice, so use_cache is turned off and the cache dropped (unless the layer only reads it)."""
    kwargs = dict(kwargs)
    if kwargs.get("use_cache"):
        kwargs["use_cache"] = False
    if not getattr(layer, "_can_checkpoint_with_cache", False):
        for name in ("past_key_values", "layer_past"):
            if kwargs.get(name) is not None:
                kwargs[name] = None
    return kwargs
