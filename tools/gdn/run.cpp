// gdn run: the GDN part of decoding a model, on one backend.
//
// Allocates a state pool per GDN layer, then for each step runs the fused
// decode over every layer with realistic random inputs (a packed mixed_qkv
// row per sequence, as an engine hands it over). Sampled steps are checked
// against the host reference; timing covers only the decode calls.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cerrno>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include "commands.hpp"
#include "gdnkit/backend.hpp"
#include "gdnkit/golden.hpp"
#include "gdnkit/half.hpp"

namespace {

struct Preset {
  const char* name;
  int layers, hk, hv, dk, dv;
};

// GDN layers and head shapes of the models gdnkit serves.
const Preset kPresets[] = {
    {"qwen3.5-35b-a3b", 30, 16, 32, 128, 128},
    {"qwen3-next-80b-a3b", 36, 16, 32, 128, 128},
    {"qwen3.5-27b", 48, 16, 48, 128, 128},
    {"qwen3.5-397b-a17b", 45, 16, 64, 128, 128},
    {"qwen3.5-0.8b", 18, 16, 16, 128, 128},
    {"qwen3.5-2b", 18, 16, 16, 128, 128},
};

struct Options {
  std::string model{"qwen3.5-35b-a3b"};
  int layers{0}, hk{0}, hv{0}, dk{0}, dv{0};  // 0: from the preset
  int tp{1};
  int64_t batch{1};
  int steps{16};
  int check_every{0};  // 0: about four checked steps
  unsigned seed{1234};
  gdn::Backend backend{gdn::Backend::kAuto};
  gdn::DType state_dtype{gdn::DType::kF32};
  gdn::DType dtype{gdn::DType::kBF16};
  gdn::Layout layout{gdn::Layout::kVK};
};

void usage(FILE* out) {
  std::fprintf(out,
               "usage: gdn run [options]\n"
               "  --model M         preset (default qwen3.5-35b-a3b), or 'custom' with the shape flags:\n");
  for (const Preset& p : kPresets)
    std::fprintf(out, "                      %-20s %2d GDN layers, Hk/Hv %d/%d, Dk/Dv %d/%d\n", p.name,
                 p.layers, p.hk, p.hv, p.dk, p.dv);
  std::fprintf(out,
               "  --layers N --hk N --hv N --dk N --dv N   override the preset's shape\n"
               "  --tp N            tensor parallelism: heads per GPU are Hk/tp, Hv/tp (default 1)\n"
               "  --batch N         sequences decoded together (default 1)\n"
               "  --steps S         decode steps (default 16)\n"
               "  --backend B       auto|host|cuda|hip (default auto: the best present)\n"
               "  --state-dtype T   fp32|bf16|fp16 (default fp32)\n"
               "  --dtype T         q/k/v/a/b and output dtype: bf16|fp16|fp32 (default bf16)\n"
               "  --layout L        vk|kv (default vk)\n"
               "  --check-every K   compare every K-th step with the host reference (default: ~4 checks)\n"
               "  --seed N          input seed (default 1234)\n");
}

bool parse_dtype(const std::string& s, gdn::DType* t) {
  if (s == "fp32" || s == "f32" || s == "float32") *t = gdn::DType::kF32;
  else if (s == "bf16" || s == "bfloat16") *t = gdn::DType::kBF16;
  else if (s == "fp16" || s == "f16" || s == "float16" || s == "half") *t = gdn::DType::kF16;
  else return false;
  return true;
}

bool parse_backend(const std::string& s, gdn::Backend* b) {
  if (s == "auto") *b = gdn::Backend::kAuto;
  else if (s == "host") *b = gdn::Backend::kHost;
  else if (s == "cuda") *b = gdn::Backend::kCuda;
  else if (s == "hip") *b = gdn::Backend::kHip;
  else return false;
  return true;
}

bool parse_int(const std::string& s, int64_t lo, int64_t hi, int64_t* out) {
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || errno != 0 || v < lo || v > hi) return false;
  *out = v;
  return true;
}

