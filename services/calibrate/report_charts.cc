// The calibration report's charts: which layers the chosen configuration rebuilds, the singleton
// risks, the ordered path and the noise control, each a standalone SVG document.
#include <algorithm>

#include "services/calibrate/report.h"
#include "services/calibrate/report_format.h"
#include "services/calibrate/svg_plot.h"

namespace riskkv {
namespace {

using report::Bar;
using report::BarChart;
using report::Esc;
using report::F;
using report::Plot;
using report::Svg;
using report::Widen;

std::string PathChart(const CalibrationResult& r) {
  const double eps = r.options.epsilon;
  double ylo = std::min(0.0, eps), yhi = eps, xhi = 0;
  for (const PathPointResult& p : r.path) {
    for (const Measured* m : {&p.validation, &p.test}) {
      if (m->requests == 0) continue;
      ylo = std::min(ylo, m->ci95.lo);
      yhi = std::max(yhi, m->ci95.hi);
    }
  }
  xhi = 100;
  for (const ExhaustiveResult& e : r.exhaustive) {
    ylo = std::min(ylo, e.mean);
    yhi = std::max(yhi, e.mean);
  }
  Widen(&ylo, &yhi);
  Plot p{0, xhi * 1.05, ylo, yhi};
  std::string s =
      p.Axes("KV bytes sent (% of FULL_KV plain)", "mean \xCE\x94NLL (nats/token)", "%.0f", "%.3g");
  for (const ExhaustiveResult& e : r.exhaustive) {
    s +=
        F("<circle cx='%.1f' cy='%.1f' r='2.5' class='subset'><title>subset %u: %.5f</title>"
          "</circle>",
          p.X(100 * (1 - e.kv_fraction)), p.Y(e.mean), e.mask, e.mean);
  }
  s += F("<line x1='%.1f' y1='%.1f' x2='%.1f' y2='%.1f' class='eps'/>", p.left, p.Y(eps),
         p.left + p.w, p.Y(eps));
  s += F("<text x='%.1f' y='%.1f' class='eps-label'>&#949; = %g</text>", p.left + 4, p.Y(eps) - 4,
         eps);
  // One line per wire form and split through consecutive points it scored (a point after an
  // unscored one starts a new line); the plain line starts at exact KV.
  auto series = [&](Measured PathPointResult::*field, const char* cls, double dx) {
    std::string line;
    const PathPointResult* last = nullptr;
    for (size_t k = 0; k < r.path.size(); ++k) {
      const PathPointResult& pt = r.path[k];
      const Measured& m = pt.*field;
      if (m.requests == 0) continue;
      const double x = p.X(100 * pt.sent_fraction) + dx;
      const bool new_form = last == nullptr || pt.form != last->form;
      const bool after_gap = !new_form && last != &r.path[k - 1];
      last = &pt;
      if (new_form) {
        if (!line.empty()) s += F("<path d='%s' class='%s-line'/>", line.c_str(), cls);
        line = pt.form == WireForm::kPlain ? F("M %.1f %.1f L", p.X(100) + dx, p.Y(0)) : "M";
        s += F("<text x='%.1f' y='%.1f' class='eps-label'>%s</text>", x + 6, p.Y(m.ci95.mean) - 6,
               std::string(WireFormName(pt.form)).c_str());
      } else {
        line += after_gap ? " M" : " L";
      }
      line += F(" %.1f %.1f", x, p.Y(m.ci95.mean));
      s += F("<line x1='%.1f' y1='%.1f' x2='%.1f' y2='%.1f' class='%s-ci'/>", x, p.Y(m.ci95.lo), x,
             p.Y(m.ci95.hi), cls);
      s +=
          F("<circle cx='%.1f' cy='%.1f' r='3.5' class='%s'><title>%.1f%% omitted: %.5f</title>"
            "</circle>",
            x, p.Y(m.ci95.mean), cls, 100 * pt.kv_fraction, m.ci95.mean);
    }
    if (!line.empty()) s += F("<path d='%s' class='%s-line'/>", line.c_str(), cls);
  };
  series(&PathPointResult::validation, "val", -2);
  series(&PathPointResult::test, "test", 2);
  if (r.chosen >= 0) {
    const PathPointResult& c = r.path[r.chosen];
    s += F("<circle cx='%.1f' cy='%.1f' r='9' class='chosen'/>", p.X(100 * c.sent_fraction),
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

}  // namespace riskkv
