"""FusedScheduler, CPU tier: whole 10-step loops equal to diffusers' DDPM / DDIM / Euler ``step(...).prev_sample``
for the same model outputs and noise (tiny 2x4x5x7 latents, Triton's interpreter; the GPU tier with fp16
64x64 latents and CUDA-graph capture is test_scheduler_gpu.py), the kernel against the float64 formula and
the textbook references, layouts, the torch.library registration, and error messages.

The output buffer starts as NaN (fixture ``poison``): an element the kernel forgets to write fails.
"""

import pytest
import torch
from diffusers import DDIMScheduler, DDPMScheduler, EulerDiscreteScheduler  # the dev extra has diffusers

import flashfuse.ops.scheduler as sched_ops
from flashfuse.ops.scheduler import FusedScheduler, scheduler_step_forward
from flashfuse.reference.scheduler import ddim_step_ref, ddpm_step_ref, euler_step_ref, fused_step_ref
from testing import rel_err  # noqa: E402

F32, F16 = torch.float32, torch.float16
# Relative error of the final latents against diffusers. fp32: the same fp32 scalars and operations
# (the interpreter even matches bitwise; FMA contraction on a GPU moves a few ulps). fp16: diffusers
# rounds after each of its ~6 ops in fp16 (2^-11 each), the kernel once: ~1e-3 measured.
TOL = {F32: 1e-6, F16: 5e-3}


@pytest.fixture(autouse=True)
def poison(monkeypatch):
    monkeypatch.setattr(sched_ops, "_alloc_like",
                        lambda t, dtype: torch.full_like(t, float("nan"), dtype=dtype))


def fake_model(x, t):
    """A deterministic stand-in for the UNet: smooth in x, depends on the timestep."""
    return torch.tanh(x.float()) * 0.7 + 0.05 * torch.cos(torch.as_tensor(t, dtype=torch.float32) / 100)


# name -> (scheduler class, config, step kwargs for diffusers / FusedScheduler)
CONFIGS = {
    "ddpm": (DDPMScheduler, {}, {}),
    "ddpm-fixed_large-noclip": (DDPMScheduler, dict(variance_type="fixed_large", clip_sample=False), {}),
    "ddpm-small_log-scaled": (DDPMScheduler, dict(variance_type="fixed_small_log", beta_schedule="scaled_linear",
                                                  beta_start=0.00085, beta_end=0.012), {}),
    "ddpm-v-trailing": (DDPMScheduler, dict(prediction_type="v_prediction", timestep_spacing="trailing"), {}),
    "ddpm-sample-cosine": (DDPMScheduler, dict(prediction_type="sample", beta_schedule="squaredcos_cap_v2",
                                               clip_sample_range=0.5), {}),
    "ddim-eta0": (DDIMScheduler, {}, dict(eta=0.0)),
    "ddim-eta1": (DDIMScheduler, {}, dict(eta=1.0)),
    "ddim-eta0.5-clipped-eps": (DDIMScheduler, dict(set_alpha_to_one=False, steps_offset=1),
                                dict(eta=0.5, use_clipped_model_output=True)),
    "ddim-v-trailing-zsnr": (DDIMScheduler, dict(prediction_type="v_prediction", timestep_spacing="trailing",
                                                 rescale_betas_zero_snr=True, clip_sample=False), dict(eta=0.0)),
    "ddim-sample-linspace": (DDIMScheduler, dict(prediction_type="sample", timestep_spacing="linspace"),
                             dict(eta=0.3)),
    "euler": (EulerDiscreteScheduler, {}, {}),
    "euler-v": (EulerDiscreteScheduler, dict(prediction_type="v_prediction"), {}),
    "euler-karras-scaled": (EulerDiscreteScheduler, dict(use_karras_sigmas=True, beta_schedule="scaled_linear",
                                                         beta_start=0.00085, beta_end=0.012,
                                                         timestep_spacing="trailing"), {}),
}


