"""The cases gen_golden.py writes: the options of a case and their defaults
(DEFAULTS), the standard set (CASES, tests/golden) and random cases
(random_case; random_case_multi for format version 3; describe). Python 3 and
numpy only.
"""

import numpy as np


# ---------------------------------------------------------------------------
# the options of a case (gen_golden.py's build_case reads them)
# ---------------------------------------------------------------------------


DEFAULTS = dict(
    B=2, Hk=1, Hv=2, Dk=64, Dv=64,
    dtype="F32",            # q, k, v (or mixed_qkv), a, b
    state_dtype="F32",
    output_dtype=None,      # None: same as dtype
    layout="kv",
    l2norm="rsqrt", eps=1e-6,
    scale=None,             # None: Dk^-0.5 (still written explicitly)
    head_map="interleaved",
    gate="raw",
    packed=False,           # mixed_qkv instead of q, k, v
    num_slots=None,         # None: B
    index_dtype=None,       # "I32" / "I64" when indices are given
    state_indices=None,
    state_out_indices=None,
    expected_state_dtype=None,  # None: F64 for an F32 state, F32 for an F16/BF16 state (see below)
    tweak=None,             # name of an input override below
    meta_style="full",      # "full" | "minimal" | "aliases_unsqueezed" | "aliases_flat"
    # format version 2: the optional stages
    conv_width=0,           # W in {2, 3, 4}: x and the conv1d prologue instead of q, k, v; 0: none
    conv_bias=True,         # with conv: a conv_bias tensor
    conv_state_layout="channel_major",  # conv pool stored (S, conv_dim, W-1), or "tap_major" (S, W-1, conv_dim)
    norm=False,             # the gated RMSNorm epilogue (z, norm_weight)
    norm_eps=1e-6,
    v2_defaults=False,      # leave conv_state_layout and norm_eps out of the metadata (their defaults),
                            # store conv_weight as torch's (conv_dim, 1, W), x as (B, 1, conv_dim),
                            # z as (B, Hv*Dv)
    # format version 3: several tokens per row (speculative decoding)
    num_tokens=None,        # T: a version 3 case with up to T tokens per row; None: one token, version 1/2
    cu_seqlens=None,        # (B + 1) offsets: packed tokens, row b owns [cu[b], cu[b+1]); None: dense (B, T)
    token_state_indices=None,  # (B, T) per-token write slots (vLLM), as lists
    num_accepted_tokens=None,  # (B): row b reads token_state_indices[b][n - 1]
    update_state=True,      # False: neither pool is written (FlashInfer's disable_state_update)
    intermediate=False,     # write expected_intermediate_states (every token's state, a dense buffer)
    intermediate_conv=False,  # write expected_intermediate_conv_states (every token's conv window)
    beta_per_channel=False,  # (gate precomputed) b holds one beta a column: (B, T, Hv, Dv)
)


# ---------------------------------------------------------------------------
# the standard set
# ---------------------------------------------------------------------------

def _dtype_cases():
    """The 9 input-dtype x state-dtype combinations, spread over layouts, G and B; fp32 in both layouts."""
    combos = [  # (inputs, state, layout, B, Hk, Hv)
        ("F32", "F32", "kv", 2, 1, 2), ("F32", "F16", "vk", 2, 1, 2), ("F32", "BF16", "kv", 2, 1, 3),
        ("F16", "F32", "vk", 1, 1, 2), ("F16", "F16", "kv", 1, 2, 4), ("F16", "BF16", "vk", 1, 1, 3),
        ("BF16", "F32", "kv", 2, 1, 1), ("BF16", "F16", "vk", 2, 1, 2), ("BF16", "BF16", "kv", 1, 2, 4),
        ("F32", "F32", "vk", 2, 1, 2),
    ]
    cases = []
    for i, (dt, st, lay, b, hk, hv) in enumerate(combos):
        cases.append((
            f"dtype_{dt.lower()}_state_{st.lower()}_{lay}", 1000 + i,
            f"inputs {dt}, state {st}, output {dt}, layout {lay}, B={b} Hk={hk} Hv={hv} (G={hv // hk}), Dk=Dv=64",
            dict(dtype=dt, state_dtype=st, layout=lay, B=b, Hk=hk, Hv=hv)))
    return cases


