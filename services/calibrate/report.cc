// The calibration report (HTML + inline SVG) and its JSON twin.
#include "services/calibrate/report.h"

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <nlohmann/json.hpp>

namespace riskkv {
namespace {

std::string F(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string F(const char* fmt, ...) {
  va_list a, b;
  va_start(a, fmt);
  va_copy(b, a);
  const int n = std::vsnprintf(nullptr, 0, fmt, a);
  va_end(a);
  std::string s(static_cast<size_t>(std::max(n, 0)) + 1, '\0');
  std::vsnprintf(s.data(), s.size(), fmt, b);
  va_end(b);
  s.pop_back();
  return s;
}

std::string Esc(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&':
        o += "&amp;";
        break;
      case '<':
        o += "&lt;";
        break;
      case '>':
        o += "&gt;";
        break;
      case '"':
        o += "&quot;";
        break;
      default:
        o += c;
    }
  }
  return o;
}

double Ppl(double nll) { return std::exp(nll); }
double DeltaPplPercent(const Measured& m) { return 100.0 * (std::exp(m.ci95.mean) - 1.0); }
std::string Ci(const Measured& m) {
  return F("%+.5f [%+.5f, %+.5f]", m.ci95.mean, m.ci95.lo, m.ci95.hi);
}
double Mib(int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

// Round tick spacing for a range: 1, 2 or 5 times a power of ten, about `n` ticks.
std::vector<double> Ticks(double lo, double hi, int n) {
  const double raw = (hi - lo) / n;
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  double step = p;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    step = m * p;
    if (step >= raw) break;
  }
  std::vector<double> t;
  for (double v = std::ceil(lo / step) * step; v <= hi + 1e-12 * step; v += step) {
    t.push_back(std::abs(v) < 1e-12 * step ? 0.0 : v);
  }
  return t;
}

// A chart area with linear axes: data (x, y) -> pixels.
struct Plot {
  double x0, x1, y0, y1;  // data ranges
  double left = 70, top = 20, w = 560, h = 260;
  double X(double x) const { return left + (x - x0) / (x1 - x0) * w; }
  double Y(double y) const { return top + h - (y - y0) / (y1 - y0) * h; }
  std::string Axes(const std::string& xlabel, const std::string& ylabel, const char* xfmt,
                   const char* yfmt) const {
    std::string s;
    for (double t : Ticks(x0, x1, 6)) {
      s += F("<line x1='%.1f' y1='%.1f' x2='%.1f' y2='%.1f' class='grid'/>", X(t), top, X(t),
             top + h);
      s += F("<text x='%.1f' y='%.1f' text-anchor='middle'>", X(t), top + h + 14) + F(xfmt, t) +
           "</text>";
    }
    for (double t : Ticks(y0, y1, 5)) {
      s += F("<line x1='%.1f' y1='%.1f' x2='%.1f' y2='%.1f' class='grid'/>", left, Y(t), left + w,
             Y(t));
      s += F("<text x='%.1f' y='%.1f' text-anchor='end'>", left - 4, Y(t) + 4) + F(yfmt, t) +
           "</text>";
    }
    s += F("<rect x='%.1f' y='%.1f' width='%.1f' height='%.1f' class='frame'/>", left, top, w, h);
    s += F("<text x='%.1f' y='%.1f' text-anchor='middle'>%s</text>", left + w / 2, top + h + 32,
           Esc(xlabel).c_str());
    s += F("<text transform='translate(14,%.1f) rotate(-90)' text-anchor='middle'>%s</text>",
           top + h / 2, Esc(ylabel).c_str());
    return s;
  }
};

void Widen(double* lo, double* hi) {
  if (*hi - *lo < 1e-9) *hi = *lo + 1e-3;
  const double pad = 0.06 * (*hi - *lo);
  *lo -= pad;
  *hi += pad;
}

// Each chart carries its own style, so it also stands alone as an .svg file.
const char* kChartStyle =
    "text{font-family:sans-serif;font-size:11px;fill:#333}.grid{stroke:#eee}"
    ".frame{fill:none;stroke:#999}.zero{stroke:#555}.eps{stroke:#c0392b;stroke-dasharray:4 3}"
    ".eps-label{fill:#c0392b}.bar-a{fill:#2f6db5}.bar-b{fill:#aaa}"
    ".whisker{stroke:#111;stroke-width:1.5}.val{fill:#2f6db5}.test{fill:#e67e22}"
    ".val-line{fill:none;stroke:#2f6db5}.test-line{fill:none;stroke:#e67e22}"
    ".val-ci{stroke:#2f6db5}.test-ci{stroke:#e67e22}.chosen{fill:none;stroke:#111;"
    "stroke-width:2}.subset{fill:#bbb}.layer-kept{fill:#ddd}.layer-anchor{fill:#2f6db5}"
    ".layer-rebuilt{fill:#e67e22}.layer-cand{fill:#f6d7b8}";

std::string Svg(double width, double height, const std::string& body) {
  return F("<svg xmlns='http://www.w3.org/2000/svg' width='%.0f' height='%.0f' viewBox='0 0 %.0f "
           "%.0f'><style>%s</style><rect width='100%%' height='100%%' fill='white'/>",
           width, height, width, height, kChartStyle) +
         body + "</svg>";
}

// Horizontal bars (one row per label) with optional second series and CI whiskers.
struct Bar {
  std::string label;
  double value, lo, hi;
  bool has_ci;
};
std::string BarChart(const std::vector<Bar>& a, const std::vector<Bar>* b, const char* a_name,
                     const char* b_name, double epsilon, const std::string& xlabel) {
  double lo = std::min(0.0, epsilon), hi = std::max(0.0, epsilon);
  auto extend = [&](const std::vector<Bar>& v) {
    for (const Bar& r : v) {
      lo = std::min({lo, r.value, r.has_ci ? r.lo : r.value});
      hi = std::max({hi, r.value, r.has_ci ? r.hi : r.value});
    }
  };
  extend(a);
  if (b) extend(*b);
  Widen(&lo, &hi);
  const double row = b ? 30 : 22;
  Plot p{lo, hi, 0, 1};
  p.left = 130;
  p.w = 520;
  p.h = row * static_cast<double>(a.size());
  std::string s;
  for (double t : Ticks(lo, hi, 6)) {
    s += F("<line x1='%.1f' y1='%.1f' x2='%.1f' y2='%.1f' class='grid'/>", p.X(t), p.top, p.X(t),
           p.top + p.h);
    s += F("<text x='%.1f' y='%.1f' text-anchor='middle'>%.3g</text>", p.X(t), p.top + p.h + 14, t);
  }
  auto draw = [&](const Bar& r, double y, double hgt, const char* cls) {
    const double x0 = p.X(std::min(0.0, r.value)), x1 = p.X(std::max(0.0, r.value));
    s +=
        F("<rect x='%.1f' y='%.1f' width='%.1f' height='%.1f' class='%s'><title>%s: %.5f</title>"
          "</rect>",
          x0, y, std::max(x1 - x0, 0.5), hgt, cls, Esc(r.label).c_str(), r.value);
    if (r.has_ci) {
      const double yc = y + hgt / 2;
      s += F("<line x1='%.1f' y1='%.1f' x2='%.1f' y2='%.1f' class='whisker'/>", p.X(r.lo), yc,
             p.X(r.hi), yc);
    }
  };
  for (size_t i = 0; i < a.size(); ++i) {
    const double y = p.top + row * static_cast<double>(i);
    s += F("<text x='%.1f' y='%.1f' text-anchor='end'>%s</text>", p.left - 6, y + row / 2 + 4,
           Esc(a[i].label).c_str());
    if (b) {
      draw(a[i], y + 3, (row - 6) / 2, "bar-a");
      draw((*b)[i], y + 3 + (row - 6) / 2, (row - 6) / 2, "bar-b");
    } else {
      draw(a[i], y + 3, row - 6, "bar-a");
    }
  }
  s += F("<line x1='%.1f' y1='%.1f' x2='%.1f' y2='%.1f' class='zero'/>", p.X(0), p.top, p.X(0),
         p.top + p.h);
  s += F("<line x1='%.1f' y1='%.1f' x2='%.1f' y2='%.1f' class='eps'/>", p.X(epsilon), p.top,
         p.X(epsilon), p.top + p.h);
  s += F("<text x='%.1f' y='%.1f' class='eps-label'>&#949; = %g</text>", p.X(epsilon) + 3,
         p.top + 10, epsilon);
  s += F("<text x='%.1f' y='%.1f' text-anchor='middle'>%s</text>", p.left + p.w / 2,
         p.top + p.h + 32, Esc(xlabel).c_str());
  double legend_y = p.top + p.h + 48;
  s +=
      F("<rect x='%.1f' y='%.1f' width='12' height='10' class='bar-a'/><text x='%.1f' "
        "y='%.1f'>%s</text>",
        p.left, legend_y - 9, p.left + 16, legend_y, a_name);
  if (b) {
    s +=
        F("<rect x='%.1f' y='%.1f' width='12' height='10' class='bar-b'/><text x='%.1f' "
          "y='%.1f'>%s</text>",
          p.left + 200, legend_y - 9, p.left + 216, legend_y, b_name);
  }
  return Svg(p.left + p.w + 20, legend_y + 10, s);
}

std::string PathChart(const CalibrationResult& r) {
  const double eps = r.options.epsilon;
  double ylo = std::min(0.0, eps), yhi = eps, xhi = 0;
  for (const PathPointResult& p : r.path) {
    for (const Measured* m : {&p.validation, &p.test}) {
      ylo = std::min(ylo, m->ci95.lo);
      yhi = std::max(yhi, m->ci95.hi);
    }
    xhi = std::max(xhi, 100 * p.kv_fraction);
  }
  for (const ExhaustiveResult& e : r.exhaustive) {
    ylo = std::min(ylo, e.mean);
    yhi = std::max(yhi, e.mean);
  }
  Widen(&ylo, &yhi);
  Plot p{0, std::max(xhi, 1.0) * 1.05, ylo, yhi};
  std::string s =
      p.Axes("KV omitted (% of layers)", "mean \xCE\x94NLL (nats/token)", "%.0f", "%.3g");
  for (const ExhaustiveResult& e : r.exhaustive) {
    s +=
        F("<circle cx='%.1f' cy='%.1f' r='2.5' class='subset'><title>subset %u: %.5f</title>"
          "</circle>",
          p.X(100 * e.kv_fraction), p.Y(e.mean), e.mask, e.mean);
  }
  s += F("<line x1='%.1f' y1='%.1f' x2='%.1f' y2='%.1f' class='eps'/>", p.left, p.Y(eps),
         p.left + p.w, p.Y(eps));
  s += F("<text x='%.1f' y='%.1f' class='eps-label'>&#949; = %g</text>", p.left + 4, p.Y(eps) - 4,
         eps);
  auto series = [&](Measured PathPointResult::*field, const char* cls, double dx) {
    std::string line = F("M %.1f %.1f", p.X(0) + dx, p.Y(0));
    for (const PathPointResult& pt : r.path) {
      const Measured& m = pt.*field;
      const double x = p.X(100 * pt.kv_fraction) + dx;
      line += F(" L %.1f %.1f", x, p.Y(m.ci95.mean));
      s += F("<line x1='%.1f' y1='%.1f' x2='%.1f' y2='%.1f' class='%s-ci'/>", x, p.Y(m.ci95.lo), x,
             p.Y(m.ci95.hi), cls);
      s +=
          F("<circle cx='%.1f' cy='%.1f' r='3.5' class='%s'><title>%.1f%% omitted: %.5f</title>"
            "</circle>",
            x, p.Y(m.ci95.mean), cls, 100 * pt.kv_fraction, m.ci95.mean);
    }
    s += F("<path d='%s' class='%s-line'/>", line.c_str(), cls);
  };
  series(&PathPointResult::validation, "val", -2);
  series(&PathPointResult::test, "test", 2);
  if (r.chosen >= 0) {
    const PathPointResult& c = r.path[r.chosen];
    s += F("<circle cx='%.1f' cy='%.1f' r='9' class='chosen'/>", p.X(100 * c.kv_fraction),
           p.Y(c.test.ci95.mean));
  }
  const double ly = p.top + p.h + 50;
  s +=
      F("<circle cx='%.1f' cy='%.1f' r='4' class='val'/><text x='%.1f' y='%.1f'>validation "
        "(selection)</text>",
        p.left + 6, ly - 4, p.left + 14, ly);
  s +=
      F("<circle cx='%.1f' cy='%.1f' r='4' class='test'/><text x='%.1f' y='%.1f'>test "
        "(held out)</text>",
        p.left + 176, ly - 4, p.left + 184, ly);
  s += F("<circle cx='%.1f' cy='%.1f' r='7' class='chosen'/><text x='%.1f' y='%.1f'>chosen</text>",
         p.left + 316, ly - 4, p.left + 328, ly);
  if (!r.exhaustive.empty()) {
    s +=
        F("<circle cx='%.1f' cy='%.1f' r='2.5' class='subset'/><text x='%.1f' y='%.1f'>every "
          "subset (validation)</text>",
          p.left + 396, ly - 4, p.left + 404, ly);
  }
  return Svg(p.left + p.w + 20, ly + 10, s);
}

std::string LayerStrip(const CalibrationResult& r) {
  const int64_t n = r.config.n_layers;
  std::vector<std::string> cls(n, "kept");
  for (const LayerGroup& g : r.groups) {
    for (int32_t l : g.targets) cls[l] = "cand";
  }
  for (const LayerGroup& g : r.ChosenGroups()) {
    for (int32_t l : g.anchors) cls[l] = "anchor";
    for (int32_t l : g.targets) cls[l] = "rebuilt";
  }
  const double cell = std::min(26.0, 640.0 / static_cast<double>(n));
  std::string s;
  for (int64_t l = 0; l < n; ++l) {
    const double x = 10 + cell * static_cast<double>(l);
    s +=
        F("<rect x='%.1f' y='10' width='%.1f' height='28' class='layer-%s'><title>layer %lld: "
          "%s</title></rect>",
          x, cell - 2, cls[l].c_str(), static_cast<long long>(l), cls[l].c_str());
    if (n <= 40 || l % 5 == 0) {
      s += F("<text x='%.1f' y='52' text-anchor='middle'>%lld</text>", x + cell / 2 - 1,
             static_cast<long long>(l));
    }
  }
  const char* names[] = {"kept exact", "anchor (kept exact)", "rebuilt", "candidate, kept exact"};
  const char* kinds[] = {"kept", "anchor", "rebuilt", "cand"};
  for (int i = 0; i < 4; ++i) {
    s +=
        F("<rect x='%d' y='62' width='12' height='12' class='layer-%s'/><text x='%d' "
          "y='72'>%s</text>",
          10 + 160 * i, kinds[i], 26 + 160 * i, names[i]);
  }
  return Svg(std::max(20 + cell * static_cast<double>(n), 660.0), 84, s);
}

const char* kPageStyle = R"(
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1000px;color:#222}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #ccc}
table{border-collapse:collapse;margin:0.5em 0;font-size:0.9em}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#f3f3f3}
td.l,th.l{text-align:left}tr.chosen td{background:#fff3d6;font-weight:600}
.note{color:#555;font-size:0.9em}code{background:#f5f5f5;padding:0 3px}
)";

std::string GateMark(const CalibrationResult& r, Gate g, size_t k) {
  const GateDecision& d = r.gates[static_cast<int>(g)].decision;
  if (k >= d.passed.size()) return "&ndash;";
  std::string s = d.passed[k] ? "pass" : "fail";
  if (d.chosen == static_cast<int>(k)) s = "<b>chosen</b>";
  return s;
}

// The best subset of the exhaustive search under `gate` (Mean or Upper-90) at `eps`: the most
// layers omitted, ties broken by the lower statistic. Returns -1 when none passes.
int BestSubset(const CalibrationResult& r, bool upper, double eps) {
  int best = -1;
  for (size_t i = 0; i < r.exhaustive.size(); ++i) {
    const ExhaustiveResult& e = r.exhaustive[i];
    const double stat = upper ? e.upper90 : e.mean;
    if (stat > eps) continue;
    if (best < 0 || e.layers > r.exhaustive[best].layers ||
        (e.layers == r.exhaustive[best].layers &&
         stat < (upper ? r.exhaustive[best].upper90 : r.exhaustive[best].mean))) {
      best = static_cast<int>(i);
    }
  }
  return best;
}

int BestOnPath(const CalibrationResult& r, bool upper, double eps) {
  int best = -1;
  for (size_t k = 0; k < r.path.size(); ++k) {
    const Measured& m = r.path[k].validation;
    if ((upper ? m.upper90 : m.ci95.mean) <= eps &&
        (best < 0 || r.path[k].layers > r.path[best].layers)) {
      best = static_cast<int>(k);
    }
  }
  return best;
}

std::string SubsetName(const CalibrationResult& r, uint32_t mask) {
  std::string s;
  for (size_t g = 0; g < r.groups.size(); ++g) {
    if (mask & (1u << g)) s += (s.empty() ? "" : ", ") + r.groups[g].ToString();
  }
  return s;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> RenderCharts(const CalibrationResult& r) {
  std::vector<std::pair<std::string, std::string>> charts;
  charts.push_back({"layers", LayerStrip(r)});
  std::vector<Bar> bars;
  for (int g : r.ranking) {
    const Measured& m = r.singleton[g];
    bars.push_back({r.groups[g].ToString(), m.ci95.mean, m.ci95.lo, m.ci95.hi, true});
  }
  charts.push_back(
      {"singleton-risk", BarChart(bars, nullptr, "rebuilt group", "", r.options.epsilon,
                                  "mean \xCE\x94NLL (nats/token)")});
  charts.push_back({"ordered-path", PathChart(r)});
  if (!r.noise.empty()) {
    std::vector<Bar> a, b;
    for (int g : r.ranking) {
      const NoiseResult& nr = r.noise[g];
      a.push_back({r.groups[g].ToString(), nr.rebuilt_mean, 0, 0, false});
      b.push_back({r.groups[g].ToString(), nr.noise_mean, 0, 0, false});
    }
    charts.push_back(
        {"noise-control", BarChart(a, &b, "RISK-KV reconstruction", "Gaussian, matched NRMSE",
                                   r.options.epsilon, "mean \xCE\x94NLL (nats/token)")});
  }
  return charts;
}

std::string RenderReport(const CalibrationResult& r, const RetentionPolicy& policy,
                         const PredictorBank* bank) {
  const CalibrateOptions& o = r.options;
  const ModelConfig& c = r.config;
  std::string h =
      "<!DOCTYPE html><html><head><meta charset='utf-8'><title>riskkv calibration: " + Esc(c.name) +
      "</title><style>" + kPageStyle + "</style></head><body>";
  h += "<h1>RISK-KV calibration of " + Esc(c.name) + "</h1>";
  const Measured& chosen_test = r.chosen >= 0 ? r.path[r.chosen].test : r.test_exact;
  const double omitted = r.chosen >= 0 ? 100 * r.path[r.chosen].kv_fraction : 0.0;
  h += F("<p><b>Chosen:</b> %s gate at &#949; = %g: ", GateName(o.gate), o.epsilon);
  if (r.chosen >= 0) {
    h +=
        F("rebuild %d of %lld layers (%.1f%% of the KV omitted, %lld of %lld bytes per token "
          "not sent). Held-out test: &#916;NLL %s, &#916;PPL %+.3f%%.</p>",
          r.path[r.chosen].layers, static_cast<long long>(c.n_layers), omitted,
          static_cast<long long>(policy.kv_bytes_saved_per_token),
          static_cast<long long>(policy.kv_bytes_per_token), Ci(chosen_test).c_str(),
          DeltaPplPercent(chosen_test));
  } else {
    h += "no configuration on the path passes; the policy keeps every layer exact.</p>";
  }

  h += "<h2>Run</h2><table>";
  auto row = [&](const std::string& k, const std::string& v) {
    h += "<tr><th class='l'>" + k + "</th><td class='l'>" + v + "</td></tr>";
  };
  row("model", Esc(r.model_path));
  row("fingerprint", "<code>" + Esc(r.fingerprint) + "</code>");
  row("layers, KV width",
      F("%lld, %lld", static_cast<long long>(c.n_layers), static_cast<long long>(c.kv_width())));
  row("corpus", Esc(o.corpus));
  row("documents", F("%lld cut at <code>", static_cast<long long>(r.corpus.documents)) +
                       Esc(o.doc_boundary) +
                       F("</code>; %lld dropped as not prose (min prose share %g)",
                         static_cast<long long>(r.corpus.dropped), o.min_prose));
  row("request", F("%lld history tokens (H) + %lld scored tokens (T)",
                   static_cast<long long>(o.history), static_cast<long long>(o.eval)));
  row("policy",
      Esc(policy.policy_id) + F(" version %llu", static_cast<unsigned long long>(policy.version)));
  row("bank", bank ? F("%s, %.3f MiB of maps, sha256 <code>", DTypeName(bank->dtype()),
                       Mib(bank->bytes())) +
                         bank->content_hash() + "</code>"
                   : std::string("none (nothing rebuilt)"));
  row("seed, bootstrap",
      F("%llu, %d resamples", static_cast<unsigned long long>(o.seed), o.bootstrap_resamples));
  h += "</table><table><tr><th class='l'>split</th><th>documents</th><th>documents "
       "read</th><th>tokens read</th><th>requests</th><th class='l'>used for</th></tr>";
  const char* uses[] = {"ridge fits",
                        "ridge strength, singleton risk, path, gates (+ confirmation requests)",
                        "held-out report only"};
  for (int s = 0; s < 3; ++s) {
    const SplitStats& st = r.splits[s];
    h +=
        F("<tr><td class='l'>%s</td><td>%lld</td><td>%lld</td><td>%lld</td><td>%d</td><td "
          "class='l'>%s</td></tr>",
          SplitName(static_cast<Split>(s)), static_cast<long long>(st.documents),
          static_cast<long long>(st.documents_used), static_cast<long long>(st.tokens), st.requests,
          uses[s]);
  }
  h +=
      F("</table><p class='note'>Validation requests: %d for selection, %d for Stable-split "
        "confirmation.</p>",
        o.validation, o.confirm);

  const auto charts = RenderCharts(r);
  auto chart = [&](const char* name) {
    for (const auto& [n, svg] : charts) {
      if (n == name) return svg;
    }
    return std::string();
  };
  h += "<h2>Chosen configuration</h2>" + chart("layers");

  h += "<h2>Singleton risk per group (validation)</h2><p class='note'>Mean NLL increase of the "
       "evaluation tokens with one group rebuilt and every other layer exact, paired per request "
       "with exact KV; whiskers are 95% bootstrap intervals. Ranked least risky first.</p>";
  h += chart("singleton-risk");
  h += "<table><tr><th>rank</th><th class='l'>group</th><th>&#916;NLL mean [95% CI]</th><th>upper "
       "90%</th><th>requests &gt; &#949;</th></tr>";
  for (size_t i = 0; i < r.ranking.size(); ++i) {
    const int g = r.ranking[i];
    h += F("<tr><td>%zu</td><td class='l'>%s</td><td>%s</td><td>%+.5f</td><td>%d/%zu</td></tr>",
           i + 1, Esc(r.groups[g].ToString()).c_str(), Ci(r.singleton[g]).c_str(),
           r.singleton[g].upper90, r.singleton[g].violations, r.singleton[g].deltas.size());
  }
  h += "</table>";

  h += "<h2>Ordered path</h2><p class='note'>Point k rebuilds the k least risky groups together, "
       "each configuration measured for real. Validation selects; the test split is held out and "
       "only reported.</p>" +
       chart("ordered-path");

  h += "<h2>Table I: held-out test split</h2><p class='note'>Paired 95% bootstrap intervals over " +
       F("%zu", r.test_exact.deltas.size()) +
       " test requests. PPL = exp(mean NLL); &#916;PPL from the mean paired &#916;NLL. Gate "
       "columns: the decision on validation data.</p>";
  h += "<table><tr><th>k</th><th class='l'>group added</th><th>layers</th><th>KV "
       "omitted</th><th>&#916;NLL mean [95% CI]</th><th>PPL exact</th><th>PPL "
       "rebuilt</th><th>&#916;PPL</th><th>requests &gt; &#949;</th><th>val mean</th><th>val "
       "upper 90%</th><th>mean</th><th>upper90</th><th>stable-split</th></tr>";
  h +=
      F("<tr><td>0</td><td class='l'>exact KV</td><td>0</td><td>0.0%%</td><td>0</td><td>%.4f</"
        "td><td>%.4f</td><td>0</td><td>0</td><td></td><td></td><td></td><td></td><td></td></tr>",
        Ppl(r.test_exact.exact_nll), Ppl(r.test_exact.exact_nll));
  for (size_t k = 0; k < r.path.size(); ++k) {
    const PathPointResult& p = r.path[k];
    h += F(
        "<tr%s><td>%zu</td><td class='l'>%s</td><td>%d</td><td>%.1f%%</td><td>%s</td><td>%.4f</"
        "td><td>%.4f</td><td>%+.3f%%</td><td>%d/%zu</td><td>%+.5f</td><td>%+.5f</td>",
        static_cast<int>(k) == r.chosen ? " class='chosen'" : "", k + 1,
        Esc(r.groups[p.groups.back()].ToString()).c_str(), p.layers, 100 * p.kv_fraction,
        Ci(p.test).c_str(), Ppl(p.test.exact_nll), Ppl(p.test.rebuilt_nll), DeltaPplPercent(p.test),
        p.test.violations, p.test.deltas.size(), p.validation.ci95.mean, p.validation.upper90);
    for (Gate g : {Gate::kMean, Gate::kUpper90, Gate::kStableSplit}) {
      h += "<td>" + GateMark(r, g, k) + "</td>";
    }
    h += "</tr>";
  }
  h += "</table>";

  h += "<h2>Quality gates</h2><p class='note'>Each gate picks the configuration with the most KV "
       "omitted among those that pass on validation data (Stable-split also on the confirmation "
       "requests), or falls back to exact KV. Outcomes on the held-out test split.</p>";
  h += "<table><tr><th class='l'>gate</th><th class='l'>decision</th><th>KV omitted</th><th>test "
       "&#916;NLL [95% CI]</th><th>test &#916;PPL</th><th>test requests &gt; &#949;</th></tr>";
  for (const GateResult& g : r.gates) {
    if (g.decision.passed.empty()) {
      h +=
          F("<tr><td class='l'>%s</td><td class='l'>not run (no confirmation "
            "requests)</td><td></td><td></td><td></td><td></td></tr>",
            GateName(g.gate));
      continue;
    }
    const int k = g.decision.chosen;
    const Measured& m = k >= 0 ? r.path[k].test : r.test_exact;
    h +=
        F("<tr%s><td class='l'>%s</td><td class='l'>%s</td><td>%.1f%%</td><td>%s</td><td>%+.3f%%"
          "</td><td>%d/%zu</td></tr>",
          g.gate == o.gate ? " class='chosen'" : "", GateName(g.gate),
          k >= 0 ? F("path point %d", k + 1).c_str() : "exact KV (fallback)",
          k >= 0 ? 100 * r.path[k].kv_fraction : 0.0, Ci(m).c_str(), DeltaPplPercent(m),
          m.violations, m.deltas.size());
  }
  h += "</table>";

  h += "<h2>Table III: predictor storage per group</h2>";
  double unf = 0, f32 = 0, f16 = 0;
  for (const StorageResult& s : r.storage) {
    unf += Mib(s.unfolded_bytes);
    f32 += Mib(s.folded_f32_bytes);
    f16 += Mib(s.folded_f16_bytes);
  }
  const double n = static_cast<double>(r.storage.size());
  h +=
      F("<table><tr><th class='l'></th><th>ridge to attention input (f32)</th><th>folded "
        "K/V maps (f32)</th><th>folded K/V maps (f16)</th></tr><tr><td class='l'>mean per "
        "group (MiB)</td><td>%.3f</td><td>%.3f</td><td>%.3f</td></tr><tr><td "
        "class='l'>relative</td><td>1</td><td>%.3f</td><td>%.3f</td></tr></table>",
        unf / n, f32 / n, f16 / n, f32 / unf, f16 / unf);
  h +=
      F("<p class='note'>Per target layer: ridge map [hidden %lld &times; F] plus intercept; "
        "folded maps 2 &times; [KV width %lld &times; F] plus two offsets, F = 2 &times; anchors "
        "&times; KV width. The chosen bank holds %.3f MiB of maps%s.</p>",
        static_cast<long long>(c.hidden), static_cast<long long>(c.kv_width()),
        bank ? Mib(bank->bytes()) : 0.0, bank ? "" : " (no bank: nothing rebuilt)");

  if (!r.noise.empty()) {
    h +=
        F("<h2>Control: Gaussian noise of matched NRMSE</h2><p class='note'>Each group's rebuilt "
          "K/V replaced by exact K/V plus isotropic Gaussian noise with the same per-request, "
          "per-layer NRMSE as the reconstruction (%d validation requests, %d draw(s)). Spearman "
          "rank correlation between the two risk orders over %zu groups: <b>%s</b>. A low value "
          "means noise sensitivity cannot stand in for measured reconstruction risk.</p>",
          o.noise_requests, o.noise_draws, r.noise.size(),
          std::isnan(r.noise_rank_correlation) ? "n/a (fewer than 3 groups)"
                                               : F("%.2f", r.noise_rank_correlation).c_str());
    h += chart("noise-control");
    h += "<table><tr><th class='l'>group</th><th>K NRMSE</th><th>V NRMSE</th><th>&#916;NLL "
         "rebuilt [95% CI]</th><th>&#916;NLL noise [95% CI]</th></tr>";
    for (int g : r.ranking) {
      const NoiseResult& nr = r.noise[g];
      h +=
          F("<tr><td class='l'>%s</td><td>%.4f</td><td>%.4f</td><td>%+.5f [%+.5f, %+.5f]</td>"
            "<td>%+.5f [%+.5f, %+.5f]</td></tr>",
            Esc(r.groups[g].ToString()).c_str(), nr.nrmse_k, nr.nrmse_v, nr.rebuilt_mean,
            nr.rebuilt_ci95.lo, nr.rebuilt_ci95.hi, nr.noise_mean, nr.noise_ci95.lo,
            nr.noise_ci95.hi);
    }
    h += "</table>";
  }

  if (!r.exhaustive.empty()) {
    h +=
        F("<h2>Exhaustive search</h2><p class='note'>All %zu non-empty subsets of the %zu "
          "candidates measured on the validation requests, against the %zu configurations of the "
          "ordered path (2G evaluations with the singletons).</p>",
          r.exhaustive.size(), r.groups.size(), r.path.size());
    h += "<table><tr><th>&#949;</th><th class='l'>gate</th><th>path: layers "
         "omitted</th><th>best subset: layers omitted</th><th class='l'>best subset</th></tr>";
    for (double mult : {0.25, 0.5, 1.0, 2.0, 4.0}) {
      const double eps = o.epsilon * mult;
      for (bool upper : {false, true}) {
        const int pk = BestOnPath(r, upper, eps), bs = BestSubset(r, upper, eps);
        h += F(
            "<tr><td>%g</td><td class='l'>%s</td><td>%d</td><td>%d</td><td class='l'>%s</td></tr>",
            eps, upper ? "upper90" : "mean", pk >= 0 ? r.path[pk].layers : 0,
            bs >= 0 ? r.exhaustive[bs].layers : 0,
            bs >= 0 ? Esc(SubsetName(r, r.exhaustive[bs].mask)).c_str() : "exact KV");
      }
    }
    h += "</table>";
  }

  h += "<h2>Time per phase</h2><table><tr><th class='l'>phase</th><th>seconds</th></tr>";
  double total = 0;
  for (const auto& [name, s] : r.phase_seconds) {
    h += F("<tr><td class='l'>%s</td><td>%.1f</td></tr>", name.c_str(), s);
    total += s;
  }
  h += F("<tr><th class='l'>total</th><th>%.1f</th></tr></table>", total);
  h += "<h2>Retention policy</h2><pre>" + Esc(PolicyToText(policy)) + "</pre></body></html>\n";
  return h;
}

std::string ResultToJson(const CalibrationResult& r, const RetentionPolicy& policy) {
  using nlohmann::json;
  auto measured = [](const Measured& m) {
    return json{{"mean", m.ci95.mean},
                {"ci_low", m.ci95.lo},
                {"ci_high", m.ci95.hi},
                {"upper90", m.upper90},
                {"exact_nll", m.exact_nll},
                {"rebuilt_nll", m.rebuilt_nll},
                {"violations", m.violations},
                {"requests", m.deltas.size()},
                {"delta_ppl_percent", DeltaPplPercent(m)}};
  };
  const CalibrateOptions& o = r.options;
  json j;
  j["model"] = {{"path", r.model_path},
                {"name", r.config.name},
                {"fingerprint", r.fingerprint},
                {"layers", r.config.n_layers}};
  j["corpus"] = {{"documents", r.corpus.documents}, {"dropped", r.corpus.dropped}};
  j["options"] = {{"corpus", o.corpus}, {"history", o.history},       {"eval", o.eval},
                  {"train", o.train},   {"validation", o.validation}, {"confirm", o.confirm},
                  {"test", o.test},     {"epsilon", o.epsilon},       {"gate", GateName(o.gate)},
                  {"seed", o.seed}};
  for (int s = 0; s < 3; ++s) {
    const SplitStats& st = r.splits[s];
    j["splits"][SplitName(static_cast<Split>(s))] = {{"documents", st.documents},
                                                     {"documents_used", st.documents_used},
                                                     {"tokens", st.tokens},
                                                     {"requests", st.requests}};
  }
  for (int g : r.ranking) {
    j["singleton"].push_back(
        {{"group", r.groups[g].ToString()}, {"validation", measured(r.singleton[g])}});
  }
  for (size_t k = 0; k < r.path.size(); ++k) {
    const PathPointResult& p = r.path[k];
    json pt = {{"groups", k + 1},
               {"layers", p.layers},
               {"kv_fraction", p.kv_fraction},
               {"validation", measured(p.validation)},
               {"test", measured(p.test)}};
    if (!p.confirm.deltas.empty()) pt["confirm"] = measured(p.confirm);
    j["path"].push_back(pt);
  }
  for (const GateResult& g : r.gates) {
    if (!g.decision.passed.empty()) j["gates"][GateName(g.gate)] = g.decision.chosen;
  }
  j["chosen"] = {{"path_index", r.chosen},
                 {"kv_fraction", r.chosen >= 0 ? r.path[r.chosen].kv_fraction : 0.0},
                 {"test", measured(r.chosen >= 0 ? r.path[r.chosen].test : r.test_exact)},
                 {"test_exact_ppl", Ppl(r.test_exact.exact_nll)}};
  for (const NoiseResult& n : r.noise) {
    j["noise"]["groups"].push_back({{"group", r.groups[n.group].ToString()},
                                    {"rebuilt_mean", n.rebuilt_mean},
                                    {"noise_mean", n.noise_mean},
                                    {"nrmse_k", n.nrmse_k},
                                    {"nrmse_v", n.nrmse_v}});
  }
  if (!r.noise.empty() && !std::isnan(r.noise_rank_correlation)) {
    j["noise"]["rank_correlation"] = r.noise_rank_correlation;
  }
  for (const ExhaustiveResult& e : r.exhaustive) {
    j["exhaustive"].push_back(
        {{"mask", e.mask}, {"layers", e.layers}, {"mean", e.mean}, {"upper90", e.upper90}});
  }
  for (size_t g = 0; g < r.storage.size(); ++g) {
    j["storage"].push_back({{"group", r.groups[g].ToString()},
                            {"unfolded_bytes", r.storage[g].unfolded_bytes},
                            {"folded_f32_bytes", r.storage[g].folded_f32_bytes},
                            {"folded_f16_bytes", r.storage[g].folded_f16_bytes}});
  }
  j["kv_bytes_per_token"] = policy.kv_bytes_per_token;
  j["kv_bytes_saved_per_token"] = policy.kv_bytes_saved_per_token;
  j["predictor_bank_sha256"] = policy.predictor_bank_sha256;
  for (const auto& [name, s] : r.phase_seconds) j["phase_seconds"][name] = s;
  return j.dump(2) + "\n";
}

}  // namespace riskkv
