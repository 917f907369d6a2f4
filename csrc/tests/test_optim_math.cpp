// The shared update rules (optim_math.h) on plain floats against a straightforward
// double-precision transcription of torch.optim's Adam/AdamW/SGD/Adagrad and of the Lion paper's
// algorithm, several steps each.
#include <cmath>
#include <cstdint>
#include <vector>

#include "check.h"
#include "dsfast/optim_math.h"

using dsfast::AdamCoeffs;
using dsfast::SGDCoeffs;

static bool close(double got, double want, double rtol, double atol) {
  return std::fabs(got - want) <= atol + rtol * std::fabs(want);
}

static void adam_case(bool adamw, bool bias_correction, float wd, float grad_scale) {
  const double lr = 1e-2, b1 = 0.9, b2 = 0.99, eps = 1e-8;
  float p = 0.5f, m = 0.f, v = 0.f;
  double P = 0.5, M = 0, V = 0;
  for (int step = 1; step <= 20; ++step) {
    float g = std::sin(0.7f * step) * 0.3f + 0.05f;
    AdamCoeffs c = dsfast::make_adam_coeffs(lr, b1, b2, eps, wd, adamw, bias_correction, step);
    c.grad_scale = grad_scale;
    dsfast::adam_update(p, g, m, v, c);
    double G = double(g) * grad_scale;
    if (adamw) P *= 1 - lr * wd; else G += wd * P;
    M = b1 * M + (1 - b1) * G;
    V = b2 * V + (1 - b2) * G * G;
    double bc1 = bias_correction ? 1 - std::pow(b1, step) : 1, bc2 = bias_correction ? 1 - std::pow(b2, step) : 1;
    P -= lr / bc1 * M / (std::sqrt(V) / std::sqrt(bc2) + eps);
    CHECK(close(p, P, 2e-5, 1e-6) && close(m, M, 2e-5, 1e-7) && close(v, V, 2e-5, 1e-9),
          "adam adamw=%d bc=%d wd=%g scale=%g step %d: p %.9g vs %.9g, m %.9g vs %.9g, v %.9g vs %.9g",
          adamw, bias_correction, wd, grad_scale, step, p, P, m, M, v, V);
  }
}

static void sgd_case(float momentum, float dampening, float wd, bool nesterov) {
  const double lr = 0.05;
  float p = 1.0f, buf = 0.0f;
  double P = 1.0, B = 0.0;
  for (int step = 1; step <= 20; ++step) {
    float g = std::cos(0.3f * step) - 0.2f;
    SGDCoeffs c = dsfast::make_sgd_coeffs(lr, momentum, dampening, wd, nesterov, step == 1);
    dsfast::sgd_update(p, g, buf, c);
    double G = g + wd * P;
    if (momentum != 0) {
      B = step == 1 ? G : momentum * B + (1 - dampening) * G;
      G = nesterov ? G + momentum * B : B;
    }
    P -= lr * G;
    CHECK(close(p, P, 1e-5, 1e-6), "sgd mom=%g damp=%g wd=%g nest=%d step %d: p %.9g vs %.9g",
          momentum, dampening, wd, nesterov, step, p, P);
    if (momentum != 0) CHECK(close(buf, B, 1e-5, 1e-6), "sgd buf step %d: %.9g vs %.9g", step, buf, B);
  }
}

static void adagrad_case(float wd, float grad_scale) {
  const double lr = 0.05, eps = 1e-10;
  float p = 0.5f, sum = 0.f;
  double P = 0.5, S = 0;
  for (int step = 1; step <= 20; ++step) {
    float g = std::sin(0.9f * step) * 0.4f - 0.1f;
    dsfast::AdagradCoeffs c = dsfast::make_adagrad_coeffs(lr, eps, wd);
    c.grad_scale = grad_scale;
    dsfast::adagrad_update(p, g, sum, c);
    double G = double(g) * grad_scale + wd * P;
    S += G * G;
    P -= lr * G / (std::sqrt(S) + eps);
    CHECK(close(p, P, 2e-5, 1e-6) && close(sum, S, 2e-5, 1e-9), "adagrad wd=%g scale=%g step %d: p %.9g vs %.9g, "
          "sum %.9g vs %.9g", wd, grad_scale, step, p, P, sum, S);
  }
}

