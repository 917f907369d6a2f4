// The memory-movement half of the kernels, written once over a vector type `Vec` and
// included by each isa_*.cpp inside its own namespace (DSFAST_ISA_NS), so every
// instantiation is a distinct symbol compiled for that TU's target only: nothing
// compiled for AVX-512 can be merged by the linker into code the scalar path runs.
// Needs, before inclusion: Vec (simd_*.h) in DSFAST_ISA_NS, cpu_optim.h.
// The math itself is dsfast::adam_update / sgd_update / adagrad_update / lion_update from optim_math.h.

namespace dsfast {
namespace cpu {
namespace DSFAST_ISA_NS {

constexpr int kF32 = int(DType::F32), kBF16 = int(DType::BF16), kF16 = int(DType::F16), kNone = int(DType::None);

inline int64_t dtype_bytes(DType d) { return d == DType::F32 ? 4 : 2; }
constexpr int bytes_of(int d) { return d == kF32 ? 4 : 2; }

// One vector of T (F32, BF16 or F16) as fp32 lanes, and back (round to nearest even).
template <int T>
inline Vec load_as(const void* p, int64_t i) {
  if constexpr (T == kF32) return Vec::load(static_cast<const float*>(p) + i);
  else if constexpr (T == kBF16) return Vec::load_bf16(static_cast<const uint16_t*>(p) + i);
  else return Vec::load_f16(static_cast<const uint16_t*>(p) + i);
}

template <int T>
inline void store_as(void* p, int64_t i, const Vec& v) {
  if constexpr (T == kF32) v.store(static_cast<float*>(p) + i);
  else if constexpr (T == kBF16) v.store_bf16(static_cast<uint16_t*>(p) + i);
  else if constexpr (T == kF16) v.store_f16(static_cast<uint16_t*>(p) + i);
}

// A param's store: round to nearest even, or (bf16, seed nonzero) stochastically; `index` is lane 0's element.
template <int P>
inline void store_param(void* p, int64_t i, const Vec& v, uint32_t seed, int64_t index) {
  if constexpr (P == kBF16) {
    if (seed != 0) {
      v.store_bf16_stochastic(static_cast<uint16_t*>(p) + i, seed, uint32_t(index));
      return;
    }
  }
  store_as<P>(p, i, v);
}

// Copies `n` elements of `bytes` each; the tail path runs one full vector on padded
// stack buffers so it needs no masked instructions and no scalar code of this target.
inline void copy_bytes(void* dst, const void* src, int64_t nbytes) {
  auto* d = static_cast<unsigned char*>(dst);
  auto* s = static_cast<const unsigned char*>(src);
  for (int64_t k = 0; k < nbytes; ++k) d[k] = s[k];
}

template <int T>
inline void* at(void* p, int64_t i) { return static_cast<unsigned char*>(p) + i * bytes_of(T); }
template <int T>
inline const void* at(const void* p, int64_t i) { return static_cast<const unsigned char*>(p) + i * bytes_of(T); }

// G grad, O 16-bit output (kNone: none), P param (master), S states: dtype codes.
// seed, index: stochastic rounding of a bf16 param (store_param); `index` is element i's index in its tensor.
template <int G, int O, int P, int S>
inline void adam_vec(void* p, const void* g, void* m, void* v, void* o, int64_t i, const AdamCoeffs& c,
                     uint32_t seed, int64_t index) {
  Vec pv = load_as<P>(p, i), mv = load_as<S>(m, i), vv = load_as<S>(v, i);
  adam_update(pv, load_as<G>(g, i), mv, vv, c);
  store_param<P>(p, i, pv, seed, index);
  store_as<S>(m, i, mv);
  store_as<S>(v, i, vv);
  store_as<O>(o, i, pv);
}

template <int G, int O, int P, int S>
void adam_span(void* p, const void* g, void* m, void* v, void* o, int64_t n, const AdamCoeffs& coeffs, uint32_t seed,
               int64_t index0) {
  // A local copy: the float stores below could alias a referenced struct's float fields,
  // which would force reloading every coefficient (and re-testing every branch) per vector.
  const AdamCoeffs c = coeffs;
  constexpr int W = Vec::W;
  int64_t i = 0;
  for (; i + W <= n; i += W) adam_vec<G, O, P, S>(p, g, m, v, o, i, c, seed, index0 + i);
  const int64_t rest = n - i;
  if (rest <= 0) return;
  alignas(64) unsigned char bp[W * 4] = {}, bm[W * 4] = {}, bv[W * 4] = {}, bg[W * 4] = {};
  alignas(64) uint16_t bo[W] = {};
  copy_bytes(bp, at<P>(p, i), rest * bytes_of(P));
  copy_bytes(bm, at<S>(m, i), rest * bytes_of(S));
  copy_bytes(bv, at<S>(v, i), rest * bytes_of(S));
  copy_bytes(bg, at<G>(g, i), rest * bytes_of(G));
  adam_vec<G, O, P, S>(bp, bg, bm, bv, bo, 0, c, seed, index0 + i);
  copy_bytes(at<P>(p, i), bp, rest * bytes_of(P));
  copy_bytes(at<S>(m, i), bm, rest * bytes_of(S));
  copy_bytes(at<S>(v, i), bv, rest * bytes_of(S));
  if constexpr (O != kNone) copy_bytes(static_cast<uint16_t*>(o) + i, bo, rest * 2);
}

template <int G, int O, int P, int S, bool MOM>
inline void sgd_vec(void* p, const void* g, void* b, void* o, int64_t i, const SGDCoeffs& c, uint32_t seed,
                    int64_t index) {
  Vec pv = load_as<P>(p, i);
  Vec bv = (MOM && !c.first_step) ? load_as<S>(b, i) : Vec(0.0f);
  sgd_update(pv, load_as<G>(g, i), bv, c);
  store_param<P>(p, i, pv, seed, index);
  if constexpr (MOM) store_as<S>(b, i, bv);
  store_as<O>(o, i, pv);
}

template <int G, int O, int P, int S, bool MOM>
void sgd_span(void* p, const void* g, void* b, void* o, int64_t n, const SGDCoeffs& coeffs, uint32_t seed,
              int64_t index0) {
  const SGDCoeffs c = coeffs;  // local copy: see adam_span
  constexpr int W = Vec::W;
  int64_t i = 0;
  for (; i + W <= n; i += W) sgd_vec<G, O, P, S, MOM>(p, g, b, o, i, c, seed, index0 + i);
  const int64_t rest = n - i;
  if (rest <= 0) return;
  alignas(64) unsigned char bp[W * 4] = {}, bb[W * 4] = {}, bg[W * 4] = {};
  alignas(64) uint16_t bo[W] = {};
  copy_bytes(bp, at<P>(p, i), rest * bytes_of(P));
  if constexpr (MOM) copy_bytes(bb, at<S>(b, i), rest * bytes_of(S));
  copy_bytes(bg, at<G>(g, i), rest * bytes_of(G));
  sgd_vec<G, O, P, S, MOM>(bp, bg, bb, bo, 0, c, seed, index0 + i);
  copy_bytes(at<P>(p, i), bp, rest * bytes_of(P));
  if constexpr (MOM) copy_bytes(at<S>(b, i), bb, rest * bytes_of(S));
  if constexpr (O != kNone) copy_bytes(static_cast<uint16_t*>(o) + i, bo, rest * 2);
}

// Updates with one state per element (OneStateTensor): a Rule names its coefficients and applies its math.
struct AdagradRule {
  using Coeffs = AdagradCoeffs;
  static void apply(Vec& p, Vec g, Vec& s, const Coeffs& c) { adagrad_update(p, g, s, c); }
};
struct LionRule {
  using Coeffs = LionCoeffs;
  static void apply(Vec& p, Vec g, Vec& s, const Coeffs& c) { lion_update(p, g, s, c); }
};

template <class Rule, int G, int O, int P, int S>
inline void one_state_vec(void* p, const void* g, void* s, void* o, int64_t i, const typename Rule::Coeffs& c,
                          uint32_t seed, int64_t index) {
  Vec pv = load_as<P>(p, i), sv = load_as<S>(s, i);
  Rule::apply(pv, load_as<G>(g, i), sv, c);
  store_param<P>(p, i, pv, seed, index);
  store_as<S>(s, i, sv);
  store_as<O>(o, i, pv);
}

template <class Rule, int G, int O, int P, int S>
void one_state_span(void* p, const void* g, void* s, void* o, int64_t n, const typename Rule::Coeffs& coeffs,
                    uint32_t seed, int64_t index0) {
  const typename Rule::Coeffs c = coeffs;  // local copy: see adam_span
  constexpr int W = Vec::W;
  int64_t i = 0;
  for (; i + W <= n; i += W) one_state_vec<Rule, G, O, P, S>(p, g, s, o, i, c, seed, index0 + i);
  const int64_t rest = n - i;
  if (rest <= 0) return;
  alignas(64) unsigned char bp[W * 4] = {}, bs[W * 4] = {}, bg[W * 4] = {};
  alignas(64) uint16_t bo[W] = {};
  copy_bytes(bp, at<P>(p, i), rest * bytes_of(P));
  copy_bytes(bs, at<S>(s, i), rest * bytes_of(S));
  copy_bytes(bg, at<G>(g, i), rest * bytes_of(G));
  one_state_vec<Rule, G, O, P, S>(bp, bg, bs, bo, 0, c, seed, index0 + i);
  copy_bytes(at<P>(p, i), bp, rest * bytes_of(P));
  copy_bytes(at<S>(s, i), bs, rest * bytes_of(S));
  if constexpr (O != kNone) copy_bytes(static_cast<uint16_t*>(o) + i, bo, rest * 2);
}

using AdamSpanFn = void (*)(void*, const void*, void*, void*, void*, int64_t, const AdamCoeffs&, uint32_t, int64_t);
using SGDSpanFn = void (*)(void*, const void*, void*, void*, int64_t, const SGDCoeffs&, uint32_t, int64_t);

// Only the combinations cpu_optim.h's valid_precision allows are instantiated; the others are nullptr.
constexpr bool implemented(int O, int P, int S) {
  return P == kF32 ? (S == kF32 && O != kF32) : (O == kNone && (S == kF32 || S == P));
}
template <int G, int O, int P, int S>
constexpr AdamSpanFn adam_entry() {
  if constexpr (implemented(O, P, S)) return &adam_span<G, O, P, S>;
  else return nullptr;
}
template <int G, int O, int P, int S, bool M>
constexpr SGDSpanFn sgd_entry() {
  if constexpr (implemented(O, P, S)) return &sgd_span<G, O, P, S, M>;
  else return nullptr;
}

// [param][state][grad][out]; dtype codes F32/BF16/F16 (outputs BF16/F16/None, the F32 slot unused).
#define DSFAST_ROW(P, S, G) {adam_entry<G, kF32, P, S>(), adam_entry<G, kBF16, P, S>(), \
                             adam_entry<G, kF16, P, S>(), adam_entry<G, kNone, P, S>()}
#define DSFAST_GRID(P, S) {DSFAST_ROW(P, S, kF32), DSFAST_ROW(P, S, kBF16), DSFAST_ROW(P, S, kF16)}
#define DSFAST_PLANE(P) {DSFAST_GRID(P, kF32), DSFAST_GRID(P, kBF16), DSFAST_GRID(P, kF16)}
constexpr AdamSpanFn kAdamTable[3][3][3][4] = {DSFAST_PLANE(kF32), DSFAST_PLANE(kBF16), DSFAST_PLANE(kF16)};
#undef DSFAST_ROW
#define DSFAST_ROW(P, S, G) {sgd_entry<G, kF32, P, S, M>(), sgd_entry<G, kBF16, P, S, M>(), \
                             sgd_entry<G, kF16, P, S, M>(), sgd_entry<G, kNone, P, S, M>()}
template <bool M>
constexpr SGDSpanFn kSGDTable[3][3][3][4] = {DSFAST_PLANE(kF32), DSFAST_PLANE(kBF16), DSFAST_PLANE(kF16)};
#undef DSFAST_ROW
template <class Rule>
using OneStateSpanFn = void (*)(void*, const void*, void*, void*, int64_t, const typename Rule::Coeffs&, uint32_t,
                                int64_t);
template <class Rule, int G, int O, int P, int S>
constexpr OneStateSpanFn<Rule> one_state_entry() {
  if constexpr (implemented(O, P, S)) return &one_state_span<Rule, G, O, P, S>;
  else return nullptr;
}
#define DSFAST_ROW(P, S, G) {one_state_entry<R, G, kF32, P, S>(), one_state_entry<R, G, kBF16, P, S>(), \
                             one_state_entry<R, G, kF16, P, S>(), one_state_entry<R, G, kNone, P, S>()}
