"""gdnkit.decode with several tokens a row (docs/operation.md, "Multi-token decode") on
numpy arrays (the host backend): one call against the same tokens as one-token calls
chained through the pool, which the library makes bitwise equal, for every way the states
go (final write slots, per-token slots with num_accepted_tokens, the intermediate buffers
with update_state=False), dense and packed (cu_seqlens) rows, the three input forms and
the fused conv1d prologue and gated RMSNorm. The float64 reference of several tokens is
the golden files' (test_numpy_step.py runs the version 3 cases). Refused calls write
nothing."""
import numpy as np
import pytest

import gdnkit
from numpy_cases import make_case, make_multi_case, multi_inputs, run_chained, run_multi

MULTI_CASES = {
    # name: make_multi_case arguments
    "final_f32_kv": dict(mode="final", qkv="f32", state="f32", layout="kv"),
    "final_bf16_vk_packed_form": dict(mode="final", qkv="bf16", state="bf16", layout="vk",
                                      form="packed", Hk=2, G=2),
    "final_f16_kv_flat_form_i64": dict(mode="final", qkv="f16", state="f16", layout="kv",
                                       form="flat", index="i64", T=4),
    "final_cu_seqlens_bf16_vk": dict(mode="final", lengths=[2, 1, 0, 3], B=4, T=3, qkv="bf16",
                                     state="f32", layout="vk"),
    "final_precomputed_tiled_max_norm": dict(mode="final", gate="precomputed", head_map="tiled",
                                             l2="max_norm", Hk=2, G=2, scale=0.3, T=2),
    "token_slots_f32_vk": dict(mode="token_slots", qkv="f32", state="f32", layout="vk", T=4),
    "token_slots_i64_bf16_kv": dict(mode="token_slots", index="i64", qkv="bf16", state="bf16",
                                    layout="kv"),
    "token_slots_cu_seqlens_f16": dict(mode="token_slots", lengths=[3, 2, 1], qkv="f16",
                                       state="f16", layout="vk", form="packed"),
    "intermediate_f32_vk": dict(mode="intermediate", qkv="bf16", state="f32", layout="vk"),
    "intermediate_cu_seqlens_bf16_kv": dict(mode="intermediate", lengths=[1, 3, 2], B=3, T=3,
                                            qkv="bf16", state="bf16", layout="kv", form="flat"),
    "conv_norm_token_slots_bf16_vk": dict(mode="token_slots", conv=True, norm=True, W=4,
                                          qkv="bf16", state="bf16", layout="vk", tap_major=True),
    "conv_intermediate_f16_kv_w3": dict(mode="intermediate", conv=True, W=3, qkv="f16",
                                        state="f16", layout="kv", bias=False),
    "conv_final_cu_seqlens_f32_w2": dict(mode="final", conv=True, norm=True, W=2, qkv="f32",
                                         lengths=[2, 0, 2], T=2, layout="vk"),
    "norm_final_out_f32_from_bf16": dict(mode="final", norm=True, qkv="bf16", out="f32",
                                         state="bf16", layout="kv"),
}


@pytest.mark.parametrize("name", sorted(MULTI_CASES))
def test_multi_token_equals_chained_one_token_calls(name):
    c = make_multi_case(sum(map(ord, name)), **MULTI_CASES[name])
    got = run_multi(c)
    want = run_chained(c)
    out, pool, conv_state, inter, inter_conv, counter = got
    shape = (c["rows"],) if c["cu"] is not None else (c["B"], c["T"])
    assert out.shape == shape + (c["Hv"], c["Dv"])
    for what, x, y in zip(("output", "state pool", "conv pool", "intermediate states",
                           "intermediate conv states"), got[:5], want[:5]):
        if y is None:
            assert x is None, what
        else:
            assert np.array_equal(x, y), f"{what}: not bitwise the chained one-token calls"
    assert int(counter[0]) == 0
    # the padding row (row 1): all its tokens' outputs zero
    pad = out[c["cu"][1]:c["cu"][2]] if c["cu"] is not None else out[1]
    assert not np.any(pad)
    assert np.any(out), "no output at all"
    if c["mode"] == "intermediate":
        assert np.array_equal(pool, c["pool"]), "update_state=False wrote the pool"
        assert np.array_equal(inter[1], c["inter"][1]), "a padding row's blocks changed"
        assert not np.array_equal(inter, c["inter"]), "no intermediate state written"
    else:
        assert not np.array_equal(pool, c["pool"]), "no state written"


