// Uploading folded maps and rebuilding on the GPU.
#include "common/recovery/gpu_rebuild.h"

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/recovery/features.h"

namespace riskkv {

absl::Status StackGroupMaps(const FoldedGroup& fg, int64_t w, std::vector<float>* a,
                            std::vector<float>* c) {
  const int64_t f = FeatureWidth(fg.group, w);
  if (fg.maps.size() != fg.group.targets.size()) {
    return absl::InvalidArgumentError(absl::StrCat("group ", fg.group.ToString(), " has ",
                                                   fg.maps.size(), " maps for ",
                                                   fg.group.targets.size(), " targets"));
  }
  a->assign(2 * fg.maps.size() * w * f, 0.0f);
  c->assign(2 * fg.maps.size() * w, 0.0f);
  for (size_t t = 0; t < fg.maps.size(); ++t) {
    const FoldedMap& m = fg.maps[t];
    if (m.k.rows != w || m.k.cols != f || m.v.rows != w || m.v.cols != f ||
        static_cast<int64_t>(m.c_k.size()) != w || static_cast<int64_t>(m.c_v.size()) != w) {
      return absl::InvalidArgumentError(absl::StrCat(
          "folded map of layer ", m.layer, " does not fit features of width ", f, " -> ", w));
    }
    for (int64_t r = 0; r < w; ++r) {
      DequantizeRow(m.k.dtype, m.k.row(r), a->data() + ((2 * t) * w + r) * f, f);
      DequantizeRow(m.v.dtype, m.v.row(r), a->data() + ((2 * t + 1) * w + r) * f, f);
    }
    std::copy(m.c_k.begin(), m.c_k.end(), c->begin() + (2 * t) * w);
    std::copy(m.c_v.begin(), m.c_v.end(), c->begin() + (2 * t + 1) * w);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<GpuPredictors>> GpuPredictors::Create(GpuModel& model,
                                                                     const PredictorBank& bank) {
  const int64_t w = model.config().kv_width();
  const auto& groups = bank.groups();
  std::vector<int32_t> n_anchors, anchors, n_targets, targets;
  std::vector<std::vector<float>> a(groups.size()), c(groups.size());
  std::vector<const float*> a_ptr, c_ptr;
  for (size_t g = 0; g < groups.size(); ++g) {
    const FoldedGroup& fg = groups[g];
    n_anchors.push_back(static_cast<int32_t>(fg.group.anchors.size()));
    n_targets.push_back(static_cast<int32_t>(fg.group.targets.size()));
    anchors.insert(anchors.end(), fg.group.anchors.begin(), fg.group.anchors.end());
    targets.insert(targets.end(), fg.group.targets.begin(), fg.group.targets.end());
    RETURN_IF_ERROR(StackGroupMaps(fg, w, &a[g], &c[g]));
    a_ptr.push_back(a[g].data());
    c_ptr.push_back(c[g].data());
  }
  cuda::Engine& e = model.engine();
  cuda::Predictors* p =
      e.NewPredictors(static_cast<int>(groups.size()), n_anchors.data(), anchors.data(),
                      n_targets.data(), targets.data(), a_ptr.data(), c_ptr.data());
  if (p == nullptr) return absl::InvalidArgumentError(std::string("GPU predictors: ") + e.error());
  return std::unique_ptr<GpuPredictors>(
      new GpuPredictors(bank, std::unique_ptr<cuda::Predictors>(p)));
}

absl::Status GpuPredictors::Rebuild(GpuSession& session, const FoldedGroup& group, int64_t begin,
                                    int64_t count) const {
  const auto& groups = bank_.groups();
  size_t index = 0;
  while (index < groups.size() && &groups[index] != &group) ++index;
  if (index == groups.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("group ", group.group.ToString(), " is not one of this bank's"));
  }
  cuda::Session& s = session.device_session();
  return FromGpu(s.Rebuild(predictors_.get(), static_cast<int>(index), begin, count), s.error());
}

}  // namespace riskkv
