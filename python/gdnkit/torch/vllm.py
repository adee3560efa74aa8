"""Drop-ins for vLLM's GatedDeltaNet decode kernels (Qwen3-Next / Qwen3.5).

vLLM (vllm/model_executor/layers/fla/ops/):

    from vllm.model_executor.layers.fla.ops import fused_sigmoid_gating_delta_rule_update
    o, state = fused_sigmoid_gating_delta_rule_update(A_log=..., a=a, b=b, dt_bias=..., q=q, k=k, v=v,
        initial_state=ssm_state, inplace_final_state=True, cu_seqlens=cu, ssm_state_indices=idx,
        use_qk_l2norm_in_kernel=True)

here:

    from gdnkit.torch.vllm import fused_sigmoid_gating_delta_rule_update
    # and vLLM's flavour of FLA's kernel (precomputed g and beta):
    from gdnkit.torch.vllm import fused_recurrent_gated_delta_rule

Same arguments and results, for one token per sequence (decode): q, k [B, T, H, K] and
v [B, T, HV, V] with B*T = N sequences ([N, 1, ...]; with cu_seqlens [0, 1, ..., N]
[1, N, ...] or [N, 1, ...]); a, b (or g, beta) [N, HV]; the state pool [slots, HV, V, K] (gdnkit's
"vk" layout, vLLM's current one; pass state_layout="kv" for releases whose pool is
[slots, HV, K, V]); ssm_state_indices [N] (or [N, T_max]) with -1 for padding rows, and
every slot up to null_block_id too (vLLM's null block: the default is the installed vLLM's
NULL_BLOCK_ID, 0 in releases that reserve slot 0 and skip slots <= 0; none where vLLM is
absent or defines none; read once a process, and a constant of torch.compile'd graphs;
pass null_block_id=None or an int to choose); returns
(o [B, T, HV, V] in q's dtype, final_state). fused_sigmoid_gating: g = -exp(A_log) *
softplus_beta(a + dt_bias), beta = sigmoid(b); l2norm x * rsqrt(sum x^2 + 1e-6) when
use_qk_l2norm_in_kernel.

Several tokens per sequence (speculative decoding), in one gdnkit call: dense q
[N, T, H, K] (a, b [N, T, HV] or [N*T, HV]), or with cu_seqlens q [1, total, H, K] (a, b
[total, HV]) holding rows of 0 to T tokens, T the columns of ssm_state_indices (without
it, the packed tokens), at most 16. Sequence n's tokens run in order on its state:
  - inplace_final_state=True: ssm_state_indices [N, T] gives every token a slot; sequence
    n starts from slot ssm_state_indices[n, num_accepted_tokens[n] - 1] (column 0 without
    num_accepted_tokens) and token t's state goes to slot ssm_state_indices[n, t] (a
    negative entry stores nothing). These are gdnkit's token_state_indices and
    num_accepted_tokens, passed through unchanged. With one slot a sequence (a 1-D table
    ssm_state_indices [N] and dense q, or no table: slot n) the row reads that slot and
    the state after its last token goes back to it (gdnkit's final-state mode); vLLM's
    kernel there stores token t at entry n + t, into the next sequences' slots.
  - inplace_final_state=False: the pool is not written; final_state is a new tensor
    [total tokens, HV, ...] (dense: [N*T, ...]) holding the state after every token at
    that token's position, as vLLM's kernel writes it. The N initial states (from the
    same slots as in place, or slot n without ssm_state_indices; zeros without
    initial_state) are copied into a pool behind those positions, which gdnkit's
    per-token slots then fill: one copy of N states besides the call.
The state is rounded to its dtype after every token (a store and a reload), each token's
output computed from the unrounded state, so the result is bitwise that of T one-token
calls chained through the pool on the same backend. Nothing synchronizes with the device: cu_seqlens (every
row within q, at most T tokens) is checked by torch's asynchronous assert, as for one
token below. On a GPU, a call whose tokens do not fit one block's shared memory is
refused (ValueError, nothing written; docs/operation.md, "Multi-token decode").

ssm_state_indices_output (keyword; vLLM's dual index, a double-buffered pool): the state
is read through ssm_state_indices and written through this table of the same shape
(one token: slot [n] or [n, 0]; several: token t's state to [n, t], the initial state
still read from ssm_state_indices[n, num_accepted_tokens[n] - 1]); None writes in place.
Column-strided 2-D tables are read as their contiguous copies.

Read as vLLM's kernels read them (its callers pass these uncut): index tables and
num_accepted_tokens with rows past the N sequences (the rows past N are never read: the
decodes of a mixed batch pass the whole table, the CUDA-graph spec path a padded one);
a, b (g, beta) for more tokens than q holds (only q's tokens' are read); with cu_seqlens,
q padded past cu_seqlens[-1] (the padding tokens' outputs left unwritten; a 1-D table then
means one token a sequence, run as one-token decode, cu_seqlens checked to be [0, 1, ...,
N] by the asynchronous assert);
num_accepted_tokens outside [1, T] makes the sequence padding: zero outputs, nothing read or
written (vLLM's current kernels mask such a count the same way).

Differences: padding rows get a zero output row (vLLM leaves them unwritten); a sequence
whose first slot is padding has every token's output zero and stores nothing; without
ssm_state_indices row n uses slot n (vLLM reads the slot of the row's first token
position out of place, and needs the table in place); num_accepted_tokens above T
makes the sequence padding, as above; out of place with
dense q and N > 1, final_state has N*T entries (vLLM allocates T and writes past them);
entries of final_state for padding sequences are left uninitialized, as vLLM leaves them.
Not supported (NotImplementedError): num_accepted_tokens with a 1-D table, a 1-D table
with packed rows of several tokens, is_kda=True, retrieve_parent_token (EAGLE trees),
softplus thresholds below 15. Per-channel beta [B, T, HV, V] (fused_recurrent_gated_delta_rule)
runs gdnkit's per-channel mode (its multi-token kernel). With one token per
sequence (1-D ssm_state_indices, as many tokens as sequences) cu_seqlens must be [0, 1,
..., N]: anything else fails torch's asynchronous assert (at once on the CPU, at the
stream's next synchronization on a GPU, before the step writes anything), so the call
never synchronizes with the device and never returns a silently wrong result.
"""
import importlib
import importlib.util
import sys

