"""``attention``: FlashAttention against every peer, the teaching progression, and one long-context row.

Three groups of cases (canonical layout: torch SDPA's (batch, nheads, seqlen, headdim)):

(a) flash-attn's benchmark shapes: model dim 2048 (headdim 64 x 32 heads, 128 x 16), batch x seqlen =
    16384 tokens, seqlen 512..16384, causal and not, fwd and bwd, bf16 by default; on the GPU also other heads
    (80, 96, 160, 192, 256; seqlen 1024..4096) beside cuDNN, FA2 and Flex. Providers: flashfuse
    (flash_attn_func, layout (B, S, H, D)), torch SDPA under the cuDNN / flash / efficient backends,
    FlexAttention compiled, and, where they fit in memory and seconds, the naive PyTorch version and
    SDPA's math backend. FLOPs: forward 4*B*H*S*S*D (x0.5 causal), backward 2.5 x forward.
    Packed batches (GPU): the same 16384 tokens as sequences of lengths drawn in [max / 8, max] (max = 2048,
    4096), hd 64 / 128, through flash_attn_varlen_func, beside FlexAttention with a document mask. Softcap
    (GPU): Gemma-2's causal attention with softcap 50 at hd 128 / 256 (seqlen 1024..4096), beside FlexAttention
    with the same score_mod (SDPA has no softcap); ALiBi likewise (MPT / BLOOM: causal, hd 128, the standard slopes
    2^(-8 (h + 1) / H)). Deterministic backward (GPU): hd 64 / 128, seqlen 1024..4096, ``deterministic=True``
    beside SDPA's flash (FA2) and efficient backends with their backward under torch.use_deterministic_algorithms,
    and cuDNN's (not deterministic in torch) for scale. Dropout (GPU): dropout_p 0.1, hd 64 / 128, seqlen
    1024..4096, causal and not, beside SDPA's cuDNN, flash and efficient backends with the same dropout_p.
(b) the progression (flashfuse.attention: naive -> basic -> vectorized -> blocked -> flash), forward,
    B=1, H=16, D=64, fp16, S = 256..8192; the slow kernels only where they finish in seconds.
(c) long context: causal S = 65536, B=1, 16 heads of 128, bf16: the naive version cannot allocate its
    S x S scores (OOM), flashfuse needs O(S) extra memory.

Correctness is checked on a reduced copy of each case (batch 1, at most 2 heads, seqlen up to 2048),
against flash-attn-layout ``attention_ref`` run in fp32 on the device (fp64 on the CPU); dropout rows' copies run
without dropout (each provider draws its own mask).
"""

from __future__ import annotations

import torch

from ..harness import (Call, Case, Provider, Skip, Suite, allow_recompiles, attention_bytes, attention_flops,
                       dtype_name)
from ..plots import Plot

