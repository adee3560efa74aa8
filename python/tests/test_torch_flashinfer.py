"""The FlashInfer drop-ins of gdnkit.torch (gated_delta_rule_decode_pretranspose,
gated_delta_rule_mtp, gated_delta_rule_decode, gated_delta_rule) against the float64
reference of torch_cases.py, with FlashInfer's shapes: q, k [B, T, H, K], v [B, T, HV, V],
a, b [B, T, HV], V-major pools [slots, HV, V, K] or K-major states [B, HV, K, V]. Several
tokens per sequence (T > 1) are also checked bitwise against T chained one-token calls.

Runs on CPU tensors wherever torch imports, and on CUDA tensors too when a GPU and a
CUDA build of gdnkit are present. Skips cleanly without torch.
"""
import inspect
import math

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

from gdnkit.torch import flashinfer as fi  # noqa: E402
from torch_cases import (DEVICES, TOL_OUT, TOL_STATE, assert_close, cuda_only,  # noqa: E402
                         reference, rel)

# Qwen3-Next's head dims with fewer heads (it has H = 16, HV = 32); HV / H = 2 exercises
# the q/k head sharing.
B, H, HV, K, V = 4, 2, 4, 128, 128
SLOTS = 2 * B + 2  # room for distinct read and write slots, and slot 0 kept free
STATE_DTYPES = [torch.float32, torch.bfloat16]
IN_DTYPES = [torch.bfloat16, torch.float16]


def fi_inputs(device, *, dtype=torch.bfloat16, state_dtype=torch.float32, layout="vk",
              slots=B, l2=True, dt_bias_dtype=torch.float32, seed=0):
    """Realistic random inputs with a random initial state (fixed seed). Without the
    in-kernel l2norm the caller hands in normalized q and k, as models that normalize
    outside the kernel do."""
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    q, k = r(B, 1, H, K), r(B, 1, H, K)
    if not l2:
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    pool_shape = (slots, HV, V, K) if layout == "vk" else (slots, HV, K, V)
    dt = torch.exp(torch.empty(HV).uniform_(math.log(1e-3), math.log(1e-1), generator=gen))
    t = dict(
        q=q.to(dtype), k=k.to(dtype), v=r(B, 1, HV, V).to(dtype),
        a=r(B, 1, HV).to(dtype), b=r(B, 1, HV).to(dtype),
        A_log=torch.log(torch.empty(HV).uniform_(1.0, 16.0, generator=gen)),
        dt_bias=torch.log(torch.expm1(dt)).to(dt_bias_dtype),  # softplus(dt_bias) = dt
        state=(0.5 * r(*pool_shape)).to(state_dtype),
    )
    return {n: x.to(device) for n, x in t.items()}


def pool_slots(device, *, split, seed):
    """(read, write or None) over SLOTS slots: distinct random slots from 1..SLOTS-1 (slot 0
    is FlashInfer's null buffer, which gdnkit must never touch); row 1 is padding (-1),
    and with split slots row 2 also reads but writes no state (-1)."""
    gen = torch.Generator().manual_seed(seed)
    perm = torch.randperm(SLOTS - 1, generator=gen) + 1
    read = perm[:B].clone()
    read[1] = -1
    write = None
    if split:
        write = perm[B:2 * B].clone()
        write[2] = -1
    as_idx = lambda x, dt: None if x is None else x.to(dt).to(device)  # noqa: E731
    return as_idx(read, torch.int32), as_idx(write, torch.int64 if split else torch.int32)


def fi_reference(t, read=None, write=None, *, layout="vk", l2=True, scale=None,
                 softplus_beta=1.0, softplus_threshold=20.0):
    """(o [B, 1, HV, V], new pool in the caller's layout), float64."""
    pool_kv = t["state"].transpose(-1, -2) if layout == "vk" else t["state"]
    o, new_kv = reference(t["q"][:, 0], t["k"][:, 0], t["v"][:, 0], t["a"][:, 0], t["b"][:, 0],
                          t["A_log"], t["dt_bias"], pool_kv, read, write,
                          l2="rsqrt" if l2 else "none", scale=scale,
                          softplus_beta=softplus_beta, softplus_threshold=softplus_threshold)
    return o.unsqueeze(1), (new_kv.transpose(-1, -2) if layout == "vk" else new_kv)


def check_step(o, pool, before, o_ref, s_ref, read=None, write=None, *, out_dtype):
    """Valid rows' outputs and the written slots within the project's tolerances; padding
    rows' outputs exactly zero; every other slot (slot 0 included) bitwise unchanged."""
    n = o.shape[0]
    reads = list(range(n)) if read is None else read.cpu().tolist()
    writes = reads if write is None else write.cpu().tolist()
    valid = torch.tensor([s >= 0 for s in reads])
    assert o.shape == (n, 1, HV, V) and o.dtype == out_dtype
    o = o.cpu()
    assert_close(o[valid], o_ref[valid], TOL_OUT[out_dtype], "output")
    assert not o[~valid].any(), "padding rows must get a zero output"
    written = sorted({w for r, w in zip(reads, writes) if r >= 0 and w >= 0})
    kept = [s for s in range(pool.shape[0]) if s not in written]
    assert_close(pool.cpu()[written], s_ref[written], TOL_STATE[pool.dtype], "written slots")
    assert torch.equal(pool.cpu()[kept], before.cpu()[kept]), "a slot no row writes changed"


def output_buffer(device, kind, dtype):
    """None, or a preallocated output ([B, 1, HV, V], NaN-filled so that every element the
    call must write is seen written) in q's dtype ("same") or float32."""
    if kind is None:
        return None
    out_dtype = dtype if kind == "same" else torch.float32
    return torch.full((B, 1, HV, V), float("nan"), dtype=out_dtype, device=device)


# ---- signatures ---------------------------------------------------------------------------------

