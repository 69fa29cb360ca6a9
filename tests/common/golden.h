// Reads golden data written by tests/tools/reference_forward.py (an independent NumPy forward).
#pragma once

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace riskkv::testing {

struct Golden {
  std::filesystem::path dir;
  nlohmann::json meta;
  std::vector<int32_t> tokens;

  static Golden Load(const std::filesystem::path& dir) {
    Golden g;
    g.dir = dir;
    std::ifstream in(dir / "golden.json");
    g.meta = nlohmann::json::parse(in);
    g.tokens = g.meta["tokens"].get<std::vector<int32_t>>();
    return g;
  }

  std::vector<float> Read(const std::string& file) const {
    std::ifstream in(dir / file, std::ios::binary | std::ios::ate);
    const auto bytes = static_cast<size_t>(in.tellg());
    std::vector<float> v(bytes / sizeof(float));
    in.seekg(0);
    in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(bytes));
    return v;
  }

  std::vector<float> ReadLayer(const std::string& kind, int64_t layer) const {
    return Read(meta["files"][kind][layer].get<std::string>());
  }

  double Tolerance(const std::string& key) const { return meta["tolerance"][key].get<double>(); }
  std::string model() const { return meta["model"].get<std::string>(); }
};

// max |a - ref| / max(1, max |ref|): the relative-to-scale error the golden tolerances bound.
inline double ScaledMaxError(const float* a, const float* ref, size_t n) {
  double err = 0, scale = 1;
  for (size_t i = 0; i < n; ++i) {
    err = std::max(err, std::fabs(static_cast<double>(a[i]) - ref[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(ref[i])));
  }
  return err / scale;
}

}  // namespace riskkv::testing