# (a) flash-attn's benchmark convention (benchmarks/benchmark_flash_attention.py there).
FA_MODEL_DIM, FA_TOKENS = 2048, 16384
FA_HEADDIMS = (64, 128)
FA_SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)
FA_QUICK_SEQLENS = (1024, 4096)
# Other head dims (SD-1.5's 80 and 160, DiT's 72 computed as 80, Phi-3's 96, Gemma's 256, 192 between) on the same
# token count, heads = round(2048 / headdim); GPU only, beside the peers that take them.
FA_WIDE_HEADDIMS = (80, 96, 160, 192, 256)
FA_WIDE_SEQLENS = (1024, 2048, 4096)
FA_WIDE_QUICK_SEQLENS = (2048,)
# Packed (varlen) batches: FA_TOKENS tokens as sequences of at most max tokens (lengths drawn in [max / 8, max], the
# first one max), canonical layout (1, H, total, D); GPU only.
FA_VARLEN_MAX = (2048, 4096)
FA_VARLEN_QUICK_MAX = (2048,)
VARLEN_PROVIDERS = ("flashfuse", "flex")
# Softcap (Gemma-2: softcap * tanh(score / softcap) before the softmax, 50.0; causal), same tokens; GPU only.
FA_SOFTCAP, FA_SOFTCAP_HEADDIMS = 50.0, (128, 256)
FA_ALIBI_HEADDIMS = (128,)
SCORE_MOD_PROVIDERS = ("flashfuse", "flex")
DETERMINISTIC_PROVIDERS = ("flashfuse", "sdpa-flash-det", "sdpa-efficient-det", "sdpa-cudnn")
# Dropout (dropout_p 0.1), causal and not, same tokens; GPU only. Each provider draws its own mask (SDPA's cannot be
# rebuilt outside it), so the check runs the reduced copy with dropout_p = 0; flashfuse's mask is pinned by the tests
# (reference_dropout_mask, and every kernel against the float reference with that mask).
FA_DROPOUT_P, FA_DROPOUT_HEADDIMS = 0.1, (64, 128)
DROPOUT_PROVIDERS = ("flashfuse", "sdpa-cudnn", "sdpa-flash", "sdpa-efficient")
# (b) one (batch, head) grid small enough that the per-query kernels finish in seconds.
PROG_BATCH, PROG_HEADS, PROG_HEADDIM = 1, 16, 64
PROG_SEQLENS = (256, 512, 1024, 2048, 4096, 8192)
PROG_QUICK_SEQLENS = (512, 2048)
# basic_attention makes 2*S dependent trips per query row (S^2 scalar work per head, no tensor cores),
# so its time grows 4x per doubling of S; it stops at 2048, where it should still take well under a
# second per call (an estimate: check the row's wall_s in results.json on the GPU).
BASIC_MAX_SEQLEN = 2048
# (c) long context.
LONG_SEQLEN, LONG_HEADS, LONG_HEADDIM = 65536, 16, 128
# Correctness on a reduced copy: the fp32 reference materializes (heads x S x S) scores, 32 MiB here.
CHECK_MAX_SEQLEN, CHECK_HEADS = 2048, 2
# The materializing providers (naive, SDPA math) run only while their estimated peak stays under this
# share of the GPU memory (32 GiB of an 80 GiB H100): the S x S traffic of such a call is then a few
# tens of GB, tens of ms at HBM speed, so a row costs seconds, not minutes.
MATERIALIZE_MEMORY_SHARE = 0.4

# CPU (interpreter): tiny shapes with batch 1 and <= 2 heads, so the reduced copy is the case itself and
# each provider runs twice (check, timed call). basic_attention, interpreted, takes ~0.5 s per call at
# S=16 with one head and 4x that per doubling, so it runs at S=16 only.
CPU_FA = dict(heads_of_headdim={32: 2, 64: 2}, seqlens=(64, 128), quick_seqlens=(64,), quick_headdims=(64,))
CPU_PROG = dict(batch=1, heads=1, headdim=16, seqlens=(16, 32, 64), quick_seqlens=(16, 32), basic_max=16)

FA_PROVIDERS = ("flashfuse", "sdpa-cudnn", "sdpa-flash", "sdpa-efficient", "flex", "flex-static", "naive",
                "sdpa-math")
FA_WIDE_PROVIDERS = ("flashfuse", "sdpa-cudnn", "sdpa-flash", "flex")
PROG_PROVIDERS = ("naive", "basic", "vectorized", "blocked", "flash")
LONG_PROVIDERS = ("naive", "flashfuse", "sdpa-cudnn", "sdpa-flash")


def _swap(t: torch.Tensor) -> torch.Tensor:
    """(B, S, H, D) <-> (B, H, S, D), a view."""
    return t.transpose(1, 2)


# ----------------------------------------------------------------------------------------------------
# Providers (every import is lazy: the suite lists and runs with whatever exists)
# ----------------------------------------------------------------------------------------------------