// Returns 0 on success, 2 (after printing why) on bad usage, -1 for --help.
int parse(const std::vector<std::string>& args, Options* o) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& flag = args[i];
    if (flag == "--help" || flag == "-h") return -1;
    if (i + 1 >= args.size()) {
      std::fprintf(stderr, "gdn run: %s needs a value\n", flag.c_str());
      return 2;
    }
    const std::string& val = args[++i];
    int64_t n = 0;
    auto bad = [&](const char* what) {
      std::fprintf(stderr, "gdn run: %s: '%s' is not %s\n", flag.c_str(), val.c_str(), what);
      return 2;
    };
    if (flag == "--model") o->model = val;
    else if (flag == "--batch") { if (!parse_int(val, 1, 1 << 20, &n)) return bad("a batch size in [1, 2^20]"); o->batch = n; }
    else if (flag == "--steps") { if (!parse_int(val, 1, 1 << 24, &n)) return bad("a step count >= 1"); o->steps = int(n); }
    else if (flag == "--check-every") { if (!parse_int(val, 1, 1 << 24, &n)) return bad("a step count >= 1"); o->check_every = int(n); }
    else if (flag == "--seed") { if (!parse_int(val, 0, UINT32_MAX, &n)) return bad("a seed in [0, 2^32)"); o->seed = unsigned(n); }
    else if (flag == "--tp") { if (!parse_int(val, 1, 1024, &n)) return bad("a tensor-parallel degree >= 1"); o->tp = int(n); }
    else if (flag == "--layers") { if (!parse_int(val, 1, 1024, &n)) return bad("a layer count in [1, 1024]"); o->layers = int(n); }
    else if (flag == "--hk") { if (!parse_int(val, 1, 4096, &n)) return bad("a head count >= 1"); o->hk = int(n); }
    else if (flag == "--hv") { if (!parse_int(val, 1, 4096, &n)) return bad("a head count >= 1"); o->hv = int(n); }
    else if (flag == "--dk") { if (!parse_int(val, 1, 4096, &n)) return bad("a head dim"); o->dk = int(n); }
    else if (flag == "--dv") { if (!parse_int(val, 1, 4096, &n)) return bad("a head dim"); o->dv = int(n); }
    else if (flag == "--backend") { if (!parse_backend(val, &o->backend)) return bad("one of auto, host, cuda, hip"); }
    else if (flag == "--state-dtype") { if (!parse_dtype(val, &o->state_dtype)) return bad("one of fp32, bf16, fp16"); }
    else if (flag == "--dtype") { if (!parse_dtype(val, &o->dtype)) return bad("one of bf16, fp16, fp32"); }
    else if (flag == "--layout") {
      if (val == "kv") o->layout = gdn::Layout::kKV;
      else if (val == "vk") o->layout = gdn::Layout::kVK;
      else return bad("one of vk, kv");
    } else {
      std::fprintf(stderr, "gdn run: unknown option '%s'\n", flag.c_str());
      return 2;
    }
  }
  // Resolve the shape: preset, then overrides, then tensor parallelism.
  const Preset* preset = nullptr;
  for (const Preset& p : kPresets)
    if (o->model == p.name) preset = &p;
  if (preset == nullptr && o->model != "custom") {
    std::fprintf(stderr, "gdn run: --model: unknown model '%s' (see gdn run --help)\n", o->model.c_str());
    return 2;
  }
  if (preset == nullptr && (!o->layers || !o->hk || !o->hv || !o->dk || !o->dv)) {
    std::fprintf(stderr, "gdn run: --model custom needs --layers, --hk, --hv, --dk and --dv\n");
    return 2;
  }
  if (preset != nullptr) {
    if (!o->layers) o->layers = preset->layers;
    if (!o->hk) o->hk = preset->hk;
    if (!o->hv) o->hv = preset->hv;
    if (!o->dk) o->dk = preset->dk;
    if (!o->dv) o->dv = preset->dv;
  }
  if (o->hk % o->tp != 0 || o->hv % o->tp != 0) {
    std::fprintf(stderr, "gdn run: --tp: %d does not divide Hk=%d and Hv=%d\n", o->tp, o->hk, o->hv);
    return 2;
  }
  o->hk /= o->tp;
  o->hv /= o->tp;
  if (!o->check_every) o->check_every = std::max(1, o->steps / 4);
  return 0;
}