template <class R>
constexpr OneStateSpanFn<R> kOneStateTable[3][3][3][4] = {DSFAST_PLANE(kF32), DSFAST_PLANE(kBF16), DSFAST_PLANE(kF16)};
#undef DSFAST_ROW
#undef DSFAST_GRID
#undef DSFAST_PLANE

// Dtypes were validated by the dispatcher (dispatch.cpp) before any thread started.
inline void adam_range(const AdamTensor& t, int64_t begin, int64_t end) {
  AdamSpanFn fn = kAdamTable[int(t.param_dtype)][int(t.state_dtype)][int(t.grad_dtype)][int(t.out_dtype)];
  const int64_t pb = dtype_bytes(t.param_dtype), sb = dtype_bytes(t.state_dtype);
  void* out = t.out16 ? static_cast<uint16_t*>(t.out16) + begin : nullptr;
  fn(static_cast<unsigned char*>(t.param) + begin * pb,
     static_cast<const unsigned char*>(t.grad) + begin * dtype_bytes(t.grad_dtype),
     static_cast<unsigned char*>(t.exp_avg) + begin * sb, static_cast<unsigned char*>(t.exp_avg_sq) + begin * sb,
     out, end - begin, t.coeffs, t.round_seed, begin);
}

inline void sgd_range(const SGDTensor& t, int64_t begin, int64_t end) {
  const bool mom = t.coeffs.momentum != 0.0f;
  const int p = int(t.param_dtype), s = int(t.state_dtype), g = int(t.grad_dtype), o = int(t.out_dtype);
  SGDSpanFn fn = mom ? kSGDTable<true>[p][s][g][o] : kSGDTable<false>[p][s][g][o];
  void* out = t.out16 ? static_cast<uint16_t*>(t.out16) + begin : nullptr;
  fn(static_cast<unsigned char*>(t.param) + begin * dtype_bytes(t.param_dtype),
     static_cast<const unsigned char*>(t.grad) + begin * dtype_bytes(t.grad_dtype),
     mom ? static_cast<unsigned char*>(t.momentum_buf) + begin * dtype_bytes(t.state_dtype) : nullptr, out,
     end - begin, t.coeffs, t.round_seed, begin);
}

template <class Rule>
inline void one_state_range(const OneStateTensor<typename Rule::Coeffs>& t, int64_t begin, int64_t end) {
  OneStateSpanFn<Rule> fn =
      kOneStateTable<Rule>[int(t.param_dtype)][int(t.state_dtype)][int(t.grad_dtype)][int(t.out_dtype)];
  void* out = t.out16 ? static_cast<uint16_t*>(t.out16) + begin : nullptr;
  fn(static_cast<unsigned char*>(t.param) + begin * dtype_bytes(t.param_dtype),
     static_cast<const unsigned char*>(t.grad) + begin * dtype_bytes(t.grad_dtype),
     static_cast<unsigned char*>(t.state) + begin * dtype_bytes(t.state_dtype), out, end - begin, t.coeffs,
     t.round_seed, begin);
}
inline void adagrad_range(const AdagradTensor& t, int64_t begin, int64_t end) {
  one_state_range<AdagradRule>(t, begin, end);
}
inline void lion_range(const LionTensor& t, int64_t begin, int64_t end) { one_state_range<LionRule>(t, begin, end); }

}  // namespace DSFAST_ISA_NS
}  // namespace cpu
}  // namespace dsfast