import torch

from . import _ops
from ._gates import check_packed_rows, check_unit_cu_seqlens, flat_indices, raw_gate_inputs

_WHO = "fused_sigmoid_gating_delta_rule_update"
_WHO_RECURRENT = "fused_recurrent_gated_delta_rule (vLLM)"


def _one_token_per_sequence(q, k, cu_seqlens, who):
    """N, the number of sequences. Without cu_seqlens [N, 1, ...]; with it [1, N, ...] or
    [N, 1, ...] (SGLang's decode) and cu_seqlens = [0, 1, ..., N], checked without a host sync."""
    B, T = k.shape[0], k.shape[1]
    if cu_seqlens is None:
        N = B
    else:
        N = cu_seqlens.shape[0] - 1
        if B != 1 and T != 1:
            raise ValueError(
                f"{who}: with cu_seqlens, q/k/v must be [1, N, H, K] or [N, 1, H, K]; got "
                f"{tuple(k.shape)}")
    if B * T != N:
        raise NotImplementedError(
            f"{who}: gdnkit runs one token per sequence (decode); got {B * T} tokens for "
            f"{N} sequences"
        )
    if cu_seqlens is not None:
        check_unit_cu_seqlens(cu_seqlens, N, who)
    return N


def _layout_id(state_layout):
    if isinstance(state_layout, str):
        return _ops.LAYOUTS[state_layout.lower()]
    return int(state_layout)


# null_block_id's default: the installed vLLM's own (read once, below)
AUTO = "auto"
_vllm_null_block = []


# (torch releases before torch.compiler.assume_constant_result have no compiler to tell)
_constant = getattr(getattr(torch, "compiler", None), "assume_constant_result", lambda f: f)


@_constant
def installed_null_block_id():
    """The installed vLLM's NULL_BLOCK_ID (vllm.v1.attention.backends.utils), or None where
    vLLM is absent or defines none. Read once, on the first call that needs it (under
    torch.compile, when the call is traced: a constant of the graph)."""
    if not _vllm_null_block:
        value = None
        if "vllm" in sys.modules or importlib.util.find_spec("vllm") is not None:
            try:
                value = int(importlib.import_module("vllm.v1.attention.backends.utils").NULL_BLOCK_ID)
            except (ImportError, AttributeError, TypeError, ValueError):
                value = None
        _vllm_null_block.append(value)
    return _vllm_null_block[0]