// A buffer in one backend's memory, released on scope exit.
class Buffer {
 public:
  Buffer(const gdn::BackendOps* ops, size_t bytes) : ops_(ops), bytes_(bytes), ptr_(ops->alloc(bytes)) {}
  ~Buffer() {
    if (ptr_) ops_->release(ptr_);
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer(Buffer&& o) noexcept : ops_(o.ops_), bytes_(o.bytes_), ptr_(o.ptr_) { o.ptr_ = nullptr; }
  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  bool upload(const void* src) const {
    return ops_->copy(ptr_, src, bytes_, gdn::CopyKind::kHostToDevice).ok();
  }
  bool download(void* dst) const {
    return ops_->copy(dst, ptr_, bytes_, gdn::CopyKind::kDeviceToHost).ok();
  }

 private:
  const gdn::BackendOps* ops_;
  size_t bytes_;
  void* ptr_;
};

// Random values stored in dtype t (rounded as a producer kernel would store them).
std::vector<uint8_t> random_tensor(std::mt19937_64& rng, int64_t n, gdn::DType t, double stddev) {
  std::vector<uint8_t> out(size_t(n) * gdn::dtype_size(t));
  std::normal_distribution<double> dist(0.0, stddev);
  for (int64_t i = 0; i < n; ++i) gdn::store_element(out.data(), t, i, dist(rng));
  return out;
}

std::vector<double> widen(const std::vector<uint8_t>& bytes, gdn::DType t) {
  std::vector<double> out(bytes.size() / gdn::dtype_size(t));
  for (size_t i = 0; i < out.size(); ++i) out[i] = gdn::load_element(bytes.data(), t, int64_t(i));
  return out;
}

class Progress {
 public:
  explicit Progress(int total) : total_(total), tty_(isatty(fileno(stderr)) != 0) {}
  void update(int done) {
    const int width = 30;
    if (tty_) {
      const int fill = done * width / total_;
      std::fprintf(stderr, "\r  [%.*s%*s] %d/%d steps", fill, "##############################",
                   width - fill, "", done, total_);
      if (done == total_) std::fprintf(stderr, "\n");
    } else if (done * 10 / total_ != last_decile_ || done == total_) {
      last_decile_ = done * 10 / total_;
      std::fprintf(stderr, "  %d/%d steps\n", done, total_);
    }
    std::fflush(stderr);
  }

