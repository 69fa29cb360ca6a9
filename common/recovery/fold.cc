// Predictor folding in double precision.
#include "common/recovery/fold.h"

#include <Eigen/Dense>
#include <vector>

#include "absl/strings/str_cat.h"

namespace riskkv {
namespace {

using MatrixD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

MatrixD Dequantized(const WeightMatrix& w) {
  MatrixD out(w.rows, w.cols);
  std::vector<float> row(w.cols);
  for (int64_t r = 0; r < w.rows; ++r) {
    DequantizeRow(w.dtype, w.row(r), row.data(), w.cols);
    for (int64_t c = 0; c < w.cols; ++c) out(r, c) = row[c];
  }
  return out;
}

void Compose(const MatrixD& proj, std::span<const float> bias, const MatrixD& w,
             const Eigen::VectorXd& b, std::vector<double>* a_out, std::vector<double>* c_out) {
  const MatrixD a = proj * w;    // [kv_width, F]
  Eigen::VectorXd c = proj * b;  // [kv_width]
  for (size_t i = 0; i < bias.size(); ++i) c[i] += bias[i];
  a_out->assign(a.data(), a.data() + a.size());
  c_out->assign(c.data(), c.data() + c.size());
}

}  // namespace

absl::StatusOr<LayerFit> FoldIntoProjections(const RidgeResult& ridge, int64_t n_features,
                                             int32_t layer, const Model& model) {
  const ModelConfig& cfg = model.config();
  if (layer < 0 || layer >= cfg.n_layers) {
    return absl::InvalidArgumentError(absl::StrCat("layer ", layer, " out of range"));
  }
  if (static_cast<int64_t>(ridge.w.size()) != cfg.hidden * n_features ||
      static_cast<int64_t>(ridge.b.size()) != cfg.hidden) {
    return absl::InvalidArgumentError(
        absl::StrCat("ridge map of layer ", layer, " is not [", cfg.hidden, ", ", n_features, "]"));
  }
  const Model::KvProjection proj = model.kv_projection(layer);
  const Eigen::Map<const MatrixD> w(ridge.w.data(), cfg.hidden, n_features);
  const Eigen::Map<const Eigen::VectorXd> b(ridge.b.data(), cfg.hidden);
  LayerFit fit;
  fit.layer = layer;
  fit.n_features = n_features;
  fit.kv_width = cfg.kv_width();
  fit.ridge_lambda = ridge.lambda;
  Compose(Dequantized(proj.k), proj.k_bias, w, b, &fit.a_k, &fit.c_k);
  Compose(Dequantized(proj.v), proj.v_bias, w, b, &fit.a_v, &fit.c_v);
  return fit;
}

}  // namespace riskkv
