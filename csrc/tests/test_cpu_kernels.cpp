// The CPU kernels (Adam, SGD, Adagrad, Lion; every ISA body this CPU can run) against an element-by-element
// loop over the shared scalar math: all sizes around the vector widths, unaligned
// pointers, each gradient dtype, each 16-bit output, multi-tensor work lists split
// over several threads (each element updated exactly once), and bad arguments.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "check.h"
#include "cpu_optim.h"
#include "half_convert.h"

using namespace dsfast;
using namespace dsfast::cpu;

namespace {

std::mt19937 rng(42);

std::vector<float> randn(int64_t n, float scale) {
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Gradient storage in one dtype plus its exact float value (what the kernel should read).
struct Grad {
  DType dtype;
  std::vector<unsigned char> bytes;
  std::vector<float> value;
  Grad(DType dt, const std::vector<float>& src, int64_t offset) : dtype(dt), value(src.size()) {
    const int64_t es = dt == DType::F32 ? 4 : 2;
    bytes.resize((src.size() + offset) * es);
    for (size_t i = 0; i < src.size(); ++i) {
      unsigned char* at = bytes.data() + (i + offset) * es;
      if (dt == DType::F32) { std::memcpy(at, &src[i], 4); value[i] = src[i]; }
      else if (dt == DType::BF16) { uint16_t h = float_to_bf16(src[i]); std::memcpy(at, &h, 2); value[i] = bf16_to_float(h); }
      else { uint16_t h = float_to_f16(src[i]); std::memcpy(at, &h, 2); value[i] = f16_to_float(h); }
    }
  }
  const void* ptr(int64_t offset) const { return bytes.data() + offset * (dtype == DType::F32 ? 4 : 2); }
};

bool close(float got, float want) {
  if (std::isnan(want)) return std::isnan(got);
  if (std::isinf(want)) return got == want;
  // vector bodies may fuse multiply-adds; the scalar reference does not
  return std::fabs(got - want) <= 1e-6f + 1e-5f * std::fabs(want);
}

uint16_t to16(float x, DType d) { return d == DType::BF16 ? float_to_bf16(x) : float_to_f16(x); }

const char* dname(DType d) { return d == DType::F32 ? "f32" : d == DType::BF16 ? "bf16" : d == DType::F16 ? "f16" : "none"; }

// Random inputs of size n, generated once per size (drawing them dominated the run time).
const std::vector<std::vector<float>>& inputs(int64_t n) {
  static std::map<int64_t, std::vector<std::vector<float>>> cache;
  auto it = cache.find(n);
  if (it != cache.end()) return it->second;
  std::vector<std::vector<float>> in = {randn(n, 1.f), randn(n, 0.1f), randn(n, 0.5f), randn(n, 0.01f)};
  for (auto& x : in[3]) x = std::fabs(x);
  if (n > 3) { in[2][1] = NAN; in[2][2] = INFINITY; }  // non-finite grads propagate as in torch
  return cache[n] = in;
}

void adam_case(Isa isa, int64_t n, DType gd, DType od, int64_t offset, bool adamw, int threads) {
  const auto& in = inputs(n);
  const auto &p0 = in[0], &m0 = in[1], &g0 = in[2], &v0 = in[3];
  Grad g(gd, g0, offset);
  // unaligned: the kernel's arrays start `offset` floats into their buffers
  std::vector<float> p(n + offset), m(n + offset), v(n + offset);
  std::copy(p0.begin(), p0.end(), p.begin() + offset);
  std::copy(m0.begin(), m0.end(), m.begin() + offset);
  std::copy(v0.begin(), v0.end(), v.begin() + offset);
  std::vector<uint16_t> out(n + offset + 1, 0xabcd);

  AdamCoeffs c = make_adam_coeffs(1e-2f, 0.9f, 0.999f, 1e-8f, 0.05f, adamw, true, 3);
  AdamTensor t{p.data() + offset, g.ptr(offset), m.data() + offset, v.data() + offset,
               od == DType::None ? nullptr : out.data() + offset, n, gd, od, c};
  adam_step(&t, 1, threads, isa);

  int bad = 0;
  for (int64_t i = 0; i < n && bad < 3; ++i) {
    float rp = p0[i], rm = m0[i], rv = v0[i];
    adam_update(rp, g.value[i], rm, rv, c);
    bool ok = close(p[offset + i], rp) && close(m[offset + i], rm) && close(v[offset + i], rv);
    if (od != DType::None) {
      // the 16-bit copy is exactly the RNE cast of the kernel's own fp32 result
      uint16_t want = to16(p[offset + i], od);
      uint16_t got = out[offset + i];
      ok = ok && (got == want || (std::isnan(p[offset + i]) && ((got & 0x7fff) > (od == DType::BF16 ? 0x7f80 : 0x7c00))));
    }
    if (!ok) ++bad;
    CHECK(ok, "adam %s n=%lld grad=%s out=%s off=%lld i=%lld: p %.9g vs %.9g", isa_name(isa), (long long)n,
          dname(gd), dname(od), (long long)offset, (long long)i, p[offset + i], rp);
  }
  if (od != DType::None) CHECK(out[offset + n] == 0xabcd, "adam wrote past the end of the 16-bit output");
}

void sgd_case(Isa isa, int64_t n, DType gd, DType od, float momentum, bool nesterov, bool first, int threads) {
  const auto& in = inputs(n);
  const auto &p0 = in[0], &b0 = in[1];
  std::vector<float> g0 = in[2];
  if (n > 3) { g0[1] = 0.25f; g0[2] = -0.5f; }
  Grad g(gd, g0, 0);
  auto p = p0, b = b0;
  std::vector<uint16_t> out(n + 1, 0xabcd);
  SGDCoeffs c = make_sgd_coeffs(0.05f, momentum, nesterov ? 0.f : 0.1f, 0.01f, nesterov, first);
  SGDTensor t{p.data(), g.ptr(0), momentum != 0 ? b.data() : nullptr, od == DType::None ? nullptr : out.data(), n,
              gd, od, c};
  sgd_step(&t, 1, threads, isa);
  int bad = 0;
  for (int64_t i = 0; i < n && bad < 3; ++i) {
    float rp = p0[i], rb = b0[i];
    sgd_update(rp, g.value[i], rb, c);
    bool ok = close(p[i], rp) && (momentum == 0 || close(b[i], rb));
    if (od != DType::None) ok = ok && out[i] == to16(p[i], od);
    if (!ok) ++bad;
    CHECK(ok, "sgd %s n=%lld grad=%s out=%s mom=%g nest=%d first=%d i=%lld: p %.9g vs %.9g", isa_name(isa),
          (long long)n, dname(gd), dname(od), momentum, nesterov, first, (long long)i, p[i], rp);
  }
  if (od != DType::None) CHECK(out[n] == 0xabcd, "sgd wrote past the end of the 16-bit output");
}

// Values stored in dtype d (the kernel's view of a 16-bit master or state), and back.
struct Stored {
  DType dtype;
  std::vector<unsigned char> bytes;
  Stored(DType dt, const std::vector<float>& src) : dtype(dt), bytes(src.size() * (dt == DType::F32 ? 4 : 2)) {
    for (size_t i = 0; i < src.size(); ++i) set(i, src[i]);
  }
  void set(size_t i, float x) {
    if (dtype == DType::F32) std::memcpy(bytes.data() + i * 4, &x, 4);
    else { uint16_t h = to16(x, dtype); std::memcpy(bytes.data() + i * 2, &h, 2); }
  }
  float get(size_t i) const {
    if (dtype == DType::F32) { float x; std::memcpy(&x, bytes.data() + i * 4, 4); return x; }
    uint16_t h; std::memcpy(&h, bytes.data() + i * 2, 2);
    return dtype == DType::BF16 ? bf16_to_float(h) : f16_to_float(h);
  }
  void* ptr() { return bytes.data(); }
};

// The fp32 result rounded to dtype d. Vector bodies may fuse multiply-adds, so one unit in the last place of the
// 16-bit value is allowed (a result near a rounding tie), and 1e-6 absolute (a moment that nearly cancels, or a
// subnormal fp16).
bool close_in(float got, float want32, DType d) {
  if (d == DType::F32) return close(got, want32);
  if (std::isnan(want32)) return std::isnan(got);
  const float want = d == DType::BF16 ? bf16_to_float(to16(want32, d)) : f16_to_float(to16(want32, d));
  const float ulp = std::fabs(want) * (d == DType::BF16 ? 1.0f / 128 : 1.0f / 1024) + 1e-30f;
  return got == want || std::fabs(got - want) <= ulp * 1.0001f + 1e-6f;
}

// 16-bit masters and states (bf16_master_weights_and_grads / bf16_optimizer_states): read as stored, computed in
// fp32, each stored value the nearest-even rounding of the fp32 result.
void low_precision_case(Isa isa, int64_t n, DType pd, DType sd, DType gd) {
  const auto& in = inputs(n);
  Grad g(gd, in[2], 0);
  Stored p(pd, in[0]), m(sd, in[1]), v(sd, in[3]);
  AdamCoeffs c = make_adam_coeffs(1e-2f, 0.9f, 0.999f, 1e-8f, 0.05f, true, true, 3);
  AdamTensor t{p.ptr(), g.ptr(0), m.ptr(), v.ptr(), nullptr, n, gd, DType::None, c, pd, sd};
  const Stored p0 = p, m0 = m, v0 = v;
  adam_step(&t, 1, 2, isa);
  int bad = 0;
  for (int64_t i = 0; i < n && bad < 3; ++i) {
    float rp = p0.get(i), rm = m0.get(i), rv = v0.get(i);
    adam_update(rp, g.value[i], rm, rv, c);
    bool ok = close_in(p.get(i), rp, pd) && close_in(m.get(i), rm, sd) && close_in(v.get(i), rv, sd);
    if (!ok) ++bad;
    CHECK(ok, "adam %s n=%lld param=%s state=%s grad=%s i=%lld: p %.9g vs %.9g, m %.9g vs %.9g", isa_name(isa),
          (long long)n, dname(pd), dname(sd), dname(gd), (long long)i, p.get(i), rp, m.get(i), rm);
  }
  Stored q(pd, in[0]), b(sd, in[1]);
  const Stored q0 = q, b0 = b;
  SGDCoeffs sc = make_sgd_coeffs(0.05f, 0.9f, 0.1f, 0.01f, false, false);
  SGDTensor s{q.ptr(), g.ptr(0), b.ptr(), nullptr, n, gd, DType::None, sc, pd, sd};
  sgd_step(&s, 1, 2, isa);
  bad = 0;
  for (int64_t i = 0; i < n && bad < 3; ++i) {
    float rp = q0.get(i), rb = b0.get(i);
    sgd_update(rp, g.value[i], rb, sc);
    bool ok = close_in(q.get(i), rp, pd) && close_in(b.get(i), rb, sd);
    if (!ok) ++bad;
    CHECK(ok, "sgd %s n=%lld param=%s state=%s grad=%s i=%lld: p %.9g vs %.9g", isa_name(isa), (long long)n,
          dname(pd), dname(sd), dname(gd), (long long)i, q.get(i), rp);
  }
}

// Stochastic rounding of bf16 params: every ISA stores the rounding half_convert.h defines for the fp32 result
// (one bf16 ulp allowed: a fused multiply-add may move the fp32 value across a threshold), and a thread split
// changes nothing (the random bits depend on the element index, not on who computes it).
void stochastic_case(Isa isa, int64_t n) {
  const auto& in = inputs(n);
  Grad g(DType::F32, in[2], 0);
  const uint32_t seed = 0x1234567u;
  Stored p(DType::BF16, in[0]), m(DType::F32, in[1]), v(DType::F32, in[3]);
  const Stored p0 = p, m0 = m, v0 = v;
  AdamCoeffs c = make_adam_coeffs(1e-2f, 0.9f, 0.999f, 1e-8f, 0.05f, true, true, 3);
  AdamTensor t{p.ptr(), g.ptr(0), m.ptr(), v.ptr(), nullptr, n, DType::F32, DType::None, c, DType::BF16, DType::F32,
               seed};
  adam_step(&t, 1, 3, isa);
  int bad = 0;
  int64_t exact = 0;
  for (int64_t i = 0; i < n && bad < 3; ++i) {
    float rp = p0.get(i), rm = m0.get(i), rv = v0.get(i);
    adam_update(rp, g.value[i], rm, rv, c);
    const float want = bf16_to_float(float_to_bf16_stochastic(rp, round_bits(seed, uint32_t(i))));
    const float got = p.get(i);
    const bool same = (std::isnan(want) && std::isnan(got)) || got == want;
    exact += same;
    bool ok = same || std::fabs(got - want) <= std::fabs(want) * (1.0f / 128) * 1.0001f;
    if (!ok) ++bad;
    CHECK(ok, "stochastic %s n=%lld i=%lld: %.9g vs %.9g", isa_name(isa), (long long)n, (long long)i, got, want);
  }
  // nearest-even rounding would match the stochastic one about half the time only
  CHECK(exact * 100 >= n * 99, "stochastic %s n=%lld: only %lld exact", isa_name(isa), (long long)n,
        (long long)exact);
  Stored q = p0, qm = m0, qv = v0;
  AdamTensor one{q.ptr(), g.ptr(0), qm.ptr(), qv.ptr(), nullptr, n, DType::F32, DType::None, c, DType::BF16,
                 DType::F32, seed};
  adam_step(&one, 1, 1, isa);
  CHECK(q.bytes == p.bytes, "stochastic %s n=%lld: one thread and three differ", isa_name(isa), (long long)n);
}

// Many tensors of odd sizes in one call, with several thread counts: the result must
// be bit-identical to processing each tensor alone on one thread.
void work_list_case(Isa isa) {
  std::vector<int64_t> sizes = {1, 70000, 0, 17, 4097, 33333, 5, 64, 65, 100003, 3};
  for (int threads : {2, 3, 7}) {
    std::vector<std::vector<float>> P, M, V, G, P1, M1, V1;
    std::vector<AdamTensor> many, single;
    for (size_t k = 0; k < sizes.size(); ++k) {
      int64_t n = sizes[k];
      P.push_back(randn(n, 1.f)); M.push_back(randn(n, .1f)); G.push_back(randn(n, .5f));
      V.push_back(std::vector<float>(n, 0.01f));
      P1.push_back(P.back()); M1.push_back(M.back()); V1.push_back(V.back());
    }
    for (size_t k = 0; k < sizes.size(); ++k) {
      AdamCoeffs c = make_adam_coeffs(1e-3f * (k + 1), 0.9f, 0.99f, 1e-6f, 0.01f * k, k % 2, true, k + 1);
      many.push_back({P[k].data(), G[k].data(), M[k].data(), V[k].data(), nullptr, sizes[k], DType::F32, DType::None, c});
      single.push_back({P1[k].data(), G[k].data(), M1[k].data(), V1[k].data(), nullptr, sizes[k], DType::F32, DType::None, c});
    }
    adam_step(many.data(), (int64_t)many.size(), threads, isa);
    for (auto& t : single) adam_step(&t, 1, 1, isa);
    for (size_t k = 0; k < sizes.size(); ++k) {
      bool same = std::memcmp(P[k].data(), P1[k].data(), sizes[k] * 4) == 0 &&
                  std::memcmp(M[k].data(), M1[k].data(), sizes[k] * 4) == 0 &&
                  std::memcmp(V[k].data(), V1[k].data(), sizes[k] * 4) == 0;
      CHECK(same, "work list %s threads=%d tensor %zu (n=%lld) differs from a single-tensor run", isa_name(isa),
            threads, k, (long long)sizes[k]);
    }
  }
}

// Adagrad and Lion (one state each) through every precision: each body against the element-by-element scalar math,
// with unaligned arrays, every gradient dtype, 16-bit outputs beside fp32 masters, 16-bit masters and states.
struct AdagradOp {
  static constexpr const char* name = "adagrad";
  static AdagradCoeffs coeffs(bool decay) { return make_adagrad_coeffs(0.05, 1e-10, decay ? 0.01 : 0.0); }
  static void update(float& p, float g, float& s, const AdagradCoeffs& c) { adagrad_update(p, g, s, c); }
  static void step(const AdagradTensor* t, int64_t n, int threads, Isa isa) { adagrad_step(t, n, threads, isa); }
  static const std::vector<float>& state0(int64_t n) { return inputs(n)[3]; }  // a sum of squares: >= 0
  static bool near_tie(float, float, const AdagradCoeffs&) { return false; }
};
struct LionOp {
  static constexpr const char* name = "lion";
  static LionCoeffs coeffs(bool decay) { return make_lion_coeffs(1e-2, 0.9, 0.99, decay ? 0.1 : 0.0); }
  static void update(float& p, float g, float& s, const LionCoeffs& c) { lion_update(p, g, s, c); }
  static void step(const LionTensor* t, int64_t n, int threads, Isa isa) { lion_step(t, n, threads, isa); }
  static const std::vector<float>& state0(int64_t n) { return inputs(n)[1]; }
  // The sign of an interpolation that (nearly) cancels depends on whether the body fused its multiply-add: there
  // the update may be any of -lr, 0, +lr.
  static bool near_tie(float m, float g, const LionCoeffs& c) {
    const float a = c.beta1 * m, b = c.one_minus_beta1 * g * c.grad_scale;
    return std::fabs(a + b) <= 1e-6f * (std::fabs(a) + std::fabs(b));
  }
};

template <class Op>
void one_state_case(Isa isa, int64_t n, DType pd, DType sd, DType gd, DType od, bool decay, int threads) {
  const auto& in = inputs(n);
  const int64_t offset = n % 3;
  Grad g(gd, in[2], offset);
  std::vector<float> pad(offset, 0.f);
  auto padded = [&](const std::vector<float>& v) { auto x = pad; x.insert(x.end(), v.begin(), v.end()); return x; };
  Stored p(pd, padded(in[0])), s(sd, padded(Op::state0(n)));
  const Stored p0 = p, s0 = s;
  std::vector<uint16_t> out(n + offset + 1, 0xabcd);
  const auto c = Op::coeffs(decay);
  const int64_t pb = pd == DType::F32 ? 4 : 2, sb = sd == DType::F32 ? 4 : 2;
  OneStateTensor<std::decay_t<decltype(c)>> t{
      static_cast<unsigned char*>(p.ptr()) + offset * pb, g.ptr(offset),
      static_cast<unsigned char*>(s.ptr()) + offset * sb, od == DType::None ? nullptr : out.data() + offset, n, gd,
      od, c, pd, sd};
  Op::step(&t, 1, threads, isa);
  int bad = 0;
  for (int64_t i = 0; i < n && bad < 3; ++i) {
    float rp = p0.get(offset + i), rs = s0.get(offset + i);
    Op::update(rp, g.value[i], rs, c);
    const float gp = p.get(offset + i), gs = s.get(offset + i);
    bool ok = close_in(gp, rp, pd) && close_in(gs, rs, sd);
    if (!ok && Op::near_tie(s0.get(offset + i), g.value[i], c)) {  // the same update with a flipped sign
      const float p_in = p0.get(offset + i), lr = 0.01f;
      for (float shift : {-2 * lr, -lr, 0.0f, lr, 2 * lr}) ok = ok || (close_in(gs, rs, sd) && close_in(gp, rp + shift, pd) &&
                                                      std::fabs(gp - p_in) <= 2 * lr);
    }
    if (od != DType::None) ok = ok && (out[offset + i] == to16(gp, od) || std::isnan(gp));
    if (!ok) ++bad;
    CHECK(ok, "%s %s n=%lld param=%s state=%s grad=%s out=%s i=%lld: p %.9g vs %.9g, state %.9g vs %.9g", Op::name,
          isa_name(isa), (long long)n, dname(pd), dname(sd), dname(gd), dname(od), (long long)i, gp, rp, gs, rs);
  }
  if (od != DType::None) CHECK(out[offset + n] == 0xabcd, "%s wrote past the end of the 16-bit output", Op::name);
}

template <class Op>
void one_state_cases(Isa isa) {
  for (int64_t n : {0, 1, 7, 15, 16, 17, 33, 4097, 70001, 200003})
    for (DType gd : {DType::F32, DType::BF16, DType::F16})
      for (DType od : {DType::None, DType::BF16, DType::F16})
        one_state_case<Op>(isa, n, DType::F32, DType::F32, gd, od, n % 2 == 1, 2);
  for (int64_t n : {1, 17, 4097, 70001})
    for (auto [pd, sd] : {std::pair{DType::BF16, DType::BF16}, std::pair{DType::BF16, DType::F32},
                          std::pair{DType::F16, DType::F16}, std::pair{DType::F16, DType::F32}})
      for (DType gd : {DType::F32, DType::BF16})
        one_state_case<Op>(isa, n, pd, sd, gd, DType::None, true, 3);
}

template <class F>
bool throws(F f) {
  try { f(); } catch (const std::invalid_argument&) { return true; }
  return false;
}

}  // namespace

int main() {
  std::printf("best ISA: %s, OpenMP: %s\n", isa_name(best_isa()), openmp_enabled() ? "yes" : "no");
  CHECK(isa_supported(Isa::Scalar), "scalar is always supported");
  std::vector<Isa> isas;
  for (Isa i : {Isa::Scalar, Isa::AVX2, Isa::AVX512, Isa::AVX512BF16}) {
    if (isa_supported(i)) isas.push_back(i);
    else std::printf("ISA %s not runnable here: skipped\n", isa_name(i));
  }
  // 200003 over 2 threads: several chunks of the dynamic work split, ragged ends
  const int64_t sizes[] = {0, 1, 7, 8, 15, 16, 17, 31, 33, 4097, 70001, 200003};
  for (Isa isa : isas) {
    for (int64_t n : sizes)
      for (DType gd : {DType::F32, DType::BF16, DType::F16})
        for (DType od : {DType::None, DType::BF16, DType::F16})
          adam_case(isa, n, gd, od, n % 3, n % 2 == 0, 2);
    for (int64_t n : {1, 17, 4097, 70001, 200003})
      for (DType gd : {DType::F32, DType::BF16, DType::F16})
        for (DType od : {DType::None, DType::BF16})
          for (float mom : {0.f, 0.9f}) {
            sgd_case(isa, n, gd, od, mom, false, false, 2);
            if (mom != 0.f) { sgd_case(isa, n, gd, od, mom, true, false, 2); sgd_case(isa, n, gd, od, mom, false, true, 2); }
          }
    work_list_case(isa);
    for (int64_t n : {1, 7, 17, 4097, 70001})
      for (auto [pd, sd] : {std::pair{DType::BF16, DType::BF16}, std::pair{DType::BF16, DType::F32},
                            std::pair{DType::F16, DType::F16}, std::pair{DType::F16, DType::F32}})
        for (DType gd : {DType::F32, DType::BF16})
          low_precision_case(isa, n, pd, sd, gd);
    for (int64_t n : {1, 17, 70001}) stochastic_case(isa, n);
    one_state_cases<AdagradOp>(isa);
    one_state_cases<LionOp>(isa);
  }

  // bad arguments are refused before any thread starts
  CHECK(throws([] { parse_isa("sse9"); }), "unknown ISA name");
  CHECK(parse_isa("auto") == Isa::Auto && parse_isa("avx512") == Isa::AVX512, "ISA names parse");
  float x = 0, y = 0, z = 0;
  AdamCoeffs c = make_adam_coeffs(1e-3f, 0.9f, 0.999f, 1e-8f, 0, true, true, 1);
  AdamTensor bad_grad{&x, &y, &y, &z, nullptr, 1, DType(7), DType::None, c};
  CHECK(throws([&] { adam_step(&bad_grad, 1, 1, Isa::Auto); }), "bad grad dtype");
  AdamTensor bad_out{&x, &y, &y, &z, nullptr, 1, DType::F32, DType::BF16, c};
  CHECK(throws([&] { adam_step(&bad_out, 1, 1, Isa::Auto); }), "out dtype without a buffer");
  SGDTensor no_buf{&x, &y, nullptr, nullptr, 1, DType::F32, DType::None, make_sgd_coeffs(0.1f, 0.9f, 0, 0, false, false)};
  CHECK(throws([&] { sgd_step(&no_buf, 1, 1, Isa::Auto); }), "momentum without a buffer");
  uint16_t h = 0;
  AdamTensor bf16_out{&h, &y, &h, &h, &h, 1, DType::F32, DType::BF16, c, DType::BF16, DType::BF16};
  CHECK(throws([&] { adam_step(&bf16_out, 1, 1, Isa::Auto); }), "a 16-bit output beside a bf16 master");
  AdamTensor mixed_states{&h, &y, &h, &h, nullptr, 1, DType::F32, DType::None, c, DType::BF16, DType::F16};
  CHECK(throws([&] { adam_step(&mixed_states, 1, 1, Isa::Auto); }), "fp16 states beside a bf16 master");
  AdamTensor f32_master_bf16_states{&x, &y, &h, &h, nullptr, 1, DType::F32, DType::None, c, DType::F32, DType::BF16};
  CHECK(throws([&] { adam_step(&f32_master_bf16_states, 1, 1, Isa::Auto); }), "bf16 states beside an fp32 master");
  AdamTensor f32_stochastic{&x, &y, &y, &z, nullptr, 1, DType::F32, DType::None, c, DType::F32, DType::F32, 7u};
  CHECK(throws([&] { adam_step(&f32_stochastic, 1, 1, Isa::Auto); }), "stochastic rounding of an fp32 param");
  AdagradTensor no_sum{&x, &y, nullptr, nullptr, 1, DType::F32, DType::None, make_adagrad_coeffs(0.1, 1e-10, 0)};
  CHECK(throws([&] { adagrad_step(&no_sum, 1, 1, Isa::Auto); }), "adagrad without a state buffer");
  LionTensor lion_bf16_out{&h, &y, &h, &h, 1, DType::F32, DType::BF16, make_lion_coeffs(0.1, 0.9, 0.99, 0),
                           DType::BF16, DType::BF16};
  CHECK(throws([&] { lion_step(&lion_bf16_out, 1, 1, Isa::Auto); }), "lion: a 16-bit output beside a bf16 master");
  if (!isa_supported(Isa::AVX512)) {
    AdamTensor ok{&x, &y, &y, &z, nullptr, 1, DType::F32, DType::None, c};
    CHECK(throws([&] { adam_step(&ok, 1, 1, Isa::AVX512); }), "forcing an ISA the CPU lacks");
  }
  TEST_MAIN_END();
}