 private:
  int total_;
  bool tty_;
  int last_decile_{-1};
};

// The model's per-layer parameters (host copies for the reference) and state pools.
struct Layers {
  std::vector<std::vector<float>> A_log, dt_bias;
  std::vector<Buffer> pools, A_dev, dt_dev;
};

// A few input sets, rotated over layers and steps.
constexpr int kInputSets = 4;
struct Inputs {
  std::vector<std::vector<uint8_t>> qkv_host, a_host, b_host;
  std::vector<Buffer> qkv_dev, a_dev, b_dev;
};

// ---- the model's per-layer parameters and state pools (random, non-zero);
// false (after a message) when an allocation or a copy fails.
bool make_layers(const Options& opt, const gdn::BackendOps* ops, size_t pool_bytes,
                 std::mt19937_64& rng, Layers* m) {
  const int64_t B = opt.batch;
  const int L = opt.layers, Hv = opt.hv, Dk = opt.dk, Dv = opt.dv;
  const int64_t slot_elems = int64_t(Hv) * Dk * Dv;
  std::vector<std::vector<float>>& A_log = m->A_log;
  std::vector<std::vector<float>>& dt_bias = m->dt_bias;
  A_log.assign(L, std::vector<float>(Hv));
  dt_bias.assign(L, std::vector<float>(Hv));
  std::uniform_real_distribution<double> A_dist(1.0, 16.0), dt_log(std::log(1e-3), std::log(1e-1));
  std::vector<Buffer>& pools = m->pools;
  std::vector<Buffer>& A_dev = m->A_dev;
  std::vector<Buffer>& dt_dev = m->dt_dev;
  for (int l = 0; l < L; ++l) {
    for (int h = 0; h < Hv; ++h) {
      // A_log = log(A), A ~ U(1, 16); dt_bias = softplus^-1(dt), dt log-uniform in [1e-3, 0.1]
      A_log[l][h] = float(std::log(A_dist(rng)));
      dt_bias[l][h] = float(std::log(std::expm1(std::exp(dt_log(rng)))));
    }
    pools.emplace_back(ops, pool_bytes);
    A_dev.emplace_back(ops, Hv * sizeof(float));
    dt_dev.emplace_back(ops, Hv * sizeof(float));
    if (!pools.back().get() || !A_dev.back().get() || !dt_dev.back().get()) {
      std::fprintf(stderr, "gdn run: out of %s memory allocating layer %d's state pool (%.1f MiB)\n",
                   ops->name, l, double(pool_bytes) / (1 << 20));
      return false;
    }
    const std::vector<uint8_t> init = random_tensor(rng, B * slot_elems, opt.state_dtype, 0.5);
    if (!pools.back().upload(init.data()) || !A_dev.back().upload(A_log[l].data()) ||
        !dt_dev.back().upload(dt_bias[l].data())) {
      std::fprintf(stderr, "gdn run: copy to %s failed\n", ops->name);
      return false;
    }
  }
  return true;
}

// ---- a few input sets, rotated over layers and steps; false (after a message)
// when a copy fails.
bool make_inputs(const Options& opt, const gdn::BackendOps* ops, int64_t conv_dim,
                 std::mt19937_64& rng, Inputs* in) {
  const int64_t B = opt.batch;
  const int Hv = opt.hv;
  std::vector<std::vector<uint8_t>>& qkv_host = in->qkv_host;
  std::vector<std::vector<uint8_t>>& a_host = in->a_host;
  std::vector<std::vector<uint8_t>>& b_host = in->b_host;
  std::vector<Buffer>& qkv_dev = in->qkv_dev;
  std::vector<Buffer>& a_dev = in->a_dev;
  std::vector<Buffer>& b_dev = in->b_dev;
  for (int i = 0; i < kInputSets; ++i) {
    qkv_host.push_back(random_tensor(rng, B * conv_dim, opt.dtype, 1.0));
    a_host.push_back(random_tensor(rng, B * Hv, opt.dtype, 1.0));
    b_host.push_back(random_tensor(rng, B * Hv, opt.dtype, 1.0));
    qkv_dev.emplace_back(ops, qkv_host.back().size());
    a_dev.emplace_back(ops, a_host.back().size());
    b_dev.emplace_back(ops, b_host.back().size());
    if (!qkv_dev.back().upload(qkv_host.back().data()) || !a_dev.back().upload(a_host.back().data()) ||
        !b_dev.back().upload(b_host.back().data())) {
      std::fprintf(stderr, "gdn run: copy to %s failed\n", ops->name);
      return false;
    }
  }
  return true;
}

// The parameters every call shares: sizes, dtypes, layout, dense strides.
gdn::DecodeParams base_params(const Options& opt) {
  gdn::DecodeParams base;
  base.batch = opt.batch;
  base.num_k_heads = opt.hk;
  base.num_v_heads = opt.hv;
  base.head_dim_k = opt.dk;
  base.head_dim_v = opt.dv;
  base.qkv_dtype = base.ab_dtype = base.o_dtype = opt.dtype;
  base.state_dtype = opt.state_dtype;
  base.layout = opt.layout;
  base.num_slots = opt.batch;
  gdn::set_dense_strides(base);
  return base;
}

// Host reference on copies of this layer's state and this step's inputs, into
// *state_ref and *o_ref; false (after a message) on failure.
bool host_reference(const gdn::DecodeParams& base, const gdn::BackendOps* ops, const Layers& m,
                    const Inputs& in, int set, int check_layer, int64_t conv_dim, size_t pool_bytes,
                    size_t o_bytes, std::vector<uint8_t>* state_ref, std::vector<uint8_t>* o_ref) {
  state_ref->resize(pool_bytes);
  o_ref->resize(o_bytes);
  if (!m.pools[check_layer].download(state_ref->data())) {
    std::fprintf(stderr, "gdn run: copy from %s failed\n", ops->name);
    return false;
  }
  gdn::DecodeParams h = base;
  gdn::set_packed_qkv(h, in.qkv_host[set].data(), conv_dim);
  h.a = in.a_host[set].data();
  h.b = in.b_host[set].data();
  h.A_log = m.A_log[check_layer].data();
  h.dt_bias = m.dt_bias[check_layer].data();
  h.state = state_ref->data();
  h.o = o_ref->data();
  const gdn::Status st = gdn::decode(h, gdn::Backend::kHost);
  if (!st.ok()) {
    std::fprintf(stderr, "gdn run: host reference failed: %s\n", st.message);
    return false;
  }
  return true;
}

// The checks' verdict and the timings of the unchecked steps.
void print_summary(const Options& opt, size_t pool_bytes, double call_seconds, int checks,
                   int failed_checks, double worst_o, double worst_state) {
  const int64_t B = opt.batch;
  const int L = opt.layers;
  int timed_steps = 0;
  for (int step = 0; step < opt.steps; ++step) {
    const bool check = (step % opt.check_every == 0) || step == opt.steps - 1;
    timed_steps += (!check || opt.steps == 1) ? 1 : 0;
  }
  std::printf("\n");
  std::printf("  %-34s %s\n", "checked against the host reference",
              failed_checks ? "FAIL" : "PASS");
  std::printf("  %-34s %d steps, worst rel. error o %.2e, state %.2e\n", "", checks, worst_o,
              worst_state);
  if (timed_steps == 0) {
    std::printf("  (every step was a checked step: run more --steps for timings)\n");
  } else {
    const double per_step = call_seconds / timed_steps;
    const double per_call = per_step / L;
    // Each call reads and writes every state it touches once.
    const double state_bytes_per_step = 2.0 * double(pool_bytes) * L;
    std::printf("  %-34s %.3f ms  (%d timed steps, wall clock incl. launch)\n", "per-call time",
                per_call * 1e3, timed_steps);
    std::printf("  %-34s %.3f ms  (all %d GDN layers, batch %lld)\n", "per-token GDN time",
                per_step * 1e3, L, (long long)B);
    std::printf("  %-34s %.2f GB/s\n", "state bytes per second", state_bytes_per_step / per_step / 1e9);
  }
}

}  // namespace