def test_token_dimension_from_the_shapes():
    """T from a [B, T, Hv] (both dimensions other than 1) or from token_state_indices; a
    [1, N, ...] input without either is N rows of one token, as before."""
    c = make_multi_case(5, mode="final", B=2, T=3, qkv="f32", state="f32", layout="vk")
    want = run_multi(c)
    got = run_multi(c, num_tokens=None)
    assert all(np.array_equal(x, y) for x, y in zip(got[:2], want[:2]))
    # B = 1: [1, T, ...] is one row of T tokens only with num_tokens
    one = make_multi_case(6, mode="token_slots", B=2, T=3, qkv="f32", state="f32", layout="vk")
    inputs = {n: x[:1] for n, x in (("q", one["q"]), ("k", one["k"]), ("v", one["v"]),
                                    ("a", one["a"]), ("b", one["b"]))}
    shaped = {n: x.reshape(1, 1, *x.shape[1:]) for n, x in inputs.items()}  # [1, 1, ...]
    assert gdnkit.decode(**shaped, state=one["pool"].copy(), A_log=one["A_log"],
                         dt_bias=one["dt_bias"], layout="vk").shape == (1, one["Hv"], one["Dv"])
    q3 = one["q"][:3].reshape(1, 3, *one["q"].shape[1:])
    args = dict(q=q3, k=one["k"][:3].reshape(q3.shape), v=one["v"][:3].reshape(1, 3, -1, one["Dv"]),
                a=one["a"][:3].reshape(1, 3, -1), b=one["b"][:3].reshape(1, 3, -1),
                A_log=one["A_log"], dt_bias=one["dt_bias"], layout="vk")
    rows = gdnkit.decode(**args, state=one["pool"].copy())  # three rows of one token
    assert rows.shape == (3, one["Hv"], one["Dv"])
    tsi = one["tsi"][:1].copy()
    tsi[0, 0] = 4
    p1, p2 = one["pool"].copy(), one["pool"].copy()
    o1 = gdnkit.decode(**args, state=p1, token_state_indices=tsi)  # T from its columns
    o2 = gdnkit.decode(**args, state=p2, token_state_indices=tsi, num_tokens=3)
    assert o1.shape == (1, 3, one["Hv"], one["Dv"])
    assert np.array_equal(o1, o2) and np.array_equal(p1, p2)


def test_bad_rows_counted_and_skipped():
    """A cu_seqlens range past the packed tokens, or num_accepted_tokens outside [1, T], is
    the caller's bug: counted, and that row reads and writes nothing."""
    c = make_multi_case(7, mode="token_slots", lengths=[2, 1, 2], T=2, qkv="f32", state="f32",
                        layout="kv")
    c["acc"] = np.array([1, 1, 3], c["itype"])  # row 2: 3 > T
    out, pool, _, _, _, counter = run_multi(c)
    assert int(counter[0]) == 1
    for s in c["tsi"][2]:
        assert np.array_equal(pool[s], c["pool"][s])
    assert not np.any(out[3:5])  # row 2 is padding
    c2 = make_multi_case(8, mode="final", lengths=[1, 2, 1], T=2, qkv="f32", state="f32",
                         layout="vk")
    cu = c2["cu"].copy()
    cu[3] = 9  # past the 4 tokens: row 2's range is refused, counted
    out, pool, _, _, _, counter = run_multi(c2, cu_seqlens=cu)
    assert int(counter[0]) == 1
    w = c2["write"][2]
    if w >= 0:
        assert np.array_equal(pool[w], c2["pool"][w])


