// Reads golden data written by tests/tools/reference_forward.py (an independent NumPy forward).
#pragma once

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

namespace riskkv::testing {

struct Golden {
  std::filesystem::path dir;
  nlohmann::json meta;
  std::vector<int32_t> tokens;

  // Missing or unreadable files throw std::runtime_error naming the path: gtest reports the
  // exception as a failure of the test (or of SetUp, skipping the body), and no caller goes on
  // to index into an empty or garbage vector.
  static Golden Load(const std::filesystem::path& dir) {
    Golden g;
    g.dir = dir;
    const auto path = dir / "golden.json";
    std::ifstream in(path);
    if (!in) throw std::runtime_error("cannot open golden file " + path.string());
    g.meta = nlohmann::json::parse(in);
    g.tokens = g.meta["tokens"].get<std::vector<int32_t>>();
    return g;
  }

  std::vector<float> Read(const std::string& file) const {
    const auto path = dir / file;
    std::ifstream in(path, std::ios::binary | std::ios::ate);
    const std::streamoff end = in ? static_cast<std::streamoff>(in.tellg()) : -1;
    if (end < 0) throw std::runtime_error("cannot open golden file " + path.string());
    if (end % sizeof(float) != 0) {
      throw std::runtime_error("golden file " + path.string() + " has " + std::to_string(end) +
                               " bytes, not a whole number of f32 values");
    }
    std::vector<float> v(static_cast<size_t>(end) / sizeof(float));
    in.seekg(0);
    if (!in.read(reinterpret_cast<char*>(v.data()), end)) {
      throw std::runtime_error("cannot read golden file " + path.string());
    }
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