# The standard set. Each entry: name, seed, description, options (see DEFAULTS: B=2 Hk=1 Hv=2
# Dk=Dv=64, everything F32, layout kv, rsqrt, default scale, interleaved, raw gate, no indices).
CASES = _dtype_cases() + [
    ("output_f32_from_bf16_vk", 1100,
     "inputs BF16, state BF16, output written as F32 (output dtype differs from the inputs), layout vk",
     dict(dtype="BF16", state_dtype="BF16", output_dtype="F32", layout="vk", B=2, Hk=1, Hv=2)),
    ("output_f16_from_f32_kv", 1101,
     "inputs F32, state F32, output written as F16 (output dtype differs from the inputs), B=1, layout kv",
     dict(dtype="F32", state_dtype="F32", output_dtype="F16", layout="kv", B=1, Hk=1, Hv=2)),

    ("dk64_dv128_kv", 1200, "Dk=64, Dv=128 (Dk != Dv), B=1 Hk=1 Hv=2, F32, layout kv",
     dict(Dk=64, Dv=128, B=1, Hk=1, Hv=2, layout="kv")),
    ("dk128_dv64_vk", 1201, "Dk=128, Dv=64 (Dk != Dv), B=1 Hk=1 Hv=2, inputs F32, state BF16, layout vk",
     dict(Dk=128, Dv=64, B=1, Hk=1, Hv=2, layout="vk", state_dtype="BF16")),
    ("dk128_dv128_kv", 1202, "Dk=Dv=128 (the tuned size), B=1 Hk=Hv=1, inputs BF16, state F32, layout kv",
     dict(Dk=128, Dv=128, B=1, Hk=1, Hv=1, layout="kv", dtype="BF16")),
    ("dk256_dv256_vk", 1203, "Dk=Dv=256 (largest head dim), B=1 Hk=Hv=1, inputs BF16, state BF16, layout vk",
     dict(Dk=256, Dv=256, B=1, Hk=1, Hv=1, layout="vk", dtype="BF16", state_dtype="BF16")),

    ("head_map_tiled_kv", 1300, "head_map tiled (hk = h % Hk), B=1 Hk=2 Hv=4 (G=2), inputs F32, state F16, layout kv",
     dict(head_map="tiled", B=1, Hk=2, Hv=4, layout="kv", state_dtype="F16")),

    ("slots_pool_i32_kv", 1400,
     "state_indices I32 [3, -1, 0]: out of order, a padding row, pool of 4 slots for B=3 "
     "(slots 1, 2 untouched); Hv=2, inputs F32, state F16, layout kv",
     dict(B=3, Hk=1, Hv=2, num_slots=4, index_dtype="I32", state_indices=[3, -1, 0], layout="kv",
          state_dtype="F16")),
    ("slots_pool_i64_vk", 1401,
     "state_indices I64 [4, -2, 1, -1]: out of order, padding rows (-1 and -2), pool of 5 slots for B=4 "
     "(slots 0, 2, 3 untouched); Hv=1, inputs BF16, state BF16, layout vk",
     dict(B=4, Hk=1, Hv=1, num_slots=5, index_dtype="I64", state_indices=[4, -2, 1, -1],
          layout="vk", dtype="BF16", state_dtype="BF16")),
    ("write_slot_i32_kv", 1402,
     "state_indices I32 [0, 1, -1, 2] with state_out_indices [3, -1, 4, 2]: row 0 reads 0 writes 3, "
     "row 1 output only (no state write), row 2 padding (slot 4 untouched despite its write index), "
     "row 3 in place; pool of 5, Hv=1, F32, layout kv",
     dict(B=4, Hk=1, Hv=1, num_slots=5, index_dtype="I32", state_indices=[0, 1, -1, 2],
          state_out_indices=[3, -1, 4, 2], layout="kv")),
    ("invalid_read_index_i32_kv", 1404,
     "state_indices I32 [3, 1, 2147483647, 0] with num_slots=3: rows 0 (index == num_slots) and 2 "
     "(INT32_MAX) are out of range, treated as padding and reported (invalid_indices=2); Hv=1, F32, kv",
     dict(B=4, Hk=1, Hv=1, num_slots=3, index_dtype="I32", state_indices=[3, 1, 2147483647, 0],
          layout="kv")),
    ("invalid_write_index_i64_vk", 1405,
     "state_indices I64 [0, 1, 2] with state_out_indices [3, 1099511627776, -1], num_slots=4: row 0 "
     "reads 0 writes 3; row 1's write index (2^40) is out of range: output computed, no state written, "
     "reported (invalid_indices=1); row 2 output only; Hv=1, inputs BF16, state BF16, layout vk",
     dict(B=3, Hk=1, Hv=1, num_slots=4, index_dtype="I64", state_indices=[0, 1, 2],
          state_out_indices=[3, 1 << 40, -1], layout="vk", dtype="BF16", state_dtype="BF16")),

    ("tiny_norm_rsqrt_kv", 1500,
     "l2norm rsqrt with q/k norms 1e-4 .. 1e-7 and one k head exactly zero; B=2 Hk=2 Hv=2, "
     "inputs F32, state F16, layout kv",
     dict(tweak="tiny_norm", l2norm="rsqrt", B=2, Hk=2, Hv=2, layout="kv", state_dtype="F16")),
    ("tiny_norm_max_norm_vk", 1501,
     "l2norm max_norm (x / max(|x|, eps)) with q/k norms 1e-4 .. 1e-7 and one k head exactly zero; "
     "B=2 Hk=2 Hv=2, inputs F32, state BF16, layout vk",
     dict(tweak="tiny_norm", l2norm="max_norm", B=2, Hk=2, Hv=2, layout="vk", state_dtype="BF16")),
    ("l2norm_none_kv", 1503,
     "l2norm none: q and k handed over already unit-norm (then rounded); B=1 Hv=2, F32, layout kv",
     dict(l2norm="none", B=1, Hk=1, Hv=2, layout="kv")),
    ("l2norm_none_bf16_vk", 1504,
     "l2norm none: q and k already unit-norm; B=2 Hk=2 Hv=2, inputs BF16, state BF16, layout vk",
     dict(l2norm="none", B=2, Hk=2, Hv=2, layout="vk", dtype="BF16", state_dtype="BF16")),
    ("scale_custom_vk", 1505, "scale 0.3 instead of the default Dk^-0.5 = 0.125; B=2 Hv=1, F32, layout vk",
     dict(scale=0.3, B=2, Hk=1, Hv=1, layout="vk")),

    ("gate_extreme_kv", 1600,
     "extreme raw gates: a+dt_bias = 25, 60, 21 (softplus linear branch), g = -960 (exp(g) = 0 even in "
     "float64), g = -400, a+dt_bias = -30 (no decay), b = +-30 (saturated sigmoid); B=2 Hk=1 Hv=3, F32, kv",
     dict(tweak="extreme_gate", B=2, Hk=1, Hv=3, layout="kv")),
    ("gate_extreme_bf16_vk", 1601,
     "extreme raw gates as in gate_extreme_kv; B=2 Hk=1 Hv=3, inputs BF16, state BF16, layout vk",
     dict(tweak="extreme_gate", B=2, Hk=1, Hv=3, layout="vk", dtype="BF16", state_dtype="BF16")),
    ("gate_precomputed_kv", 1602,
     "gate precomputed: a holds g (mostly U(-3,-1e-4), some down to -20), b holds beta in [0,1]; "
     "no A_log/dt_bias; B=1 Hv=2, F32, layout kv",
     dict(gate="precomputed", B=1, Hk=1, Hv=2, layout="kv")),
    ("gate_precomputed_bf16_vk", 1603,
     "gate precomputed; B=1 Hk=2 Hv=4, inputs BF16, state BF16, layout vk",
     dict(gate="precomputed", B=1, Hk=2, Hv=4, layout="vk", dtype="BF16", state_dtype="BF16")),

    ("mixed_qkv_bf16_vk", 1700,
     "packed mixed_qkv rows [q | k | v] instead of q, k, v; B=1 Hk=2 Hv=4, inputs BF16, state BF16, layout vk",
     dict(packed=True, B=1, Hk=2, Hv=4, layout="vk", dtype="BF16", state_dtype="BF16")),
    ("mixed_qkv_dk64_dv128_kv", 1701,
     "packed mixed_qkv rows with Dk=64 != Dv=128, B=1 Hk=1 Hv=1, state_indices I64 [1] into a pool of 2 "
     "(slot 0 untouched); inputs F32, state F16, layout kv",
     dict(packed=True, Dk=64, Dv=128, B=1, Hk=1, Hv=1, num_slots=2, index_dtype="I64",
          state_indices=[1], layout="kv", state_dtype="F16")),

    ("metadata_minimal_kv", 1800,
     "metadata has only op, format_version, layout (plus description, invalid_indices): every other key "
     "takes its default (rsqrt, eps 1e-6, scale Dk^-0.5, interleaved, raw, output = input dtype); "
     "B=2 Hv=1, inputs F16, state F32",
     dict(meta_style="minimal", layout="kv", dtype="F16", state_dtype="F32", B=2, Hk=1, Hv=1)),
    ("metadata_aliases_unsqueezed_vk", 1801,
     "metadata in alias spellings and mixed case (GDN_DECODE, VK, Default, Repeat_Interleave, RAW, bfloat16, "
     "scale 'default', an extra key 'format'); q/k/v/expected_o as [B, 1, H, D], a/b as [B, 1, Hv]; "
     "B=2 Hv=2, inputs BF16, state BF16",
     dict(meta_style="aliases_unsqueezed", layout="vk", dtype="BF16", state_dtype="BF16", B=2, Hk=1, Hv=2)),
    ("metadata_aliases_flat_kv", 1802,
     "metadata aliases (f_normalize, tile, fp16, eps '1e-6'; num_slots absent); q/k as [B, Hk*Dk], v and "
     "expected_o as [B, Hv*Dv]; max_norm, tiled, B=1 Hk=2 Hv=4, inputs F16, state F16",
     dict(meta_style="aliases_flat", layout="kv", dtype="F16", state_dtype="F16", l2norm="max_norm",
          head_map="tiled", B=1, Hk=2, Hv=4)),

    ("qwen35_35b_a3b_bf16_vk", 1900,
     "Qwen3.5-35B-A3B shape: B=1, Hk=16, Hv=32, Dk=Dv=128, inputs BF16, state BF16, layout vk; "
     "expected_state stored as F32 (not F64) to keep the file at ~3 MB",
     dict(B=1, Hk=16, Hv=32, Dk=128, Dv=128, dtype="BF16", state_dtype="BF16", layout="vk",
          expected_state_dtype="F32")),
]

