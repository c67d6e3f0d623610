"""``decode``: attention of one new token over a long KV cache, and greedy generation end to end.

Kernel rows (``attn``): seqlen_q = 1, Llama-3-8B's heads (32 query / 8 KV heads, head dim 128), batch 1..256
and cache 1k..128k tokens (pairs up to 4M cached tokens, 16 GiB of bf16 K/V). Work = the bytes of the K and
V caches read once (q and the output are ~1/S of that); % of the copy ceiling is the goal's measure.
Providers: flashfuse ``flash_attn_with_kvcache`` on a contiguous cache and on a paged one (16-token pages, a
shuffled block table: vLLM's default page size), SDPA under each backend, math included (``enable_gqa=True``; a backend
that refuses it gets K/V expanded to 32 heads, so it reads 4x the bytes, as serving code must then do) and
compiled FlexAttention (``enable_gqa=True``). Every provider gets its preferred layout, made outside the timing.
Decode steps are timed as CUDA-graph replays: serving captures them (the ``generate`` rows do), and a 1-token
step is a few microseconds of GPU work behind ~100 us of host work otherwise.

Generation rows (``generate``): a Llama-3.2-1B-shaped model (random init, bf16), a batch of prompts, greedy
decoding of ``new`` tokens. ``flashfuse``: ``flashfuse.generation.Generator`` (paged cache, prefill through
flash_attn_with_kvcache, one CUDA graph per decode step); ``hf-generate``: ``model.generate`` with
``cache_implementation="static"`` and sdpa attention. Timed as whole calls (do_bench events), tokens/s =
``params["tokens"] / ms``. The check compares token ids with HF's fp32 greedy tokens on a small model whose
initialization (std 0.5) gives decisive logits, so rounding never decides a token.
"""

from __future__ import annotations

import math

import torch

from ..harness import Call, Case, Provider, Suite, allow_recompiles, dtype_name
from ..plots import Plot
from .models import LLAMA_1B

HQ, HK, D = 32, 8, 128
GPU_BATCHES, GPU_CACHES = (1, 4, 16, 64, 256), (1024, 4096, 16384, 65536, 131072)
MAX_CACHED_TOKENS = 1 << 22
QUICK = ((1, 16384), (16, 16384), (64, 4096), (4, 131072))
CPU = ((2, 77), (1, 300))
PAGE = 16

# Generation: Llama-3.2-1B (models.py's config); the CPU run and the checks use a tiny one.
LLAMA_GEN_CHECK = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=32, vocab_size=512, rope_theta=500000.0, rms_norm_eps=1e-5,
                       tie_word_embeddings=True, max_position_embeddings=1024, initializer_range=0.5)
GEN_MODELS = {"llama-3.2-1b": LLAMA_1B, "llama-check": LLAMA_GEN_CHECK}
GPU_GEN = ((1, 128, 256), (16, 128, 256))          # (batch, prompt, new tokens)
CPU_GEN = ((2, 5, 4),)


def _cache_bytes(batch, cache, elem):
    return 2.0 * batch * cache * HK * D * elem


# ----------------------------------------------------------------------------------------------------
# Kernel providers: inputs q (B, 1, HQ, D), k_cache, v_cache (B, S, HK, D)
# ----------------------------------------------------------------------------------------------------