int cmd_run(const std::vector<std::string>& args) {
  Options opt;
  const int rc = parse(args, &opt);
  if (rc == -1) {
    usage(stdout);
    return 0;
  }
  if (rc != 0) {
    usage(stderr);
    return 2;
  }

  const gdn::Backend backend = gdn::resolve_backend(opt.backend);
  const gdn::BackendOps* ops = gdn::backend_ops(backend);
  char why[256] = {};
  if (ops == nullptr || !ops->available(why, sizeof why)) {
    std::fprintf(stderr, "gdn run: backend %s is %s\n", gdn::to_string(backend),
                 ops == nullptr ? "not built into this gdnkit" : why);
    return 1;
  }

  const int64_t B = opt.batch;
  const int L = opt.layers, Hk = opt.hk, Hv = opt.hv, Dk = opt.dk, Dv = opt.dv;
  const int64_t conv_dim = 2 * int64_t(Hk) * Dk + int64_t(Hv) * Dv;
  const size_t s_elem = gdn::dtype_size(opt.state_dtype);
  const int64_t slot_elems = int64_t(Hv) * Dk * Dv;
  const size_t pool_bytes = size_t(B) * size_t(slot_elems) * s_elem;

  std::printf("gdn run: %s, %d GDN layers, Hk/Hv %d/%d, Dk/Dv %d/%d, batch %lld, %d steps\n",
              opt.model.c_str(), L, Hk, Hv, Dk, Dv, (long long)B, opt.steps);
  std::printf("         backend %s, state %s (%s), inputs/output %s, state pools %.1f MiB in all\n",
              ops->name, gdn::to_string(opt.state_dtype), gdn::to_string(opt.layout),
              gdn::to_string(opt.dtype), double(pool_bytes) * L / (1 << 20));
  std::fflush(stdout);  // the header before the progress bar (stderr)

  std::mt19937_64 rng(opt.seed);
  Layers m;
  if (!make_layers(opt, ops, pool_bytes, rng, &m)) return 1;
  Inputs in;
  if (!make_inputs(opt, ops, conv_dim, rng, &in)) return 1;
  Buffer o_dev(ops, size_t(B) * Hv * Dv * gdn::dtype_size(opt.dtype));

  const gdn::DecodeParams base = base_params(opt);

  auto params_for = [&](int step, int layer, void* state, void* o) {
    gdn::DecodeParams p = base;
    const int set = (step * L + layer) % kInputSets;
    gdn::set_packed_qkv(p, in.qkv_dev[set].get(), conv_dim);
    p.a = in.a_dev[set].get();
    p.b = in.b_dev[set].get();
    p.A_log = static_cast<const float*>(m.A_dev[layer].get());
    p.dt_bias = static_cast<const float*>(m.dt_dev[layer].get());
    p.state = state;
    p.o = o;
    return p;
  };

  // ---- decode
  Progress progress(opt.steps);
  double call_seconds = 0.0;
  int checks = 0, failed_checks = 0;
  double worst_o = 0.0, worst_state = 0.0;
  for (int step = 0; step < opt.steps; ++step) {
    const bool check = (step % opt.check_every == 0) || step == opt.steps - 1;
    const int check_layer = step % L;
    std::vector<uint8_t> state_ref, o_ref;
    if (check && !host_reference(base, ops, m, in, (step * L + check_layer) % kInputSets,
                                 check_layer, conv_dim, pool_bytes, o_dev.bytes(), &state_ref,
                                 &o_ref))
      return 1;

    const auto t0 = std::chrono::steady_clock::now();
    for (int l = 0; l < L; ++l) {
      const gdn::Status st = gdn::decode(params_for(step, l, m.pools[l].get(), o_dev.get()), backend);
      if (!st.ok()) {
        std::fprintf(stderr, "\ngdn run: step %d layer %d: %s\n", step, l, st.message);
        return 1;
      }
      if (check && l == check_layer) {
        // o is reused by every layer: compare the checked layer's before the next one overwrites it.
        ops->synchronize(nullptr);
        std::vector<uint8_t> o_got(o_dev.bytes());
        o_dev.download(o_got.data());
        const gdn::golden::Comparison c = gdn::golden::compare(
            widen(o_got, opt.dtype), widen(o_ref, opt.dtype), gdn::golden::output_tolerance(opt.dtype));
        worst_o = std::max(worst_o, c.rel_l2);
        failed_checks += c.pass ? 0 : 1;
      }
    }
    const gdn::Status sync = ops->synchronize(nullptr);
    const auto t1 = std::chrono::steady_clock::now();
    if (!sync.ok()) {
      std::fprintf(stderr, "\ngdn run: %s\n", sync.message);
      return 1;
    }
    // A checked step's timing includes one extra sync and copy: keep it out.
    if (!check || opt.steps == 1) call_seconds += std::chrono::duration<double>(t1 - t0).count();

    if (check) {
      std::vector<uint8_t> state_got(pool_bytes);
      m.pools[check_layer].download(state_got.data());
      const gdn::golden::Comparison c =
          gdn::golden::compare(widen(state_got, opt.state_dtype), widen(state_ref, opt.state_dtype),
                               gdn::golden::state_tolerance(opt.state_dtype));
      worst_state = std::max(worst_state, c.rel_l2);
      failed_checks += c.pass ? 0 : 1;
      ++checks;
    }
    progress.update(step + 1);
  }

  print_summary(opt, pool_bytes, call_seconds, checks, failed_checks, worst_o, worst_state);
  return failed_checks ? 1 : 0;
}
