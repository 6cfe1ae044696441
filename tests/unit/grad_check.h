// grad_check.h: central finite differences with Richardson extrapolation (O(eps^4)), for checking
// explicit backward passes in fp32.
#pragma once

#include <cmath>
#include <functional>
#include <vector>

namespace mt::test {

// d f / d x[i] numerically; f is re-evaluated with x[i] perturbed (and restored).
inline double numeric_grad(const std::function<double()>& f, float* x, double eps = 1e-2) {
  const float orig = *x;
  auto at = [&](double delta) {
    *x = static_cast<float>(orig + delta);
    const double v = f();
    *x = orig;
    return v;
  };
  const double d1 = (at(eps) - at(-eps)) / (2 * eps);
  const double d2 = (at(eps / 2) - at(-eps / 2)) / eps;
  return (4 * d2 - d1) / 3;
}

// Fills with N(0, std) from a simple LCG-driven Box-Muller (tests only).
inline void fill_normal(std::vector<float>& v, unsigned seed, float std = 1.0f) {
  unsigned long long s = seed * 6364136223846793005ull + 1442695040888963407ull;
  auto u = [&] {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return (static_cast<double>(s >> 11) + 0.5) / 9007199254740992.0;
  };
  for (auto& x : v) x = static_cast<float>(std * std::sqrt(-2 * std::log(u())) * std::cos(6.283185307179586 * u()));
}

// max |a - n| / (atol + rtol * |n|) over the pairs: <= 1 passes.
inline double worst_ratio(const std::vector<double>& analytic, const std::vector<double>& numeric, double atol, double rtol) {
  double worst = 0;
  for (size_t i = 0; i < analytic.size(); ++i) {
    worst = std::max(worst, std::fabs(analytic[i] - numeric[i]) / (atol + rtol * std::fabs(numeric[i])));
  }
  return worst;
}

}  // namespace mt::test
