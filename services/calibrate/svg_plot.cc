// The SVG drawing of the calibration report's charts (see svg_plot.h).
#include "services/calibrate/svg_plot.h"

#include <algorithm>
#include <cmath>

#include "services/calibrate/report_format.h"

namespace riskkv::report {
namespace {

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

}  // namespace

std::string Plot::Axes(const std::string& xlabel, const std::string& ylabel, const char* xfmt,
                       const char* yfmt) const {
  std::string s;
  for (double t : Ticks(x0, x1, 6)) {
    s +=
        F("<line x1='%.1f' y1='%.1f' x2='%.1f' y2='%.1f' class='grid'/>", X(t), top, X(t), top + h);
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

void Widen(double* lo, double* hi) {
  if (*hi - *lo < 1e-9) *hi = *lo + 1e-3;
  const double pad = 0.06 * (*hi - *lo);
  *lo -= pad;
  *hi += pad;
}

std::string Svg(double width, double height, const std::string& body) {
  return F("<svg xmlns='http://www.w3.org/2000/svg' width='%.0f' height='%.0f' viewBox='0 0 %.0f "
           "%.0f'><style>%s</style><rect width='100%%' height='100%%' fill='white'/>",
           width, height, width, height, kChartStyle) +
         body + "</svg>";
}

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

}  // namespace riskkv::report