# Format version 2: the conv1d prologue (x, conv_state, conv_weight, conv_bias) and the gated
# RMSNorm epilogue (z, norm_weight). x ~ N(0, 1), conv_weight ~ U(-0.6, 0.6), conv_bias ~
# U(-0.2, 0.2), conv_state ~ N(0, 1) in every slot, z ~ N(0, 1), norm_weight ~ U(0.5, 1.5).
CASES_V2 = [
    ("conv_w2_f32_kv", 2000,
     "conv prologue W=2 with conv_bias; x, conv pool (S, conv_dim, 1) channel_major; B=2 Hk=1 Hv=2, "
     "inputs F32, state F32, layout kv",
     dict(conv_width=2, B=2, Hk=1, Hv=2, layout="kv")),
    ("conv_w3_bf16_vk", 2001,
     "conv prologue W=3 without conv_bias (as Qwen3-Next); B=2 Hk=2 Hv=4, inputs BF16, state BF16, layout vk",
     dict(conv_width=3, conv_bias=False, B=2, Hk=2, Hv=4, layout="vk", dtype="BF16", state_dtype="BF16")),
    ("conv_w4_f32_dk64_dv128_vk", 2002,
     "conv prologue W=4 with conv_bias, Dk=64 != Dv=128; B=1 Hk=1 Hv=2, inputs F32, state F16, layout vk",
     dict(conv_width=4, B=1, Hk=1, Hv=2, Dk=64, Dv=128, layout="vk", state_dtype="F16")),
    ("conv_w4_bf16_kv", 2003,
     "conv prologue W=4 with conv_bias; B=2 Hk=1 Hv=2, inputs BF16, state F32, layout kv",
     dict(conv_width=4, B=2, Hk=1, Hv=2, layout="kv", dtype="BF16", state_dtype="F32")),
    ("conv_w3_f16_tiled_kv", 2004,
     "conv prologue W=3 with conv_bias, head_map tiled; B=1 Hk=2 Hv=4, inputs F16, state F16, layout kv",
     dict(conv_width=3, B=1, Hk=2, Hv=4, head_map="tiled", layout="kv", dtype="F16", state_dtype="F16")),

    ("norm_bf16_vk", 2100,
     "gated RMSNorm epilogue (z, norm_weight, norm_eps 1e-6) on q, k, v inputs; B=2 Hk=1 Hv=2, "
     "inputs BF16, state BF16, layout vk",
     dict(norm=True, B=2, Hk=1, Hv=2, layout="vk", dtype="BF16", state_dtype="BF16")),
    ("norm_eps_f32_dk128_dv64_kv", 2101,
     "gated RMSNorm epilogue with norm_eps 1e-5, Dk=128 != Dv=64; B=2 Hk=1 Hv=1, F32, layout kv",
     dict(norm=True, norm_eps=1e-5, B=2, Hk=1, Hv=1, Dk=128, Dv=64, layout="kv")),
    ("norm_mixed_qkv_f16_out_f32_kv", 2102,
     "gated RMSNorm epilogue on packed mixed_qkv rows, output written as F32; B=2 Hk=1 Hv=2, "
     "inputs F16, state F32, layout kv",
     dict(norm=True, packed=True, output_dtype="F32", B=2, Hk=1, Hv=2, layout="kv", dtype="F16",
          state_dtype="F32")),

    ("conv_norm_w4_bf16_vk", 2200,
     "conv prologue W=4 (no bias) and gated RMSNorm epilogue; B=2 Hk=2 Hv=4, inputs BF16, state BF16, "
     "layout vk",
     dict(conv_width=4, conv_bias=False, norm=True, B=2, Hk=2, Hv=4, layout="vk", dtype="BF16",
          state_dtype="BF16")),
    ("conv_norm_w3_f32_dk64_dv128_kv", 2201,
     "conv prologue W=3 with conv_bias and gated RMSNorm epilogue, Dk=64 != Dv=128; B=2 Hk=1 Hv=1, F32, "
     "layout kv",
     dict(conv_width=3, norm=True, B=2, Hk=1, Hv=1, Dk=64, Dv=128, layout="kv")),

    ("conv_slots_i32_kv", 2300,
     "conv prologue W=4 with a slot pool: state_indices I32 [4, -1, 1, 0] with state_out_indices "
     "[2, 3, -1, 0]: row 0 reads slot 4 writes 2 (both pools), row 1 padding (slot 3 untouched despite "
     "its write index), row 2 output only (neither pool written), row 3 in place; pool of 6 (slots 1, 3, "
     "4, 5 keep their state and conv state); Hv=1, inputs F32, state F16, layout kv",
     dict(conv_width=4, B=4, Hk=1, Hv=1, num_slots=6, index_dtype="I32", state_indices=[4, -1, 1, 0],
          state_out_indices=[2, 3, -1, 0], layout="kv", state_dtype="F16")),
    ("conv_norm_padding_i64_vk", 2301,
     "conv prologue W=3 and gated RMSNorm with padding rows: state_indices I64 [2, -1, 0, -3] in place, "
     "pool of 4 (slots 1, 3 untouched); padding rows output zeros after the norm; Hk=1 Hv=2, inputs BF16, "
     "state BF16, layout vk",
     dict(conv_width=3, norm=True, B=4, Hk=1, Hv=2, num_slots=4, index_dtype="I64",
          state_indices=[2, -1, 0, -3], layout="vk", dtype="BF16", state_dtype="BF16")),
    ("conv_norm_invalid_i64_kv", 2302,
     "conv prologue W=2 and gated RMSNorm with out-of-range indices: state_indices I64 [0, 7, 1] with "
     "state_out_indices [2, -1, 1099511627776], num_slots=3: row 0 reads 0 writes 2; row 1's read index "
     "is out of range (padding: zeros, neither pool touched, reported); row 2's write index (2^40) is "
     "out of range (output computed, neither pool written, reported); invalid_indices=2; Hv=1, F32, kv",
     dict(conv_width=2, norm=True, B=3, Hk=1, Hv=1, num_slots=3, index_dtype="I64",
          state_indices=[0, 7, 1], state_out_indices=[2, -1, 1 << 40], layout="kv")),

    ("conv_tap_major_bf16_kv", 2400,
     "conv prologue W=4 with the conv pool stored tap_major (S, W-1, conv_dim); state_indices I32 [2, 0] "
     "into a pool of 3 (slot 1 untouched); B=2 Hk=1 Hv=1, inputs BF16, state F32, layout kv",
     dict(conv_width=4, conv_state_layout="tap_major", B=2, Hk=1, Hv=1, num_slots=3, index_dtype="I32",
          state_indices=[2, 0], layout="kv", dtype="BF16", state_dtype="F32")),
    ("conv_norm_defaults_f16_kv", 2401,
     "conv prologue W=2 and gated RMSNorm with the v2 keys at their defaults (no conv_state_layout: "
     "channel_major; no norm_eps: 1e-6) and other ranks: x as [B, 1, conv_dim], conv_weight as torch's "
     "[conv_dim, 1, W], z as [B, Hv*Dv]; B=2 Hk=1 Hv=2, inputs F16, state F16, layout kv",
     dict(conv_width=2, norm=True, v2_defaults=True, B=2, Hk=1, Hv=2, layout="kv", dtype="F16",
          state_dtype="F16")),

    ("conv_norm_qwen35_tp8_bf16_vk", 2500,
     "Qwen3.5-35B-A3B under tensor parallelism 8, with its conv prologue (W=4, no bias) and gated "
     "RMSNorm: B=2, Hk=2, Hv=4, Dk=Dv=128 (conv_dim 1024), inputs BF16, state BF16, layout vk; "
     "expected_state stored as F32",
     dict(conv_width=4, conv_bias=False, norm=True, B=2, Hk=2, Hv=4, Dk=128, Dv=128, layout="vk",
          dtype="BF16", state_dtype="BF16", expected_state_dtype="F32")),
]

