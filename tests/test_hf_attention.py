"""attn_implementation="flashfuse" for transformers, CPU tier: tiny models built from config classes with
random weights (nothing downloaded) give the same logits and the same parameter gradients as
attn_implementation="eager", unpadded and with a left-padded batch; the mask function builds no dense mask
when the pattern is causal / sliding and unpadded; the kernel choice, windows, softcap, encoders, dropout,
2-D padding masks, KV-cache decoding and registration. Kernels run in Triton's interpreter (fp32)."""

import copy

import pytest
import torch
from transformers import (AutoModelForCausalLM, Gemma2Config, GPT2Config, LlamaConfig, MistralConfig,
                          Qwen2Config, Qwen2MoeConfig)
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

from flashfuse.integrations import hf_attention
from flashfuse.integrations.hf_attention import (flashfuse_attention_forward, flashfuse_mask,
                                                 register_transformers_attention)

VOCAB, SEQ = 61, 13
LOGITS_REL = 1e-5           # fp32 end to end: both sides round differently, ~1e-7 seen
GRAD_REL = 1e-4             # gradients through 2 layers and a softmax: ~1e-6 seen

SMALL = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64)
CONFIGS = {
    "llama": lambda: LlamaConfig(**SMALL),
    "mistral-sliding": lambda: MistralConfig(**SMALL, sliding_window=5),
    "qwen2": lambda: Qwen2Config(**SMALL),
    "gemma2-softcap-sliding": lambda: Gemma2Config(**SMALL, head_dim=8, sliding_window=4,
                                                   attn_logit_softcapping=2.0, final_logit_softcapping=5.0,
                                                   query_pre_attn_scalar=8),
    "gpt2": lambda: GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64),
    # sliding_window set on the first layer's module but not passed to the attention function (the mask carries it)
    "qwen2moe-sliding": lambda: Qwen2MoeConfig(**SMALL, moe_intermediate_size=16, shared_expert_intermediate_size=16,
                                               num_experts=4, num_experts_per_tok=2, use_sliding_window=True,
                                               sliding_window=4, max_window_layers=2),
}


@pytest.fixture(scope="module", autouse=True)
def _registered():
    register_transformers_attention()


def model_pair(name, device):
    """(eager, flashfuse) models with the same random weights, in eval mode (no dropout)."""
    cfg = CONFIGS[name]()
    torch.manual_seed(0)
    eager = AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation="eager").eval().to(device)
    fused = AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation="flashfuse").eval().to(device)
    fused.load_state_dict(eager.state_dict())
    assert fused.config._attn_implementation == "flashfuse"
    assert eager.config._attn_implementation == "eager"
    return eager, fused


def rel_error(x, ref):
    return ((x.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30)).item()


def run(model, ids, mask, weights):
    """logits at the real (unpadded) tokens and d(loss)/d(every parameter), loss = sum(logits * weights)
    over real tokens (padding rows are garbage by definition: eager averages every value there, flashfuse
    gives 0, and no loss reads them)."""
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=ids, attention_mask=mask).logits
    keep = mask.bool() if mask is not None else torch.ones(ids.shape, dtype=torch.bool, device=ids.device)
    (logits[keep] * weights[keep]).sum().backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return logits.detach()[keep], grads


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "left-padded"])
def test_same_logits_and_grads_as_eager(name, padded, device):
    eager, fused = model_pair(name, device)
    ids = torch.randint(0, VOCAB, (2, SEQ), device=device)
    mask = None
    if padded:
        mask = torch.ones(2, SEQ, dtype=torch.long, device=device)
        mask[0, :4] = 0                                        # row 0: 4 pad tokens on the left
    weights = torch.randn(2, SEQ, VOCAB, device=device)
    ref_logits, ref_grads = run(eager, ids, mask, weights)
    logits, grads = run(fused, ids, mask, weights)
    assert torch.isfinite(logits).all()
    err = rel_error(logits, ref_logits)
    assert err <= LOGITS_REL, f"{name}: logits relative error {err:.2e} > {LOGITS_REL:.0e}"
    assert grads.keys() == ref_grads.keys()
    for pname, ref in ref_grads.items():
        assert torch.isfinite(grads[pname]).all(), pname
        if ref.norm() == 0:
            assert grads[pname].abs().max() <= 1e-7, pname
            continue
        err = rel_error(grads[pname], ref)
        assert err <= GRAD_REL, f"{name}: d{pname} relative error {err:.2e} > {GRAD_REL:.0e}"


