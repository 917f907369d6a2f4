// Adam with 8-bit block-wise moments (cpu_optim.h's Adam8bitTensor), included by each isa_*.cpp after
// kernel_body.h, inside the same DSFAST_ISA_NS. Per block of kQuantBlock elements, in one pass that stays in L1:
//   1. dequantize: m[k] = m_map[code] * scale (a table lookup and one multiply, into two 1 KiB stack buffers);
//   2. the fp32 Adam update of kernel_body.h's adam_span, vectorized with this ISA's Vec, reading and writing
//      those buffers as fp32 states (so the update is bit for bit the fp32-state kernel's);
//   3. requantize with the block's fresh absmax: code = the nearest entry of the sorted map to x / absmax.
// Quantization choice: a branchless binary search (8 compares, always the same 8 loads of a 1 KiB map that sits in
// L1) then the nearer of the two neighbours, ties to the lower code. It is exact for any sorted map (no
// precomputed midpoint table to keep in step with the map); it is compute on data already in L1, beside a pass that
// is memory-bound (not yet measured on a quiet machine). The lookups are plain loops compiled for this TU's target (the
// compiler may turn them into gathers); the update math is the Vec code.
#pragma once

namespace dsfast {
namespace cpu {
namespace DSFAST_ISA_NS {

// Index of the map entry nearest to x (map ascending, 256 entries); NaN gives 0.
inline uint8_t nearest_code(const float* map, float x) {
  int i = 0;
  for (int step = 128; step > 0; step >>= 1) i = (map[i + step] <= x) ? i + step : i;
  if (i < 255 && (map[i + 1] - x) < (x - map[i])) ++i;
  return uint8_t(i);
}

inline float block_absmax(const float* x, int64_t n) {
  float a = 0.0f;
  for (int64_t k = 0; k < n; ++k) {
    const float v = x[k] < 0.0f ? -x[k] : x[k];
    a = v > a ? v : a;
  }
  return a;
}

// Codes of x / scale (scale 0: every element is 0, the map's code nearest to 0).
inline void quantize_block(const float* map, const float* x, int64_t n, float scale, uint8_t* codes) {
  if (scale == 0.0f) {
    const uint8_t zero = nearest_code(map, 0.0f);
    for (int64_t k = 0; k < n; ++k) codes[k] = zero;
    return;
  }
  for (int64_t k = 0; k < n; ++k) codes[k] = nearest_code(map, x[k] / scale);
}

inline void adam8bit_range(const Adam8bitTensor& t, const QuantMaps& maps, int64_t begin, int64_t end) {
  // the fp32-state span of this (param, grad, out) combination: validated by the dispatcher
  AdamSpanFn fn = kAdamTable[int(t.param_dtype)][kF32][int(t.grad_dtype)][int(t.out_dtype)];
  const int64_t pb = dtype_bytes(t.param_dtype), gb = dtype_bytes(t.grad_dtype);
  const AdamCoeffs c = t.coeffs;
  alignas(64) float m[kQuantBlock], v[kQuantBlock];
  for (int64_t b0 = begin; b0 < end; b0 += kQuantBlock) {   // begin is a block start (dispatch.cpp)
    const int64_t n = end - b0 < kQuantBlock ? end - b0 : kQuantBlock;
    const int64_t blk = b0 / kQuantBlock;
    uint8_t* mc = t.exp_avg_codes + b0;
    uint8_t* vc = t.exp_avg_sq_codes + b0;
    const float ms = t.exp_avg_scales[blk], vs = t.exp_avg_sq_scales[blk];
    for (int64_t k = 0; k < n; ++k) {
      m[k] = maps.exp_avg[mc[k]] * ms;
      v[k] = maps.exp_avg_sq[vc[k]] * vs;
    }
    void* out = t.out16 ? static_cast<uint16_t*>(t.out16) + b0 : nullptr;
    fn(static_cast<unsigned char*>(t.param) + b0 * pb, static_cast<const unsigned char*>(t.grad) + b0 * gb, m, v,
       out, n, c, t.round_seed, b0);
    const float new_ms = block_absmax(m, n), new_vs = block_absmax(v, n);
    quantize_block(maps.exp_avg, m, n, new_ms, mc);
    quantize_block(maps.exp_avg_sq, v, n, new_vs, vc);
    t.exp_avg_scales[blk] = new_ms;
    t.exp_avg_sq_scales[blk] = new_vs;
  }
}

}  // namespace DSFAST_ISA_NS
}  // namespace cpu
}  // namespace dsfast