# Format version 3: several tokens per row (speculative decoding). Inputs are drawn as for a
# one-token case with one row per token (B*T rows dense, total_tokens packed), in the same order.
# An F32 output goes only with an F32 state when T > 1: a later token's output is computed from
# the state rounded after the token before, and one F16/BF16 rounding that an fp32 kernel lands
# on the other side of moves that output by more than the F32 output bound (1e-5) allows.
CASES_V3 = [
    ("mt_t2_inplace_f32_kv", 3000,
     "T=2 tokens per row, final state only, in place, no index arrays (row b in slot b); B=2 Hk=1 Hv=2, "
     "inputs F32, state F32, layout kv",
     dict(num_tokens=2, B=2, Hk=1, Hv=2, layout="kv")),
    ("mt_t4_write_slot_i32_bf16_vk", 3001,
     "T=4, final state only, state_indices I32 [0, 3, -1, 2] with state_out_indices [4, 3, 1, 6], "
     "num_slots=6: row 0 reads 0 writes 4, row 1 in place, row 2 padding (all 4 output rows zero; slot 1 "
     "untouched despite its write index), row 3's write index 6 is out of range (outputs computed, "
     "nothing written, reported: invalid_indices=1); slots 0, 2 read only, 1, 5 untouched; Hk=1 Hv=2, "
     "inputs BF16, state BF16, layout vk",
     dict(num_tokens=4, B=4, Hk=1, Hv=2, num_slots=6, index_dtype="I32", state_indices=[0, 3, -1, 2],
          state_out_indices=[4, 3, 1, 6], layout="vk", dtype="BF16", state_dtype="BF16")),
    ("mt_t8_i64_f16_kv", 3002,
     "T=8 (eight tokens on one state, rounded to F16 after each), final state in place, state_indices I64 "
     "[1, 0] (swapped slots); B=2 Hk=1 Hv=2, head_map tiled, inputs F16, state F16, layout kv",
     dict(num_tokens=8, B=2, Hk=1, Hv=2, head_map="tiled", num_slots=2, index_dtype="I64", state_indices=[1, 0],
          layout="kv", dtype="F16", state_dtype="F16")),
    ("mt_token_slots_accepted_i32_bf16_vk", 3003,
     "per-token slots (vLLM's ssm_state_indices [B, T]) with num_accepted_tokens, T=3, num_slots=6: "
     "token_state_indices I32 [[0, 1, 2], [-1, -1, -1], [3, 4, 6], [-1, -1, -1]], num_accepted_tokens "
     "[2, 1, 1, 0]: row 0 reads slot 1 (its 2nd token's slot) and writes 0, 1, 2 after tokens 0, 1, 2; "
     "row 1 padding (slot -1); row 2 reads 3 and writes 3, 4, its 3rd slot 6 is out of range (not written, "
     "reported); row 3 has num_accepted_tokens 0 (outside [1, T]: padding, reported); invalid_indices=2, "
     "slot 5 untouched; Hk=1 Hv=2, inputs BF16, state BF16, layout vk",
     dict(num_tokens=3, B=4, Hk=1, Hv=2, num_slots=6, index_dtype="I32",
          token_state_indices=[[0, 1, 2], [-1, -1, -1], [3, 4, 6], [-1, -1, -1]],
          num_accepted_tokens=[2, 1, 1, 0], layout="vk", dtype="BF16", state_dtype="BF16")),
    ("mt_state_indices_token_slots_i64_f16_kv", 3004,
     "per-token slots read through state_indices (no num_accepted_tokens), T=2: state_indices I64 [3, 0], "
     "token_state_indices [[1, 2], [0, -1]]: row 0 reads 3 (left as it was) and writes 1, 2; row 1 reads 0, "
     "writes its first token's state back to 0 and keeps the second nowhere; pool of 4; B=2 Hk=1 Hv=2, "
     "inputs F32, output F16, state F16, layout kv",
     dict(num_tokens=2, B=2, Hk=1, Hv=2, num_slots=4, index_dtype="I64", state_indices=[3, 0],
          token_state_indices=[[1, 2], [0, -1]], layout="kv", state_dtype="F16", output_dtype="F16")),
    ("mt_intermediate_no_update_f32_vk", 3005,
     "FlashInfer MTP: expected_intermediate_states (B, T, Hv, Dv, Dk) with update_state=false (neither pool "
     "written: expected_state equals state), T=2, state_indices I64 [1, 0]; B=2 Hk=1 Hv=2, inputs BF16, "
     "state F32 (intermediate states F64), layout vk",
     dict(num_tokens=2, B=2, Hk=1, Hv=2, num_slots=2, index_dtype="I64", state_indices=[1, 0],
          update_state=False, intermediate=True, layout="vk", dtype="BF16", state_dtype="F32")),
    ("mt_cu_seqlens_intermediate_i32_f16_kv", 3006,
     "cu_seqlens I32 [0, 2, 2, 5, 6] (rows of 2, 0, 3, 1 tokens, T=3, 6 packed tokens) with state_indices "
     "[1, 2, -1, 0], state_out_indices [3, 2, 4, 0] and expected_intermediate_states, update_state=true: "
     "row 0 reads 1 writes 3 after its 2nd token; row 1 has no tokens (nothing written, slot 2 unchanged); "
     "row 2 is padding (3 zero output rows; slot 4 untouched despite its write index); row 3 in place; "
     "intermediate entries of missing tokens and of the padding row are NaN (not compared); Hk=1 Hv=2, "
     "inputs F16, state F16, layout kv",
     dict(num_tokens=3, B=4, Hk=1, Hv=2, num_slots=5, index_dtype="I32", cu_seqlens=[0, 2, 2, 5, 6],
          state_indices=[1, 2, -1, 0], state_out_indices=[3, 2, 4, 0], intermediate=True, layout="kv",
          dtype="F16", state_dtype="F16")),
    ("mt_t1_cu_seqlens_i64_f16_vk", 3007,
     "T=1 through the version 3 path: cu_seqlens I64 [0, 1, 1, 2] (rows of 1, 0, 1 tokens) with "
     "state_indices [2, 0, 1] in place; row 1 has no token (slot 0 unchanged); B=3 Hk=1 Hv=2, inputs F16, "
     "state BF16, layout vk",
     dict(num_tokens=1, B=3, Hk=1, Hv=2, num_slots=3, index_dtype="I64", cu_seqlens=[0, 1, 1, 2],
          state_indices=[2, 0, 1], layout="vk", dtype="F16", state_dtype="BF16")),
    ("mt_conv_w4_bf16_kv", 3008,
     "conv prologue W=4 with conv_bias, conv pool channel_major, T=3: the window advances one tap per "
     "token; state_indices I32 [0, 2] in place, pool of 3 (slot 1 untouched in both pools); B=2 Hk=1 "
     "Hv=2, inputs BF16, state BF16, layout kv",
     dict(num_tokens=3, conv_width=4, B=2, Hk=1, Hv=2, num_slots=3, index_dtype="I32",
          state_indices=[0, 2], layout="kv", dtype="BF16", state_dtype="BF16")),
    ("mt_conv_w3_tap_major_intermediate_f16_vk", 3009,
     "conv prologue W=3 without bias, conv pool tap_major (S, W-1, conv_dim), T=2, with "
     "expected_intermediate_states and expected_intermediate_conv_states (B, T, W-1, conv_dim), "
     "final state in place; B=2 Hk=1 Hv=2, inputs F16, state F16, layout vk",
     dict(num_tokens=2, conv_width=3, conv_bias=False, conv_state_layout="tap_major", intermediate=True,
          intermediate_conv=True, B=2, Hk=1, Hv=2, layout="vk", dtype="F16", state_dtype="F16")),
    ("mt_conv_norm_token_slots_i64_bf16_vk", 3010,
     "Qwen3-Next spec decode: conv prologue W=4 (no bias) and gated RMSNorm with per-token slots for both "
     "pools, T=2: token_state_indices I64 [[0, 1], [2, 3]], num_accepted_tokens [2, 1]: row 0 reads slot 1 "
     "and writes 0, 1; row 1 reads 2 and writes 2, 3; pool of 5 (slot 4 untouched); B=2 Hk=1 Hv=2, inputs "
     "BF16, state BF16, layout vk",
     dict(num_tokens=2, conv_width=4, conv_bias=False, norm=True, B=2, Hk=1, Hv=2, num_slots=5,
          index_dtype="I64", token_state_indices=[[0, 1], [2, 3]], num_accepted_tokens=[2, 1],
          layout="vk", dtype="BF16", state_dtype="BF16")),
    ("mt_norm_f32_kv", 3011,
     "gated RMSNorm epilogue on every token, T=4, on q, k, v inputs, final state in place; B=2 Hk=1 Hv=2, "
     "inputs F32, state F32, layout kv",
     dict(num_tokens=4, norm=True, B=2, Hk=1, Hv=2, layout="kv")),
    ("mt_mixed_qkv_bf16_vk", 3012,
     "packed mixed_qkv rows (B, T, 2*Hk*Dk + Hv*Dv), T=3, final state in place; B=2 Hk=1 Hv=2, inputs BF16, "
     "state BF16, layout vk",
     dict(num_tokens=3, packed=True, B=2, Hk=1, Hv=2, layout="vk", dtype="BF16", state_dtype="BF16")),
    ("mt_gate_precomputed_f16_kv", 3013,
     "gate precomputed (a holds g, b holds beta; no A_log/dt_bias), T=4, final state in place; B=2 Hk=1 "
     "Hv=2, inputs F16, state F16, layout kv",
     dict(num_tokens=4, gate="precomputed", B=2, Hk=1, Hv=2, layout="kv", dtype="F16", state_dtype="F16")),
    ("mt_qwen35_tp8_t4_bf16_vk", 3014,
     "Qwen3.5-35B-A3B under tensor parallelism 8 with MTP: T=4, conv prologue W=4 (no bias) and gated "
     "RMSNorm, B=2, Hk=2, Hv=4, Dk=Dv=128 (conv_dim 1024), state_indices I32 [0, -1] in place into a pool "
     "of 1 (row 1 a padding row of a padded batch: 4 zero output rows); inputs BF16, state BF16, layout vk",
     dict(num_tokens=4, conv_width=4, conv_bias=False, norm=True, B=2, Hk=2, Hv=4, Dk=128, Dv=128,
          num_slots=1, index_dtype="I32", state_indices=[0, -1], layout="vk", dtype="BF16",
          state_dtype="BF16")),
    ("mt_split_pool_token_slots_i32_bf16_vk", 3015,
     "FlashInfer's split pool: per-token slots and the final state to a write slot besides, T=2, num_slots=9: "
     "state_indices I32 [0, 1, -1, 2], token_state_indices [[3, 4], [5, -1], [7, 8], [-1, 9]], "
     "state_out_indices [6, 1, 2, 12]: row 0 reads 0, writes 3, 4 and its final state to 6; row 1 reads 1, "
     "writes 5 and its final state back to 1; row 2 is padding (slots 7, 8 and 2 untouched by it); row 3 "
     "reads 2 and writes nothing: its 2nd token slot 9 and final slot 12 are out of range (reported); "
     "invalid_indices=2; Hk=1 Hv=2, inputs BF16, state BF16, layout vk",
     dict(num_tokens=2, B=4, Hk=1, Hv=2, num_slots=9, index_dtype="I32", state_indices=[0, 1, -1, 2],
          token_state_indices=[[3, 4], [5, -1], [7, 8], [-1, 9]], state_out_indices=[6, 1, 2, 12],
          layout="vk", dtype="BF16", state_dtype="BF16")),
    ("mt_beta_per_channel_t1_i32_bf16_kv", 3016,
     "per-channel beta (gate precomputed: b [B, T, Hv, Dv] holds one beta a column, U(0, 1)), T=1 (the "
     "engines' decode call), state_indices I32 [2, -1, 0] in place into a pool of 3 (row 1 padding); B=3 Hk=1 "
     "Hv=2, inputs BF16, state F32, layout kv",
     dict(num_tokens=1, gate="precomputed", beta_per_channel=True, B=3, Hk=1, Hv=2, num_slots=3,
          index_dtype="I32", state_indices=[2, -1, 0], layout="kv", dtype="BF16", state_dtype="F32")),
    ("mt_beta_per_channel_t4_f32_vk", 3017,
     "per-channel beta (gate precomputed), T=4, final state in place; B=2 Hk=2 Hv=4, Dk=32, Dv=64 (a "
     "transposed column shows), inputs F32, state BF16, layout vk",
     dict(num_tokens=4, gate="precomputed", beta_per_channel=True, B=2, Hk=2, Hv=4, Dk=32, Dv=64,
          layout="vk", dtype="F32", state_dtype="BF16")),
]

