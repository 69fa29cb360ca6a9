// riskkv-kv-transform-bench: the rate-distortion curve of transform coding a model's KV
// (common/kvcodec/transform_codec.h) beside the wire forms it would replace, on held-out text.
//
// 1. Prefills --fit-tokens tokens of --fit-text and fits one transform per layer, K and V, and
//    kind (--transforms), as a calibration would.
// 2. Cuts --eval-requests requests (--eval-history + --eval-tokens tokens) from each --eval-text
//    file, none of which the fit saw, and scores each configuration paired with exact KV in the
//    arithmetic nodes serve with: every layer's moved rows sent in int8, int4, or transform coded
//    at each --steps ratio (a layer's step is the ratio times its RMS around the mean), with the
//    first --sink and last --recent rows exact. Bytes are the encoded sizes of those rows.
// 3. Encode and decode rates of each transform configuration on one thread over the fitted rows
//    but the sink, beside 1 Gbit/s, with zstd's bits a value against the codes' entropy.
// Prints a table, the configurations on the lower convex hull of bytes against the worst text's
// upper ΔNLL bound, and the fewest bytes within ΔPPL 0.5% and 1%; writes --json and --svg.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "bench/eval_texts.h"
#include "bench/paired_mean.h"
#include "common/kvcodec/kv_codec.h"
#include "common/kvcodec/kv_transform.h"
#include "common/kvcodec/transform_codec.h"
#include "common/model/kv_cache.h"
#include "common/model/model.h"
#include "common/recovery/calibration.h"
#include "nlohmann/json.hpp"
#include "services/calibrate/report_format.h"
#include "services/calibrate/svg_plot.h"
#include "services/cli_args.h"

ABSL_FLAG(std::string, model, "", "GGUF file or Hugging Face model directory");
ABSL_FLAG(std::string, fit_text, "", "plain text whose prefill the transforms are fitted to");
ABSL_FLAG(int, fit_tokens, 2048, "tokens of --fit-text to prefill");
ABSL_FLAG(std::string, eval_text, "", "comma-separated held-out plain-text files");
ABSL_FLAG(int, eval_requests, 8, "requests per --eval-text file");
ABSL_FLAG(int, eval_history, 512, "history tokens of each request");
ABSL_FLAG(int, eval_tokens, 128, "scored tokens of each request");
ABSL_FLAG(std::string, transforms, "pca,hadamard", "comma-separated: pca, hadamard, identity");
ABSL_FLAG(std::string, steps, "0.125,0.25,0.5,1,2",
          "comma-separated step ratios (a layer's step over its RMS around the mean)");
ABSL_FLAG(double, value_step_scale, 1.0, "the values' step ratio over the keys'");
ABSL_FLAG(std::string, code, "both",
          "which the transform configurations code: keys, values or both (the other sent f16)");
ABSL_FLAG(bool, per_layer, false,
          "also score, for each transform at the first --steps ratio, every layer coded alone "
          "(the others exact): each layer's sensitivity");
ABSL_FLAG(int, sink, 1, "rows at the start of the history sent exact (f16)");
ABSL_FLAG(int, recent, 0, "rows at the end of the history sent exact (f16)");
ABSL_FLAG(int, zstd_level, 3, "zstd level of the transform codec");
ABSL_FLAG(int, threads, 0, "CPU threads (0: all)");
ABSL_FLAG(std::string, activations, "int8", "int8 or f32");
ABSL_FLAG(std::string, json, "", "write the results here");
ABSL_FLAG(std::string, svg, "", "write the rate-distortion chart here");