def _null_block(null_block_id):
    return installed_null_block_id() if isinstance(null_block_id, str) and null_block_id == AUTO \
        else null_block_id


def _padding(x, null_block_id):
    """x with the slots that releases marking padding with a null slot (<= null_block_id)
    use as -1, gdnkit's padding."""
    return x if null_block_id is None else torch.where(x <= null_block_id, -1, x)


def _first(x, n, dim):
    """x cut to its first n entries along dim, where it has more."""
    return x if x is None or x.ndim <= dim or x.shape[dim] <= n else x.narrow(dim, 0, n)


def _gate_tokens(x, n, like=None):
    """The first n tokens of a gate tensor, [tokens, HV] or [1, tokens, HV] (or a per-channel
    beta, [tokens, HV, V] or [1, tokens, HV, V], given a as `like`)."""
    return _first(x, n, 0 if (x if like is None else like).ndim == 2 else 1)


def _initial_slots(idx, num_accepted_tokens, T):
    """Each sequence's initial slot by vLLM's rule, idx[n, num_accepted_tokens[n] - 1]
    (column 0 without the counts), as int64; -1 where the count lies outside [1, T]."""
    rows = idx.shape[0]
    col = torch.zeros(rows, dtype=torch.int64, device=idx.device) if num_accepted_tokens is None \
        else num_accepted_tokens.to(idx.device, torch.int64).reshape(-1) - 1
    ok = (col >= 0) & (col < T)
    return torch.where(ok, torch.gather(idx.to(torch.int64), 1, col.clamp(0, T - 1)[:, None])[:, 0], -1)


def _slots(ssm_state_indices, num_accepted_tokens, null_block_id, who):
    """(read, write) slot vectors. vLLM reads ssm_state_indices[n, num_accepted_tokens[n] - 1]
    and, with T = 1, writes ssm_state_indices[n, 0]. None = row n uses slot n."""
    if ssm_state_indices is None:
        return None, None
    if ssm_state_indices.ndim == 1:
        if num_accepted_tokens is not None:
            raise NotImplementedError(f"{who}: num_accepted_tokens needs 2-D ssm_state_indices")
        read, write = flat_indices(ssm_state_indices), None
    else:
        write = flat_indices(ssm_state_indices[:, 0])
        if num_accepted_tokens is None:
            read, write = write, None
        else:
            col = (num_accepted_tokens.to(torch.int64) - 1).reshape(-1, 1)
            read = flat_indices(torch.gather(ssm_state_indices, 1, col))
    read = _padding(read, null_block_id)
    if write is not None:
        write = _padding(write, null_block_id)
    if write is not None and write.dtype != read.dtype:
        write = write.to(read.dtype)
    return read, write


def _several_tokens(k, cu_seqlens, ssm_state_indices):
    """Whether the call verifies several tokens per sequence (speculative decoding): dense
    q [N, T > 1, ...], a table of several slots per sequence, or packed rows whose token
    count is not the number of sequences."""
    if cu_seqlens is None:
        return k.shape[1] > 1
    if ssm_state_indices is not None and ssm_state_indices.ndim == 2 and ssm_state_indices.shape[1] > 1:
        return True
    return k.shape[0] * k.shape[1] != cu_seqlens.shape[0] - 1


def _index_like(x, ref):
    """x as a contiguous index vector in ref's dtype (the library reads every index array
    of a call in one dtype)."""
    x = x.reshape(-1)
    return x if x.dtype == ref.dtype and x.is_contiguous() else x.to(ref.dtype).contiguous()