# ----------------------------------------------------------------------------------------------------
# Which kernel runs, and what mask transformers builds
# ----------------------------------------------------------------------------------------------------

def spy_kernels(monkeypatch):
    """Record the flash_attn_func / scaled_dot_product_attention / internal calls the forward makes."""
    calls = []
    for fn_name in ("flash_attn_func", "scaled_dot_product_attention", "_run"):
        real = getattr(hf_attention, fn_name)

        def spy(*args, _real=real, _name=fn_name, **kwargs):
            calls.append((_name, kwargs))
            return _real(*args, **kwargs)

        monkeypatch.setattr(hf_attention, fn_name, spy)
    return calls


@pytest.mark.parametrize("name, window_sizes", [
    ("llama", [(-1, -1)] * 2),
    ("mistral-sliding", [(4, 0)] * 2),                         # sliding_window 5: keys (i - 5, i] = (4, 0)
    ("gemma2-softcap-sliding", [(3, 0), (-1, -1)]),            # layer 0 sliding (window 4), layer 1 full
])
def test_unpadded_runs_flash_with_window(name, window_sizes, monkeypatch, device):
    """No padding: no dense mask, flash_attn_func with causal=True and transformers' window mapped exactly."""
    _, fused = model_pair(name, device)
    calls = spy_kernels(monkeypatch)
    with torch.no_grad():
        fused(input_ids=torch.randint(0, VOCAB, (2, SEQ), device=device))
    assert [c[0] for c in calls] == ["flash_attn_func"] * len(window_sizes)
    assert [c[1]["window_size"] for c in calls] == window_sizes
    assert all(c[1]["causal"] for c in calls)
    if name.startswith("gemma2"):
        assert all(c[1]["softcap"] == 2.0 for c in calls)


@pytest.mark.parametrize("name, kernel", [("llama", "scaled_dot_product_attention"),
                                          ("gemma2-softcap-sliding", "_run")])
def test_padded_runs_masked_kernel(name, kernel, monkeypatch, device):
    """With padding, the dense boolean mask goes to the SDPA kernel (softcap: the same kernel, internal)."""
    _, fused = model_pair(name, device)
    calls = spy_kernels(monkeypatch)
    mask = torch.ones(2, SEQ, dtype=torch.long, device=device)
    mask[1, :2] = 0
    with torch.no_grad():
        fused(input_ids=torch.randint(0, VOCAB, (2, SEQ), device=device), attention_mask=mask)
    assert [c[0] for c in calls] == [kernel] * 2


def test_mask_function_skips_dense_masks():
    """transformers' mask builders with the "flashfuse" mask function: None (nothing built) for unpadded
    causal and sliding layers, even where the window matters; the full boolean pattern otherwise."""
    cfg = MistralConfig(**SMALL, sliding_window=5)
    cfg._attn_implementation = "flashfuse"
    embeds = torch.zeros(2, SEQ, 32)
    ones = torch.ones(2, SEQ, dtype=torch.long)
    for make in (create_causal_mask, create_sliding_window_causal_mask):
        assert make(config=cfg, inputs_embeds=embeds, attention_mask=None, past_key_values=None) is None
        assert make(config=cfg, inputs_embeds=embeds, attention_mask=ones, past_key_values=None) is None
    padded = ones.clone()
    padded[0, :3] = 0
    full = create_causal_mask(config=cfg, inputs_embeds=embeds, attention_mask=padded, past_key_values=None)
    sliding = create_sliding_window_causal_mask(config=cfg, inputs_embeds=embeds, attention_mask=padded,
                                                past_key_values=None)
    i, j = torch.arange(SEQ)[:, None], torch.arange(SEQ)[None, :]
    keep = padded.bool()[:, None, None, :]
    assert full.dtype == torch.bool and torch.equal(full, keep & (j <= i))
    assert torch.equal(sliding, keep & (j <= i) & (j > i - 5))


