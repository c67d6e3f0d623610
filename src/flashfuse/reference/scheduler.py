"""Plain PyTorch diffusion scheduler steps, readable like a textbook. Tests compare the fused kernel
(flashfuse.ops.scheduler) with them and with diffusers' own ``step``.

Notation: s = x_t the current sample, m = the model output, z ~ N(0, I) fresh noise,
a_t = alphas_cumprod[t] (alpha-bar), a_prev = alpha-bar of the previous (less noisy) timestep.

DDPM (Ho et al. 2020, eqs. 6-7): predict x0, then sample the posterior q(x_{t-1} | x_t, x0):
    x0   = (s - sqrt(1 - a_t) m) / sqrt(a_t)                      (epsilon prediction)
    mean = sqrt(a_prev) beta_t / (1 - a_t) x0 + sqrt(alpha_t) (1 - a_prev) / (1 - a_t) s
    x_{t-1} = mean + std_t z,  std_t^2 = (1 - a_prev) / (1 - a_t) beta_t   (fixed_small; none at t = 0)
    with alpha_t = a_t / a_prev, beta_t = 1 - alpha_t.

DDIM (Song et al. 2021, eq. 12):
    x_{t-1} = sqrt(a_prev) x0 + sqrt(1 - a_prev - std_t^2) eps + std_t z,
    std_t = eta sqrt((1 - a_prev) / (1 - a_t) (1 - a_t / a_prev))       (eta = 0: deterministic)

Euler (Karras et al. 2022, Algorithm 2 with s_churn = 0), in sigma = sqrt((1 - a) / a) units:
    x0 = s - sigma m,  d = (s - x0) / sigma,  x_next = s + (sigma_next - sigma) d
    (the model sees s / sqrt(sigma^2 + 1): ``scale_model_input``)

``fused_step_ref`` is the single formula the kernel evaluates with a per-step coefficient row (see
flashfuse.ops.scheduler), in float64.
"""

from __future__ import annotations


def predict_x0(s, m, a_t, prediction_type="epsilon"):
    """x0 from the model output, for alpha-bar schedulers (DDPM, DDIM)."""
    if prediction_type == "epsilon":
        return (s - (1 - a_t) ** 0.5 * m) / a_t ** 0.5
    if prediction_type == "sample":
        return m
    if prediction_type == "v_prediction":
        return a_t ** 0.5 * s - (1 - a_t) ** 0.5 * m
    raise ValueError(prediction_type)


def ddpm_step_ref(s, m, a_t, a_prev, z=None, clip_range=None, prediction_type="epsilon", variance="fixed_small"):
    x0 = predict_x0(s, m, a_t, prediction_type)
    if clip_range is not None:
        x0 = x0.clamp(-clip_range, clip_range)
    alpha_t = a_t / a_prev
    beta_t = 1 - alpha_t
    mean = a_prev ** 0.5 * beta_t / (1 - a_t) * x0 + alpha_t ** 0.5 * (1 - a_prev) / (1 - a_t) * s
    if z is None:
        return mean
    var = (1 - a_prev) / (1 - a_t) * beta_t if variance == "fixed_small" else beta_t
    return mean + var ** 0.5 * z


def ddim_step_ref(s, m, a_t, a_prev, eta=0.0, z=None, clip_range=None, prediction_type="epsilon"):
    x0 = predict_x0(s, m, a_t, prediction_type)
    if prediction_type == "epsilon":
        eps = m
    elif prediction_type == "sample":
        eps = (s - a_t ** 0.5 * x0) / (1 - a_t) ** 0.5
    else:
        eps = a_t ** 0.5 * m + (1 - a_t) ** 0.5 * s
    if clip_range is not None:
        x0 = x0.clamp(-clip_range, clip_range)
    std = eta * ((1 - a_prev) / (1 - a_t) * (1 - a_t / a_prev)) ** 0.5
    prev = a_prev ** 0.5 * x0 + (1 - a_prev - std ** 2) ** 0.5 * eps
    return prev if eta == 0 else prev + std * z


def euler_step_ref(s, m, sigma, sigma_next, prediction_type="epsilon"):
    if prediction_type == "epsilon":
        x0 = s - sigma * m
    elif prediction_type == "v_prediction":
        x0 = m * (-sigma / (sigma ** 2 + 1) ** 0.5) + s / (sigma ** 2 + 1)
    else:
        x0 = m
    d = (s - x0) / sigma
    return s + (sigma_next - sigma) * d


def fused_step_ref(coefficients, step, model_output, sample, noise=None, clip_range=0.0):
    """The kernel's formula in float64: x0 = (P0 s + P1 m) / P2, clamp, eps = (E0 s + E1 m + E2 x0) / E3,
    prev = C0 x0 + C1 s + C2 eps + C3 z, with row ``step`` of the (n_steps + 1, 11) coefficient table."""
    p0, p1, p2, e0, e1, e2, e3, c0, c1, c2, c3 = coefficients[step].double().tolist()
    s, m = sample.double(), model_output.double()
    x0 = (p0 * s + p1 * m) / p2
    if clip_range > 0:
        x0 = x0.clamp(-clip_range, clip_range)
    eps = (e0 * s + e1 * m + e2 * x0) / e3
    prev = c0 * x0 + c1 * s + c2 * eps
    return prev if noise is None else prev + c3 * noise.double()