def run_loops(name, dtype, device, n_steps=10, shape=(2, 4, 5, 7)):
    """The same denoising loop through diffusers' step and through FusedScheduler (device-side step
    counter). Noise: DDPM draws it from a generator inside step (we draw the same numbers from a twin
    generator exactly when it does); DDIM with eta > 0 gets it explicitly (variance_noise). Returns
    (ours, theirs, per-step relative errors)."""
    cls, config, kwargs = CONFIGS[name]
    scheduler = cls(**config)
    scheduler.set_timesteps(n_steps, device=device)
    fused = FusedScheduler(scheduler, **kwargs)
    theirs = (torch.randn(shape, device=device) * scheduler.init_noise_sigma).to(dtype)
    ours = theirs.clone()
    gen_theirs = torch.Generator(device).manual_seed(1)
    gen_ours = torch.Generator(device).manual_seed(1)
    i = fused.new_step_index()
    errors = []
    for k, t in enumerate(scheduler.timesteps):
        out_theirs = fake_model(scheduler.scale_model_input(theirs, t), t).to(dtype)
        out_ours = fake_model(fused.scale_model_input(ours, i), fused.timestep(i)).to(dtype)
        noise = None
        if fused.stochastic:
            noise = (torch.randn(shape, generator=gen_ours, device=device, dtype=dtype) if fused.needs_noise[k]
                     else torch.zeros(shape, device=device, dtype=dtype))
        if cls is DDPMScheduler:
            theirs = scheduler.step(out_theirs, t, theirs, generator=gen_theirs).prev_sample
        elif cls is DDIMScheduler:
            extra = {"variance_noise": noise} if kwargs["eta"] > 0 else {}
            theirs = scheduler.step(out_theirs, t, theirs, **kwargs, **extra).prev_sample
        else:
            theirs = scheduler.step(out_theirs, t, theirs).prev_sample
        ours = fused.step(out_ours, i, ours, noise)
        i += 1
        assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
        assert torch.isfinite(ours).all()
        errors.append(rel_err(ours, theirs))
    assert int(i) == n_steps
    return ours, theirs, errors


@pytest.mark.parametrize("dtype", [F32, F16])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_loop_matches_diffusers(device, name, dtype):
    _, _, errors = run_loops(name, dtype, device)
    assert max(errors) < TOL[dtype], f"per-step rel errors {errors}"


def test_ddpm_noise_usage(device):
    """DDPM adds noise on every step except t = 0 ("leading" spacing ends at t = 0, "trailing" does not)."""
    for spacing, last in (("leading", False), ("trailing", True)):
        scheduler = DDPMScheduler(timestep_spacing=spacing)
        scheduler.set_timesteps(10)
        fused = FusedScheduler(scheduler)
        assert fused.stochastic and fused.needs_noise == [True] * 9 + [last]
    scheduler = DDIMScheduler()
    scheduler.set_timesteps(10)
    assert not FusedScheduler(scheduler).stochastic and FusedScheduler(scheduler, eta=1.0).stochastic


@pytest.mark.parametrize("dtype", [F32, F16])
@pytest.mark.parametrize("clip", [0.0, 0.8])
def test_kernel_formula(device, dtype, clip):
    """The kernel against the float64 formula for random coefficient rows (all 11 used), odd sizes."""
    coef = torch.randn(4, 11, device=device)
    coef[:, 2] = coef[:, 2].abs() + 0.5      # P2, E3 are divisors
    coef[:, 6] = coef[:, 6].abs() + 0.5
    coef[-1] = float("nan")
    for n, step in ((1, 0), (1000, 2), (1025, 1), (3 * 37 * 5, 2)):
        s, m, z = (torch.randn(n, device=device).to(dtype) for _ in range(3))
        idx = torch.tensor(step, device=device)
        out = scheduler_step_forward(m, s, z, coef, idx, clip, dtype)
        ref = fused_step_ref(coef, step, m, s, z, clip)
        assert out.dtype == dtype and torch.isfinite(out).all()
        assert rel_err(out, ref) < {F32: 1e-6, F16: 1e-3}[dtype]


def test_textbook_references(device):
    """One float64 step of each scheduler against the textbook formulas (reference/scheduler.py)."""
    s, m, z = (torch.randn(2, 3, 4, dtype=torch.float64) for _ in range(3))
    sched = DDPMScheduler(clip_sample=False)
    sched.set_timesteps(10)
    fused = FusedScheduler(sched)
    ac = sched.alphas_cumprod.double()
    idx = fused.new_step_index(3)
    t, t_prev = int(sched.timesteps[3]), int(sched.timesteps[4])
    ref = ddpm_step_ref(s, m, ac[t], ac[t_prev], z)
    assert rel_err(fused_step_ref(fused.coefficients, 3, m, s, z), ref) < 1e-6
    sched = DDIMScheduler()
    sched.set_timesteps(10)
    fused = FusedScheduler(sched, eta=0.7)
    t = int(sched.timesteps[2])
    ref = ddim_step_ref(s, m, ac[t], ac[t - 100], eta=0.7, z=z, clip_range=1.0)
    assert rel_err(fused_step_ref(fused.coefficients, 2, m, s, z, 1.0), ref) < 1e-6
    sched = EulerDiscreteScheduler(prediction_type="v_prediction")
    sched.set_timesteps(10)
    fused = FusedScheduler(sched)
    sig = sched.sigmas.double()
    ref = euler_step_ref(s, m, sig[5], sig[6], "v_prediction")
    assert rel_err(fused_step_ref(fused.coefficients, 5, m, s), ref) < 1e-6
    out = fused.step(m.float(), idx.clone().fill_(5), s.float())
    assert rel_err(out, ref) < 1e-6


