// Choosing the engine a node serves with (see CreateEngine in engine.h).
#include <string>

#include "absl/strings/str_cat.h"
#include "common/engine/cpu_engine.h"
#include "common/engine/engine.h"
#include "common/engine/gpu_engine.h"
#include "common/model/gpu_model.h"
#include "kernels/gpu.h"

namespace riskkv {

absl::StatusOr<std::unique_ptr<Engine>> CreateEngine(Model& model, const EngineOptions& options,
                                                     std::string* note) {
  std::string ignored;
  if (note == nullptr) note = &ignored;
  const std::string& backend = options.backend;
  if (backend != "auto" && backend != "cpu" && backend != "cuda") {
    return absl::InvalidArgumentError("backend '" + backend + "' is not auto, cpu or cuda");
  }
  if (backend == "cpu") {
    *note = "cpu";
    return std::make_unique<CpuEngine>(model, options.kv_dtype);
  }
  if (backend == "auto" && options.kv_dtype != DType::kF16) {
    *note = "cpu (--kv-dtype f32 keeps sessions on the CPU)";
    return std::make_unique<CpuEngine>(model, options.kv_dtype);
  }
  if (options.kv_dtype != DType::kF16) {
    return absl::InvalidArgumentError("--backend cuda stores KV rows in f16 (kv_dtype f32 given)");
  }
  auto gpu = GpuModel::Create(model, options.gpu_device);
  if (!gpu.ok()) {
    if (backend == "cuda") {
      return absl::Status(gpu.status().code(), "--backend cuda: " + gpu.status().ToString());
    }
    *note = "cpu (" + std::string(gpu.status().message()) + ")";
    return std::make_unique<CpuEngine>(model, options.kv_dtype);
  }
  std::string device = "GPU " + std::to_string(options.gpu_device);
  if (auto rt = LoadGpuRuntime();
      rt.ok() && options.gpu_device >= 0 &&
      options.gpu_device < static_cast<int>((*rt)->probe.devices.size())) {
    device = (*rt)->probe.devices[options.gpu_device].name;
  }
  *note = absl::StrCat("cuda (", device, ", ", (*gpu)->device_bytes() >> 20, " MiB of weights)");
  return std::make_unique<GpuEngine>(model, *std::move(gpu), *note);
}

}  // namespace riskkv