def _flashfuse(paged: bool):
    def factory(case: Case, q, k_cache, v_cache):
        from flashfuse import flash_attn_with_kvcache
        batch, cache = case.params["B"], case.params["S"]
        lens = torch.full((batch,), cache, dtype=torch.int32, device=q.device)
        if not paged:
            return Call(lambda: flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens))
        pages = -(-cache // PAGE)
        order = torch.randperm(batch * pages, generator=torch.Generator().manual_seed(0)).to(q.device)
        table = order.view(batch, pages).to(torch.int32)
        kp = torch.empty(batch * pages, PAGE, HK, D, dtype=k_cache.dtype, device=q.device)
        vp = torch.empty_like(kp)
        pad = pages * PAGE - cache
        for src, dst in ((k_cache, kp), (v_cache, vp)):
            padded = torch.nn.functional.pad(src.detach(), (0, 0, 0, 0, 0, pad))
            dst[table.flatten().long()] = padded.reshape(batch * pages, PAGE, HK, D)
        return Call(lambda: flash_attn_with_kvcache(q, kp, vp, cache_seqlens=lens, block_table=table))
    return factory


def _bhsd(t):
    return t.transpose(1, 2)


def _sdpa(backend: str):
    def factory(case: Case, q, k_cache, v_cache):
        from torch.nn.attention import SDPBackend, sdpa_kernel
        chosen = getattr(SDPBackend, backend)
        qh, kh, vh = (_bhsd(t).contiguous() for t in (q, k_cache, v_cache))

        def gqa():
            with sdpa_kernel(chosen):
                return torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, enable_gqa=True)
        try:
            with torch.no_grad():
                gqa()
            fn = gqa
        except RuntimeError:          # no GQA in this backend: expand K/V to the query heads
            ke, ve = (t.repeat_interleave(HQ // HK, dim=1) for t in (kh, vh))

            def fn():
                with sdpa_kernel(chosen):
                    return torch.nn.functional.scaled_dot_product_attention(qh, ke, ve)
        return Call(fn, to_canon=_bhsd, from_canon=_bhsd)
    return factory


_FLEX: dict = {}


def _every_key(b, h, q_idx, kv_idx):
    return kv_idx >= 0


def _flex(case: Case, q, k_cache, v_cache):
    """The block mask (every key visible) is built here, once: without one, flex_attention builds a default
    mask on every call, with a host-to-device copy that CUDA-graph capture refuses."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    allow_recompiles()      # one graph per (batch, cache) shape: more than dynamo's default of 8
    key = case.dtype
    if key not in _FLEX:
        _FLEX[key] = torch.compile(flex_attention, dynamic=False)
    compiled = _FLEX[key]
    qh, kh, vh = (_bhsd(t).contiguous() for t in (q, k_cache, v_cache))
    mask = create_block_mask(_every_key, None, None, 1, case.params["S"], device=q.device)
    return Call(lambda: compiled(qh, kh, vh, block_mask=mask, enable_gqa=True), to_canon=_bhsd,
                from_canon=_bhsd)


# ----------------------------------------------------------------------------------------------------
# Generation providers: input prompt ids (B, P)
# ----------------------------------------------------------------------------------------------------

def _gen_model(case: Case, device, dtype):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    config = LlamaConfig(**GEN_MODELS[case.params["model"]], attn_implementation="sdpa")
    with torch.device(device):
        model = LlamaForCausalLM(config).eval()
    for param in model.parameters():     # parameters only: HF keeps the rotary inv_freq in fp32
        param.data = param.data.to(dtype)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def _flashfuse_generate(case: Case, prompt):
    from flashfuse.generation import Generator
    p = case.params
    model = _gen_model(case, prompt.device, case.dtype)
    gen = Generator(model, p["B"], p["P"] + p["new"], page_size=PAGE)
    return Call(lambda: gen.generate(prompt, p["new"]).float())


def _hf_generate(case: Case, prompt):
    p = case.params
    model = _gen_model(case, prompt.device, case.dtype)
    mask = torch.ones_like(prompt)

    def fn():
        out = model.generate(prompt, attention_mask=mask, max_new_tokens=p["new"], do_sample=False,
                             cache_implementation="static")
        return out[:, prompt.shape[1]:].float()
    return Call(fn)


def _only(kind: str):
    """Kernel providers skip generation rows and the other way round."""
    what = {"attn": "decode-attention rows only", "generate": "generation rows only"}[kind]

    def skip(case: Case):
        return None if case.params["kind"] == kind else what
    return skip


class Decode(Suite):
    name = "decode"
    description = ("KV-cache decode (1 query token, 32q/8kv heads, hd128, batch 1..256, cache 1k..128k: flashfuse "
                   "contiguous and paged vs SDPA backends and FlexAttention, CUDA-graph timing) and greedy "
                   "generation of a Llama-3.2-1B-shaped model vs HF generate (static cache)")
    baseline = None
    metric = "gbps"
    plots = (Plot("gbps", "GB/s reading the KV cache", "gbps", groups=r"^B", xlabel="cache tokens"),)
    rep_ms = 200

    def providers(self, opts):
        kernel, gen = _only("attn"), _only("generate")
        return [
            Provider("flashfuse", _flashfuse(False), kind="flashfuse", skip=kernel,
                     description="flash_attn_with_kvcache, contiguous cache (num_splits=0: automatic)"),
            Provider("flashfuse-paged", _flashfuse(True), kind="flashfuse", skip=kernel,
                     description=f"flash_attn_with_kvcache, {PAGE}-token pages, shuffled block table"),
            Provider("sdpa-cudnn", _sdpa("CUDNN_ATTENTION"), needs_cuda=True, skip=kernel),
            Provider("sdpa-flash", _sdpa("FLASH_ATTENTION"), needs_cuda=True, skip=kernel),
            Provider("sdpa-efficient", _sdpa("EFFICIENT_ATTENTION"), needs_cuda=True, skip=kernel),
            Provider("sdpa-math", _sdpa("MATH"), needs_cuda=True, skip=kernel,
                     description="SDPA's math backend (materialized scores)"),
            Provider("flex", _flex, needs_cuda=True, skip=kernel,
                     description="torch.compile(flex_attention, dynamic=False), enable_gqa=True"),
            Provider("flashfuse-generate", _flashfuse_generate, kind="flashfuse", skip=gen,
                     description="flashfuse.generation.Generator: paged cache, CUDA-graph decode steps"),
            Provider("hf-generate", _hf_generate, skip=gen,
                     description="model.generate(cache_implementation='static'), sdpa attention, greedy"),
        ]

    def cases(self, opts):
        dtypes = opts.dtypes or (torch.bfloat16,)
        if not opts.gpu:
            pairs, gens = CPU, CPU_GEN
        elif opts.quick:
            pairs, gens = QUICK, GPU_GEN[:1]
        else:
            pairs = tuple((b, s) for b in GPU_BATCHES for s in GPU_CACHES if b * s <= MAX_CACHED_TOKENS)
            gens = GPU_GEN
        cases = []
        for dtype in dtypes:
            elem = torch.tensor([], dtype=dtype).element_size()
            for batch, cache in pairs:
                cases.append(Case(name=f"attn B{batch} cache {cache} {dtype_name(dtype)}",
                                  params=dict(kind="attn", B=batch, S=cache), dtype=dtype,
                                  bytes=_cache_bytes(batch, cache, elem), group=f"B{batch} {dtype_name(dtype)}",
                                  x=float(cache), ceiling="copy"))
            model = "llama-3.2-1b" if opts.gpu else "llama-check"
            for batch, prompt, new in gens:
                cases.append(Case(name=f"generate {model} B{batch} prompt {prompt} +{new} {dtype_name(dtype)}",
                                  params=dict(kind="generate", model=model, B=batch, P=prompt, new=new,
                                              tokens=batch * new), dtype=dtype))
        return cases

    def cuda_graph(self, case: Case) -> bool:
        return case.params["kind"] == "attn"

    def check_case(self, case):
        p = case.params
        if p["kind"] == "attn":
            return case.replace(B=min(p["B"], 2), S=min(p["S"], 1000))
        # token ids are compared exactly: a small fp32 model with decisive logits (module docstring)
        from dataclasses import replace
        return replace(case, dtype=torch.float32, params=dict(p, model="llama-check", B=2, P=16, new=8, tokens=16))

    def make_inputs(self, case, device):
        p = case.params
        if p["kind"] == "generate":
            vocab = GEN_MODELS[p["model"]]["vocab_size"]
            return (torch.randint(0, vocab, (p["B"], p["P"]), device=device),)
        q = torch.randn(p["B"], 1, HQ, D, device=device, dtype=case.dtype)
        k = torch.randn(p["B"], p["S"], HK, D, device=device, dtype=case.dtype)
        v = torch.randn(p["B"], p["S"], HK, D, device=device, dtype=case.dtype)
        return q, k, v

    def tolerance(self, case):
        return 1e-6 if case.params["kind"] == "generate" else super().tolerance(case)

    def reference(self, case, *inputs):
        p = case.params
        if p["kind"] == "generate":
            (prompt,) = inputs
            model = _gen_model(case, prompt.device, torch.float32)
            with torch.no_grad():
                out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=p["new"],
                                     do_sample=False)
            return out[:, prompt.shape[1]:].float()
        q, k, v = inputs
        k, v = (t.repeat_interleave(HQ // HK, dim=2) for t in (k, v))
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(D)
        return torch.einsum("bhqk,bkhd->bqhd", scores.softmax(dim=-1), v)

    def ref_dtype(self, case, device):
        return torch.float32 if case.params["kind"] == "generate" or device.startswith("cuda") else torch.float64