static void lion_case(float wd, float grad_scale) {
  const double lr = 1e-2, b1 = 0.9, b2 = 0.99;
  float p = 0.5f, m = 0.f;
  double P = 0.5, M = 0;
  for (int step = 1; step <= 20; ++step) {
    float g = std::cos(0.4f * step) * 0.3f + 0.02f;
    dsfast::LionCoeffs c = dsfast::make_lion_coeffs(lr, b1, b2, wd);
    c.grad_scale = grad_scale;
    dsfast::lion_update(p, g, m, c);
    double G = double(g) * grad_scale, C = b1 * M + (1 - b1) * G;
    P = P * (1 - lr * wd) - lr * (C > 0 ? 1 : C < 0 ? -1 : 0);
    M = b2 * M + (1 - b2) * G;
    CHECK(close(p, P, 2e-5, 1e-6) && close(m, M, 2e-5, 1e-7), "lion wd=%g scale=%g step %d: p %.9g vs %.9g, "
          "m %.9g vs %.9g", wd, grad_scale, step, p, P, m, M);
  }
}

int main() {
  for (bool adamw : {false, true})
    for (bool bc : {false, true})
      for (float wd : {0.0f, 0.1f}) adam_case(adamw, bc, wd, 1.0f);
  adam_case(true, true, 0.01f, 0.25f);  // grad_scale: an inverse loss scale
  adam_case(false, true, 0.0f, -1.0f);  // grad_scale -1: maximize

  for (float mom : {0.0f, 0.9f})
    for (float damp : {0.0f, 0.3f})
      for (float wd : {0.0f, 0.01f}) sgd_case(mom, damp, wd, false);
  sgd_case(0.9f, 0.0f, 0.0f, true);
  sgd_case(0.9f, 0.0f, 0.01f, true);

  for (float wd : {0.0f, 0.1f}) {
    adagrad_case(wd, 1.0f);
    lion_case(wd, 1.0f);
  }
  adagrad_case(0.0f, -1.0f);
  lion_case(0.01f, 0.25f);

  // sign as torch.sign: 0 stays 0 (a zero gradient on a zero momentum moves nothing but the decay), NaN stays NaN
  CHECK(dsfast::dsfast_sign(0.0f) == 0.0f && dsfast::dsfast_sign(-3.0f) == -1.0f && dsfast::dsfast_sign(1e-30f) == 1.0f
        && std::isnan(dsfast::dsfast_sign(NAN)), "dsfast_sign");
  {
    float p = 2.f, m = 0.f;
    dsfast::lion_update(p, 0.0f, m, dsfast::make_lion_coeffs(0.1, 0.9, 0.99, 0.5));
    CHECK(close(p, 2.0 * (1 - 0.1 * 0.5), 1e-6, 0) && m == 0.f, "lion: zero gradient and momentum: decay only, p %.9g", p);
    p = 1.f; m = 0.f;
    dsfast::lion_update(p, NAN, m, dsfast::make_lion_coeffs(0.1, 0.9, 0.99, 0.0));
    CHECK(std::isnan(p) && std::isnan(m), "lion: NaN grad -> NaN param/momentum");
    float s = 0.f;
    p = 1.f;
    dsfast::adagrad_update(p, NAN, s, dsfast::make_adagrad_coeffs(0.1, 1e-10, 0.0));
    CHECK(std::isnan(p) && std::isnan(s), "adagrad: NaN grad -> NaN param/sum");
  }

  // Non-finite inputs propagate like torch's: a NaN gradient poisons the parameter.
  {
    float p = 1.f, m = 0.f, v = 0.f;
    dsfast::adam_update(p, NAN, m, v, dsfast::make_adam_coeffs(1e-3f, 0.9f, 0.999f, 1e-8f, 0, true, true, 1));
    CHECK(std::isnan(p) && std::isnan(m) && std::isnan(v), "NaN grad -> NaN param/state");
    p = 1.f; m = 0.f; v = 0.f;
    dsfast::adam_update(p, INFINITY, m, v, dsfast::make_adam_coeffs(1e-3f, 0.9f, 0.999f, 1e-8f, 0, true, true, 1));
    CHECK(std::isnan(p) && std::isinf(m) && std::isinf(v), "inf grad -> inf/inf states, NaN param (inf/inf)");
  }
  TEST_MAIN_END();
}