def test_mask_function_compiles_with_a_composed_mask_function():
    """torch.compile(fullgraph=True) over flashfuse_mask with a mask function built inside the graph (HF's
    packed-sequence / padding compositions): no truthiness test on the function, the dense mask as eager's."""
    from transformers.masking_utils import and_masks, causal_mask_function
    config = LlamaConfig()

    def build(x):
        def first_five_keys(batch_idx, head_idx, q_idx, kv_idx):
            return kv_idx < 5
        mask = flashfuse_mask(batch_size=2, q_length=7, kv_length=7, mask_function=and_masks(
            causal_mask_function, first_five_keys), allow_is_causal_skip=False, config=config,
            device=x.device)
        return mask, x + 1

    eager, _ = build(torch.zeros(1))
    compiled, _ = torch.compile(build, backend="eager", fullgraph=True)(torch.zeros(1))
    i, j = torch.arange(7)[:, None], torch.arange(7)[None, :]
    assert torch.equal(eager, ((j <= i) & (j < 5)).expand(2, 1, 7, 7))
    assert torch.equal(compiled, eager)


def test_mask_function_static_cache_and_chunks():
    """Queries not aligned with the last keys (a static cache's kv_length) and chunked patterns need the
    dense mask; unknown windows too."""
    from transformers.masking_utils import causal_mask_function

    m = flashfuse_mask(batch_size=1, q_length=3, kv_length=8, q_offset=0, kv_offset=0,
                       mask_function=causal_mask_function, attention_mask=None)
    assert m is not None and m.shape == (1, 1, 3, 8) and not m[0, 0, 0, 1]
    cfg = MistralConfig(**SMALL, sliding_window=5)
    m = flashfuse_mask(batch_size=1, q_length=8, kv_length=8, mask_function=causal_mask_function,
                       local_size=4, config=cfg)                    # a chunk size, not the sliding window
    assert m is not None
    assert flashfuse_mask(batch_size=1, q_length=1, kv_length=9, q_offset=8, kv_offset=0,
                          mask_function=causal_mask_function) is None   # decoding with a dynamic cache


# ----------------------------------------------------------------------------------------------------
# The attention function on its own
# ----------------------------------------------------------------------------------------------------

class _Module(torch.nn.Module):
    def __init__(self, is_causal):
        super().__init__()
        self.is_causal = is_causal


def sdpa_reference(q, k, v, mask=None, causal=False, scale=None):
    """torch SDPA in float64 with repeated kv heads, returned in the (B, S, H, D) layout."""
    rep = q.shape[1] // k.shape[1]
    k, v = (t.repeat_interleave(rep, dim=1) for t in (k, v))
    out = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=mask,
                                                           is_causal=causal, scale=scale)
    return out.transpose(1, 2)


def qkv(device, batch=2, hq=4, hk=2, sq=9, sk=9, d=16, dv=None):
    return (torch.randn(batch, hq, sq, d, device=device), torch.randn(batch, hk, sk, d, device=device),
            torch.randn(batch, hk, sk, dv or d, device=device))


@pytest.mark.parametrize("is_causal", [True, False], ids=["decoder", "encoder"])
def test_module_is_causal_and_kwarg(is_causal, device):
    """module.is_causal decides (encoders: False); an explicit is_causal kwarg wins over it."""
    q, k, v = qkv(device)
    out, weights = flashfuse_attention_forward(_Module(is_causal), q, k, v, None, scaling=0.3)
    assert weights is None and out.shape == (2, 9, 4, 16) and out.is_contiguous()
    assert rel_error(out, sdpa_reference(q, k, v, causal=is_causal, scale=0.3)) <= 1e-6
    out, _ = flashfuse_attention_forward(_Module(is_causal), q, k, v, None, scaling=0.3, is_causal=not is_causal)
    assert rel_error(out, sdpa_reference(q, k, v, causal=not is_causal, scale=0.3)) <= 1e-6


