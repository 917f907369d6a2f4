// The memory-movement half of the kernels, written once over a vector type `Vec` and
// included by each isa_*.cpp inside its own namespace (DSFAST_ISA_NS), so every
// instantiation is a distinct symbol compiled for that TU's target only: nothing
// compiled for AVX-512 can be merged by the linker into code the scalar path runs.
// Needs, before inclusion: Vec (simd_*.h) in DSFAST_ISA_NS, cpu_optim.h.
// The math itself is dsfast::adam_update / sgd_update from optim_math.h.

namespace dsfast {
namespace cpu {
namespace DSFAST_ISA_NS {

constexpr int kF32 = int(DType::F32), kBF16 = int(DType::BF16), kF16 = int(DType::F16), kNone = int(DType::None);

inline int64_t dtype_bytes(DType d) { return d == DType::F32 ? 4 : 2; }

template <int G>
inline Vec load_grad(const void* g, int64_t i) {
  if constexpr (G == kF32) return Vec::load(static_cast<const float*>(g) + i);
  else if constexpr (G == kBF16) return Vec::load_bf16(static_cast<const uint16_t*>(g) + i);
  else return Vec::load_f16(static_cast<const uint16_t*>(g) + i);
}

template <int O>
inline void store_out(void* o, int64_t i, const Vec& p) {
  if constexpr (O == kBF16) p.store_bf16(static_cast<uint16_t*>(o) + i);
  else if constexpr (O == kF16) p.store_f16(static_cast<uint16_t*>(o) + i);
}

// Copies `n` elements of `bytes` each; the tail path runs one full vector on padded
// stack buffers so it needs no masked instructions and no scalar code of this target.
inline void copy_bytes(void* dst, const void* src, int64_t nbytes) {
  auto* d = static_cast<unsigned char*>(dst);
  auto* s = static_cast<const unsigned char*>(src);
  for (int64_t k = 0; k < nbytes; ++k) d[k] = s[k];
}

template <int G, int O>
inline void adam_vec(float* p, const void* g, float* m, float* v, void* o, int64_t i, const AdamCoeffs& c) {
  Vec pv = Vec::load(p + i), mv = Vec::load(m + i), vv = Vec::load(v + i);
  adam_update(pv, load_grad<G>(g, i), mv, vv, c);
  pv.store(p + i);
  mv.store(m + i);
  vv.store(v + i);
  store_out<O>(o, i, pv);
}

template <int G, int O>
void adam_span(float* p, const void* g, float* m, float* v, void* o, int64_t n, const AdamCoeffs& coeffs) {
  // A local copy: the float stores below could alias a referenced struct's float fields,
  // which would force reloading every coefficient (and re-testing every branch) per vector.
  const AdamCoeffs c = coeffs;
  constexpr int W = Vec::W;
  int64_t i = 0;
  for (; i + W <= n; i += W) adam_vec<G, O>(p, g, m, v, o, i, c);
  const int64_t rest = n - i;
  if (rest <= 0) return;
  constexpr int GB = (G == kF32) ? 4 : 2;
  alignas(64) float bp[W] = {}, bm[W] = {}, bv[W] = {};
  alignas(64) unsigned char bg[W * 4] = {};
  alignas(64) uint16_t bo[W] = {};
  copy_bytes(bp, p + i, rest * 4);
  copy_bytes(bm, m + i, rest * 4);
  copy_bytes(bv, v + i, rest * 4);
  copy_bytes(bg, static_cast<const unsigned char*>(g) + i * GB, rest * GB);
  adam_vec<G, O>(bp, bg, bm, bv, bo, 0, c);
  copy_bytes(p + i, bp, rest * 4);
  copy_bytes(m + i, bm, rest * 4);
  copy_bytes(v + i, bv, rest * 4);
  if constexpr (O != kNone) copy_bytes(static_cast<uint16_t*>(o) + i, bo, rest * 2);
}

template <int G, int O, bool MOM>
inline void sgd_vec(float* p, const void* g, float* b, void* o, int64_t i, const SGDCoeffs& c) {
  Vec pv = Vec::load(p + i);
  Vec bv = (MOM && !c.first_step) ? Vec::load(b + i) : Vec(0.0f);
  sgd_update(pv, load_grad<G>(g, i), bv, c);
  pv.store(p + i);
  if constexpr (MOM) bv.store(b + i);
  store_out<O>(o, i, pv);
}

template <int G, int O, bool MOM>
void sgd_span(float* p, const void* g, float* b, void* o, int64_t n, const SGDCoeffs& coeffs) {
  const SGDCoeffs c = coeffs;  // local copy: see adam_span
  constexpr int W = Vec::W;
  int64_t i = 0;
  for (; i + W <= n; i += W) sgd_vec<G, O, MOM>(p, g, b, o, i, c);
  const int64_t rest = n - i;
  if (rest <= 0) return;
  constexpr int GB = (G == kF32) ? 4 : 2;
  alignas(64) float bp[W] = {}, bb[W] = {};
  alignas(64) unsigned char bg[W * 4] = {};
  alignas(64) uint16_t bo[W] = {};
  copy_bytes(bp, p + i, rest * 4);
  if constexpr (MOM) copy_bytes(bb, b + i, rest * 4);
  copy_bytes(bg, static_cast<const unsigned char*>(g) + i * GB, rest * GB);
  sgd_vec<G, O, MOM>(bp, bg, bb, bo, 0, c);
  copy_bytes(p + i, bp, rest * 4);
  if constexpr (MOM) copy_bytes(b + i, bb, rest * 4);
  if constexpr (O != kNone) copy_bytes(static_cast<uint16_t*>(o) + i, bo, rest * 2);
}

using AdamSpanFn = void (*)(float*, const void*, float*, float*, void*, int64_t, const AdamCoeffs&);
using SGDSpanFn = void (*)(float*, const void*, float*, void*, int64_t, const SGDCoeffs&);

// [grad dtype][out dtype]; grads are F32/BF16/F16, outputs BF16/F16/None (F32 slot unused).
#define DSFAST_ROW(G) {nullptr, &adam_span<G, kBF16>, &adam_span<G, kF16>, &adam_span<G, kNone>}
constexpr AdamSpanFn kAdamTable[3][4] = {DSFAST_ROW(kF32), DSFAST_ROW(kBF16), DSFAST_ROW(kF16)};
#undef DSFAST_ROW
#define DSFAST_ROW(G, M) {nullptr, &sgd_span<G, kBF16, M>, &sgd_span<G, kF16, M>, &sgd_span<G, kNone, M>}
constexpr SGDSpanFn kSGDTable[2][3][4] = {
    {DSFAST_ROW(kF32, false), DSFAST_ROW(kBF16, false), DSFAST_ROW(kF16, false)},
    {DSFAST_ROW(kF32, true), DSFAST_ROW(kBF16, true), DSFAST_ROW(kF16, true)}};
#undef DSFAST_ROW

// Dtypes were validated by the dispatcher (dispatch.cpp) before any thread started.
inline void adam_range(const AdamTensor& t, int64_t begin, int64_t end) {
  AdamSpanFn fn = kAdamTable[int(t.grad_dtype)][int(t.out_dtype)];
  void* out = t.out16 ? static_cast<uint16_t*>(t.out16) + begin : nullptr;
  fn(t.param + begin, static_cast<const unsigned char*>(t.grad) + begin * dtype_bytes(t.grad_dtype),
     t.exp_avg + begin, t.exp_avg_sq + begin, out, end - begin, t.coeffs);
}

inline void sgd_range(const SGDTensor& t, int64_t begin, int64_t end) {
  const bool mom = t.coeffs.momentum != 0.0f;
  SGDSpanFn fn = kSGDTable[mom ? 1 : 0][int(t.grad_dtype)][int(t.out_dtype)];
  void* out = t.out16 ? static_cast<uint16_t*>(t.out16) + begin : nullptr;
  fn(t.param + begin, static_cast<const unsigned char*>(t.grad) + begin * dtype_bytes(t.grad_dtype),
     mom ? t.momentum_buf + begin : nullptr, out, end - begin, t.coeffs);
}

}  // namespace DSFAST_ISA_NS
}  // namespace cpu
}  // namespace dsfast