def snapshot(*arrays):
    return [None if x is None else x.copy() for x in arrays]


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda c, kw: kw.update(num_tokens=17), r"^num_tokens: must be in \[1, 16\], got 17$"),
        (lambda c, kw: kw.update(num_tokens=2), r"^a: 9 tokens are not B rows of num_tokens=2$"),
        (lambda c, kw: kw.update(q=kw["q"][:, :2]), r"^q: shape \(3, 2, 1, 64\) does not hold"),
        (lambda c, kw: kw.update(update_state=False),
         r"^update_state: false with token_state_indices"),
        (lambda c, kw: kw.update(num_accepted_tokens=kw["num_accepted_tokens"].astype(np.int64)),
         r"^num_accepted_tokens: dtype int64 differs from token_state_indices' int32"),
        (lambda c, kw: kw.update(token_state_indices=kw["token_state_indices"][:, :2]),
         r"^token_state_indices: expected shape \(B=3, T=3\)"),
        (lambda c, kw: kw.update(intermediate_states=np.zeros((3, 3, 2, 64, 64), np.float16)),
         r"^intermediate_states: dtype float16 differs from state's float32"),
        (lambda c, kw: kw.update(intermediate_states=np.zeros((3, 2, 2, 64, 64), np.float32)),
         r"^intermediate_states: expected shape \(B=3, T=3 or more"),
        (lambda c, kw: kw.update(
            intermediate_states=np.zeros((3, 3, 2, 64, 128), np.float32)[..., ::2]),
         r"^intermediate_states: every token's block must be dense"),
        (lambda c, kw: kw.update(intermediate_conv_states=np.zeros((3, 3, 256, 3), np.float32)),
         r"^intermediate_conv_states: given without x"),
        (lambda c, kw: kw.update(cu_seqlens=np.array([0, 3, 6, 9], np.int32)),
         r"^a: shape \(3, 3, 2\) does not hold the call's tokens: expected \[total_tokens, "
         r"Hv\] or \[1, total_tokens, Hv\] with total_tokens=9$"),
        (lambda c, kw: kw.update({n: kw[n].reshape(9, *kw[n].shape[2:]) for n in "qkvab"},
                                 out=kw["out"].reshape(9, 2, 64),
                                 cu_seqlens=np.array([0, 3, 6, 9], np.int32), num_tokens=2),
         r"^total_tokens: must be in \[0, batch\*num_tokens=6\], got 9$"),
    ],
)
def test_refused_and_nothing_written(change, message):
    c = make_multi_case(9, mode="token_slots", B=3, T=3, qkv="f32", state="f32", layout="vk")
    pool = c["pool"].copy()
    out = np.full((3, 3, c["Hv"], c["Dv"]), 5.0, np.float32)
    kw = dict(multi_inputs(c), A_log=c["A_log"], dt_bias=c["dt_bias"], layout="vk", out=out,
              token_state_indices=c["tsi"], num_accepted_tokens=c["acc"])
    change(c, kw)
    written = [pool, out] + [x for x in (kw.get("intermediate_states"),) if x is not None]
    before = snapshot(*written)
    with pytest.raises(ValueError, match=message):
        gdnkit.decode(state=pool, **kw)
    assert all(np.array_equal(x, y) for x, y in zip(before, written))


def test_one_token_calls_unchanged_by_the_multi_token_arguments():
    """T = 1 with none of the multi-token arguments is the one-token call it always was;
    passing num_tokens=1 changes nothing."""
    c = make_case(11, B=3, Hk=1, G=2, layout="vk", indices="i32", pool_extra=2)
    p1, p2 = c["pool"].copy(), c["pool"].copy()
    kw = dict(A_log=c["A_log"], dt_bias=c["dt_bias"], layout="vk", state_indices=c["idx"])
    o1 = gdnkit.decode(c["q"], c["k"], c["v"], c["a"], c["b"], p1, **kw)
    o2 = gdnkit.decode(c["q"], c["k"], c["v"], c["a"], c["b"], p2, num_tokens=1, **kw)
    assert o1.shape == (3, c["Hv"], c["Dv"])
    assert np.array_equal(o1, o2) and np.array_equal(p1, p2)