def _decode_tokens(who, *, q, k, v, a, b, A_log, dt_bias, gate, scale, initial_state,
                   inplace_final_state, cu_seqlens, ssm_state_indices, num_accepted_tokens,
                   l2norm, layout, null_block_id, out_table=None):
    """Several tokens per sequence, as vLLM's spec decode, in one gdnkit call (see the module
    docstring): in place through the per-token slots of ssm_state_indices, or out of place
    into a new tensor of one state per token."""
    H, K = k.shape[-2:]
    HV, V = v.shape[-2:]
    dev = q.device
    idx = ssm_state_indices
    one_per_row = idx is not None and idx.ndim == 1 and cu_seqlens is not None
    # A 1-D table with dense q [N, T]: one slot a sequence, entry n, read and (in place)
    # written once with the state after the row's last token. (vLLM's kernel stores token
    # t of sequence n at entry n + t, the next sequences' slots.)
    one_slot = idx is not None and idx.ndim == 1 and cu_seqlens is None
    if one_per_row:
        # A 1-D table with packed rows: one token a sequence, entry n its slot, q padded past
        # cu_seqlens[-1] (a padded decode batch). vLLM's kernel reads token t of sequence n
        # at entry n + t, the next sequence's: rows of several tokens are refused below.
        idx = idx.reshape(-1, 1)
    elif idx is not None and idx.ndim != 2 and not one_slot:
        raise NotImplementedError(
            f"{who}: several tokens per sequence need ssm_state_indices [N] or [N, T]")
    if one_slot and num_accepted_tokens is not None:
        # vLLM would read entry n + num_accepted_tokens[n] - 1, another sequence's
        raise NotImplementedError(f"{who}: num_accepted_tokens needs ssm_state_indices [N, T]")
    if cu_seqlens is None:
        N, T = k.shape[0], k.shape[1]
        total = N * T
        if idx is not None and (idx.shape[0] != N or (idx.ndim == 2 and idx.shape[1] < T)):
            raise ValueError(f"{who}: q [B, T] = [{N}, {T}] does not fit ssm_state_indices "
                             f"{tuple(idx.shape)}")
    else:
        if k.shape[0] != 1:
            raise ValueError(
                f"The batch size is expected to be 1 rather than {k.shape[0]} when using "
                f"`cu_seqlens`. Please flatten variable-length inputs before processing.")
        N = cu_seqlens.shape[0] - 1
        total = k.shape[1]
        if idx is not None and idx.shape[0] != N:
            raise ValueError(f"{who}: cu_seqlens has {N} sequences, ssm_state_indices "
                             f"{idx.shape[0]}")
        # T bounds every row; the table's columns are the slots a row may use
        T = min(idx.shape[1] if idx is not None else max(total, 1), _ops.MAX_TOKENS)
        check_packed_rows(cu_seqlens, total, T, who, padded=True)
    if idx is not None:
        if idx.dtype not in (torch.int32, torch.int64):
            idx = idx.to(torch.int32)
        idx = _padding(idx, null_block_id)
    # q padded past N * T tokens (a padded batch): no row of at most T tokens reaches the
    # tokens past N * T, so the call takes the first N * T and the output its padding back
    # (unwritten, as vLLM leaves it).
    cap = min(total, N * T)
    out_shape = v.shape
    if cap < total:
        q, k, v = (x.narrow(1, 0, cap) for x in (q, k, v))
        a, b = _gate_tokens(a, cap), _gate_tokens(b, cap, like=a)

    def full(o):
        o = o.reshape(v.shape)
        if cap < total:
            o = torch.cat([o, o.new_empty((1, total - cap, *o.shape[2:]))], 1)
        return o.reshape(out_shape)

    step = dict(q=q, k=k, v=v, a=a, b=b, A_log=A_log, dt_bias=dt_bias, layout=layout,
                gate=gate, l2norm=l2norm, scale=float(scale), out_dtype=q.dtype, num_tokens=T)

    if inplace_final_state:
        if initial_state is None:
            raise ValueError(f"{who}: inplace_final_state=True needs initial_state (the state "
                             f"pool)")
        if idx is None or one_slot:
            # One slot a sequence (slot n without a table): the state after the row's last
            # token to it, or to ssm_state_indices_output[n] (a double-buffered pool)
            write = None if out_table is None else _padding(out_table.to(idx.dtype), null_block_id)
            o = _ops.decode_kw(
                **step, state=initial_state, state_indices=idx, state_out_indices=write,
                cu_seqlens=None if cu_seqlens is None else
                cu_seqlens.to(torch.int64 if idx is None else idx.dtype))
            return full(o), initial_state
        if out_table is not None:
            # Dual index: read slot idx[n, num_accepted[n] - 1] (column 0 without it), token
            # t's state to out_table[n, t]: gdnkit's state_indices and token_state_indices.
            if out_table.shape != idx.shape:
                raise ValueError(f"{who}: ssm_state_indices_output {tuple(out_table.shape)} must "
                                 f"match ssm_state_indices {tuple(idx.shape)}")
            read = _initial_slots(idx, num_accepted_tokens, T).to(idx.dtype)
            o = _ops.decode_kw(
                **step, state=initial_state, state_indices=read,
                token_state_indices=_padding(out_table.to(idx.dtype), null_block_id),
                cu_seqlens=None if cu_seqlens is None else _index_like(cu_seqlens, idx))
            return full(o), initial_state
        # The library's per-token slots are vLLM's: read slot idx[n, num_accepted[n] - 1],
        # token t's state to slot idx[n, t].
        o = _ops.decode_kw(
            **step, state=initial_state, token_state_indices=idx,
            num_accepted_tokens=None if num_accepted_tokens is None
            else _index_like(num_accepted_tokens, idx),
            cu_seqlens=None if cu_seqlens is None else _index_like(cu_seqlens, idx))
        return full(o), initial_state

    # Out of place: vLLM's final_state holds the state after every token at the token's
    # position ([total tokens, HV, ...]). One pool of total + N slots: the N initial states
    # copied behind the per-token slots, row n reading slot total + n and writing token t
    # to slot (start of row n) + t. Positions past a row's tokens are never consulted.
    slot_shape = ((HV, V, K) if layout == _ops.VK else (HV, K, V)) if initial_state is None \
        else tuple(initial_state.shape[1:])
    dtype = torch.float32 if initial_state is None else initial_state.dtype
    pool = torch.empty((total + N, *slot_shape), dtype=dtype, device=dev)
    rows = torch.arange(N, device=dev)
    if initial_state is None:
        pool[total:].zero_()
        read = rows + total
    else:
        # (num_accepted_tokens in [1, T], as in place)
        src = rows if idx is None else idx.to(torch.int64) if one_slot \
            else _initial_slots(idx, num_accepted_tokens, T)
        live = (src >= 0) & (src < initial_state.shape[0])
        pool[total:] = initial_state.index_select(0, torch.where(live, src, 0))
        read = torch.where(live, rows + total, -1)
    starts = rows * T if cu_seqlens is None else cu_seqlens[:-1].to(torch.int64)
    per_token = starts[:, None] + torch.arange(T, device=dev)[None, :]
    o = _ops.decode_kw(**step, state=pool, state_indices=read, token_state_indices=per_token,
                       cu_seqlens=None if cu_seqlens is None else cu_seqlens.to(torch.int64))
    return full(o), pool[:total]