_EMPTY = inspect.Parameter.empty
_KW = inspect.Parameter.KEYWORD_ONLY
_DECODE_PARAMS = [("q", _EMPTY), ("k", _EMPTY), ("v", _EMPTY), ("state", _EMPTY),
                  ("A_log", _EMPTY), ("a", _EMPTY), ("dt_bias", _EMPTY), ("b", _EMPTY),
                  ("scale", None), ("output", None), ("use_qk_l2norm", True)]


@pytest.mark.parametrize("fn,expected", [
    (fi.gated_delta_rule_decode_pretranspose,
     _DECODE_PARAMS + [("initial_state", None), ("initial_state_indices", None),
                       ("output_state_indices", None), ("*intermediate_states_buffer", None),
                       ("*disable_state_update", False)]),
    (fi.gated_delta_rule_mtp,
     [("q", _EMPTY), ("k", _EMPTY), ("v", _EMPTY), ("initial_state", _EMPTY),
      ("initial_state_indices", _EMPTY), ("A_log", _EMPTY), ("a", _EMPTY), ("dt_bias", _EMPTY),
      ("b", _EMPTY), ("scale", None), ("output", None), ("intermediate_states_buffer", None),
      ("ssm_state_indices", None), ("disable_state_update", None), ("use_qk_l2norm", True),
      ("output_state_indices", None)]),
    (fi.gated_delta_rule_decode, _DECODE_PARAMS),
    (fi.gated_delta_rule,
     [("A_log", _EMPTY), ("a", _EMPTY), ("dt_bias", _EMPTY), ("softplus_beta", 1.0),
      ("softplus_threshold", 20.0), ("q", None), ("k", None), ("v", None), ("b", None),
      ("initial_state_source", None), ("initial_state_indices", None),
      ("output_state_indices", None), ("output", None), ("use_qk_l2norm_in_kernel", True),
      ("scale", None)]),
])
def test_signatures(fn, expected):
    """FlashInfer's parameter order, names and defaults (callers pass many positionally);
    a leading * marks a keyword-only parameter."""
    params = inspect.signature(fn).parameters.values()
    got = [("*" if p.kind == _KW else "") + p.name for p in params]
    assert got == [name for name, _ in expected]
    defaults = [p.default for p in params]
    assert defaults == [default for _, default in expected]


