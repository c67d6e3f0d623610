"""Fused diffusion scheduler steps (DDPM, DDIM, Euler discrete): one Triton kernel per step, schedule on
the device, no host synchronisation, CUDA-graph capturable; equal to diffusers' ``step(...).prev_sample``.

diffusers' ``scheduler.step`` runs 6-12 small elementwise PyTorch ops per denoising step (and a
``nonzero`` look-up of the timestep, a host sync, in DDPM and Euler). ``FusedScheduler`` precomputes,
once, every step's scalars from the scheduler's own tables (alphas_cumprod, sigmas, timesteps, config),
with diffusers' own fp32 arithmetic, and stores them as one (n_steps + 1, 11) fp32 device tensor. A step
is then one kernel that reads its row through a device-side step index (a 0-dim integer tensor the loop
increments on the device) and writes prev_sample.

All three schedulers are one formula with per-step coefficients (s = sample, m = model_output, z = noise,
arithmetic in fp32):

    x0   = (P0 s + P1 m) / P2                     predicted original sample ("pred_original_sample")
    x0   = clamp(x0, -clip_range, clip_range)      DDPM / DDIM with config.clip_sample
    eps  = (E0 s + E1 m + E2 x0) / E3              predicted noise (Euler: the ODE derivative)
    prev = C0 x0 + C1 s + C2 eps + C3 z

    DDPM (x0-mean form, eq. 7 of Ho et al.):  C0 = sqrt(a_prev) beta_t / (1 - a_t),
              C1 = sqrt(alpha_t) (1 - a_prev) / (1 - a_t),  C2 = 0,  C3 = std_t (0 at t = 0)
    DDIM (eq. 12 of Song et al.):  C0 = sqrt(a_prev),  C1 = 0,  C2 = sqrt(1 - a_prev - std_t^2),
              C3 = std_t = eta sqrt((1 - a_prev) / (1 - a_t) (1 - a_t / a_prev))
    Euler:    eps = (s - x0) / sigma (the derivative d),  prev = s + (sigma_next - sigma) d:
              C0 = 0, C1 = 1, C2 = sigma_next - sigma, C3 = 0
    x0 by prediction type (a = alphas_cumprod[t], b = 1 - a):
              epsilon: (s - sqrt(b) m) / sqrt(a)  [Euler: s - sigma m];  sample: m;
              v_prediction: sqrt(a) s - sqrt(b) m  [Euler: s / (sigma^2 + 1) - sigma / sqrt(sigma^2 + 1) m]

Not supported (NotImplementedError at construction): thresholding=True (dynamic thresholding needs a
per-sample quantile, a reduction), DDPM variance_type "learned" / "learned_range" (the variance comes from
the model's extra channels) / "fixed_large_log", and stochastic Euler (``s_churn > 0``: FusedScheduler's
Euler step is diffusers' default s_churn = 0).
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

from .._checks import check_same, check_tensor
from ._custom_op import FlashfuseOp
from ._triton import cdiv

COEFFICIENTS = ("P0", "P1", "P2", "E0", "E1", "E2", "E3", "C0", "C1", "C2", "C3")
N_COEF = len(COEFFICIENTS)
# fp32 arithmetic mirrors torch's: IEEE division (div_rn; Triton's default fp32 division is approximate,
# 2 ulp) and no fused multiply-adds (enable_fp_fusion=False), so that with the same fp32 coefficients
# every product and sum rounds where diffusers' separate ops round (the fp32 loops match bitwise in the
# interpreter). Free here: the step is memory- or launch-bound.
# 1024 elements per program on 4 warps: 8 per thread, one 16-byte vector of fp16/bf16 (two of fp32) for
# each of the 3-4 streams; SD latents (2, 4, 64, 64) are 32 programs, SDXL's (2, 4, 128, 128) 128: the
# step is launch-bound there, and bandwidth-bound (read 3 streams, write 1) at video sizes.
BLOCK, NUM_WARPS = 1024, 4


# ----------------------------------------------------------------------------------------------------
# Kernel
# ----------------------------------------------------------------------------------------------------

@triton.jit
def _scheduler_step_kernel(
    SAMPLE, MODEL, NOISE, OUT,  # [n_elements] each, one memory order (flat)
    COEF, STEP,                 # COEF: [n_steps + 1, N_COEF] fp32, row n_steps all NaN; STEP: 0-dim int
    n_elements, n_steps, clip_range,
    CLIP: tl.constexpr, HAS_NOISE: tl.constexpr, N_COEF: tl.constexpr, BLOCK: tl.constexpr,
):
    """prev = C0 x0 + C1 s + C2 eps + C3 z for one BLOCK of elements (module docstring). The step index is
    read on the device; an index outside [0, n_steps) reads the NaN row, so a runaway loop gives NaN, not
    a silently wrong sample."""
    i_step = tl.load(STEP).to(tl.int64)
    i_step = tl.where((i_step >= 0) & (i_step < n_steps), i_step, n_steps)
    p_coef = COEF + i_step * N_COEF
    p0, p1, p2 = tl.load(p_coef + 0), tl.load(p_coef + 1), tl.load(p_coef + 2)
    e0, e1, e2, e3 = tl.load(p_coef + 3), tl.load(p_coef + 4), tl.load(p_coef + 5), tl.load(p_coef + 6)
    c0, c1, c2 = tl.load(p_coef + 7), tl.load(p_coef + 8), tl.load(p_coef + 9)
    i = tl.program_id(0).to(tl.int64)
    o = i * BLOCK + tl.arange(0, BLOCK)                                        # [BLOCK]
    m = o < n_elements
    s = tl.load(SAMPLE + o, mask=m, other=0.0).to(tl.float32)
    mo = tl.load(MODEL + o, mask=m, other=0.0).to(tl.float32)
    x0 = tl.div_rn(p0 * s + p1 * mo, p2)
    if CLIP:
        x0 = tl.minimum(tl.maximum(x0, -clip_range), clip_range)
    eps = tl.div_rn(e0 * s + e1 * mo + e2 * x0, e3)
    prev = c0 * x0 + c1 * s + c2 * eps
    if HAS_NOISE:
        z = tl.load(NOISE + o, mask=m, other=0.0).to(tl.float32)
        prev += tl.load(p_coef + 10) * z
    tl.store(OUT + o, prev.to(OUT.dtype.element_ty), mask=m)


# ----------------------------------------------------------------------------------------------------
# Launcher and torch.library op
# ----------------------------------------------------------------------------------------------------

def _alloc_like(t: Tensor, dtype: torch.dtype) -> Tensor:
    """The output buffer (same memory format as the sample); tests replace it with a NaN fill."""
    return torch.empty_like(t, dtype=dtype)


def scheduler_step_forward(model_output: Tensor, sample: Tensor, noise: Optional[Tensor], coefficients: Tensor,
                           step_index: Tensor, clip_range: float, out_dtype: torch.dtype) -> Tensor:
    """One fused step. model_output, sample, noise: one shape and one dense memory order (the launch
    treats them as flat arrays); coefficients (n_steps + 1, N_COEF) fp32; step_index a 0-dim integer
    tensor; clip_range <= 0 means no clipping."""
    out = _alloc_like(sample, out_dtype)
    n = sample.numel()
    if n == 0:
        return out
    _scheduler_step_kernel[(cdiv(n, BLOCK),)](
        sample, model_output, sample if noise is None else noise, out, coefficients, step_index,
        n, coefficients.shape[0] - 1, float(clip_range),
        CLIP=clip_range > 0, HAS_NOISE=noise is not None, N_COEF=N_COEF, BLOCK=BLOCK, num_warps=NUM_WARPS,
        enable_fp_fusion=False)
    return out


def _step_impl(model_output: Tensor, sample: Tensor, noise: Optional[Tensor], coefficients: Tensor,
               step_index: Tensor, clip_range: float, out_dtype: torch.dtype) -> Tensor:
    return scheduler_step_forward(model_output, sample, noise, coefficients, step_index, clip_range, out_dtype)


def _step_fake(model_output, sample, noise, coefficients, step_index, clip_range, out_dtype):
    return torch.empty_like(sample, dtype=out_dtype)


_scheduler_step = FlashfuseOp("flashfuse::scheduler_step", _step_impl, fake=_step_fake)


# ----------------------------------------------------------------------------------------------------
# Coefficient tables, computed with diffusers' own fp32 arithmetic (0-dim float32 tensors, the same
# operations in the same order), so the kernel sees the very scalars diffusers' step uses
# ----------------------------------------------------------------------------------------------------

def _row(**c) -> list[Tensor]:
    return [torch.as_tensor(c.get(name, 0.0), dtype=torch.float32) for name in COEFFICIENTS]


def _x0_eps(prediction_type: str, a_t: Tensor, b_t: Tensor, use_clipped: bool) -> dict:
    """P and E coefficients of DDPM / DDIM (E only matters to DDIM)."""
    if prediction_type == "epsilon":
        c = dict(P0=1.0, P1=-(b_t ** 0.5), P2=a_t ** 0.5, E1=1.0, E3=1.0)
    elif prediction_type == "sample":
        c = dict(P1=1.0, P2=1.0, E0=1.0, E1=-(a_t ** 0.5), E3=b_t ** 0.5)
    elif prediction_type == "v_prediction":
        c = dict(P0=a_t ** 0.5, P1=-(b_t ** 0.5), P2=1.0, E0=b_t ** 0.5, E1=a_t ** 0.5, E3=1.0)
    else:
        raise NotImplementedError(f"prediction_type is {prediction_type!r}; supported: 'epsilon', 'sample', "
                                  "'v_prediction'")
    if use_clipped:  # eps re-derived from the clipped x0 (Glide); DDIM's use_clipped_model_output
        c.update(E0=1.0, E1=0.0, E2=-(a_t ** 0.5), E3=b_t ** 0.5)
    return c


def _check_common(scheduler) -> None:
    cfg = scheduler.config
    if scheduler.num_inference_steps is None:
        raise ValueError(f"{type(scheduler).__name__} has no timesteps; call scheduler.set_timesteps(n) first")
    if getattr(cfg, "thresholding", False):
        raise NotImplementedError("thresholding=True (dynamic thresholding: a per-sample quantile of x0) is "
                                  "not supported; supported: thresholding=False with clip_sample True or False")


def _ddpm_rows(scheduler) -> list[list[Tensor]]:
    cfg = scheduler.config
    if scheduler.variance_type not in ("fixed_small", "fixed_small_log", "fixed_large"):
        raise NotImplementedError(f"DDPMScheduler variance_type is {scheduler.variance_type!r}; supported: "
                                  "'fixed_small', 'fixed_small_log', 'fixed_large'")
    ac, one = scheduler.alphas_cumprod.cpu(), torch.tensor(1.0)
    rows = []
    for t in scheduler.timesteps.cpu().tolist():
        prev_t = int(scheduler.previous_timestep(t))
        a_t = ac[t]
        a_prev = ac[prev_t] if prev_t >= 0 else one
        b_t, b_prev = 1 - a_t, 1 - a_prev
        cur_a = a_t / a_prev
        cur_b = 1 - cur_a
        c = _x0_eps(cfg.prediction_type, a_t, b_t, use_clipped=False)
        c.update(E0=0.0, E1=0.0, E2=0.0, E3=1.0)  # DDPM's mean needs no eps
        c["C0"] = (a_prev ** 0.5 * cur_b) / b_t
        c["C1"] = cur_a ** 0.5 * b_prev / b_t
        variance = torch.clamp((1 - a_prev) / (1 - a_t) * cur_b, min=1e-20)
        if scheduler.variance_type == "fixed_small":
            std = variance ** 0.5
        elif scheduler.variance_type == "fixed_small_log":
            std = torch.exp(0.5 * torch.log(variance))
        else:
            std = cur_b ** 0.5
        c["C3"] = std if t > 0 else 0.0  # diffusers adds noise only while t > 0
        rows.append(_row(**c))
    return rows


def _ddim_rows(scheduler, eta: float, use_clipped: bool) -> list[list[Tensor]]:
    cfg = scheduler.config
    ac, final = scheduler.alphas_cumprod.cpu(), scheduler.final_alpha_cumprod.cpu()
    rows = []
    for t in scheduler.timesteps.cpu().tolist():
        prev_t = t - cfg.num_train_timesteps // scheduler.num_inference_steps
        a_t = ac[t]
        a_prev = ac[prev_t] if prev_t >= 0 else final
        b_t, b_prev = 1 - a_t, 1 - a_prev
        c = _x0_eps(cfg.prediction_type, a_t, b_t, use_clipped)
        std = eta * ((b_prev / b_t) * (1 - a_t / a_prev)) ** 0.5
        c["C0"] = a_prev ** 0.5
        c["C2"] = (1 - a_prev - std ** 2) ** 0.5
        c["C3"] = std if eta > 0 else 0.0
        rows.append(_row(**c))
    return rows


def _euler_rows(scheduler) -> tuple[list[list[Tensor]], Tensor]:
    cfg = scheduler.config
    sigmas = scheduler.sigmas.cpu()
    rows, divisors = [], []
    for i in range(len(scheduler.timesteps)):
        sigma = sigmas[i]
        sigma_hat = sigma * (0.0 + 1)  # gamma = 0: s_churn = 0
        if cfg.prediction_type in ("epsilon",):
            c = dict(P0=1.0, P1=-sigma_hat, P2=1.0)
        elif cfg.prediction_type in ("sample", "original_sample"):
            c = dict(P1=1.0, P2=1.0)
        elif cfg.prediction_type == "v_prediction":
            c = dict(P0=1 / (sigma ** 2 + 1), P1=-sigma / (sigma ** 2 + 1) ** 0.5, P2=1.0)
        else:
            raise NotImplementedError(f"prediction_type is {cfg.prediction_type!r}; supported: 'epsilon', "
                                      "'sample', 'v_prediction'")
        c.update(E0=1.0, E2=-1.0, E3=sigma_hat, C1=1.0, C2=sigmas[i + 1] - sigma_hat)
        rows.append(_row(**c))
        divisors.append((sigma ** 2 + 1) ** 0.5)
    return rows, torch.stack(divisors) if divisors else torch.empty(0)


# ----------------------------------------------------------------------------------------------------
# Public object
# ----------------------------------------------------------------------------------------------------

def _dense_same_layout(tensors: list[Tensor]) -> bool:
    first = tensors[0]
    dense = first.is_contiguous() or (first.dim() == 4 and first.is_contiguous(memory_format=torch.channels_last))
    return dense and all(t.stride() == first.stride() for t in tensors[1:])


class FusedScheduler:
    """A diffusers DDPMScheduler, DDIMScheduler or EulerDiscreteScheduler as one fused kernel per step.

    Build it after ``scheduler.set_timesteps(n, device)``; it reads the scheduler's tables once (the
    scheduler itself is not modified) and keeps on ``device``:

    - ``timesteps``: (n,) the scheduler's timesteps (give the model ``timesteps[step_index]``);
    - ``coefficients``: (n + 1, 11) fp32, one row per step (see the module docstring) + a NaN row;
    - ``sigmas`` and ``input_divisors`` (Euler): ``scale_model_input`` divides by sqrt(sigma^2 + 1).

    Options: ``eta`` (DDIM's step argument; eta > 0 needs ``noise`` every step) and
    ``use_clipped_model_output`` (DDIM). Stochastic schedulers (``stochastic``: DDPM, DDIM with eta > 0)
    need ``noise`` (any float dtype, the sample's shape) on every step; steps where diffusers adds none
    (DDPM at t = 0) multiply it by 0; ``needs_noise[i]`` says, on the host, which steps use it (diffusers
    draws ``randn_tensor(model_output.shape, generator=..., dtype=model_output.dtype)`` exactly then).

    Step i is the position in ``scheduler.timesteps`` (diffusers' step index); img2img pipelines that
    start mid-schedule start the counter at their begin index.

    Example (a CUDA-graph capturable loop: no host sync, the counter lives on the device)::

        scheduler.set_timesteps(30, device="cuda")
        fs = FusedScheduler(scheduler)
        i = fs.new_step_index()                                 # 0-dim int64 tensor on the device
        for _ in range(fs.num_steps):
            x_in = fs.scale_model_input(latents, i)
            eps = unet(x_in, fs.timestep(i), text_emb).sample
            latents = fs.step(eps, i, latents)
            i += 1                                              # in place, on the device
    """

    def __init__(self, scheduler, *, eta: float = 0.0, use_clipped_model_output: bool = False, device=None):
        kind = type(scheduler).__name__
        names = {c.__name__ for c in type(scheduler).__mro__}
        if isinstance(eta, bool) or not isinstance(eta, (int, float)) or not math.isfinite(eta) or eta < 0:
            raise ValueError(f"eta is {eta!r}; supported: a finite number >= 0 (DDIM)")
        if "DDIMScheduler" in names:
            self.kind = "ddim"
        elif "DDPMScheduler" in names:
            self.kind = "ddpm"
        elif "EulerDiscreteScheduler" in names:
            self.kind = "euler"
        else:
            raise NotImplementedError(f"scheduler is a {kind}; supported: DDPMScheduler, DDIMScheduler, "
                                      "EulerDiscreteScheduler (diffusers)")
        if self.kind != "ddim" and (eta != 0 or use_clipped_model_output):
            raise ValueError(f"eta and use_clipped_model_output are DDIMScheduler.step options; got them for {kind}")
        _check_common(scheduler)
        device = torch.device(device) if device is not None else scheduler.timesteps.device
        divisors = None
        if self.kind == "ddpm":
            rows = _ddpm_rows(scheduler)
        elif self.kind == "ddim":
            rows = _ddim_rows(scheduler, float(eta), use_clipped_model_output)
        else:
            rows, divisors = _euler_rows(scheduler)
        cfg = scheduler.config
        self.clip_range = float(cfg.clip_sample_range) if self.kind != "euler" and cfg.clip_sample else 0.0
        if self.kind != "euler" and cfg.clip_sample and not self.clip_range > 0:
            raise NotImplementedError(f"clip_sample_range is {cfg.clip_sample_range!r}; supported: > 0")
        table = torch.stack([torch.stack(r) for r in rows]) if rows else torch.empty(0, N_COEF)
        table = torch.cat([table, torch.full((1, N_COEF), float("nan"))])
        self.coefficients = table.to(device)
        self.num_steps = len(rows)
        self.timesteps = scheduler.timesteps.to(device)
        self.needs_noise = [bool(r[10] != 0) for r in rows]
        self.stochastic = any(self.needs_noise) or (self.kind == "ddim" and eta > 0)
        self.input_divisors = None if divisors is None else divisors.to(device)
        self.sigmas = scheduler.sigmas.to(device) if self.kind == "euler" else None
        self.init_noise_sigma = scheduler.init_noise_sigma

    def new_step_index(self, start: int = 0) -> Tensor:
        """A fresh 0-dim int64 step counter on the device."""
        return torch.tensor(start, dtype=torch.int64, device=self.coefficients.device)

    def timestep(self, step_index: Tensor) -> Tensor:
        """The model's timestep for this step, a 0-dim device tensor (index_select: no host sync, unlike
        indexing with a tensor, which may read it on the host)."""
        return self.timesteps.index_select(0, step_index.reshape(1)).reshape(())

    def scale_model_input(self, sample: Tensor, step_index: Tensor) -> Tensor:
        """diffusers' ``scale_model_input``: Euler divides by sqrt(sigma^2 + 1); DDPM / DDIM return sample."""
        if self.input_divisors is None:
            return sample
        return sample / self.input_divisors.index_select(0, step_index.reshape(1)).reshape(())

    def step(self, model_output: Tensor, step_index: Tensor, sample: Tensor, noise: Optional[Tensor] = None) -> Tensor:
        """prev_sample of step ``step_index`` (a 0-dim integer tensor on the sample's device) in one kernel.

        Shapes: model_output, sample, noise: any one shape (latents (batch, channels, height, width)),
        fp16, bf16 or fp32. The output dtype is diffusers': promote(sample, model_output) for DDPM / DDIM,
        model_output's for Euler. Equal to ``scheduler.step(model_output, scheduler.timesteps[i], sample,
        ...).prev_sample`` (fp32 arithmetic, one rounding).
        """
        check_tensor("model_output", model_output)
        check_tensor("sample", sample)
        check_same(("sample", "model_output"), (sample, model_output), dtype=False)
        if model_output.shape != sample.shape:
            raise ValueError(f"model_output has shape {tuple(model_output.shape)} but sample has "
                             f"{tuple(sample.shape)}; they must match (learned-variance outputs are not supported)")
        if not isinstance(step_index, Tensor) or step_index.dim() != 0 or step_index.dtype not in (
                torch.int32, torch.int64):
            raise TypeError(f"step_index must be a 0-dim int32/int64 tensor (FusedScheduler.new_step_index()), "
                            f"got {step_index!r}")
        if step_index.device != self.coefficients.device or sample.device != self.coefficients.device:
            raise ValueError(f"step_index is on {step_index.device} and sample on {sample.device}; the schedule is "
                             f"on {self.coefficients.device}")
        tensors = [sample, model_output]
        if noise is not None:
            check_tensor("noise", noise)
            check_same(("sample", "noise"), (sample, noise), dtype=False)
            if noise.shape != sample.shape:
                raise ValueError(f"noise has shape {tuple(noise.shape)} but sample has {tuple(sample.shape)}")
            tensors.append(noise)
        elif self.stochastic:
            raise ValueError(f"noise is None but this {self.kind} schedule is stochastic (DDPM, or DDIM with "
                             "eta > 0): pass noise (standard normal, the sample's shape) on every step")
        if not _dense_same_layout(tensors):
            tensors = [t.contiguous() for t in tensors]
        if self.kind == "euler":
            out_dtype = model_output.dtype
        else:
            out_dtype = torch.promote_types(sample.dtype, model_output.dtype)
        noise = tensors[2] if noise is not None else None
        if noise is not None and not self.stochastic:
            noise = None  # every noise coefficient is 0
        return _scheduler_step(tensors[1], tensors[0], noise, self.coefficients, step_index, self.clip_range,
                               out_dtype)