def _what_vllm_reads(k, a, b, cu_seqlens, ssm_state_indices, num_accepted_tokens):
    """The parts of the inputs vLLM's kernels read, which callers pass uncut: its grid runs
    a program per sequence (N = len(cu_seqlens) - 1, or the batch), so the index tables'
    rows past N are never read (the mixed decode + prefill batch passes the whole table
    with the decodes' cu_seqlens; the CUDA-graph spec path a padded one); its gates are
    read at the tokens' positions, so a, b past q's tokens are never read (the spec path
    passes every scheduled token's)."""
    n_seq = k.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1
    tokens = k.shape[0] * k.shape[1]
    ssm_state_indices = _first(ssm_state_indices, n_seq, 0)
    num_accepted_tokens = _first(num_accepted_tokens, n_seq, 0)
    if k.shape[0] == 1:  # packed (or one-row) tokens: gates [tokens, HV] or [1, tokens, HV]
        a, b = _gate_tokens(a, tokens), _gate_tokens(b, tokens, like=a)
    return a, b, ssm_state_indices, num_accepted_tokens


def _decode(who, *, q, k, v, a, b, A_log, dt_bias, gate, scale, initial_state,
            inplace_final_state, cu_seqlens, ssm_state_indices, num_accepted_tokens,
            use_qk_l2norm_in_kernel, state_layout, null_block_id, ssm_state_indices_output=None):
    if scale is not None:
        assert scale > 0, "scale must be positive"
    a, b, ssm_state_indices, num_accepted_tokens = _what_vllm_reads(
        k, a, b, cu_seqlens, ssm_state_indices, num_accepted_tokens)
    out = ssm_state_indices_output
    if out is not None:
        # vLLM's dual index: the state read through ssm_state_indices, written through this
        # table of the same shape (a double-buffered pool); None = in place
        if ssm_state_indices is None:
            raise ValueError(f"{who}: ssm_state_indices_output needs ssm_state_indices")
        out = _first(out, ssm_state_indices.shape[0], 0)
        if out.ndim == 2 and out.stride(-1) != 1:
            out = out.contiguous()
        if ssm_state_indices.ndim == 2 and ssm_state_indices.stride(-1) != 1:
            ssm_state_indices = ssm_state_indices.contiguous()
        if out.shape != ssm_state_indices.shape:
            raise ValueError(f"{who}: ssm_state_indices_output {tuple(out.shape)} must match "
                             f"ssm_state_indices {tuple(ssm_state_indices.shape)}")
    n_seq = None if cu_seqlens is None else cu_seqlens.shape[0] - 1
    if (n_seq is not None and ssm_state_indices is not None and ssm_state_indices.ndim == 1
            and k.shape[0] == 1 and k.shape[1] > n_seq):
        # A padded decode batch (q past cu_seqlens[-1], a 1-D table): one token a sequence,
        # so the first N tokens through the one-token path (cu_seqlens checked to be
        # [0, 1, ..., N] there) and the output's padding back, unwritten as vLLM leaves it.
        shape = v.shape
        q, k, v = (x.narrow(1, 0, n_seq) for x in (q, k, v))
        a, b = _gate_tokens(a, n_seq), _gate_tokens(b, n_seq, like=a)
        o, final = _decode(who, q=q, k=k, v=v, a=a, b=b, A_log=A_log, dt_bias=dt_bias, gate=gate,
                           scale=scale, initial_state=initial_state,
                           inplace_final_state=inplace_final_state, cu_seqlens=cu_seqlens,
                           ssm_state_indices=ssm_state_indices,
                           num_accepted_tokens=num_accepted_tokens,
                           use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                           state_layout=state_layout, null_block_id=null_block_id,
                           ssm_state_indices_output=out)
        return torch.cat([o, o.new_empty((1, shape[1] - n_seq, *shape[2:]))], 1), final
    if _several_tokens(k, cu_seqlens, ssm_state_indices):
        return _decode_tokens(
            who, q=q, k=k, v=v, a=a, b=b, A_log=A_log, dt_bias=dt_bias, gate=gate,
            scale=k.shape[-1]**-0.5 if scale is None else scale,
            initial_state=initial_state, inplace_final_state=inplace_final_state,
            cu_seqlens=cu_seqlens, ssm_state_indices=ssm_state_indices,
            num_accepted_tokens=num_accepted_tokens,
            l2norm=_ops.RSQRT if use_qk_l2norm_in_kernel else _ops.NO_NORM,
            layout=_layout_id(state_layout), null_block_id=null_block_id,
            out_table=out if inplace_final_state else None)
    N = _one_token_per_sequence(q, k, cu_seqlens, who)
    K = k.shape[-1]
    HV, V = v.shape[-2], v.shape[-1]
    if scale is None:
        scale = K**-0.5
    layout = _layout_id(state_layout)
    l2norm = _ops.RSQRT if use_qk_l2norm_in_kernel else _ops.NO_NORM
    read_idx, write_idx = _slots(ssm_state_indices, num_accepted_tokens, null_block_id, who)
    if out is not None and inplace_final_state:
        # one token: its state to the output table's first column (vLLM's write slot)
        write_idx = _padding(flat_indices(out if out.ndim == 1 else out[:, 0]).to(read_idx.dtype),
                             null_block_id)

    def step(state, idx, out_idx):
        o = _ops.decode_kw(
            q=q, k=k, v=v, a=a, b=b, A_log=A_log, dt_bias=dt_bias, state=state,
            state_indices=idx, state_out_indices=out_idx, layout=layout, gate=gate,
            l2norm=l2norm, scale=float(scale), out_dtype=q.dtype)
        return o.reshape(v.shape)

    if inplace_final_state:
        if initial_state is None:
            raise ValueError(f"{who}: inplace_final_state=True needs initial_state (the state pool)")
        return step(initial_state, read_idx, write_idx), initial_state

    # Out of place: one new state per sequence, [N, HV, ...] in the pool's layout.
    if initial_state is None:
        shape = (N, HV, V, K) if layout == _ops.VK else (N, HV, K, V)
        final_state = torch.zeros(shape, dtype=torch.float32, device=q.device)
        return step(final_state, None, None), final_state
    if read_idx is None:
        final_state = initial_state[:N].clone(memory_format=torch.contiguous_format)
        return step(final_state, None, None), final_state
    slots = initial_state.shape[0]
    valid = (read_idx >= 0) & (read_idx < slots)
    final_state = initial_state.index_select(0, torch.where(valid, read_idx, 0).to(torch.int64))
    local = torch.where(valid, torch.arange(N, device=read_idx.device, dtype=read_idx.dtype), -1)
    return step(final_state, local, None), final_state