CASES = CASES + CASES_V2 + CASES_V3


# ---------------------------------------------------------------------------
# random cases (files "written elsewhere", for tests)
# ---------------------------------------------------------------------------

def _random_slots(o, rng, pick, B):
    """Random read slots for B rows (padding and out-of-range ones among them, at least one
    real), and half the time distinct write slots that no other row reads; returns num_slots.
    One draw order for the one-token and the multi-token random cases."""
    num_slots = B + int(rng.integers(0, 3))
    reads = [int(s) for s in rng.permutation(num_slots)[:B]]
    for r in range(B):
        if rng.random() < 0.2:
            reads[r] = -1                      # padding
        elif rng.random() < 0.1:
            reads[r] = num_slots + int(rng.integers(0, 3))  # out of range: padding, reported
    if not any(0 <= s < num_slots for s in reads):
        reads[0] = int(rng.integers(num_slots))  # keep one real row, so expected_o is not all zero
    o.update(num_slots=num_slots, index_dtype=pick(["I32", "I64"]), state_indices=reads)
    if rng.random() < 0.5:
        # write slots: distinct, never a slot another row reads (no read/write race)
        taken = {s for s in reads if 0 <= s < num_slots}
        free = [s for s in range(num_slots) if s not in taken]
        writes = []
        for s in reads:
            roll = rng.random()
            if not (0 <= s < num_slots) or roll < 0.15:
                writes.append(-1)              # padding row (no state traffic), or output only
            elif roll < 0.25:
                writes.append(num_slots + 5)   # out of range write: output only, reported
            elif roll < 0.6 and free:
                writes.append(free.pop(0))     # a different slot
            else:
                writes.append(s)               # in place
        o["state_out_indices"] = writes
    return num_slots


