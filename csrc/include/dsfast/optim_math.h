// The optimizer update rules: the single source of truth for the math.
//
// Every function is a template over the value type V so the same text runs on
// scalar floats (CPU tails, C++ tests, CUDA threads) and on SIMD wrappers
// (csrc/cpu/simd.h) that overload + - * / and provide dsfast_sqrt(V).
// Hyperparameters are folded into per-step coefficients on the host once, so a
// kernel's inner loop is only multiply-adds, one sqrt and one divide.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define DSFAST_HD __host__ __device__ __forceinline__
#else
#define DSFAST_HD inline
#endif

namespace dsfast {

DSFAST_HD float dsfast_sqrt(float x) { return sqrtf(x); }
// torch.sign: -1, 0 or +1, and NaN stays NaN (a zero keeps its sign bit; the SIMD wrappers do the same).
DSFAST_HD float dsfast_sign(float x) { return x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : x); }

// Adam / AdamW coefficients for one step of one param group.
struct AdamCoeffs {
  float beta1, beta2;
  float one_minus_beta1, one_minus_beta2;
  float eps;
  float step_size;        // lr / bias_correction1
  float inv_bc2_sqrt;     // 1 / sqrt(bias_correction2)
  float l2_decay;         // Adam (L2): g += l2_decay * p
  float decoupled_decay;  // AdamW: p *= (1 - decoupled_decay), i.e. lr * weight_decay
  float grad_scale;       // g *= grad_scale first (1 = off; e.g. an inverse loss scale, -1 = maximize)
};

// `step` is the 1-based count after this update, as torch stores it. Arguments are
// double so that 1 - beta and lr * wd are formed before rounding to float, as torch does
// (1.0f - 0.999f is 1.3e-5 away from 0.001f). Host and device: CUDA kernels call it per
// tensor, whose step counts may differ (hence ::pow/::sqrt on double, which both have).
DSFAST_HD AdamCoeffs make_adam_coeffs(double lr, double beta1, double beta2, double eps,
                                   double weight_decay, bool adamw, bool bias_correction,
                                   int64_t step) {
  AdamCoeffs c;
  c.beta1 = (float)beta1;
  c.beta2 = (float)beta2;
  c.one_minus_beta1 = (float)(1.0 - beta1);
  c.one_minus_beta2 = (float)(1.0 - beta2);
  c.eps = (float)eps;
  double bc1 = bias_correction ? 1.0 - ::pow(beta1, (double)step) : 1.0;
  double bc2 = bias_correction ? 1.0 - ::pow(beta2, (double)step) : 1.0;
  c.step_size = (float)(lr / bc1);
  c.inv_bc2_sqrt = (float)(1.0 / ::sqrt(bc2));
  c.l2_decay = adamw ? 0.0f : (float)weight_decay;
  c.decoupled_decay = adamw ? (float)(lr * weight_decay) : 0.0f;
  c.grad_scale = 1.0f;
  return c;
}

// One element (or one vector of elements) of Adam/AdamW, matching torch.optim's
// formulation: denom = sqrt(v) / sqrt(bc2) + eps; p -= lr / bc1 * m / denom.
// The first moment is a lerp (m + (1 - beta1) * (g - m)) as torch computes it, and
// decoupled decay multiplies p by (1 - lr * wd), so results track torch to an ulp or two.
template <typename V>
DSFAST_HD void adam_update(V& p, V g, V& m, V& v, const AdamCoeffs& c) {
  g = g * V(c.grad_scale);
  // skipped when zero, as torch does: 0 * inf would turn an infinite param into NaN
  if (c.l2_decay != 0.0f) g = g + V(c.l2_decay) * p;
  m = m + V(c.one_minus_beta1) * (g - m);
  v = V(c.beta2) * v + V(c.one_minus_beta2) * g * g;
  V denom = dsfast_sqrt(v) * V(c.inv_bc2_sqrt) + V(c.eps);
  p = p * (V(1.0f) - V(c.decoupled_decay));
  p = p - V(c.step_size) * m / denom;
}