namespace {

using riskkv::DType;
using riskkv::LayerTransform;
using riskkv::TransformKind;
using riskkv::WireForm;
using riskkv::bench::Mean;
using riskkv::bench::MeanCi;

int Fail(const std::string& m) {
  std::fprintf(stderr, "riskkv-kv-transform-bench: %s\n", m.c_str());
  return 1;
}

struct Config {
  std::string name;
  bool exact = false;
  bool transform = false;
  WireForm form = WireForm::kPlain;  // when !transform
  TransformKind kind = TransformKind::kPca;
  double ratio = 0;    // the keys' step ratio
  int64_t layer = -1;  // the only layer coded (the others exact), or -1 for every layer
};

// Fitted transforms of every layer: [kind][layer][0 keys, 1 values].
using Fitted = std::map<TransformKind, std::vector<std::array<LayerTransform, 2>>>;

float Step(const Config& c, const LayerTransform& t, bool values) {
  const double ratio = c.ratio * (values ? absl::GetFlag(FLAGS_value_step_scale) : 1.0);
  return static_cast<float>(std::max(1e-6, ratio * t.Rms()));
}

// Sends rows [0, n) of one layer's keys or values as configuration c would and returns the bytes;
// rows become what the target decodes.
absl::StatusOr<int64_t> Send(const Config& c, const Fitted& fitted, int64_t layer, bool values,
                             float* rows, int64_t n, int64_t heads, int64_t dim) {
  const int64_t width = heads * dim;
  if (!c.transform) {
    if (absl::Status s = riskkv::RoundTrip(c.form, values, rows, 0, n, heads, dim, DType::kF16);
        !s.ok()) {
      return s;
    }
    return riskkv::EncodedBytes(c.form, values, 0, n, heads, dim, DType::kF16);
  }
  const std::string code = absl::GetFlag(FLAGS_code);
  if (code != "both" && (code == "values") != values) return n * width * 2;  // f16, unchanged
  const int64_t sink = std::min<int64_t>(absl::GetFlag(FLAGS_sink), n);
  const int64_t recent = std::min<int64_t>(absl::GetFlag(FLAGS_recent), n - sink);
  const int64_t coded = n - sink - recent;
  int64_t bytes = (sink + recent) * width * 2;
  if (coded > 0) {
    const LayerTransform& t = fitted.at(c.kind)[layer][values ? 1 : 0];
    auto b = riskkv::RoundTripTransformed(t, Step(c, t, values), rows + sink * width, coded,
                                          absl::GetFlag(FLAGS_zstd_level));
    if (!b.ok()) return b.status();
    bytes += *b;
  }
  return bytes;
}

struct Row {
  const Config* config;
  double bytes_share = 0;  // of the moved rows in f16
  Mean all;
  Mean kl;          // mean KL(exact || this) per token, over requests
  double top1 = 1;  // share of positions whose most likely token is the exact one's
  std::vector<Mean> per_text;
  double worst_upper = 0;                                  // the largest upper bound over the texts
  double encode_mbps = 0, decode_mbps = 0, wire_mbps = 0;  // f16 rows in, f16 rows out, bytes out
  // On the fit rows: coded components' share, zstd's bits per value, and the empirical entropy of
  // each coded component's codes (what a coder with a model per component would approach).
  double coded_share = 0, zstd_bits = 0, entropy_bits = 0;
};

// Indices of the rows on the lower convex hull of (bytes, worst upper bound), by bytes.
std::vector<size_t> LowerHull(const std::vector<Row>& rows) {
  std::vector<size_t> idx;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (!rows[i].config->exact && rows[i].config->layer < 0) idx.push_back(i);
  }
  std::sort(idx.begin(), idx.end(), [&](size_t a, size_t b) {
    return rows[a].bytes_share < rows[b].bytes_share ||
           (rows[a].bytes_share == rows[b].bytes_share &&
            rows[a].worst_upper < rows[b].worst_upper);
  });
  std::vector<size_t> hull;
  for (size_t i : idx) {
    // Keep only points that lower the damage as bytes grow, then drop those above the chord.
    if (!hull.empty() && rows[i].worst_upper >= rows[hull.back()].worst_upper) continue;
    while (hull.size() >= 2) {
      const Row& a = rows[hull[hull.size() - 2]];
      const Row& b = rows[hull.back()];
      const Row& c = rows[i];
      const double cross = (b.bytes_share - a.bytes_share) * (c.worst_upper - a.worst_upper) -
                           (b.worst_upper - a.worst_upper) * (c.bytes_share - a.bytes_share);
      if (cross > 0) break;  // b lies below the chord from a to c
      hull.pop_back();
    }
    hull.push_back(i);
  }
  return hull;
}