def test_out_of_range_step_is_nan(device):
    """A counter past the schedule (or negative) reads the NaN row: the loop's bug shows, never a
    silently wrong sample."""
    sched = DDIMScheduler()
    sched.set_timesteps(5)
    fused = FusedScheduler(sched)
    x = torch.randn(2, 4, 5, 7, device=device)
    for bad in (5, 6, -1):
        assert torch.isnan(fused.step(x, fused.new_step_index(bad), x)).all()


def test_layouts(device):
    """channels_last latents run in place (output channels_last too); mixed layouts are copied."""
    sched = EulerDiscreteScheduler()
    sched.set_timesteps(10)
    fused = FusedScheduler(sched)
    x = torch.randn(2, 4, 5, 7, device=device)
    m = torch.randn(2, 4, 5, 7, device=device)
    i = fused.new_step_index(4)
    ref = sched.step(m, sched.timesteps[4], x).prev_sample
    cl = fused.step(m.to(memory_format=torch.channels_last), i, x.to(memory_format=torch.channels_last))
    assert cl.is_contiguous(memory_format=torch.channels_last)
    assert rel_err(cl, ref) < TOL[F32]
    mixed = fused.step(m.to(memory_format=torch.channels_last), i, x.transpose(2, 3).contiguous().transpose(2, 3))
    assert rel_err(mixed, ref) < TOL[F32]


def test_opcheck_and_compile(device):
    sched = DDIMScheduler()
    sched.set_timesteps(10)
    fused = FusedScheduler(sched, eta=1.0)
    x, m, z = (torch.randn(2, 4, 5, 7, device=device) for _ in range(3))
    i = fused.new_step_index(3)
    torch.library.opcheck(torch.ops.flashfuse.scheduler_step, (m, x, z, fused.coefficients, i, 1.0, F32))

    def two_steps(x, m, z, i):
        x = fused.step(m, i, x, z)
        return fused.step(m * 0.5, i + 1, x, z)

    compiled = torch.compile(two_steps, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(x, m, z, i), two_steps(x, m, z, i), rtol=0, atol=0)


def test_errors(device):
    from diffusers import PNDMScheduler

    x = torch.randn(2, 4, 5, 7, device=device)
    with pytest.raises(NotImplementedError, match="scheduler is a PNDMScheduler; supported: DDPMScheduler"):
        FusedScheduler(PNDMScheduler())
    with pytest.raises(ValueError, match="has no timesteps; call scheduler.set_timesteps"):
        FusedScheduler(DDIMScheduler())
    sched = DDPMScheduler(thresholding=True)
    sched.set_timesteps(10)
    with pytest.raises(NotImplementedError, match="thresholding=True .* is not supported"):
        FusedScheduler(sched)
    sched = DDPMScheduler(variance_type="learned_range")
    sched.set_timesteps(10)
    with pytest.raises(NotImplementedError, match="variance_type is 'learned_range'; supported: 'fixed_small'"):
        FusedScheduler(sched)
    sched = DDPMScheduler()
    sched.set_timesteps(10)
    with pytest.raises(ValueError, match="eta and use_clipped_model_output are DDIMScheduler.step options"):
        FusedScheduler(sched, eta=1.0)
    fused = FusedScheduler(sched)
    i = fused.new_step_index()
    with pytest.raises(ValueError, match="noise is None but this ddpm schedule is stochastic"):
        fused.step(x, i, x)
    with pytest.raises(TypeError, match="step_index must be a 0-dim int32/int64 tensor"):
        fused.step(x, 0, x, x)
    with pytest.raises(ValueError, match=r"model_output has shape \(2, 8, 5, 7\) but sample has \(2, 4, 5, 7\)"):
        fused.step(torch.randn(2, 8, 5, 7, device=device), i, x, x)
    with pytest.raises(ValueError, match=r"noise has shape \(2, 4, 5\)"):
        fused.step(x, i, x, x[..., 0])
    with pytest.raises(TypeError, match="sample has dtype torch.int64"):
        fused.step(x, i, x.long(), x)
    sched = DDIMScheduler()
    sched.set_timesteps(10)
    with pytest.raises(ValueError, match="eta is -1.0; supported: a finite number >= 0"):
        FusedScheduler(sched, eta=-1.0)
