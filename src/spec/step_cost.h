// How long a forward pass takes, learned from the engine's own steps:
//   seconds ~ fixed + per_token * tokens + per_row * logits_rows,
// fitted by exponentially weighted least squares (recent steps weigh most:
// the machine is shared and loads change). The fixed part is mostly
// streaming the weights (memory bound, paid once per step); each token adds
// compute; each row of logits adds the output projection, which for a large
// vocabulary costs more than a layer stack. Speculative decoding asks it
// what one more verified draft costs against what the step costs anyway.
#pragma once

#include <cstdint>

namespace pagellm {

class StepCostModel {
 public:
  // A step of `tokens` tokens that computed `rows` rows of logits.
  void observe(int64_t tokens, int64_t rows, double seconds);
  // Enough steps of different sizes to trust the fit.
  bool ready() const { return ready_; }
  double predict(double tokens, double rows) const { return coef_[0] + coef_[1] * tokens + coef_[2] * rows; }
  // Seconds one more verified draft adds: a token and a row of logits.
  double per_draft() const { return coef_[1] + coef_[2]; }
  double fixed() const { return coef_[0]; }

 private:
  static constexpr double kDecay = 0.98;  // weight of a step falls to 1/e after ~50 steps
  double xx_[3][3] = {};                  // weighted sums of x x^T, x = (1, tokens, rows)
  double xy_[3] = {};
  double coef_[3] = {};
  int64_t steps_ = 0;
  bool ready_ = false;
};

}  // namespace pagellm
