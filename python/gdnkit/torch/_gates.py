"""Argument adapters shared by the vLLM and SGLang wrappers."""
import math

import torch

# Above this the softplus switch point of the caller and gdnkit's (20, as torch's
# F.softplus) give the same float32 result: log1p(exp(-x)) / x < 2.1e-8 for x >= 15.
MIN_SOFTPLUS_THRESHOLD = 15.0


def raw_gate_inputs(A_log, a, b, dt_bias, softplus_beta, softplus_threshold, who):
    """Map softplus with (beta, threshold) onto gdnkit's gate, returning (A_log, a, b, dt_bias).

    softplus_beta(x) = softplus(beta * x) / beta, so with a' = beta * a, dt' = beta * dt
    and A_log' = A_log - log(beta): -exp(A_log') * softplus(a' + dt') equals the caller's
    g = -exp(A_log) * softplus_beta(a + dt). Costs a float32 copy of a and b when beta != 1.
    """
    beta = float(softplus_beta)
    threshold = float(softplus_threshold)
    if not beta > 0.0:
        raise ValueError(f"{who}: softplus beta must be > 0, got {beta}")
    if threshold < MIN_SOFTPLUS_THRESHOLD:
        raise NotImplementedError(
            f"{who}: softplus threshold {threshold} is not supported by gdnkit (it switches "
            f"softplus(x) to x above x = 20, as torch does; thresholds >= "
            f"{MIN_SOFTPLUS_THRESHOLD:g} give the same float32 result)"
        )
    A_log = A_log.float().contiguous()
    dt_bias = dt_bias.float().contiguous()
    if beta != 1.0:
        a = a.float() * beta
        b = b.float()
        A_log = A_log - math.log(beta)
        dt_bias = dt_bias * beta
    elif a.dtype != b.dtype:
        a, b = a.float(), b.float()
    if a.stride(-1) != 1:
        a = a.contiguous()
    if b.stride(-1) != 1:
        b = b.contiguous()
    return A_log, a, b, dt_bias


def flat_indices(idx):
    """A 1-D contiguous index vector the library accepts (int32 or int64)."""
    if idx.dtype not in (torch.int32, torch.int64):
        idx = idx.to(torch.int32)
    return idx.reshape(-1).contiguous()