std::string Chart(const std::vector<Row>& rows, const std::vector<size_t>& hull) {
  using riskkv::report::F;
  double xhi = 0, ylo = 0, yhi = std::log(1.01);
  for (const Row& r : rows) {
    if (r.config->exact || r.config->layer >= 0) continue;
    xhi = std::max(xhi, 100 * r.bytes_share);
    ylo = std::min(ylo, r.all.lo);
    yhi = std::max(yhi, std::min(r.worst_upper, 0.05));
  }
  riskkv::report::Widen(&ylo, &yhi);
  const riskkv::report::Plot p{0, xhi * 1.05, ylo, yhi};
  std::string s =
      p.Axes("KV bytes sent (% of FULL_KV f16)",
             "\xCE\x94NLL (nats/token): mean, 95% CI, worst text's bound", "%.0f", "%.3g");
  for (const double budget : {std::log(1.005), std::log(1.01)}) {
    s += F("<line x1='%.1f' y1='%.1f' x2='%.1f' y2='%.1f' class='eps'/>", p.left, p.Y(budget),
           p.left + p.w, p.Y(budget));
    s += F("<text x='%.1f' y='%.1f' class='eps-label'>&#916;PPL %.1f%%</text>", p.left + 4,
           p.Y(budget) - 4, 100 * std::expm1(budget));
  }
  const char* colours[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"};
  std::map<std::string, int> series;
  int above = 0;  // configurations whose mean lies above the chart
  for (const Row& r : rows) {
    if (r.config->exact || r.config->layer >= 0) continue;
    const std::string key = r.config->transform
                                ? std::string(riskkv::TransformKindName(r.config->kind))
                                : std::string(riskkv::WireFormName(r.config->form));
    const int k = series.emplace(key, static_cast<int>(series.size())).first->second;
    if (r.all.mean > yhi) {
      ++above;
      continue;
    }
    const char* col = colours[k % 5];
    const double x = p.X(100 * r.bytes_share);
    const double top = std::min(r.all.hi, yhi), bottom = std::max(r.all.lo, ylo);
    s += F("<line x1='%.1f' y1='%.1f' x2='%.1f' y2='%.1f' stroke='%s'/>", x, p.Y(bottom), x,
           p.Y(top), col);
    s +=
        F("<circle cx='%.1f' cy='%.1f' r='3.5' fill='%s'><title>%s: %.1f%%, %+.5f</title>"
          "</circle>",
          x, p.Y(r.all.mean), col, riskkv::report::Esc(r.config->name).c_str(), 100 * r.bytes_share,
          r.all.mean);
    if (r.worst_upper <= yhi) {
      s += F("<path d='M%.1f %.1f l-4 -6 h8 z' fill='%s'/>", x, p.Y(r.worst_upper), col);
    }
  }
  std::string hull_path;
  for (size_t i : hull) {
    if (rows[i].worst_upper > yhi) continue;
    hull_path += F("%s%.1f %.1f ", hull_path.empty() ? "M" : "L", p.X(100 * rows[i].bytes_share),
                   p.Y(rows[i].worst_upper));
  }
  s += F("<path d='%s' fill='none' stroke='#555' stroke-dasharray='4 3'/>", hull_path.c_str());
  int k = 0;
  for (const auto& [name, index] : series) {
    s += F("<circle cx='%.1f' cy='%.1f' r='4' fill='%s'/><text x='%.1f' y='%.1f'>%s</text>",
           p.left + p.w - 120, p.top + 14 + 16.0 * k, colours[index % 5], p.left + p.w - 110,
           p.top + 18 + 16.0 * k, name.c_str());
    ++k;
  }
  s +=
      F("<text x='%.1f' y='%.1f'>&#9660; worst text's upper bound; dashed: its lower hull%s</text>",
        p.left + 8, p.top + 14,
        above > 0 ? F("; %d above the chart (in the table)", above).c_str() : "");
  return riskkv::report::Svg(p.left + p.w + 30, p.top + p.h + 50, s);
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "riskkv-kv-transform-bench --model PATH --fit-text FILE --eval-text A,B,C [--steps ...]");
  std::vector<std::string> store;
  std::vector<char*> args = riskkv::NormalizeFlagNames(argc, argv, &store);
  absl::ParseCommandLine(static_cast<int>(args.size()), args.data());
  auto options =
      riskkv::ModelOptionsFromFlags(absl::GetFlag(FLAGS_threads), absl::GetFlag(FLAGS_activations));
  if (!options.ok()) return Fail(options.status().ToString());
  auto model = riskkv::Model::Load(absl::GetFlag(FLAGS_model), *options);
  if (!model.ok()) return Fail(model.status().ToString());
  const riskkv::ModelConfig& c = (*model)->config();
  const int64_t heads = c.n_kv_heads, dim = c.head_dim, width = c.kv_width();
  if (absl::GetFlag(FLAGS_sink) < 0 || absl::GetFlag(FLAGS_recent) < 0) {
    return Fail("--sink and --recent must be >= 0");
  }

  // 1. The transforms, fitted to the prefill of --fit-text.
  std::vector<TransformKind> kinds;
  for (absl::string_view k :
       absl::StrSplit(absl::GetFlag(FLAGS_transforms), ',', absl::SkipEmpty())) {
    auto kind = riskkv::ParseTransformKind(std::string_view(k.data(), k.size()));
    if (!kind.ok()) return Fail("--transforms: " + kind.status().ToString());
    kinds.push_back(*kind);
  }
  std::vector<double> ratios;
  for (absl::string_view r : absl::StrSplit(absl::GetFlag(FLAGS_steps), ',', absl::SkipEmpty())) {
    double v = 0;
    if (!absl::SimpleAtod(r, &v) || !(v > 0)) return Fail("--steps: '" + std::string(r) + "'");
    ratios.push_back(v);
  }
  const absl::StatusOr<std::string> fit_text =
      riskkv::bench::ReadTextFile(absl::GetFlag(FLAGS_fit_text));
  if (!fit_text.ok()) return Fail("--fit-text: " + fit_text.status().ToString());
  auto fit_ids = (*model)->tokenizer().Encode(*fit_text, /*add_special=*/true, false);
  if (!fit_ids.ok()) return Fail(fit_ids.status().ToString());
  const int64_t n = absl::GetFlag(FLAGS_fit_tokens);
  if (n < 2 || static_cast<int64_t>(fit_ids->size()) < n) {
    return Fail("--fit-text has " + std::to_string(fit_ids->size()) + " tokens, --fit-tokens " +
                std::to_string(n));
  }
  fit_ids->resize(static_cast<size_t>(n));
  auto cache = (*model)->NewKvCache(n);
  if (!cache.ok()) return Fail(cache.status().ToString());
  std::fprintf(stderr, "prefilling %lld tokens of %s\n", static_cast<long long>(n),
               absl::GetFlag(FLAGS_fit_text).c_str());
  if (auto l = (*model)->Prefill(*fit_ids, **cache); !l.ok()) return Fail(l.status().ToString());
  std::vector<std::array<std::vector<float>, 2>> fit_rows(c.n_layers);
  Fitted fitted;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    for (int v = 0; v < 2; ++v) {
      std::vector<float>& x = fit_rows[l][v];
      x.resize(n * width);
      const absl::Status st =
          v ? (*cache)->ReadValues(l, 0, n, x.data()) : (*cache)->ReadKeys(l, 0, n, x.data());
      if (!st.ok()) return Fail(st.ToString());
    }
    for (TransformKind k : kinds) {
      auto& layers = fitted[k];
      layers.resize(c.n_layers);
      for (int v = 0; v < 2; ++v) {
        // The sink row is sent exact and would dominate the covariance: fit to the rest.
        auto t = riskkv::FitTransform(k, fit_rows[l][v].data() + width, n - 1, heads, dim);
        if (!t.ok()) return Fail(t.status().ToString());
        layers[l][v] = std::move(*t);
      }
    }
    std::fprintf(stderr, "\rfitted layer %lld/%lld", static_cast<long long>(l + 1),
                 static_cast<long long>(c.n_layers));
  }
  std::fprintf(stderr, "\n");

  // 2. The configurations, scored on held-out requests.
  std::vector<Config> configs = {{.name = "exact", .exact = true},
                                 {.name = "int8", .form = WireForm::kInt8},
                                 {.name = "int4", .form = WireForm::kInt4}};
  for (TransformKind k : kinds) {
    for (double r : ratios) {
      char name[96];
      std::snprintf(name, sizeof name, "%s, step %g",
                    std::string(riskkv::TransformKindName(k)).c_str(), r);
      configs.push_back({.name = name, .transform = true, .kind = k, .ratio = r});
    }
    for (int64_t l = 0; absl::GetFlag(FLAGS_per_layer) && l < c.n_layers; ++l) {
      char name[96];
      std::snprintf(name, sizeof name, "%s, step %g, layer %lld alone",
                    std::string(riskkv::TransformKindName(k)).c_str(), ratios[0],
                    static_cast<long long>(l));
      configs.push_back(
          {.name = name, .transform = true, .kind = k, .ratio = ratios[0], .layer = l});
    }
  }
  const std::vector<std::string> paths =
      absl::StrSplit(absl::GetFlag(FLAGS_eval_text), ',', absl::SkipEmpty());
  if (paths.empty()) return Fail("--eval-text names no file");
  auto cut = riskkv::bench::CutEvalRequests(**model, paths, absl::GetFlag(FLAGS_eval_history),
                                            absl::GetFlag(FLAGS_eval_tokens),
                                            absl::GetFlag(FLAGS_eval_requests));
  if (!cut.ok()) return Fail("--eval-text: " + cut.status().ToString());
  const std::vector<riskkv::Request>& requests = cut->requests;
  const std::vector<size_t>& file_of = cut->file_of;  // the file each request was cut from
  const int64_t moved = requests[0].moved_rows();
  // bytes[config][request]: each (config, request) is applied once, by one thread.
  std::vector<std::vector<int64_t>> bytes(configs.size(), std::vector<int64_t>(requests.size()));
  auto apply = [&](size_t k, size_t r, const riskkv::KvCache&, riskkv::KvCache& work,
                   riskkv::Backend&) -> absl::Status {
    if (configs[k].exact) return absl::OkStatus();
    std::vector<float> buf(static_cast<size_t>(moved * width));
    for (int64_t l = 0; l < c.n_layers; ++l) {
      if (configs[k].layer >= 0 && configs[k].layer != l) {
        bytes[k][r] += 2 * moved * width * 2;  // keys and values in f16, unchanged
        continue;
      }
      for (const bool v : {false, true}) {
        absl::Status st =
            v ? work.ReadValues(l, 0, moved, buf.data()) : work.ReadKeys(l, 0, moved, buf.data());
        if (!st.ok()) return st;
        auto b = Send(configs[k], fitted, l, v, buf.data(), moved, heads, dim);
        if (!b.ok()) return b.status();
        bytes[k][r] += *b;
        st =
            v ? work.WriteValues(l, 0, moved, buf.data()) : work.WriteKeys(l, 0, moved, buf.data());
        if (!st.ok()) return st;
      }
    }
    return absl::OkStatus();
  };
  auto quality = riskkv::MeasureQualityWith(
      **model, requests, configs.size(), apply, [](int64_t done, int64_t total) {
        std::fprintf(stderr, "\rΔNLL %lld/%lld", static_cast<long long>(done),
                     static_cast<long long>(total));
      });
  std::fprintf(stderr, "\n");
  if (!quality.ok()) return Fail(quality.status().ToString());
  const std::vector<std::vector<double>>* nll = &quality->nll;

  // 3. Rates on one thread, over the fit prefill's rows.
  const double f16_bytes_per_request = 2.0 * 2 * static_cast<double>(c.n_layers * moved * width);
  std::vector<Row> rows(configs.size());
  for (size_t k = 0; k < configs.size(); ++k) {
    Row& row = rows[k];
    row.config = &configs[k];
    double sent = 0;
    for (int64_t b : bytes[k]) sent += static_cast<double>(b);
    row.bytes_share = configs[k].exact ? 1.0 : sent / (f16_bytes_per_request * requests.size());
    std::vector<double> d(requests.size());
    for (size_t r = 0; r < d.size(); ++r) d[r] = (*nll)[k][r] - (*nll)[0][r];
    row.all = MeanCi(d);
    row.kl = MeanCi(quality->kl[k]);
    row.top1 = 0;
    for (double a : quality->top1[k]) row.top1 += a / static_cast<double>(requests.size());
    for (size_t f = 0; f < paths.size(); ++f) {
      std::vector<double> own;
      for (size_t r = 0; r < d.size(); ++r) {
        if (file_of[r] == f) own.push_back(d[r]);
      }
      row.per_text.push_back(MeanCi(own));
      row.worst_upper =
          f == 0 ? row.per_text.back().hi : std::max(row.worst_upper, row.per_text.back().hi);
    }
    if (!configs[k].transform || configs[k].layer >= 0) continue;
    double enc = 0, dec = 0, out_bytes = 0, coded = 0, entropy = 0;
    std::string chunk;
    std::vector<float> back;
    for (int64_t l = 0; l < c.n_layers; ++l) {
      for (int v = 0; v < 2; ++v) {
        const LayerTransform& t = fitted.at(configs[k].kind)[l][v];
        const float step = Step(configs[k], t, v == 1);
        // The fitted rows but the first (the sink, sent exact): m rows from x.
        const float* x = fit_rows[l][v].data() + width;
        const int64_t m = n - 1;
        back.resize(static_cast<size_t>(m * width));
        const auto t0 = std::chrono::steady_clock::now();
        if (!riskkv::EncodeTransformed(t, step, x, m, absl::GetFlag(FLAGS_zstd_level), &chunk)
                 .ok()) {
          return Fail("encode failed");
        }
        const auto t1 = std::chrono::steady_clock::now();
        if (absl::Status s = riskkv::DecodeTransformed(t, step, chunk, m, back.data()); !s.ok()) {
          return Fail(s.ToString());
        }
        const auto t2 = std::chrono::steady_clock::now();
        enc += std::chrono::duration<double>(t1 - t0).count();
        dec += std::chrono::duration<double>(t2 - t1).count();
        out_bytes += static_cast<double>(chunk.size());
        for (int64_t h = 0; h < heads; ++h) {
          const riskkv::HeadTransform& ht = t.head[h];
          for (int64_t i = 0; i < dim; ++i) {
            if (!riskkv::ComponentCoded(ht.variance[i], step)) continue;
            coded += 1;
            std::map<int64_t, int64_t> histogram;
            for (int64_t r = 0; r < m; ++r) {
              double y = 0;
              for (int64_t j = 0; j < dim; ++j) {
                y += double(ht.basis[i * dim + j]) * (x[r * width + h * dim + j] - ht.mean[j]);
              }
              ++histogram[std::llround(y / step)];
            }
            for (const auto& [code, count] : histogram) {
              const double p = static_cast<double>(count) / static_cast<double>(m);
              entropy -= static_cast<double>(count) * std::log2(p);
            }
          }
        }
      }
    }
    const double values = 2.0 * static_cast<double>(c.n_layers * (n - 1) * width);
    row.coded_share = coded / (2.0 * static_cast<double>(c.n_layers * width));
    row.zstd_bits = 8 * out_bytes / values;
    row.entropy_bits = entropy / values;
    const double f16_mb = 2.0 * 2 * static_cast<double>(c.n_layers * (n - 1) * width) / 1e6;
    row.encode_mbps = f16_mb / enc;
    row.decode_mbps = f16_mb / dec;
    row.wire_mbps = out_bytes / 1e6 / std::max(enc, dec);
  }

  std::printf(
      "%s, %s activations, scored over an f32 cache; transforms fitted to %lld tokens of %s; %zu "
      "held-out "
      "requests of %d + %d tokens (%d per text); %d sink and %d recent rows exact; zstd "
      "level %d\n\n",
      c.name.c_str(), absl::GetFlag(FLAGS_activations).c_str(), static_cast<long long>(n),
      absl::GetFlag(FLAGS_fit_text).c_str(), requests.size(), absl::GetFlag(FLAGS_eval_history),
      absl::GetFlag(FLAGS_eval_tokens), absl::GetFlag(FLAGS_eval_requests),
      absl::GetFlag(FLAGS_sink), absl::GetFlag(FLAGS_recent), absl::GetFlag(FLAGS_zstd_level));
  std::printf("| configuration | bytes (of f16) | ΔNLL [95%% CI] | ΔPPL | KL [95%% CI] | top-1 |");
  for (size_t f = 0; f < paths.size(); ++f) std::printf(" text %zu: mean (upper) |", f + 1);
  std::printf(
      " worst upper | encode / decode MB/s f16 | wire MB/s | coded | bits/value zstd (entropy) "
      "|\n|---|---|---|---|---|---|");
  for (size_t f = 0; f < paths.size(); ++f) std::printf("---|");
  std::printf("---|---|---|---|---|\n");
  for (const Row& r : rows) {
    if (r.config->exact) continue;
    std::printf("| %s | %.2f%% | %+.5f [%+.5f, %+.5f] | %+.3f%% | %.5f [%.5f, %.5f] | %.2f%% |",
                r.config->name.c_str(), 100 * r.bytes_share, r.all.mean, r.all.lo, r.all.hi,
                100 * std::expm1(r.all.mean), r.kl.mean, r.kl.lo, r.kl.hi, 100 * r.top1);
    for (const Mean& m : r.per_text) std::printf(" %+.5f (%+.5f) |", m.mean, m.hi);
    if (r.config->transform && r.config->layer < 0) {
      std::printf(" %+.5f | %.0f / %.0f | %.0f | %.1f%% | %.2f (%.2f) |\n", r.worst_upper,
                  r.encode_mbps, r.decode_mbps, r.wire_mbps, 100 * r.coded_share, r.zstd_bits,
                  r.entropy_bits);
    } else {
      std::printf(" %+.5f | – | – | – | – |\n", r.worst_upper);
    }
  }
  const std::vector<size_t> hull = LowerHull(rows);
  std::printf("\nLower convex hull of bytes against the worst text's upper bound:");
  for (size_t i : hull) {
    std::printf(" %s (%.2f%%, %+.5f);", rows[i].config->name.c_str(), 100 * rows[i].bytes_share,
                rows[i].worst_upper);
  }
  std::printf("\n");
  for (const double ppl : {0.005, 0.01}) {
    const Row* best = nullptr;
    for (const Row& r : rows) {
      if (r.config->exact || r.config->layer >= 0 || r.worst_upper > std::log1p(ppl)) continue;
      if (best == nullptr || r.bytes_share < best->bytes_share) best = &r;
    }
    if (best == nullptr) {
      std::printf("ΔPPL <= %.1f%% on the worst text's upper bound: no configuration\n", 100 * ppl);
    } else {
      std::printf("ΔPPL <= %.1f%% on the worst text's upper bound: %s, %.2f%% of f16\n", 100 * ppl,
                  best->config->name.c_str(), 100 * best->bytes_share);
    }
  }

  if (const std::string path = absl::GetFlag(FLAGS_json); !path.empty()) {
    nlohmann::json j;
    j["model"] = c.name;
    j["activations"] = absl::GetFlag(FLAGS_activations);
    j["fit_tokens"] = n;
    j["requests"] = requests.size();
    j["eval_history"] = absl::GetFlag(FLAGS_eval_history);
    j["eval_tokens"] = absl::GetFlag(FLAGS_eval_tokens);
    j["sink"] = absl::GetFlag(FLAGS_sink);
    j["recent"] = absl::GetFlag(FLAGS_recent);
    j["zstd_level"] = absl::GetFlag(FLAGS_zstd_level);
    j["value_step_scale"] = absl::GetFlag(FLAGS_value_step_scale);
    j["texts"] = paths;
    for (const Row& r : rows) {
      if (r.config->exact) continue;
      nlohmann::json e = {{"name", r.config->name},
                          {"bytes_share", r.bytes_share},
                          {"delta_nll", {r.all.mean, r.all.lo, r.all.hi}},
                          {"worst_upper", r.worst_upper},
                          {"kl", {r.kl.mean, r.kl.lo, r.kl.hi}},
                          {"top1", r.top1}};
      for (const Mean& m : r.per_text) e["per_text"].push_back({m.mean, m.lo, m.hi});
      if (r.config->transform) {
        e["transform"] = riskkv::TransformKindName(r.config->kind);
        e["step_ratio"] = r.config->ratio;
        e["encode_mbps_f16"] = r.encode_mbps;
        e["decode_mbps_f16"] = r.decode_mbps;
        e["wire_mbps"] = r.wire_mbps;
        e["coded_share"] = r.coded_share;
        e["zstd_bits_per_value"] = r.zstd_bits;
        e["entropy_bits_per_value"] = r.entropy_bits;
      }
      j["configs"].push_back(e);
    }
    std::ofstream(path) << j.dump(1) << "\n";
  }
  if (const std::string path = absl::GetFlag(FLAGS_svg); !path.empty()) {
    std::ofstream(path) << Chart(rows, hull);
  }
  return 0;
}