def fused_sigmoid_gating_delta_rule_update(
    A_log,
    a,
    b,
    dt_bias,
    q,
    k,
    v,
    beta=1.0,
    threshold=20.0,
    scale=None,
    initial_state=None,
    inplace_final_state=True,
    cu_seqlens=None,
    ssm_state_indices=None,
    num_accepted_tokens=None,
    use_qk_l2norm_in_kernel=False,
    is_kda=False,
    *,
    ssm_state_indices_output=None,
    state_layout="vk",
    null_block_id=AUTO,
):
    """vLLM's signature and semantics, one or several tokens per sequence; returns (o, final_state)."""
    if is_kda:
        raise NotImplementedError(f"{_WHO}: is_kda=True (per-channel KDA gates) is not supported by gdnkit")
    A_log, a, b, dt_bias = raw_gate_inputs(A_log, a, b, dt_bias, beta, threshold, _WHO)
    null_block_id = _null_block(null_block_id)
    return _decode(_WHO, q=q, k=k, v=v, a=a, b=b, A_log=A_log, dt_bias=dt_bias, gate=_ops.RAW,
                   scale=scale, initial_state=initial_state,
                   inplace_final_state=inplace_final_state, cu_seqlens=cu_seqlens,
                   ssm_state_indices=ssm_state_indices, num_accepted_tokens=num_accepted_tokens,
                   use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, state_layout=state_layout,
                   null_block_id=null_block_id, ssm_state_indices_output=ssm_state_indices_output)


