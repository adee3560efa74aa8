// gdnkit — host-side conversions between fp32 and the 16-bit storage types.
//
// Round-to-nearest-even, NaN and infinity preserved, subnormals exact: the
// same rounding the GPUs' __float2half_rn / __float2bfloat16_rn do, so the
// host backend and golden tools store results the way a GPU would.
#pragma once

#include <cstdint>
#include <cstring>

#include "gdnkit/types.hpp"

namespace gdn {

inline float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// bf16 is the upper half of an fp32.
inline float bf16_to_float(uint16_t h) { return bits_to_float(uint32_t(h) << 16); }

inline uint16_t float_to_bf16(float f) {
  uint32_t u = float_to_bits(f);
  // NaN: keep it a (quiet) NaN rather than letting rounding turn it into inf.
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x0040u);
  // round half to even on the 16 dropped bits
  uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return uint16_t((u + rounding) >> 16);
}

inline float fp16_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  if (exp == 0x1f) return bits_to_float(sign | 0x7f800000u | (man << 13));  // inf / NaN
  if (exp == 0) {
    // zero or subnormal: man * 2^-24, exact in fp32
    float mag = float(man) * 5.9604644775390625e-8f;
    return sign ? -mag : mag;
  }
  return bits_to_float(sign | ((exp + 112u) << 23) | (man << 13));
}

inline uint16_t float_to_fp16(float f) {
  uint32_t u = float_to_bits(f);
  uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return uint16_t(sign | 0x7e00u);  // NaN
  if (abs >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (abs < 0x38800000u) {
    // result is subnormal (or zero) in fp16: value / 2^-24, rounded to even
    float mag = bits_to_float(abs) * 16777216.0f;  // exact scaling by 2^24
    // nearbyint under the default rounding mode (round half to even)
    uint32_t m = uint32_t(mag);
    float rem = mag - float(m);
    if (rem > 0.5f || (rem == 0.5f && (m & 1u))) ++m;
    return uint16_t(sign | m);
  }
  // normal: rebias exponent, round the 13 dropped mantissa bits to even
  uint32_t rounding = 0xfffu + ((abs >> 13) & 1u);
  abs += rounding;
  return uint16_t(sign | (((abs >> 13) - (112u << 10)) & 0x7fffu));
}

// Read element i of a buffer of dtype t as double / write a double rounded
// through fp32 into dtype t (the GPUs round fp32 results, so does the host).
inline double load_element(const void* base, DType t, int64_t i) {
  switch (t) {
    case DType::kF32: return double(static_cast<const float*>(base)[i]);
    case DType::kF16: return double(fp16_to_float(static_cast<const uint16_t*>(base)[i]));
    case DType::kBF16: return double(bf16_to_float(static_cast<const uint16_t*>(base)[i]));
  }
  return 0.0;
}

inline void store_element(void* base, DType t, int64_t i, double x) {
  switch (t) {
    case DType::kF32: static_cast<float*>(base)[i] = float(x); return;
    case DType::kF16: static_cast<uint16_t*>(base)[i] = float_to_fp16(float(x)); return;
    case DType::kBF16: static_cast<uint16_t*>(base)[i] = float_to_bf16(float(x)); return;
  }
}

// Value of x after a round trip through dtype t.
inline double round_to(DType t, double x) {
  switch (t) {
    case DType::kF32: return double(float(x));
    case DType::kF16: return double(fp16_to_float(float_to_fp16(float(x))));
    case DType::kBF16: return double(bf16_to_float(float_to_bf16(float(x))));
  }
  return x;
}

}  // namespace gdn
