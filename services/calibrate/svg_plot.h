// The SVG drawing the calibration report's charts are made of: linear axes, horizontal bar
// charts and standalone SVG documents. Knows nothing of calibration results.
#pragma once

#include <string>
#include <vector>

namespace riskkv::report {

// A chart area with linear axes: data (x, y) -> pixels.
struct Plot {
  double x0, x1, y0, y1;  // data ranges
  double left = 70, top = 20, w = 560, h = 260;
  double X(double x) const { return left + (x - x0) / (x1 - x0) * w; }
  double Y(double y) const { return top + h - (y - y0) / (y1 - y0) * h; }
  // Grid, tick labels (printf formats `xfmt`, `yfmt`), frame and axis labels.
  std::string Axes(const std::string& xlabel, const std::string& ylabel, const char* xfmt,
                   const char* yfmt) const;
};

// Pads a data range by 6% each side (and gives an empty range some width), so marks at its ends
// do not sit on the frame.
void Widen(double* lo, double* hi);

// A standalone SVG document of `width` x `height` pixels around `body`, with the charts' style.
std::string Svg(double width, double height, const std::string& body);

// One row of a horizontal bar chart.
struct Bar {
  std::string label;
  double value, lo, hi;
  bool has_ci;
};

// Horizontal bars (one row per label of `a`) with an optional second series `b` of the same
// labels, CI whiskers where a bar has them, a dashed line at `epsilon` and a legend naming the
// series.
std::string BarChart(const std::vector<Bar>& a, const std::vector<Bar>* b, const char* a_name,
                     const char* b_name, double epsilon, const std::string& xlabel);

}  // namespace riskkv::report