# ---- gated_delta_rule_decode_pretranspose -------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("state_dtype", STATE_DTYPES)
@pytest.mark.parametrize("dtype", IN_DTYPES)
@pytest.mark.parametrize("l2", [True, False])
@pytest.mark.parametrize("scale", [None, 0.3])
@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("out", [None, "same", "float32"])
def test_pretranspose_pool(device, state_dtype, dtype, l2, scale, split, out):
    """Pool mode: initial_state [SLOTS, HV, V, K] with initial_state_indices (and
    output_state_indices when split), -1 padding rows; state=None as FlashInfer's callers
    pass it. Returns (output, initial_state), the pool updated in place."""
    t = fi_inputs(device, dtype=dtype, state_dtype=state_dtype, slots=SLOTS, l2=l2, seed=1)
    read, write = pool_slots(device, split=split, seed=2)
    o_ref, s_ref = fi_reference(t, read, write, l2=l2, scale=scale)
    pool = t["state"].clone()
    output = output_buffer(device, out, dtype)
    o, ret = fi.gated_delta_rule_decode_pretranspose(
        t["q"], t["k"], t["v"], None, t["A_log"], t["a"], t["dt_bias"], t["b"], scale=scale,
        output=output, use_qk_l2norm=l2, initial_state=pool, initial_state_indices=read,
        output_state_indices=write)
    assert ret is pool
    if output is not None:
        assert o is output
    check_step(o, pool, t["state"], o_ref, s_ref, read, write,
               out_dtype=dtype if output is None else output.dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("state_dtype", STATE_DTYPES)
@pytest.mark.parametrize("dtype", IN_DTYPES)
@pytest.mark.parametrize("contiguous", [True, False])
def test_pretranspose_state(device, state_dtype, dtype, contiguous):
    """Per-batch state [B, HV, V, K] (row n is slot n), updated in place and returned; a
    non-contiguous state view is updated in place too."""
    t = fi_inputs(device, dtype=dtype, state_dtype=state_dtype, seed=3)
    o_ref, s_ref = fi_reference(t)
    if contiguous:
        state = t["state"].clone()
    else:
        state = t["state"].transpose(-1, -2).contiguous().transpose(-1, -2)
        assert state.stride(-1) != 1 and torch.equal(state, t["state"])
    o, ret = fi.gated_delta_rule_decode_pretranspose(
        t["q"], t["k"], t["v"], state, t["A_log"], t["a"], t["dt_bias"], t["b"])
    assert ret is state
    check_step(o, state, t["state"], o_ref, s_ref, out_dtype=dtype)


# ---- gated_delta_rule_decode (K-major) -------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("state_dtype", STATE_DTYPES)
@pytest.mark.parametrize("dtype", IN_DTYPES)
@pytest.mark.parametrize("l2", [True, False])
@pytest.mark.parametrize("scale", [None, 0.3])
@pytest.mark.parametrize("out", [None, "same", "float32"])
def test_decode_kmajor(device, state_dtype, dtype, l2, scale, out):
    """State [B, HV, K, V] updated in place; returns (output, state)."""
    t = fi_inputs(device, dtype=dtype, state_dtype=state_dtype, layout="kv", l2=l2, seed=4)
    o_ref, s_ref = fi_reference(t, layout="kv", l2=l2, scale=scale)
    state = t["state"].clone()
    output = output_buffer(device, out, dtype)
    o, ret = fi.gated_delta_rule_decode(t["q"], t["k"], t["v"], state, t["A_log"], t["a"],
                                        t["dt_bias"], t["b"], scale, output, l2)
    assert ret is state
    if output is not None:
        assert o is output
    check_step(o, state, t["state"], o_ref, s_ref,
               out_dtype=dtype if output is None else output.dtype)


# ---- gated_delta_rule (the BF16-state entry) ------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("state_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("dtype", IN_DTYPES)
@pytest.mark.parametrize("l2", [True, False])
@pytest.mark.parametrize("scale", [None, 0.3])
@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("out", [None, "same"])
def test_gated_delta_rule_pool(device, state_dtype, dtype, l2, scale, split, out):
    """Keyword call as FlashInfer's own dispatcher makes it; returns only the output and
    updates initial_state_source in place."""
    t = fi_inputs(device, dtype=dtype, state_dtype=state_dtype, slots=SLOTS, l2=l2, seed=5)
    read, write = pool_slots(device, split=split, seed=6)
    o_ref, s_ref = fi_reference(t, read, write, l2=l2, scale=scale)
    pool = t["state"].clone()
    output = output_buffer(device, out, dtype)
    o = fi.gated_delta_rule(
        A_log=t["A_log"], a=t["a"], dt_bias=t["dt_bias"], softplus_beta=1.0,
        softplus_threshold=20.0, q=t["q"], k=t["k"], v=t["v"], b=t["b"],
        initial_state_source=pool, initial_state_indices=read, output_state_indices=write,
        use_qk_l2norm_in_kernel=l2, scale=scale, output=output)
    assert torch.is_tensor(o)
    if output is not None:
        assert o is output
    check_step(o, pool, t["state"], o_ref, s_ref, read, write, out_dtype=dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("softplus_beta,softplus_threshold", [(2.0, 20.0), (0.5, 15.0)])
def test_gated_delta_rule_softplus(device, softplus_beta, softplus_threshold):
    """softplus_beta / softplus_threshold, positional as FlashInfer's signature orders
    them, with a bfloat16 dt_bias (FlashInfer takes bfloat16 or float32)."""
    t = fi_inputs(device, state_dtype=torch.bfloat16, slots=SLOTS,
                  dt_bias_dtype=torch.bfloat16, seed=7)
    read, _ = pool_slots(device, split=False, seed=8)
    o_ref, s_ref = fi_reference(t, read, softplus_beta=softplus_beta,
                                softplus_threshold=softplus_threshold)
    pool = t["state"].clone()
    o = fi.gated_delta_rule(t["A_log"], t["a"], t["dt_bias"], softplus_beta, softplus_threshold,
                            t["q"], t["k"], t["v"], t["b"], pool, read)
    check_step(o, pool, t["state"], o_ref, s_ref, read, out_dtype=torch.bfloat16)


@pytest.mark.parametrize("device", DEVICES)
def test_gated_delta_rule_without_indices(device):
    """No initial_state_indices: row n reads and writes slot n; slots >= B untouched."""
    t = fi_inputs(device, state_dtype=torch.bfloat16, slots=SLOTS, seed=9)
    o_ref, s_ref = fi_reference(t)
    pool = t["state"].clone()
    o = fi.gated_delta_rule(t["A_log"], t["a"], t["dt_bias"], q=t["q"], k=t["k"], v=t["v"],
                            b=t["b"], initial_state_source=pool)
    check_step(o, pool, t["state"], o_ref, s_ref, out_dtype=torch.bfloat16)
    assert fi.gated_delta_rule_bf16state_cooprow is fi.gated_delta_rule


# ---- float16 inputs are read as float16 --------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("state_dtype", STATE_DTYPES)
def test_fp16_inputs_not_rounded_to_bf16(device, state_dtype):
    """The same values as float16 and as bfloat16: gdnkit reads float16 natively (FlashInfer
    would round it to bfloat16 and return the bfloat16 result bit for bit). The float16
    result is at least as close to the caller's unrounded values as the bfloat16 one,
    within the bfloat16 tolerance of it, and not identical to it. Float32 outputs, so that
    only the inputs' precision differs between the two runs."""
    t = fi_inputs(device, dtype=torch.float32, state_dtype=state_dtype, slots=SLOTS, seed=10)
    read, _ = pool_slots(device, split=False, seed=11)
    o_true, s_true = fi_reference(t, read)
    valid = (read >= 0).cpu()
    written = read[read >= 0].long().cpu()
    runs = {}
    for dtype in (torch.float16, torch.bfloat16):
        ti = dict(t, **{n: t[n].to(dtype) for n in ("q", "k", "v", "a", "b")})
        pool = t["state"].clone()
        output = torch.empty(B, 1, HV, V, dtype=torch.float32, device=device)
        o, _ = fi.gated_delta_rule_decode_pretranspose(
            ti["q"], ti["k"], ti["v"], None, ti["A_log"], ti["a"], ti["dt_bias"], ti["b"],
            output=output, initial_state=pool, initial_state_indices=read)
        o_ref, s_ref = fi_reference(ti, read)  # from the values as stored in `dtype`
        check_step(o, pool, t["state"], o_ref, s_ref, read, out_dtype=torch.float32)
        runs[dtype] = (o.cpu()[valid], pool.cpu()[written])
    (o16, s16), (obf, sbf) = runs[torch.float16], runs[torch.bfloat16]
    assert rel(o16, o_true[valid]) <= rel(obf, o_true[valid])
    assert rel(s16, s_true[written]) <= rel(sbf, s_true[written])
    assert_close(o16, obf, TOL_OUT[torch.bfloat16], "float16 vs bfloat16 output")
    assert_close(s16, sbf, TOL_STATE[torch.bfloat16], "float16 vs bfloat16 state")
    assert not torch.equal(o16, obf)


# ---- refused calls ----------------------------------------------------------------------------

def test_refused():
    """Unsupported options raise NotImplementedError naming the argument; arguments
    FlashInfer asserts on raise an error that is both ValueError and AssertionError (what
    FlashInfer's assert raises); nothing is written either way."""
    t = fi_inputs("cpu", state_dtype=torch.bfloat16, slots=SLOTS, seed=12)
    read, _ = pool_slots("cpu", split=False, seed=13)
    pool = t["state"].clone()
    gates = (t["A_log"], t["a"], t["dt_bias"], t["b"])
    q2, k2 = (torch.cat([t[n], t[n]], 1) for n in ("q", "k"))  # T = 2
    v2 = torch.cat([t["v"], t["v"]], 1)

    def pretranspose(q=t["q"], k=t["k"], v=t["v"], **kw):
        kw.setdefault("initial_state", pool)
        kw.setdefault("initial_state_indices", read)
        return fi.gated_delta_rule_decode_pretranspose(q, k, v, None, *gates[:3], gates[3], **kw)

    # FlashInfer's one-token entries assert T == 1 (its MTP path is another entry).
    with pytest.raises(ValueError, match="T = 2"):
        fi.gated_delta_rule_decode(q2, k2, v2, pool[:B].transpose(-1, -2), *gates)
    with pytest.raises(AssertionError, match="T = 2"):  # as FlashInfer's own tests expect it
        fi.gated_delta_rule_decode(q2, k2, v2, pool[:B].transpose(-1, -2), *gates)
    with pytest.raises(ValueError, match="T = 2"):
        fi.gated_delta_rule(*gates[:3], q=q2, k=k2, v=v2, b=t["b"], initial_state_source=pool,
                            initial_state_indices=read)
    with pytest.raises(ValueError, match="disable_state_update"):
        pretranspose(disable_state_update=True)
    with pytest.raises(ValueError, match="intermediate_states_buffer"):
        pretranspose(intermediate_states_buffer=torch.empty(B, 1, HV, V, K, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="initial_state_indices"):
        pretranspose(initial_state_indices=None)
    with pytest.raises(ValueError, match="output_state_indices"):
        fi.gated_delta_rule_decode_pretranspose(
            t["q"], t["k"], t["v"], pool[:B], *gates[:3], gates[3], output_state_indices=read)
    with pytest.raises(ValueError, match="initial_state_indices must be int32 or int64"):
        pretranspose(initial_state_indices=read.float())
    with pytest.raises(ValueError, match="K-contiguous"):
        pretranspose(initial_state=pool.transpose(-1, -2).contiguous().transpose(-1, -2))
    with pytest.raises(ValueError, match="output shape"):
        pretranspose(output=torch.empty(B, HV, V, dtype=torch.bfloat16))
    with pytest.raises(NotImplementedError, match="scale"):
        pretranspose(scale=0.0)
    with pytest.raises(NotImplementedError, match="threshold"):
        fi.gated_delta_rule(*gates[:3], 1.0, 10.0, t["q"], t["k"], t["v"], t["b"], pool, read)
    with pytest.raises(ValueError, match="initial_state_source"):
        fi.gated_delta_rule(*gates[:3], q=t["q"], k=t["k"], v=t["v"], b=t["b"])
    assert torch.equal(pool, t["state"])


# ---- several tokens per sequence (gated_delta_rule_mtp, pretranspose with T > 1) -------------

def mtp_inputs(device, T, *, dtype=torch.bfloat16, state_dtype=torch.float32, slots=SLOTS,
               seed=0):
    """fi_inputs with T tokens per sequence: q, k [B, T, H, K], v [B, T, HV, V], a, b
    [B, T, HV]; a random initial pool [slots, HV, V, K]."""
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    dt = torch.exp(torch.empty(HV).uniform_(math.log(1e-3), math.log(1e-1), generator=gen))
    t = dict(
        q=r(B, T, H, K).to(dtype), k=r(B, T, H, K).to(dtype), v=r(B, T, HV, V).to(dtype),
        a=r(B, T, HV).to(dtype), b=r(B, T, HV).to(dtype),
        A_log=torch.log(torch.empty(HV).uniform_(1.0, 16.0, generator=gen)),
        dt_bias=torch.log(torch.expm1(dt)),  # softplus(dt_bias) = dt
        state=(0.5 * r(slots, HV, V, K)).to(state_dtype),
    )
    return {n: x.to(device) for n, x in t.items()}


def mtp_slots(device, *, split, seed, slots=SLOTS):
    """(read, write or None): distinct random slots from 1..slots-1, row 1 padding (-1);
    with split, distinct write slots that no row reads."""
    gen = torch.Generator().manual_seed(seed)
    perm = torch.randperm(slots - 1, generator=gen) + 1
    read = perm[:B].clone()
    read[1] = -1
    write = perm[B:2 * B].clone() if split else None
    return read.to(torch.int32).to(device), None if write is None else write.to(device)


def intermediate_buffer(T, state_dtype, device, *, rows=B, steps=None, seed=99):
    """A caller's intermediate_states_buffer [rows, steps, HV, V, K], filled with random
    values so that blocks the call must leave alone can be checked bitwise."""
    gen = torch.Generator().manual_seed(seed)
    shape = (rows, T if steps is None else steps, HV, V, K)
    return torch.randn(*shape, generator=gen).to(state_dtype).to(device)


def mtp_reference(t, read, write=None, *, update=True, ssm=None, l2=True, scale=None):
    """The float64 reference of T tokens a row, routed by hand: row n starts from slot
    read[n]; each token is one step of torch_cases.reference (the math, in float64), its
    output taken from the unrounded state, the state then rounded to the pool's dtype (a
    store and a reload) before the next token. Returns (o [B, T, HV, V], the state after
    each token [B, T, HV, V, K] (as stored), the expected pool, the slots written)."""
    pool = t["state"].cpu()
    n_rows, T = t["q"].shape[:2]
    slots = pool.shape[0]
    reads = read.cpu().tolist()
    writes = reads if write is None else write.cpu().tolist()
    o = torch.zeros(n_rows, T, HV, V, dtype=torch.float64)
    states = torch.zeros(n_rows, T, HV, V, K, dtype=pool.dtype)
    new_pool = pool.clone()
    written = set()
    for n in range(n_rows):
        if not 0 <= reads[n] < slots:
            continue  # padding: zero output, nothing read or written
        s = pool[reads[n]]
        for tok in range(T):
            row = {x: t[x][n:n + 1, tok].cpu() for x in ("q", "k", "v", "a", "b")}
            o_t, s_kv = reference(row["q"], row["k"], row["v"], row["a"], row["b"], t["A_log"],
                                  t["dt_bias"], s.transpose(-1, -2)[None],
                                  l2="rsqrt" if l2 else "none", scale=scale)
            o[n, tok] = o_t[0]
            s = s_kv[0].transpose(-1, -2).to(pool.dtype)
            states[n, tok] = s
            if ssm is not None and 0 <= int(ssm[n, tok]) < slots:
                new_pool[int(ssm[n, tok])] = s
                written.add(int(ssm[n, tok]))
        # the final state: to the write slot, which with ssm must be given explicitly
        if update and (ssm is None or write is not None) and 0 <= writes[n] < slots:
            new_pool[writes[n]] = s
            written.add(writes[n])
    return o, states, new_pool, sorted(written)


def chained_calls(t, read, write=None, *, per_batch=False, ssm=None):
    """T one-token calls of gated_delta_rule_decode_pretranspose chained through a copy of
    the pool: token 0 reads `read`, token t reads the slot token t - 1 wrote (`write`, or
    ssm[:, t - 1]); padding rows stay padding. per_batch: the per-batch `state` instead of
    a pool. Returns (outputs [B, T, HV, V], the state after each token as the pool holds it
    [B, T, HV, V, K], the final pool)."""
    pool = t["state"].clone()
    T = t["q"].shape[1]
    for_row = read.long() if write is None else write.long()
    outs, states = [], []
    for tok in range(T):
        x = {n: t[n][:, tok:tok + 1] for n in ("q", "k", "v", "a", "b")}
        args = (x["q"], x["k"], x["v"], pool if per_batch else None, t["A_log"], x["a"],
                t["dt_bias"], x["b"])
        if per_batch:
            o, _ = fi.gated_delta_rule_decode_pretranspose(*args)
            dst = torch.arange(B, device=pool.device)
        else:
            dst = for_row if ssm is None else ssm[:, tok].long()
            prev = for_row if ssm is None else ssm[:, tok - 1].long()
            src = read.long() if tok == 0 else torch.where(read >= 0, prev, -1)
            o, _ = fi.gated_delta_rule_decode_pretranspose(
                *args, initial_state=pool, initial_state_indices=src,
                output_state_indices=None if (write is None and ssm is None) else dst)
        outs.append(o)
        states.append(pool.index_select(0, dst.clamp(min=0)))
    return torch.cat(outs, 1), torch.stack(states, 1), pool


def check_mtp(o, pool, before, o_ref, pool_ref, written, read, *, out_dtype):
    """Valid rows' outputs and the written slots within the project's tolerances; padding
    rows' outputs exactly zero; every other slot (slot 0 included) bitwise unchanged."""
    valid = torch.tensor([0 <= s < pool.shape[0] for s in read.cpu().tolist()])
    assert o.shape == o_ref.shape and o.dtype == out_dtype
    o = o.cpu()
    # From the second token on the output is computed from a state stored in its dtype, so
    # its bound is the looser of the output's and the state's (docs/golden-format.md,
    # Tolerances): one rounding of that state landing the other way moves a float32 output
    # past 1e-5.
    tol = max(TOL_OUT[out_dtype], TOL_STATE[pool.dtype]) if o.shape[1] > 1 else TOL_OUT[out_dtype]
    assert_close(o[valid], o_ref[valid], tol, "output")
    assert not o[~valid].any(), "padding rows must get a zero output"
    kept = [s for s in range(pool.shape[0]) if s not in written]
    assert_close(pool.cpu()[written], pool_ref[written], TOL_STATE[pool.dtype], "written slots")
    assert torch.equal(pool.cpu()[kept], before.cpu()[kept]), "a slot no row writes changed"
    return valid


def check_buffer(buffer, before, states_ref, valid, T):
    """Valid rows' blocks [n, t] within tolerance of the reference's state after token t;
    padding rows' blocks (and steps past T) bitwise untouched."""
    buffer, before = buffer.cpu(), before.cpu()
    assert_close(buffer[:B][valid, :T], states_ref[valid], TOL_STATE[buffer.dtype],
                 "intermediate states")
    assert torch.equal(buffer[:B][~valid], before[:B][~valid]), "a padding row's blocks changed"
    assert torch.equal(buffer[:, T:], before[:, T:]) and torch.equal(buffer[B:], before[B:])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("state_dtype", STATE_DTYPES)
@pytest.mark.parametrize("T", [2, 4, 8])
@pytest.mark.parametrize("with_buffer", [False, True])
@pytest.mark.parametrize("disable", [False, True])
@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("entry", ["mtp", "pretranspose"])
def test_mtp(device, state_dtype, T, with_buffer, disable, split, entry):
    """T tokens a row over a pool larger than B (random distinct slots, a padding row),
    with or without intermediate_states_buffer and output_state_indices, the pool updated
    or left alone: against the float64 reference that rounds the state between tokens,
    and bitwise against T one-token calls chained through the pool."""
    t = mtp_inputs(device, T, state_dtype=state_dtype, seed=30 + T)
    read, write = mtp_slots(device, split=split, seed=31 + T)
    o_ref, s_ref, pool_ref, written = mtp_reference(t, read, write, update=not disable)
    pool = t["state"].clone()
    buffer = intermediate_buffer(T, state_dtype, device) if with_buffer else None
    buffer_before = None if buffer is None else buffer.clone()
    if entry == "mtp":
        o, ret = fi.gated_delta_rule_mtp(
            t["q"], t["k"], t["v"], pool, read, t["A_log"], t["a"], t["dt_bias"], t["b"],
            intermediate_states_buffer=buffer, disable_state_update=disable,
            output_state_indices=write)
    else:
        o, ret = fi.gated_delta_rule_decode_pretranspose(
            t["q"], t["k"], t["v"], None, t["A_log"], t["a"], t["dt_bias"], t["b"],
            initial_state=pool, initial_state_indices=read, output_state_indices=write,
            intermediate_states_buffer=buffer, disable_state_update=disable)
    assert ret is pool
    valid = check_mtp(o, pool, t["state"], o_ref, pool_ref, written, read,
                      out_dtype=t["q"].dtype)
    if buffer is not None:
        check_buffer(buffer, buffer_before, s_ref, valid, T)
    if disable:
        assert torch.equal(pool, t["state"]), "disable_state_update must leave the pool alone"

    o_chain, s_chain, pool_chain = chained_calls(t, read, write)
    assert torch.equal(o, o_chain), "not bitwise T one-token calls (output)"
    if not disable:
        assert torch.equal(pool, pool_chain), "not bitwise T one-token calls (pool)"
    if buffer is not None:
        assert torch.equal(buffer.cpu()[valid], s_chain.cpu()[valid]), \
            "not bitwise T one-token calls (intermediate states)"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("state_dtype", STATE_DTYPES)
@pytest.mark.parametrize("with_buffer", [False, True])
@pytest.mark.parametrize("contiguous", [True, False])
def test_mtp_pretranspose_per_batch_state(device, state_dtype, with_buffer, contiguous):
    """T > 1 with the per-batch state [B, HV, V, K] (row n is slot n), as FlashInfer's BF16
    path takes it; a non-contiguous state view is updated in place too."""
    T = 4
    t = mtp_inputs(device, T, state_dtype=state_dtype, slots=B, seed=40)
    rows = torch.arange(B, device=device)
    o_ref, s_ref, pool_ref, written = mtp_reference(t, rows)
    if contiguous:
        state = t["state"].clone()
    else:
        state = t["state"].transpose(-1, -2).contiguous().transpose(-1, -2)
        assert state.stride(-1) != 1 and torch.equal(state, t["state"])
    buffer = intermediate_buffer(T, state_dtype, device) if with_buffer else None
    buffer_before = None if buffer is None else buffer.clone()
    o, ret = fi.gated_delta_rule_decode_pretranspose(
        t["q"], t["k"], t["v"], state, t["A_log"], t["a"], t["dt_bias"], t["b"],
        intermediate_states_buffer=buffer)
    assert ret is state
    valid = check_mtp(o, state, t["state"], o_ref, pool_ref, written, rows,
                      out_dtype=t["q"].dtype)
    if buffer is not None:
        check_buffer(buffer, buffer_before, s_ref, valid, T)
    o_chain, s_chain, pool_chain = chained_calls(t, rows, per_batch=True)
    assert torch.equal(o, o_chain) and torch.equal(state, pool_chain)
    if buffer is not None:
        assert torch.equal(buffer, s_chain)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("state_dtype", STATE_DTYPES)
@pytest.mark.parametrize("split", [False, True])
def test_mtp_ssm_state_indices(device, state_dtype, split):
    """ssm_state_indices [B, T]: token t's state to slot ssm_state_indices[n, t]; with
    output_state_indices (split), the last token's state also to output_state_indices[n]
    (FlashInfer's split pool; a negative entry writes no final state), else nothing else
    written (the read slots keep their state); a padding row writes none of its slots."""
    T = 4
    slots = 1 + B * (T + 2)
    t = mtp_inputs(device, T, state_dtype=state_dtype, slots=slots, seed=50)
    gen = torch.Generator().manual_seed(51)
    perm = (torch.randperm(slots - 1, generator=gen) + 1).to(device)
    read = perm[:B].clone()
    read[1] = -1
    ssm = perm[B:B + B * T].reshape(B, T).to(torch.int32)
    final = perm[B + B * T:2 * B + B * T].clone() if split else None
    if split:
        final[0] = -1
    o_ref, s_ref, pool_ref, written = mtp_reference(t, read, final, ssm=ssm.cpu())
    assert not set(ssm[1].tolist()) & set(written)
    assert set(read.tolist()).isdisjoint(written)
    pool = t["state"].clone()
    o, ret = fi.gated_delta_rule_mtp(
        t["q"], t["k"], t["v"], pool, read, t["A_log"], t["a"], t["dt_bias"], t["b"],
        ssm_state_indices=ssm, disable_state_update=False, output_state_indices=final)
    assert ret is pool
    check_mtp(o, pool, t["state"], o_ref, pool_ref, written, read, out_dtype=t["q"].dtype)
    o_chain, _, pool_chain = chained_calls(t, read, ssm=ssm)
    if split:  # the final slots hold what the chain left in each valid row's last token slot
        for n in range(B):
            if read[n] >= 0 and final[n] >= 0:
                pool_chain[final[n]] = pool_chain[ssm[n, T - 1]]
    assert torch.equal(o, o_chain) and torch.equal(pool, pool_chain)


@pytest.mark.parametrize("device", DEVICES)
def test_mtp_default_disables_state_update(device):
    """disable_state_update=None is FlashInfer's current default, True: a FutureWarning, the
    outputs, and the pool bitwise unchanged."""
    T = 2
    t = mtp_inputs(device, T, state_dtype=torch.bfloat16, seed=60)
    read, _ = mtp_slots(device, split=False, seed=61)
    o_ref, _, pool_ref, written = mtp_reference(t, read, update=False)
    pool = t["state"].clone()
    with pytest.warns(FutureWarning, match="disable_state_update"):
        o, _ = fi.gated_delta_rule_mtp(t["q"], t["k"], t["v"], pool, read, t["A_log"], t["a"],
                                       t["dt_bias"], t["b"])
    assert not written and torch.equal(pool, t["state"])
    check_mtp(o, pool, t["state"], o_ref, pool_ref, written, read, out_dtype=t["q"].dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("out", ["same", "float32"])
@pytest.mark.parametrize("dtype", IN_DTYPES)
def test_mtp_output(device, out, dtype):
    """A preallocated output [B, T, HV, V] (NaN-filled) is written whole and returned,
    padding rows zeroed; in q's dtype it is bitwise the chained one-token calls' output."""
    T = 4
    t = mtp_inputs(device, T, dtype=dtype, state_dtype=torch.bfloat16, seed=70)
    read, write = mtp_slots(device, split=True, seed=71)
    o_ref, _, pool_ref, written = mtp_reference(t, read, write)
    pool = t["state"].clone()
    output = torch.full((B, T, HV, V), float("nan"), device=device,
                        dtype=dtype if out == "same" else torch.float32)
    o, _ = fi.gated_delta_rule_mtp(t["q"], t["k"], t["v"], pool, read, t["A_log"], t["a"],
                                   t["dt_bias"], t["b"], scale=None, output=output,
                                   disable_state_update=False, output_state_indices=write)
    assert o is output
    check_mtp(o, pool, t["state"], o_ref, pool_ref, written, read, out_dtype=output.dtype)
    if out == "same":
        o_chain, _, pool_chain = chained_calls(t, read, write)
        assert torch.equal(o, o_chain) and torch.equal(pool, pool_chain)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("with_buffer", [False, True])
@pytest.mark.parametrize("split", [False, True])
def test_mtp_bad_indices(device, with_buffer, split):
    """An index at or beyond the pool size is padding; a negative write slot (valid read)
    computes the outputs and writes no state (its intermediate states are still kept); a
    batch of padding rows only leaves the pool and the buffer bitwise as they were."""
    T = 4
    t = mtp_inputs(device, T, seed=80)
    read = torch.tensor([3, -1, SLOTS, 5], dtype=torch.int64, device=device)
    write = torch.tensor([7, 8, 9, -1], device=device) if split else None
    o_ref, s_ref, pool_ref, written = mtp_reference(t, read, write)
    pool = t["state"].clone()
    buffer = intermediate_buffer(T, pool.dtype, device) if with_buffer else None
    buffer_before = None if buffer is None else buffer.clone()
    o, _ = fi.gated_delta_rule_mtp(t["q"], t["k"], t["v"], pool, read, t["A_log"], t["a"],
                                   t["dt_bias"], t["b"], intermediate_states_buffer=buffer,
                                   disable_state_update=False, output_state_indices=write)
    valid = check_mtp(o, pool, t["state"], o_ref, pool_ref, written, read,
                      out_dtype=t["q"].dtype)
    assert valid.tolist() == [True, False, False, True]
    if buffer is not None:
        check_buffer(buffer, buffer_before, s_ref, valid, T)

    padding = torch.tensor([-1, SLOTS, -3, SLOTS + 5], device=device)
    pool = t["state"].clone()
    buffer = None if buffer is None else buffer_before.clone()
    o, _ = fi.gated_delta_rule_mtp(t["q"], t["k"], t["v"], pool, padding, t["A_log"], t["a"],
                                   t["dt_bias"], t["b"], intermediate_states_buffer=buffer,
                                   disable_state_update=False, output_state_indices=write)
    assert not o.any() and torch.equal(pool, t["state"])
    if buffer is not None:
        assert torch.equal(buffer, buffer_before)


@pytest.mark.parametrize("device", DEVICES)
def test_mtp_buffer_with_more_steps(device):
    """A buffer with more rows and steps than the call's B and T: FlashInfer's kernels write
    row n's state after token t to the buffer's state block n * T + t counted from its
    start, and so does gdnkit; every other block stays as it was."""
    T, steps = 2, 5
    t = mtp_inputs(device, T, state_dtype=torch.bfloat16, seed=90)
    read, write = mtp_slots(device, split=True, seed=91)
    exact = intermediate_buffer(T, torch.bfloat16, device)
    wide = intermediate_buffer(T, torch.bfloat16, device, rows=B + 1, steps=steps)
    wide_before = wide.clone()
    results = []
    for buffer in (exact, wide):
        pool = t["state"].clone()
        o, _ = fi.gated_delta_rule_mtp(t["q"], t["k"], t["v"], pool, read, t["A_log"], t["a"],
                                       t["dt_bias"], t["b"], intermediate_states_buffer=buffer,
                                       disable_state_update=True, output_state_indices=write)
        results.append(o)
    assert torch.equal(results[0], results[1])
    flat, flat_before = wide.view(-1, HV, V, K), wide_before.view(-1, HV, V, K)
    blocks = torch.arange(B).repeat_interleave(T) * T + torch.arange(T).repeat(B)
    valid = (read >= 0).cpu().repeat_interleave(T)
    assert torch.equal(flat.cpu()[blocks[valid]], exact.view(-1, HV, V, K).cpu()[valid])
    kept = [i for i in range(flat.shape[0]) if i not in blocks[valid].tolist()]
    assert torch.equal(flat.cpu()[kept], flat_before.cpu()[kept])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("split", [False, True])
def test_mtp_unpacked_pool(device, split):
    """A pool whose slots are not packed (a K-slice of a wider tensor) gives bitwise the
    packed pool's result, updated in place, the columns outside the slice untouched."""
    T = 4
    t = mtp_inputs(device, T, seed=100)
    read, write = mtp_slots(device, split=split, seed=101)
    wide = torch.randn(SLOTS, HV, V, K + 16, generator=torch.Generator().manual_seed(102))
    wide = wide.to(device)
    wide[..., :K] = t["state"]
    wide_before = wide.clone()
    pool = wide[..., :K]
    packed = t["state"].clone()
    runs = []
    for p in (pool, packed):
        o, ret = fi.gated_delta_rule_mtp(t["q"], t["k"], t["v"], p, read, t["A_log"], t["a"],
                                         t["dt_bias"], t["b"], disable_state_update=False,
                                         output_state_indices=write)
        assert ret is p
        runs.append(o)
    assert torch.equal(runs[0], runs[1]) and torch.equal(pool, packed)
    assert not torch.equal(packed, t["state"])
    assert torch.equal(wide[..., K:], wide_before[..., K:])


def test_mtp_refused():
    """Arguments FlashInfer asserts on raise ValueError naming them; nothing is written."""
    T = 2
    t = mtp_inputs("cpu", T, state_dtype=torch.bfloat16, seed=110)
    read, _ = mtp_slots("cpu", split=False, seed=111)
    pool = t["state"].clone()
    buffer = intermediate_buffer(T, torch.bfloat16, "cpu")
    buffer_before = buffer.clone()

    def mtp(**kw):
        kw.setdefault("disable_state_update", False)
        x = {n: kw.pop(n, t[n]) for n in ("q", "k", "v", "a", "b")}
        return fi.gated_delta_rule_mtp(x["q"], x["k"], x["v"], pool, read, t["A_log"], x["a"],
                                       t["dt_bias"], x["b"], **kw)

    with pytest.raises(ValueError, match="intermediate_states_buffer must be in the state"):
        mtp(intermediate_states_buffer=buffer.float())
    with pytest.raises(ValueError, match="intermediate_states_buffer shape"):
        mtp(intermediate_states_buffer=buffer[:, :1])
    with pytest.raises(ValueError, match="intermediate_states_buffer shape"):
        mtp(intermediate_states_buffer=buffer[:B - 1])
    with pytest.raises(ValueError, match="intermediate_states_buffer must be contiguous"):
        mtp(intermediate_states_buffer=buffer.transpose(0, 1).contiguous().transpose(0, 1))
    ssm = torch.arange(B * T, dtype=torch.int32).reshape(B, T) + 1
    with pytest.raises(ValueError, match="mutually exclusive"):
        mtp(ssm_state_indices=ssm, intermediate_states_buffer=buffer)
    with pytest.raises(ValueError, match="disable_state_update must be False"):
        mtp(ssm_state_indices=ssm, disable_state_update=True)
    with pytest.raises(ValueError, match="ssm_state_indices must have shape"):
        mtp(ssm_state_indices=ssm[:, :1])
    with pytest.raises(ValueError, match="ssm_state_indices must be int32"):
        mtp(ssm_state_indices=ssm.float())
    with pytest.raises(AssertionError, match="ssm_state_indices must be int32"):  # as FlashInfer
        mtp(ssm_state_indices=ssm.long())
    with pytest.raises(ValueError, match="T >= 2"):
        mtp(ssm_state_indices=ssm[:, :1], **{n: t[n][:, :1] for n in ("q", "k", "v", "a", "b")})
    with pytest.raises(ValueError, match="output shape"):
        mtp(output=torch.empty(B, 1, HV, V, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="expected a shape"):
        mtp(a=t["a"][:, :1])
    with pytest.raises(ValueError, match="output_state_indices must be int32 or int64"):
        mtp(output_state_indices=read.float())
    with pytest.raises(NotImplementedError, match="scale"):
        mtp(scale=0.0)
    with pytest.raises(ValueError, match="initial_state_indices are required"):
        fi.gated_delta_rule_mtp(t["q"], t["k"], t["v"], pool, None, t["A_log"], t["a"],
                                t["dt_bias"], t["b"], disable_state_update=False)
    assert torch.equal(pool, t["state"]) and torch.equal(buffer, buffer_before)


# ---- several tokens under torch.compile and in CUDA graphs ------------------------------------

def mtp_step(t, read, write, ssm):
    """Three MTP calls of one verify step: the intermediate buffer with the pool left alone,
    split write slots, and per-token slots."""
    def step(pool, buffer):
        o1, _ = fi.gated_delta_rule_mtp(t["q"], t["k"], t["v"], pool, read, t["A_log"], t["a"],
                                        t["dt_bias"], t["b"], intermediate_states_buffer=buffer,
                                        disable_state_update=True)
        o2, _ = fi.gated_delta_rule_mtp(t["q"], t["k"], t["v"], pool, read, t["A_log"], t["a"],
                                        t["dt_bias"], t["b"], disable_state_update=False,
                                        output_state_indices=write)
        o3, _ = fi.gated_delta_rule_mtp(t["q"], t["k"], t["v"], pool, write, t["A_log"], t["a"],
                                        t["dt_bias"], t["b"], ssm_state_indices=ssm,
                                        disable_state_update=False)
        return o1 + o2, o3

    return step


def mtp_step_inputs(device, T=3):
    t = mtp_inputs(device, T, state_dtype=torch.bfloat16, slots=1 + B * (T + 2), seed=120)
    gen = torch.Generator().manual_seed(121)
    perm = (torch.randperm(B * (T + 2), generator=gen) + 1).to(device)
    read = perm[:B].to(torch.int32)
    write = perm[B:2 * B].to(torch.int32)
    ssm = perm[2 * B:2 * B + B * T].reshape(B, T).to(torch.int32)
    return t, read, write, ssm


@pytest.mark.parametrize("device", DEVICES)
def test_mtp_compile(device):
    """gated_delta_rule_mtp under torch.compile (fullgraph): the same bits as eager."""
    T = 3
    t, read, write, ssm = mtp_step_inputs(device, T)
    step = mtp_step(t, read, write, ssm)
    for backend in ("aot_eager",) + (("inductor",) if device == "cuda" else ()):
        torch._dynamo.reset()
        eager = (t["state"].clone(), intermediate_buffer(T, torch.bfloat16, device))
        compiled = (t["state"].clone(), intermediate_buffer(T, torch.bfloat16, device))
        fn = torch.compile(step, backend=backend, fullgraph=True)
        for x, y in zip(step(*eager), fn(*compiled)):
            assert torch.equal(x, y), backend
        for x, y in zip(eager, compiled):
            assert torch.equal(x, y), backend


@cuda_only
def test_mtp_cuda_graph():
    """gated_delta_rule_mtp captured in a CUDA graph and replayed against eager calls."""
    T = 3
    t, read, write, ssm = mtp_step_inputs("cuda", T)
    step = mtp_step(t, read, write, ssm)
    make = lambda: (t["state"].clone(), intermediate_buffer(T, torch.bfloat16, "cuda"))  # noqa: E731
    eager, graphed = make(), make()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step(*make())
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        graph_out = step(*graphed)
    for _ in range(2):
        g.replay()
        eager_out = step(*eager)
        torch.cuda.synchronize()
        for x, y in zip(graph_out + graphed, eager_out + eager):
            assert torch.equal(x, y)
