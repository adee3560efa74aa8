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


def same_qkv_dtype(q, k, v):
    """q, k, v in one dtype, as the kernel loads them: the narrower ones upcast to the widest.

    Upcasting is exact (fp16 and bf16 values are float32 values), so the step sees the
    caller's numbers unchanged. It costs one elementwise pass over the upcast tensors: q, k
    and v are 1/K of the state's bytes per token, so under 1% of a decode call's traffic.
    """
    if q.dtype == k.dtype == v.dtype:
        return q, k, v
    wide = torch.promote_types(torch.promote_types(q.dtype, k.dtype), v.dtype)
    return q.to(wide), k.to(wide), v.to(wide)


def check_unit_cu_seqlens(cu_seqlens, n, who):
    """One token per sequence means cu_seqlens = [0, 1, ..., n]; anything else is refused.

    The comparison runs where cu_seqlens lives and fails through torch's asynchronous assert:
    on the CPU at once, on a GPU at the stream's next synchronization (a device-side
    assertion, as for an out-of-range index in torch), and never with a host sync on the
    call. The failed assertion stops the stream before the step runs, so nothing is written.
    """
    expected = torch.arange(n + 1, device=cu_seqlens.device, dtype=cu_seqlens.dtype)
    torch._assert_async((cu_seqlens == expected).all(),
                        f"{who}: cu_seqlens must be [0, 1, ..., {n}] (one token per sequence)")


def store_rows(dst, dst_index, ok, src, src_index):
    """dst[dst_index[r]] = src[src_index[r]] (cast to dst's dtype) for every r with ok[r];
    the other entries write nothing. Without a host synchronization the entries cannot be
    filtered, and index_copy_ takes one source block per index, its result undefined where
    duplicate indices carry different blocks: so each entry that must not write repeats
    the first ok entry's copy (same index, same bits), and when no entry is ok, every
    entry copies block 0 of dst onto itself."""
    first = ok.to(torch.int32).argmax().reshape(1)  # the first ok entry, 0 when there is none
    anyone = ok.any()
    dst_index = torch.where(ok, dst_index, dst_index.index_select(0, first))
    src_index = torch.where(ok, src_index, src_index.index_select(0, first))
    dst_index = torch.where(anyone, dst_index, 0)
    blocks = src.index_select(0, src_index.clamp(0, src.shape[0] - 1)).to(dst.dtype)
    blocks = torch.where(anyone, blocks, dst[0])
    dst.index_copy_(0, dst_index, blocks)


def check_packed_rows(cu_seqlens, total, T, who, padded=False):
    """With cu_seqlens: rows inside the packed tokens [0, total), each of at most T tokens,
    ending at total (padded: at or before it; the tokens past the last row are padding that
    nothing reads, as vLLM's kernels treat a padded batch). A row outside would be skipped
    by gdnkit (and counted), so it is refused instead, by torch's asynchronous assert: at
    once on the CPU, at the stream's next synchronization on a GPU (before the step writes
    anything), never with a host sync on the call."""
    lengths = cu_seqlens[1:] - cu_seqlens[:-1]
    end = (cu_seqlens[-1] <= total) if padded else (cu_seqlens[-1] == total)
    torch._assert_async(((lengths >= 0) & (lengths <= T)).all() & (cu_seqlens[0] == 0) & end,
                        f"{who}: cu_seqlens must rise from 0 to {'at most ' if padded else ''}{total} "
                        f"by at most {T} tokens a sequence")
