"""Validation of gdnkit.decode on numpy arrays: bad arguments raise ValueError with the
library's message (or the extension's), and nothing is written."""
import numpy as np
import pytest

import gdnkit
from numpy_cases import make_case, make_middle_case


# ---- validation: ValueError with the library's message, nothing written ------------------

def snapshot(*arrays):
    return [x.copy() for x in arrays]


def unchanged(before, *arrays):
    return all(np.array_equal(x, y) for x, y in zip(before, arrays))


def base():
    c = make_case(20, B=2, Hk=1, G=2, Dk=64, Dv=64, layout="vk")
    pool = c["pool"].copy()
    out = np.full((2, 2, 64), 3.0, np.float32)
    kw = dict(A_log=c["A_log"], dt_bias=c["dt_bias"], out=out, layout="vk")
    return c, pool, out, kw


def test_library_message_head_stride():
    c, pool, out, kw = base()
    # v whose heads are 48 elements apart while Dv = 64: the library's own check.
    buf = np.zeros(2 * 2 * 64 + 64, np.float32)
    v = np.lib.stride_tricks.as_strided(buf, shape=(2, 2, 64), strides=(2 * 64 * 4, 48 * 4, 4))
    before = snapshot(pool, out)
    with pytest.raises(ValueError, match=r"^v: head stride 48 is smaller than Dv=64$"):
        gdnkit.decode(c["q"], c["k"], v, c["a"], c["b"], pool, **kw)
    assert unchanged(before, pool, out)


def test_library_message_aliasing():
    c, pool, out, kw = base()
    # q living inside the state pool: outputs must not alias inputs.
    q = pool.reshape(-1)[: c["q"].size].reshape(c["q"].shape)
    before = snapshot(pool, out)
    with pytest.raises(ValueError, match=r"^state: memory overlaps input q"):
        gdnkit.decode(q, c["k"], c["v"], c["a"], c["b"], pool, **kw)
    assert unchanged(before, pool, out)


def test_library_message_head_dims():
    rng = np.random.default_rng(3)
    q = rng.standard_normal((1, 1, 24)).astype(np.float32)
    v = rng.standard_normal((1, 2, 32)).astype(np.float32)
    a = np.zeros((1, 2), np.float32)
    pool = np.ones((1, 2, 32, 24), np.float32)
    before = snapshot(pool)
    with pytest.raises(ValueError, match=r"^head_dim_k: 24 is not a multiple of 16"):
        gdnkit.decode(q, q, v, a, a, pool, A_log=np.zeros(2, np.float32),
                      dt_bias=np.zeros(2, np.float32))
    assert unchanged(before, pool)


def test_library_message_heads_not_multiple():
    rng = np.random.default_rng(4)
    q = rng.standard_normal((1, 2, 32)).astype(np.float32)
    v = rng.standard_normal((1, 3, 32)).astype(np.float32)
    a = np.zeros((1, 3), np.float32)
    pool = np.ones((1, 3, 32, 32), np.float32)
    with pytest.raises(ValueError, match=r"^num_v_heads: 3 is not a multiple of num_k_heads=2$"):
        gdnkit.decode(q, q, v, a, a, pool, A_log=np.zeros(3, np.float32),
                      dt_bias=np.zeros(3, np.float32))