def fused_recurrent_gated_delta_rule(
    q,
    k,
    v,
    g,
    beta=None,
    scale=None,
    initial_state=None,
    inplace_final_state=True,
    cu_seqlens=None,
    ssm_state_indices=None,
    num_accepted_tokens=None,
    retrieve_parent_token=None,
    use_qk_l2norm_in_kernel=False,
    *,
    ssm_state_indices_output=None,
    state_layout="vk",
    null_block_id=AUTO,
):
    """vLLM's fused_recurrent_gated_delta_rule (g in log space and beta precomputed, continuous
    batching over a state pool), one or several tokens per sequence; returns (o, final_state)."""
    if retrieve_parent_token is not None:
        raise NotImplementedError(f"{_WHO_RECURRENT}: retrieve_parent_token (EAGLE trees) is not supported by gdnkit")
    if beta is None:
        beta = torch.ones(v.shape[:-1], dtype=g.dtype, device=v.device)
    if g.dtype != beta.dtype:
        g, beta = g.float(), beta.float()
    if g.stride(-1) != 1:
        g = g.contiguous()
    if beta.stride(-1) != 1:
        beta = beta.contiguous()
    null_block_id = _null_block(null_block_id)
    return _decode(_WHO_RECURRENT, q=q, k=k, v=v, a=g, b=beta, A_log=None, dt_bias=None,
                   gate=_ops.PRECOMPUTED, scale=scale, initial_state=initial_state,
                   inplace_final_state=inplace_final_state, cu_seqlens=cu_seqlens,
                   ssm_state_indices=ssm_state_indices, num_accepted_tokens=num_accepted_tokens,
                   use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, state_layout=state_layout,
                   null_block_id=null_block_id, ssm_state_indices_output=ssm_state_indices_output)


__all__ = ["fused_sigmoid_gating_delta_rule_update", "fused_recurrent_gated_delta_rule"]