def random_case(rng):
    """Random valid options, including padding, pools, write slots and out-of-range indices."""
    pick = lambda seq: seq[int(rng.integers(len(seq)))]
    dtypes = ["F32", "F16", "BF16"]
    o = dict(dtype=pick(dtypes), state_dtype=pick(dtypes), layout=pick(["kv", "vk"]),
             Dk=pick([64, 64, 128, 256]), Dv=pick([64, 64, 128]), l2norm=pick(["rsqrt", "rsqrt", "max_norm", "none"]),
             head_map=pick(["interleaved", "tiled"]), gate=pick(["raw", "raw", "precomputed"]),
             packed=bool(rng.random() < 0.25))
    if rng.random() < 0.3:
        o["output_dtype"] = pick(dtypes)
    if rng.random() < 0.2:
        o["scale"] = float(np.round(rng.uniform(0.05, 1.0), 4))
    Hk = int(rng.integers(1, 3))
    G = int(rng.integers(1, 4))
    B = int(rng.integers(1, 5))
    o.update(B=B, Hk=Hk, Hv=Hk * G)
    if rng.random() < 0.6:
        _random_slots(o, rng, pick, B)
    # format version 2 stages, drawn last so the options above keep their draws
    if rng.random() < 0.35:
        o.update(conv_width=pick([2, 3, 4]), conv_bias=bool(rng.random() < 0.6),
                 conv_state_layout=pick(["channel_major", "tap_major"]), packed=False)
        if o["l2norm"] == "none":
            o["l2norm"] = "rsqrt"  # conv outputs are not unit-norm
    if rng.random() < 0.35:
        o.update(norm=True, norm_eps=pick([1e-6, 1e-6, 1e-5]))
    return o