def test_two_dim_padding_mask_and_small_value_head_dim(device):
    """A (batch, seqlen_k) padding mask (what models hand to "flash" implementations) becomes padding &
    causal & window; a value head dim below the query's is padded and cropped."""
    q, k, v = qkv(device, sq=7, sk=7, dv=8)
    pad = torch.ones(2, 7, dtype=torch.long, device=device)
    pad[1, :2] = 0
    out, _ = flashfuse_attention_forward(_Module(True), q, k, v, pad, sliding_window=3)
    i, j = torch.arange(7, device=device)[:, None], torch.arange(7, device=device)[None, :]
    mask = pad.bool()[:, None, None, :] & (j <= i) & (j > i - 3)
    ref = sdpa_reference(q, k, torch.nn.functional.pad(v, [0, 8]), mask=mask)[..., :8]
    assert out.shape == (2, 7, 4, 8)
    real = pad.bool()                                                  # rows 0, 1 of batch 1 see no key
    assert rel_error(out[real], ref[real]) <= 1e-6
    assert torch.all(out[~real] == 0)


def test_decoding_with_cache_matches_eager(device):
    """Prefill then two single-token steps with a DynamicCache (queries aligned with the last keys, the
    sliding window applied to the cache) give eager's logits."""
    eager, fused = model_pair("mistral-sliding", device)
    ids = torch.randint(0, VOCAB, (2, 9), device=device)
    with torch.no_grad():
        for model in (eager, fused):
            out = model(input_ids=ids, use_cache=True)
            cache, steps = out.past_key_values, [out.logits[:, -1]]
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            for _ in range(2):
                out = model(input_ids=nxt, past_key_values=cache, use_cache=True)
                cache, nxt = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
                steps.append(out.logits[:, -1])
            model.steps = torch.stack(steps)
    assert rel_error(fused.steps, eager.steps) <= LOGITS_REL


def test_dropout_in_training(device):
    """dropout reaches the kernel in training (and is off in eval): same seed, same output; another seed
    or no dropout, another output."""
    q, k, v = qkv(device)
    module = _Module(True)
    outs = []
    for seed, p in ((0, 0.3), (0, 0.3), (1, 0.3), (0, 0.0)):
        torch.manual_seed(seed)
        outs.append(flashfuse_attention_forward(module, q, k, v, None, dropout=p)[0])
    assert torch.equal(outs[0], outs[1])
    assert not torch.allclose(outs[0], outs[2]) and not torch.allclose(outs[0], outs[3])
    assert rel_error(outs[3], sdpa_reference(q, k, v, causal=True)) <= 1e-6


def test_unsupported_requests_raise(device):
    q, k, v = qkv(device)
    with pytest.raises(NotImplementedError, match="output_attentions=True"):
        flashfuse_attention_forward(_Module(True), q, k, v, None, output_attentions=True)
    with pytest.raises(NotImplementedError, match="does not support s_aux"):
        flashfuse_attention_forward(_Module(True), q, k, v, None, s_aux=torch.zeros(4))
    with pytest.raises(NotImplementedError, match="value head dim 32 > query head dim 16"):
        flashfuse_attention_forward(_Module(True), q, k, torch.randn(2, 2, 9, 32, device=device), None)


def test_registration_is_idempotent():
    from transformers import modeling_flash_attention_utils as fa_utils
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    loader = fa_utils._lazy_imports
    assert register_transformers_attention() == "flashfuse"
    assert register_transformers_attention() == "flashfuse"
    assert fa_utils._lazy_imports is loader                         # wrapped once, not once per call
    assert ALL_ATTENTION_FUNCTIONS["flashfuse"] is flashfuse_attention_forward
    assert ALL_MASK_ATTENTION_FUNCTIONS["flashfuse"] is flashfuse_mask
    # transformers sees a "flash" implementation and preloads its kernels: flashfuse's own.
    fns, _ = fa_utils.lazy_import_flash_attention("flashfuse")
    import flashfuse
    assert fns[0] is flashfuse.flash_attn_func and fns[1] is flashfuse.flash_attn_varlen_func
    assert loader.flashfuse_names == {"flashfuse"}          # other names: transformers' own loader