def test_library_message_small_pool():
    c, pool, out, kw = base()
    small = pool[:1].copy()
    before = snapshot(small, out)
    with pytest.raises(ValueError, match=r"^num_slots: 1 is smaller than batch=2"):
        gdnkit.decode(c["q"], c["k"], c["v"], c["a"], c["b"], small, **kw)
    assert unchanged(before, small, out)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda c, kw: kw.update(dt_bias=c["dt_bias"].astype(np.float64)),
         r"^dt_bias: dtype must be float32, got float64$"),
        (lambda c, kw: kw.update(A_log=c["A_log"][:1]), r"^A_log: expected shape \(2,\)"),
        (lambda c, kw: kw.update(A_log=None), r"^A_log: required with the raw gate$"),
        (lambda c, kw: c.update(v=c["v"][:, :, :32]), r"^v: shape \(2, 2, 32\) does not match"),
        (lambda c, kw: c.update(k=c["k"].astype(np.float16)), r"^q, k, v: dtypes"),
        (lambda c, kw: c.update(b=c["b"].astype(np.float16)), r"^b: dtype float16 differs"),
        (lambda c, kw: c.update(a=c["a"][:1]), r"^b: shape \(2, 2\) does not match a \(1, 2\)$"),
        (lambda c, kw: c.update(a=c["a"][:1], b=c["b"][:1]),
         r"^q, k, v: 2 and 2 rows, but a has 1$"),
        (lambda c, kw: c.update(q=c["q"].astype(np.float64), k=c["k"].astype(np.float64),
                                v=c["v"].astype(np.float64)),
         r"^q: dtype float64 is not supported"),
        (lambda c, kw: c.update(q=np.asfortranarray(c["q"])),
         r"^q: the last dimension must be contiguous"),
        (lambda c, kw: kw.update(state_indices=np.array([0, 1], np.uint8)),
         r"^state_indices: dtype must be int32 or int64, got uint8$"),
        (lambda c, kw: kw.update(state_indices=np.array([0, 1], np.int32),
                                 state_out_indices=np.array([0, 1], np.int64)),
         r"^state_out_indices: dtype int64 differs"),
        (lambda c, kw: kw.update(state_out_indices=np.array([0, 1], np.int32)),
         r"^state_out_indices: given without state_indices$"),
        (lambda c, kw: kw.update(out=np.zeros((2, 2, 64), np.float32)[:, :1]),
         r"^out: shape \(2, 1, 64\), expected"),
        (lambda c, kw: kw.update(invalid_index_count=np.zeros(2, np.uint32)),
         r"^invalid_index_count: expected one uint32"),
        (lambda c, kw: kw.update(layout="dv"), r"^layout: unknown value 'dv'"),
        (lambda c, kw: kw.update(l2norm="l1"), r"^l2norm: unknown value 'l1'"),
        (lambda c, kw: kw.update(scale=float("nan")), r"^scale: must be finite, got nan$"),
        (lambda c, kw: kw.update(l2norm_eps=-1.0), r"^l2norm_eps: must be finite and >= 0"),
    ],
)
def test_refused_and_nothing_written(change, message):
    c, pool, out, kw = base()
    change(c, kw)
    before = snapshot(pool, out)
    with pytest.raises(ValueError, match=message):
        gdnkit.decode(c["q"], c["k"], c["v"], c["a"], c["b"], pool, **kw)
    assert unchanged(before, pool, out)


def middle_base():
    c = make_middle_case(30, B=2, Hk=1, G=2, Dk=64, Dv=64, layout="vk", W=4)
    kw = dict(x=c["x"], conv_state=c["conv_state"].copy(), conv_weight=c["conv_weight"],
              conv_bias=c["conv_bias"], z=c["z"], norm_weight=c["norm_weight"],
              A_log=c["A_log"], dt_bias=c["dt_bias"], out=np.full((2, 2, 64), 3.0, np.float32),
              layout="vk")
    return c, c["pool"].copy(), kw


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda c, kw: kw.update(qkv=np.zeros((2, 256), np.float32)), r"^x: give either x"),
        (lambda c, kw: kw.update(q=c["q"], k=c["k"], v=c["v"]), r"^x: give either x"),
        (lambda c, kw: kw.update(conv_state=None), r"^conv_state: required with x"),
        (lambda c, kw: kw.update(conv_weight=None), r"^conv_weight: required with x"),
        (lambda c, kw: kw.update(x=None, q=c["q"], k=c["k"], v=c["v"]),
         r"^conv_state: given without x"),
        (lambda c, kw: kw.update(x=None, conv_state=None, conv_weight=None, q=c["q"], k=c["k"],
                                 v=c["v"]),
         r"^conv_bias: given without x"),
        (lambda c, kw: kw.update(x=c["x"][:, :200]),
         r"^x: width 200 is not 2\*Hk\*Dk \+ Hv\*Dv"),
        (lambda c, kw: kw.update(conv_weight=np.zeros((256, 5), np.float32)),
         r"^conv_weight: width W=5 \(its last dimension\) is not 2, 3 or 4$"),
        (lambda c, kw: kw.update(conv_weight=np.zeros((255, 4), np.float32)),
         r"^conv_weight: expected \(conv_dim=256, W\)"),
        (lambda c, kw: kw.update(conv_weight=np.zeros((4, 256), np.float32).T),
         r"^conv_weight: must be contiguous"),
        (lambda c, kw: kw.update(conv_weight=c["conv_weight"].astype(np.float16)),
         r"^conv_weight: dtype float16 differs from x's float32"),
        (lambda c, kw: kw.update(conv_bias=c["conv_bias"][:128]),
         r"^conv_bias: expected shape \(256,\)"),
        (lambda c, kw: kw.update(conv_state=np.zeros((2, 256, 4), np.float32)),
         r"^conv_state: expected \(num_slots, conv_dim=256, W-1=3\)"),
        (lambda c, kw: kw.update(conv_state=np.zeros((1, 256, 3), np.float32)),
         r"^conv_state: 1 slots, fewer than the state pool's 2$"),
        (lambda c, kw: kw.update(conv_state=np.zeros((2, 256, 3), np.float16)),
         r"^conv_state: dtype float16 differs from x's float32"),
        (lambda c, kw: kw.update(conv_state=np.zeros((2, 3, 256, 2), np.float32)[:, :, :, 0]
                                 .transpose(0, 2, 1)),
         r"^conv_state: channel stride 2 and tap stride 512 overlap"),
        (lambda c, kw: kw.update(norm_weight=None), r"^norm_weight: required with z"),
        (lambda c, kw: kw.update(z=None), r"^z: required with norm_weight"),
        (lambda c, kw: kw.update(norm_weight=c["norm_weight"][:32]),
         r"^norm_weight: expected shape \(64,\)"),
        (lambda c, kw: kw.update(z=c["z"].astype(np.float16)),
         r"^z: dtype float16 differs from x's float32"),
        (lambda c, kw: kw.update(z=c["z"][:, :1]),
         r"^z: shape \(2, 1, 64\), expected \[B=2, Hv=2, Dv=64\]"),
        (lambda c, kw: kw.update(norm_eps=float("inf")), r"^norm_eps: must be finite and >= 0"),
    ],
)
def test_middle_refused_and_nothing_written(change, message):
    c, pool, kw = middle_base()
    change(c, kw)
    written = [x for x in (pool, kw["out"], kw["conv_state"]) if x is not None]
    before = snapshot(*written)
    with pytest.raises(ValueError, match=message):
        gdnkit.decode(a=c["a"], b=c["b"], state=pool, **kw)
    assert unchanged(before, *written)