def _real_rows(o, num_slots):
    """The rows of a multi-token option set that read a state (the others are padding)."""
    real = []
    for r in range(o["B"]):
        if o.get("state_indices") is not None:
            s = o["state_indices"][r]
        elif o.get("token_state_indices") is not None:
            n = o["num_accepted_tokens"][r] if o.get("num_accepted_tokens") is not None else 1
            s = o["token_state_indices"][r][n - 1] if 1 <= n <= o["num_tokens"] else -1
        else:
            s = r
        if 0 <= s < num_slots:
            real.append(r)
    return real


def random_case_multi(rng):
    """Random valid format version 3 options: T tokens per row, dense or packed by cu_seqlens, with
    the final state (read/write slots, padding, out-of-range), per-token slots (num_accepted_tokens
    or state_indices) or the dense buffer of every token's state (update_state either way)."""
    pick = lambda seq: seq[int(rng.integers(len(seq)))]
    dtypes = ["F32", "F16", "BF16"]
    o = dict(dtype=pick(dtypes), state_dtype=pick(dtypes), layout=pick(["kv", "vk"]),
             Dk=pick([64, 64, 128]), Dv=pick([64, 64, 128]), l2norm=pick(["rsqrt", "rsqrt", "max_norm", "none"]),
             head_map=pick(["interleaved", "tiled"]), gate=pick(["raw", "raw", "precomputed"]),
             packed=bool(rng.random() < 0.25))
    if rng.random() < 0.3:
        o["output_dtype"] = pick(dtypes)
    if rng.random() < 0.2:
        o["scale"] = float(np.round(rng.uniform(0.05, 1.0), 4))
    Hk = int(rng.integers(1, 3))
    G = int(rng.integers(1, 4))
    B = int(rng.integers(1, 5))
    mode = pick(["final", "final", "token_slots", "buffer"])
    # per-token slots take B*T slots of the pool: fewer tokens there keep the files small
    T = pick([1, 2, 3, 4]) if mode == "token_slots" else pick([1, 2, 2, 3, 4, 4, 5, 8, 16])
    if mode == "buffer":  # every token's state in the file: at most 2^19 values
        while T > 1 and B * T * Hk * G * o["Dk"] * o["Dv"] > 1 << 19:
            T //= 2
    o.update(B=B, Hk=Hk, Hv=Hk * G, num_tokens=T)
    lens = None
    if rng.random() < 0.4:
        lens = [int(n) for n in rng.integers(0, T + 1, B)]
    num_slots = B
    if mode == "token_slots":
        # every row gets T slots of its own (-1 here and there, now and then one out of range);
        # read through num_accepted_tokens (vLLM) or through state_indices from a slot nobody writes
        by_state_indices = rng.random() < 0.3
        # FlashInfer's split pool: the final state to a slot of its own besides
        split = by_state_indices and rng.random() < 0.5
        num_slots = B * T + (B if by_state_indices else 0) + (B if split else 0) + int(rng.integers(0, 3))
        free = [int(s) for s in rng.permutation(num_slots)]
        tsi, reads, accepted = [], [], []
        for r in range(B):
            if r > 0 and rng.random() < 0.15:
                tsi.append([-1] * T)               # padding row: no slots at all
                reads.append(-1)
                accepted.append(1)
                continue
            row = [free.pop() for _ in range(T)]
            own = list(row)
            for t in range(T):
                roll = rng.random()
                if roll < 0.1:
                    row[t] = -1                    # this token's state is not kept
                elif roll < 0.15:
                    row[t] = num_slots + int(rng.integers(0, 4))  # out of range: not written, reported
            reads.append(free.pop() if by_state_indices else -1)
            n = int(rng.integers(1, T + 1))
            if rng.random() < 0.08:
                n = pick([0, T + 1])               # outside [1, T]: padding, reported
            if r == 0 and not by_state_indices:
                n = min(max(n, 1), T)              # row 0 stays a real row
                row[n - 1] = own[n - 1]
            tsi.append(row)
            accepted.append(n)
        o.update(num_slots=num_slots, index_dtype=pick(["I32", "I64"]), token_state_indices=tsi)
        if by_state_indices:
            o["state_indices"] = reads
            if split:
                o["state_out_indices"] = [free.pop() if rng.random() < 0.8 else -1 for _ in range(B)]
        else:
            o["num_accepted_tokens"] = accepted
    elif rng.random() < 0.7 or lens is not None:
        num_slots = _random_slots(o, rng, pick, B)
    if lens is not None:
        # packed rows of 0..T tokens; a real row keeps at least one token, so that some output is not 0
        real = _real_rows(o, num_slots)
        if real and all(lens[r] == 0 for r in real):
            lens[real[0]] = 1
        o["cu_seqlens"] = [int(c) for c in np.concatenate([[0], np.cumsum(lens)])]
        o.setdefault("index_dtype", pick(["I32", "I64"]))
    if mode == "buffer":
        o.update(intermediate=True, update_state=bool(rng.random() < 0.6))
    elif mode == "final" and rng.random() < 0.1:
        o["update_state"] = False
    if rng.random() < 0.35:
        o.update(conv_width=pick([2, 3, 4]), conv_bias=bool(rng.random() < 0.6),
                 conv_state_layout=pick(["channel_major", "tap_major"]), packed=False)
        if o["l2norm"] == "none":
            o["l2norm"] = "rsqrt"  # conv outputs are not unit-norm
        if mode == "buffer" and rng.random() < 0.7:
            o["intermediate_conv"] = True
    if rng.random() < 0.35:
        o.update(norm=True, norm_eps=pick([1e-6, 1e-6, 1e-5]))
    if T > 1 and o["state_dtype"] != "F32" and (o.get("output_dtype") or o["dtype"]) == "F32":
        # a later token's output carries the F16/BF16 rounding of the state before it: an F32
        # output bound (1e-5) would judge one rounding flipped by an fp32 kernel, not the kernel
        o["output_dtype"] = o["state_dtype"]
    return o


