#include "spec/step_cost.h"

#include <cmath>

namespace pagellm {

namespace {

// Solves a x = b for a 3x3 system by elimination with partial pivoting;
// false when it is (nearly) singular.
bool solve3(double a[3][3], double b[3], double x[3]) {
  for (int c = 0; c < 3; ++c) {
    int p = c;
    for (int r = c + 1; r < 3; ++r)
      if (std::fabs(a[r][c]) > std::fabs(a[p][c])) p = r;
    if (std::fabs(a[p][c]) < 1e-12) return false;
    for (int k = 0; k < 3; ++k) std::swap(a[c][k], a[p][k]);
    std::swap(b[c], b[p]);
    for (int r = c + 1; r < 3; ++r) {
      const double f = a[r][c] / a[c][c];
      for (int k = c; k < 3; ++k) a[r][k] -= f * a[c][k];
      b[r] -= f * b[c];
    }
  }
  for (int c = 2; c >= 0; --c) {
    double s = b[c];
    for (int k = c + 1; k < 3; ++k) s -= a[c][k] * x[k];
    x[c] = s / a[c][c];
  }
  return true;
}

}  // namespace

void StepCostModel::observe(int64_t tokens, int64_t rows, double seconds) {
  if (tokens <= 0 || !(seconds > 0)) return;
  const double x[3] = {1.0, static_cast<double>(tokens), static_cast<double>(rows)};
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 3; ++j) xx_[i][j] = kDecay * xx_[i][j] + x[i] * x[j];
    xy_[i] = kDecay * xy_[i] + x[i] * seconds;
  }
  ++steps_;
  // A little ridge on the slopes keeps the fit defined while the steps seen
  // do not yet separate tokens from rows (all decodes, say).
  double a[3][3], b[3], c[3];
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 3; ++j) a[i][j] = xx_[i][j];
    b[i] = xy_[i];
  }
  const double ridge = 1e-3 * (xx_[0][0] + 1.0);
  a[1][1] += ridge;
  a[2][2] += ridge;
  if (!solve3(a, b, c)) return;
  // A fit with a negative part is noise, not a model: keep the last one.
  if (c[0] < 0 || c[1] < 0 || c[2] < 0) return;
  for (int i = 0; i < 3; ++i) coef_[i] = c[i];
  ready_ = steps_ >= 16;
}

}  // namespace pagellm