def test_middle_conv_state_read_only_refused():
    c, pool, kw = middle_base()
    kw["conv_state"].setflags(write=False)
    with pytest.raises(ValueError, match=r"^conv_state: the array is read-only"):
        gdnkit.decode(a=c["a"], b=c["b"], state=pool, **kw)


def test_middle_conv_state_aliasing_refused():
    """The conv pool overlapping the state pool: the library's own check."""
    c, pool, kw = middle_base()
    big = np.zeros(pool.size + 2 * 256 * 3, np.float32)
    big[: pool.size] = pool.reshape(-1)
    pool_view = big[: pool.size].reshape(pool.shape)
    kw["conv_state"] = big[pool.size - 256 * 3: pool.size + 256 * 3].reshape(2, 256, 3)
    before = snapshot(big)
    with pytest.raises(ValueError, match=r"overlaps"):
        gdnkit.decode(a=c["a"], b=c["b"], state=pool_view, **kw)
    assert unchanged(before, big)


def test_state_layout_must_be_dense():
    c, pool, out, kw = base()
    transposed = np.ascontiguousarray(pool.transpose(0, 1, 3, 2)).transpose(0, 1, 3, 2)
    before = snapshot(transposed, out)
    with pytest.raises(ValueError, match=r"^state: every slot's \[Hv, Dv, Dk\] block must be dense"):
        gdnkit.decode(c["q"], c["k"], c["v"], c["a"], c["b"], transposed, **kw)
    assert unchanged(before, transposed, out)


def test_read_only_state_refused():
    c, pool, out, kw = base()
    pool.setflags(write=False)
    with pytest.raises(ValueError, match=r"^state: the array is read-only"):
        gdnkit.decode(c["q"], c["k"], c["v"], c["a"], c["b"], pool, **kw)


def test_read_only_inputs_accepted():
    c, pool, out, kw = base()
    for name in ("q", "k", "v", "a", "b"):
        c[name].setflags(write=False)
    gdnkit.decode(c["q"], c["k"], c["v"], c["a"], c["b"], pool, **kw)


def test_not_an_array():
    c, pool, out, kw = base()
    with pytest.raises(ValueError, match=r"^q: expected an array with DLPack"):
        gdnkit.decode([[1.0]], c["k"], c["v"], c["a"], c["b"], pool, **kw)


def test_info():
    info = gdnkit.info()
    assert info["version"] == gdnkit.__version__
    assert info["backends"]["host"]["built"] and info["backends"]["host"]["available"]
    assert gdnkit.backend_built("host")