def describe(o):
    c = dict(DEFAULTS)
    c.update(o)
    parts = [f"B={c['B']} Hk={c['Hk']} Hv={c['Hv']} Dk={c['Dk']} Dv={c['Dv']}",
             f"inputs {c['dtype']} state {c['state_dtype']} output {c['output_dtype'] or c['dtype']}",
             f"layout {c['layout']} l2norm {c['l2norm']} head_map {c['head_map']} gate {c['gate']}"]
    if c["packed"]:
        parts.append("mixed_qkv")
    if c["scale"] is not None:
        parts.append(f"scale {c['scale']}")
    if c["state_indices"] is not None:
        parts.append(f"num_slots {c['num_slots']} state_indices {c['index_dtype']} {c['state_indices']}")
    if c["state_out_indices"] is not None:
        parts.append(f"state_out_indices {c['state_out_indices']}")
    if c["conv_width"]:
        parts.append(f"conv W={c['conv_width']} {c['conv_state_layout']}" + (" +bias" if c["conv_bias"] else ""))
    if c["norm"]:
        parts.append(f"gated RMSNorm eps {c['norm_eps']}")
    if c["num_tokens"] is not None:  # format version 3 (one-token descriptions stay as they were)
        parts.append(f"T={c['num_tokens']}")
        if c["cu_seqlens"] is not None:
            parts.append(f"cu_seqlens {c['cu_seqlens']}")
        if c["token_state_indices"] is not None:
            parts.append(f"token_state_indices {c['token_state_indices']}")
        if c["num_accepted_tokens"] is not None:
            parts.append(f"num_accepted_tokens {c['num_accepted_tokens']}")
        if c["intermediate"]:
            parts.append("intermediate states" + (" and conv windows" if c["intermediate_conv"] else ""))
        if not c["update_state"]:
            parts.append("update_state false")
    return "random case: " + ", ".join(parts)