def varlen_lengths(total: int, max_len: int, seed: int = 0) -> tuple[int, ...]:
    """Sequence lengths summing to total: max_len first, then lengths drawn in [max_len / 8, max_len], the last one
    what remains."""
    g = torch.Generator().manual_seed(seed)
    lens = [min(max_len, total)]
    while total - sum(lens) > max_len:
        lens.append(int(torch.randint(max(1, max_len // 8), max_len + 1, (1,), generator=g)))
    if total > sum(lens):
        lens.append(total - sum(lens))
    return tuple(lens)


def _cu_seqlens(lens, device) -> torch.Tensor:
    return torch.tensor([0, *lens], device=device).cumsum(0).to(torch.int32)


def _flashfuse_varlen(case: Case, q, k, v):
    from flashfuse import flash_attn_varlen_func

    p = case.params
    cu = _cu_seqlens(p["lens"], q.device)
    # (1, H, total, D) -> (total, H, D), contiguous, untimed
    qs, ks, vs = (_swap(t.detach())[0].contiguous().requires_grad_(t.requires_grad) for t in (q, k, v))
    return Call(lambda: flash_attn_varlen_func(qs, ks, vs, cu, cu, p["S"], p["S"], causal=p["causal"]),
                leaves=(qs, ks, vs), to_canon=lambda t: _swap(t.unsqueeze(0)), from_canon=lambda t: _swap(t)[0])


def alibi_slopes(nheads: int, device) -> torch.Tensor:
    """ALiBi's standard slopes 2^(-8 (h + 1) / nheads), fp32 (nheads,)."""
    return torch.exp2(-8.0 * torch.arange(1, nheads + 1, device=device, dtype=torch.float32) / nheads)


def _flashfuse(case: Case, q, k, v):
    from flashfuse import flash_attn_func

    if case.params.get("lens"):
        return _flashfuse_varlen(case, q, k, v)
    causal, softcap = case.params["causal"], case.params.get("softcap", 0.0)
    slopes = alibi_slopes(q.shape[1], q.device) if case.params.get("alibi") else None
    deterministic, dropout_p = case.params.get("deterministic", False), case.params.get("dropout_p", 0.0)
    # Its own layout, contiguous, as a flash-attn user would hold it; the copies are made here, untimed.
    qs, ks, vs = (_swap(t.detach()).contiguous().requires_grad_(t.requires_grad) for t in (q, k, v))
    return Call(lambda: flash_attn_func(qs, ks, vs, dropout_p=dropout_p, causal=causal, softcap=softcap,
                                        alibi_slopes=slopes, deterministic=deterministic),
                leaves=(qs, ks, vs), to_canon=_swap, from_canon=_swap)


class _DeterministicSpan(torch.autograd.Function):
    """The identity, whose backward sets torch.use_deterministic_algorithms: ``on`` (True on SDPA's output, whose
    backward runs first; the setting before it on its inputs, whose backward runs last), so that SDPA's own backward
    alone runs deterministic (FA2's deterministic dQ, the efficient backend's one key split)."""

    @staticmethod
    def forward(ctx, x, on):
        ctx.on = on
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        torch.use_deterministic_algorithms(ctx.on)
        return grad, None


def _sdpa(backend: str, deterministic: bool = False):
    def factory(case: Case, q, k, v):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        chosen, causal = getattr(SDPBackend, backend), case.params["causal"]
        dropout_p = case.params.get("dropout_p", 0.0)

        def fn():
            with sdpa_kernel(chosen):
                if not deterministic:
                    return torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p,
                                                                            is_causal=causal)
                before = torch.are_deterministic_algorithms_enabled()
                qd, kd, vd = (_DeterministicSpan.apply(t, before) for t in (q, k, v))
                out = torch.nn.functional.scaled_dot_product_attention(qd, kd, vd, is_causal=causal)
                return _DeterministicSpan.apply(out, True)
        return fn
    return factory


_FLEX: dict = {}


def _causal_mask_mod(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx


def _flex_score_mod(softcap: float, slopes):
    """FlexAttention's score_mod for flash-attn's softcap (on the scaled score) or ALiBi (equal lengths: no offset)."""
    if softcap:
        return lambda score, b, h, q_idx, kv_idx: softcap * torch.tanh(score / softcap)
    if slopes is not None:
        return lambda score, b, h, q_idx, kv_idx: score - slopes[h] * (q_idx - kv_idx).abs()
    return None


def _flex(static: bool):
    """torch.compile(flex_attention), one compiled callable per (head dim, causal, dtype).

    Dynamic (the default ``flex``): batch, heads and seqlen are marked dynamic, so the sequence lengths
    share a compilation (expect a recompilation or two per config: the check copy's batch of 1 and the
    block mask's first shape get specialized); ``flex-static`` compiles per shape, as attention-gym's
    benchmark does, for comparison. Compilation happens in untimed calls, never under do_bench.
    """
    def factory(case: Case, q, k, v):
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        allow_recompiles()
        p = case.params
        cap, alibi = p.get("softcap", 0.0), p.get("alibi", False)
        key = (p["D"], p["causal"], case.dtype, static, cap, alibi)
        if key not in _FLEX:
            _FLEX[key] = torch.compile(flex_attention, dynamic=False if static else None)
        compiled = _FLEX[key]
        score_mod = _flex_score_mod(cap, alibi_slopes(q.shape[1], q.device) if alibi else None)
        mask = None
        if p.get("lens"):    # a packed batch: the document mask (built once per case, outside the timed callable)
            doc = torch.repeat_interleave(torch.arange(len(p["lens"]), device=q.device),
                                          torch.tensor(p["lens"], device=q.device))
            causal = p["causal"]

            def document(b, h, q_idx, kv_idx):
                same = doc[q_idx] == doc[kv_idx]
                return same & (q_idx >= kv_idx) if causal else same
            mask = create_block_mask(document, None, None, q.shape[2], q.shape[2], device=q.device)
        elif p["causal"]:    # built once per shape, here, outside the timed callable
            mask = create_block_mask(_causal_mask_mod, None, None, p["S"], p["S"], device=q.device)
        if not static:
            for t in (q, k, v):
                for dim in (0, 1, 2):
                    torch._dynamo.maybe_mark_dynamic(t, dim)
        return lambda: compiled(q, k, v, score_mod=score_mod, block_mask=mask)
    return factory


def _naive(case: Case, q, k, v):
    from flashfuse.reference.attention import naive_attention

    causal = case.params["causal"]
    return lambda: naive_attention(q, k, v, is_causal=causal)


def _progression(fn_name: str):
    def factory(case: Case, q, k, v):
        import flashfuse.attention as progression

        fn, causal = getattr(progression, fn_name), case.params["causal"]
        if fn_name == "vectorized_attention":
            from flashfuse.ops.attention.progression import vectorized_max_seqlen

            limit = vectorized_max_seqlen(case.params["D"])
            if case.params["S"] > limit:
                raise Skip(f"vectorized_attention holds all keys on chip: seqlen <= {limit} at headdim "
                           f"{case.params['D']}")
        return lambda: fn(q, k, v, is_causal=causal)
    return factory


def _device_memory(opts) -> int | None:
    """Total memory of the GPU the run uses (None on the CPU, where the tiny cases always fit)."""
    return torch.cuda.get_device_properties(torch.device(opts.device)).total_memory if opts.gpu else None


def _materialize_skip(bytes_per_score_fwd: float, opts):
    """Skip a materializing provider where its S x S buffers would not fit (long-context rows excepted:
    there the OOM is the point)."""
    def skip(case: Case):
        p, total = case.params, _device_memory(opts)
        if p.get("long") or total is None:
            return None
        per_score = bytes_per_score_fwd * (1 if case.mode == "fwd" else 2)   # bwd keeps and makes as much again
        need = p["B"] * p["H"] * p["S"] * p["S"] * per_score
        budget = MATERIALIZE_MEMORY_SHARE * total
        if need > budget:
            return f"needs ~{need / 2**30:.0f} GiB for its S x S buffers (> {budget / 2**30:.0f} GiB budget)"
        return None
    return skip


def _basic_skip(opts):
    limit = BASIC_MAX_SEQLEN if opts.gpu else CPU_PROG["basic_max"]

    def skip(case: Case):
        if case.params["S"] > limit:
            return f"too slow above S={limit} (2*S serial trips per query)"
        return None
    return skip


# ----------------------------------------------------------------------------------------------------
# The suite
# ----------------------------------------------------------------------------------------------------

def _case(group_kind: str, B, H, S, D, causal, dtype, mode, providers, **extra) -> Case:
    dt = dtype_name(dtype)
    mask = "causal" if causal else "full"
    elem = torch.empty((), dtype=dtype).element_size()
    if group_kind == "fa":
        name = f"{mode} hd{D} {mask} S={S} {dt}"
        group = f"hd{D} {'causal' if causal else 'non-causal'} {mode} {dt}"
    elif group_kind == "progression":
        name, group = f"progression S={S} {dt}", f"progression B{B} H{H} D{D} {mask} {dt}"
    else:
        name, group = f"long-context {mode} hd{D} {mask} S={S} {dt}", f"long-context hd{D} {mode} {dt}"
    lens = extra.get("lens")
    if group_kind in ("softcap", "alibi", "deterministic", "dropout"):
        name = f"{mode} hd{D} {mask} {group_kind} S={S} {dt}"
        group = f"{group_kind} hd{D} {'causal' if causal else 'non-causal'} {mode} {dt}"
    if group_kind == "varlen":
        name = f"{mode} hd{D} {mask} varlen max={S} {dt}"
        group = f"varlen hd{D} {'causal' if causal else 'non-causal'} {mode} {dt}"
    return Case(name=name, params=dict(B=B, H=H, S=S, D=D, causal=causal, **extra), dtype=dtype, mode=mode,
                flops=(sum(attention_flops(1, H, n, n, D, causal, mode) for n in lens) if lens
                       else attention_flops(B, H, S, S, D, causal, mode)),
                bytes=(sum(attention_bytes(1, H, n, n, D, elem, mode) for n in lens) if lens
                       else attention_bytes(B, H, S, S, D, elem, mode)),
                group=group, x=S, ceiling="matmul", providers=providers)


class Attention(Suite):
    name = "attention"
    description = ("FlashAttention fwd/bwd vs SDPA (cuDNN, flash, efficient), FlexAttention and naive on "
                   "flash-attn's shapes; the naive -> basic -> vectorized -> blocked -> flash progression; "
                   "a causal S=65536 memory row")
    baseline = "naive"
    metric = "tflops"
    plots = (
        Plot("tflops", "TFLOP/s", "tflops", groups=r"^hd", xlabel="seqlen"),
        Plot("speedup", "speedup vs naive PyTorch (x)", "speedup", logy=True, groups=r"^hd", xlabel="seqlen"),
        Plot("peak_mem_MiB", "peak memory beyond inputs (MiB)", "memory", logy=True, xlabel="seqlen"),
        Plot("pct_roofline", "% of roofline (bf16 matmul peak)", "roofline", groups=r"^hd", xlabel="seqlen"),
        Plot("ms", "forward time (ms)", "progression_ms", logy=True, groups=r"^progression", xlabel="seqlen"),
        Plot("peak_mem_MiB", "peak memory beyond inputs (MiB)", "progression_memory", logy=True,
             groups=r"^progression", xlabel="seqlen"),
    )

    def providers(self, opts):
        return [
            Provider("flashfuse", _flashfuse, kind="flashfuse", description="flashfuse.flash_attn_func (B, S, H, D)"),
            Provider("sdpa-cudnn", _sdpa("CUDNN_ATTENTION"), needs_cuda=True, description="SDPA, cuDNN backend"),
            Provider("sdpa-flash", _sdpa("FLASH_ATTENTION"), needs_cuda=True, description="SDPA, flash backend (FA2)"),
            Provider("sdpa-efficient", _sdpa("EFFICIENT_ATTENTION"), needs_cuda=True,
                     description="SDPA, memory-efficient backend"),
            Provider("sdpa-flash-det", _sdpa("FLASH_ATTENTION", deterministic=True), needs_cuda=True,
                     description="SDPA, flash backend (FA2), backward under torch.use_deterministic_algorithms"),
            Provider("sdpa-efficient-det", _sdpa("EFFICIENT_ATTENTION", deterministic=True), needs_cuda=True,
                     description="SDPA, efficient backend, backward under torch.use_deterministic_algorithms"),
            Provider("flex", _flex(static=False), needs_cuda=True,
                     description="torch.compile(flex_attention), dynamic shapes: one compile per (hd, causal)"),
            Provider("flex-static", _flex(static=True), needs_cuda=True, default=False,
                     description="torch.compile(flex_attention, dynamic=False): one compile per shape"),
            # naive, per score at bf16: q k^T and its scaled copy (2 + 2), the fp32 upcast and softmax
            # (4 + 4): ~12 bytes; the backward about twice that.
            Provider("naive", _naive, kind="baseline", skip=_materialize_skip(12, opts),
                     description="flashfuse.reference.attention.naive_attention (materializes S x S)"),
            # SDPA math: budgeted as if it worked in fp32 throughout (recent torch upcasts half inputs).
            Provider("sdpa-math", _sdpa("MATH"), kind="baseline", skip=_materialize_skip(16, opts),
                     description="SDPA, math backend"),
            Provider("basic", _progression("basic_attention"), kind="flashfuse", skip=_basic_skip(opts),
                     description="flashfuse.attention.basic_attention"),
            Provider("vectorized", _progression("vectorized_attention"), kind="flashfuse",
                     description="flashfuse.attention.vectorized_attention"),
            Provider("blocked", _progression("blocked_attention"), kind="flashfuse",
                     description="flashfuse.attention.blocked_attention"),
            Provider("flash", _progression("flash_attention"), kind="flashfuse",
                     description="flashfuse.attention.flash_attention"),
        ]

    def cases(self, opts):
        return self._fa_cases(opts) + self._progression_cases(opts) + self._long_cases(opts)

    def _fa_cases(self, opts):
        cases = []
        if opts.gpu:
            seqlens = FA_QUICK_SEQLENS if opts.quick else FA_SEQLENS
            heads = {d: FA_MODEL_DIM // d for d in FA_HEADDIMS}
        else:
            seqlens = CPU_FA["quick_seqlens"] if opts.quick else CPU_FA["seqlens"]
            heads = {d: h for d, h in CPU_FA["heads_of_headdim"].items()
                     if not opts.quick or d in CPU_FA["quick_headdims"]}
        for dtype in opts.dtypes or (torch.bfloat16,):
            for D, H in heads.items():
                for causal in (False, True):
                    for mode in ("fwd", "bwd"):
                        for S in seqlens:
                            B = FA_TOKENS // S if opts.gpu else 1
                            cases.append(_case("fa", B, H, S, D, causal, dtype, mode, FA_PROVIDERS))
            if opts.gpu:
                for D in FA_WIDE_HEADDIMS:
                    for causal in (False, True):
                        for mode in ("fwd", "bwd"):
                            for S in FA_WIDE_QUICK_SEQLENS if opts.quick else FA_WIDE_SEQLENS:
                                cases.append(_case("fa", FA_TOKENS // S, round(FA_MODEL_DIM / D), S, D, causal,
                                                   dtype, mode, FA_WIDE_PROVIDERS))
                for D in FA_HEADDIMS:
                    for causal in (False, True):
                        for mode in ("fwd", "bwd"):
                            for S in FA_VARLEN_QUICK_MAX if opts.quick else FA_VARLEN_MAX:
                                cases.append(_case("varlen", 1, FA_MODEL_DIM // D, S, D, causal, dtype, mode,
                                                   VARLEN_PROVIDERS, lens=varlen_lengths(FA_TOKENS, S)))
                for D in FA_SOFTCAP_HEADDIMS:
                    for mode in ("fwd", "bwd"):
                        for S in FA_WIDE_QUICK_SEQLENS if opts.quick else FA_WIDE_SEQLENS:
                            cases.append(_case("softcap", FA_TOKENS // S, FA_MODEL_DIM // D, S, D, True, dtype, mode,
                                               SCORE_MOD_PROVIDERS, softcap=FA_SOFTCAP))
                for D in FA_ALIBI_HEADDIMS:
                    for mode in ("fwd", "bwd"):
                        for S in FA_WIDE_QUICK_SEQLENS if opts.quick else FA_WIDE_SEQLENS:
                            cases.append(_case("alibi", FA_TOKENS // S, FA_MODEL_DIM // D, S, D, True, dtype, mode,
                                               SCORE_MOD_PROVIDERS, alibi=True))
                for D in FA_HEADDIMS:
                    for causal in (False, True):
                        for S in FA_WIDE_QUICK_SEQLENS if opts.quick else FA_WIDE_SEQLENS:
                            cases.append(_case("deterministic", FA_TOKENS // S, FA_MODEL_DIM // D, S, D, causal,
                                               dtype, "bwd", DETERMINISTIC_PROVIDERS, deterministic=True))
                for D in FA_DROPOUT_HEADDIMS:
                    for causal in (False, True):
                        for mode in ("fwd", "bwd"):
                            for S in FA_WIDE_QUICK_SEQLENS if opts.quick else FA_WIDE_SEQLENS:
                                cases.append(_case("dropout", FA_TOKENS // S, FA_MODEL_DIM // D, S, D, causal, dtype,
                                                   mode, DROPOUT_PROVIDERS, dropout_p=FA_DROPOUT_P))
        return cases

    def _progression_cases(self, opts):
        if opts.gpu:
            B, H, D = PROG_BATCH, PROG_HEADS, PROG_HEADDIM
            seqlens = PROG_QUICK_SEQLENS if opts.quick else PROG_SEQLENS
        else:
            B, H, D = CPU_PROG["batch"], CPU_PROG["heads"], CPU_PROG["headdim"]
            seqlens = CPU_PROG["quick_seqlens"] if opts.quick else CPU_PROG["seqlens"]
        return [_case("progression", B, H, S, D, False, dtype, "fwd", PROG_PROVIDERS)
                for dtype in opts.dtypes or (torch.float16,) for S in seqlens]

    def _long_cases(self, opts):
        if not opts.gpu:      # a GPU memory story; nothing to show on the host
            return []
        return [_case("long", 1, LONG_HEADS, LONG_SEQLEN, LONG_HEADDIM, True, dtype, mode, LONG_PROVIDERS,
                      long=True)
                for dtype in opts.dtypes or (torch.bfloat16,) for mode in ("fwd", "bwd")]

    def make_inputs(self, case, device):
        p = case.params
        shape = (1, p["H"], sum(p["lens"]), p["D"]) if p.get("lens") else (p["B"], p["H"], p["S"], p["D"])
        return tuple(torch.randn(shape, device=device, dtype=case.dtype) for _ in range(3))

    def reference(self, case, q, k, v):
        from flashfuse.reference.attention import attention_ref

        p = case.params
        if p.get("lens"):       # one reference per packed sequence
            ends = _cu_seqlens(p["lens"], "cpu").tolist()
            return torch.cat([self.reference(case.replace(lens=None), *(t[:, :, a:b] for t in (q, k, v)))
                              for a, b in zip(ends[:-1], ends[1:])], dim=2)
        slopes = alibi_slopes(q.shape[1], q.device) if p.get("alibi") else None
        out, _ = attention_ref(_swap(q), _swap(k), _swap(v), causal=p["causal"], softcap=p.get("softcap", 0.0),
                               alibi_slopes=slopes, compute_dtype=None)
        return _swap(out)

    def check_case(self, case):
        p = case.params
        if p.get("lens"):       # three sequences, the longest at the check's max
            n = min(p["S"], CHECK_MAX_SEQLEN)
            return case.replace(H=min(p["H"], CHECK_HEADS), S=n, lens=(n, n // 3 + 1, min(77, n)))
        if p.get("dropout_p"):  # each provider's own mask: checked without dropout (see DROPOUT_PROVIDERS)
            case = case.replace(dropout_p=0.0)
        return case.replace(B=1, H=min(p["H"], CHECK_HEADS), S=min(p["S"], CHECK_MAX_SEQLEN))