// SGD coefficients for one step of one param group (torch.optim.SGD semantics).
struct SGDCoeffs {
  float lr;
  float weight_decay;
  float momentum;
  float one_minus_dampening;
  bool nesterov;
  bool first_step;  // torch seeds the momentum buffer with the gradient itself
  float grad_scale; // g *= grad_scale first (1 = off; -1 = maximize)
};

DSFAST_HD SGDCoeffs make_sgd_coeffs(double lr, double momentum, double dampening, double weight_decay,
                                 bool nesterov, bool first_step) {
  return SGDCoeffs{(float)lr, (float)weight_decay, (float)momentum, (float)(1.0 - dampening), nesterov,
                   first_step, 1.0f};
}

// One element of SGD. `buf` is ignored when momentum == 0.
template <typename V>
DSFAST_HD void sgd_update(V& p, V g, V& buf, const SGDCoeffs& c) {
  g = g * V(c.grad_scale);
  if (c.weight_decay != 0.0f) g = g + V(c.weight_decay) * p;  // skipped at 0, as torch does
  if (c.momentum != 0.0f) {
    buf = c.first_step ? g : V(c.momentum) * buf + V(c.one_minus_dampening) * g;
    g = c.nesterov ? g + V(c.momentum) * buf : buf;
  }
  p = p - V(c.lr) * g;
}

// Adagrad coefficients for one step of one param group (torch.optim.Adagrad with lr_decay 0 and
// initial_accumulator_value 0, which is all DeepSpeedCPUAdagrad has).
struct AdagradCoeffs {
  float lr;
  float eps;
  float weight_decay;  // L2: g += weight_decay * p
  float grad_scale;    // g *= grad_scale first (1 = off; -1 = maximize)
};

DSFAST_HD AdagradCoeffs make_adagrad_coeffs(double lr, double eps, double weight_decay) {
  return AdagradCoeffs{(float)lr, (float)eps, (float)weight_decay, 1.0f};
}

// One element of Adagrad: sum += g^2; p -= lr * g / (sqrt(sum) + eps), as torch.optim.Adagrad.
template <typename V>
DSFAST_HD void adagrad_update(V& p, V g, V& sum, const AdagradCoeffs& c) {
  g = g * V(c.grad_scale);
  if (c.weight_decay != 0.0f) g = g + V(c.weight_decay) * p;  // skipped at 0, as torch does
  sum = sum + g * g;
  p = p - V(c.lr) * (g / (dsfast_sqrt(sum) + V(c.eps)));  // torch's addcdiv order
}

// Lion coefficients for one step of one param group (Chen et al. 2023, "Symbolic Discovery of
// Optimization Algorithms", Algorithm 2; DeepSpeedCPULion's arguments).
struct LionCoeffs {
  float lr;
  float beta1, one_minus_beta1;   // the interpolation whose sign is the update
  float beta2, one_minus_beta2;   // the momentum kept for the next step
  float decoupled_decay;          // p *= (1 - decoupled_decay), i.e. lr * weight_decay
  float grad_scale;               // g *= grad_scale first (1 = off; -1 = maximize)
};

// Arguments are double so that 1 - beta and lr * wd are formed before rounding to float (see make_adam_coeffs).
DSFAST_HD LionCoeffs make_lion_coeffs(double lr, double beta1, double beta2, double weight_decay) {
  return LionCoeffs{(float)lr, (float)beta1, (float)(1.0 - beta1), (float)beta2, (float)(1.0 - beta2),
                    (float)(lr * weight_decay), 1.0f};
}

// One element of Lion: p = p * (1 - lr * wd) - lr * sign(beta1 * m + (1 - beta1) * g);
// m = beta2 * m + (1 - beta2) * g. sign(0) is 0, as torch.sign and the paper's.
template <typename V>
DSFAST_HD void lion_update(V& p, V g, V& m, const LionCoeffs& c) {
  g = g * V(c.grad_scale);
  V direction = dsfast_sign(V(c.beta1) * m + V(c.one_minus_beta1) * g);
  p = p * (V(1.0f) - V(c.decoupled_decay));
  p = p - V(c.lr) * direction;
  m = V(c.beta2) * m + V(c.one_minus_beta2) * g;
}

}  // namespace dsfast
