// Links gdnkit::gdnkit from an installed package and runs one small step on the host.
#include <gdnkit/gdnkit.hpp>

#include <cmath>
#include <cstdio>
#include <vector>

int main() {
  const int B = 2, Hk = 1, Hv = 2, D = 64;
  std::vector<float> q(B * Hk * D), k(B * Hk * D), v(B * Hv * D), a(B * Hv, 0.5f), b(B * Hv, 0.0f);
  std::vector<float> A_log(Hv, 0.0f), dt_bias(Hv, 0.0f), state(B * Hv * D * D), o(B * Hv * D, -1.0f);
  for (size_t i = 0; i < q.size(); ++i) q[i] = k[i] = std::sin(0.1f * float(i));
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::cos(0.2f * float(i));
  for (size_t i = 0; i < state.size(); ++i) state[i] = 0.01f * float(i % 17) - 0.08f;

  gdn::DecodeParams p;
  p.batch = B;
  p.num_k_heads = Hk;
  p.num_v_heads = Hv;
  p.head_dim_k = p.head_dim_v = D;
  p.qkv_dtype = p.ab_dtype = p.o_dtype = p.state_dtype = gdn::DType::kF32;
  p.q = q.data();
  p.k = k.data();
  p.v = v.data();
  p.a = a.data();
  p.b = b.data();
  p.A_log = A_log.data();
  p.dt_bias = dt_bias.data();
  p.state = state.data();
  p.num_slots = B;
  p.o = o.data();
  gdn::set_dense_strides(p);

  const gdn::Status st = gdn::decode(p, gdn::Backend::kHost);
  if (!st.ok()) {
    std::printf("consumer: decode failed: %s\n", st.message);
    return 1;
  }
  for (float x : o)
    if (!std::isfinite(x) || x == -1.0f) {
      std::printf("consumer: output not written\n");
      return 1;
    }
  std::printf("consumer: gdnkit %s found and ran, o[0] = %g\n", gdn::version(), double(o[0]));
  return 0;
}
