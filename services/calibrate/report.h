// riskkv-calibrate's outputs for people and scripts: a self-contained HTML report with inline SVG
// charts, and the same figures as JSON.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "common/recovery/predictor_bank.h"
#include "common/recovery/retention_policy.h"
#include "services/calibrate/calibrate.h"

namespace riskkv {

// The report's charts as standalone SVG documents, by name: "layers", "singleton-risk",
// "ordered-path" and, when the control ran, "noise-control".
std::vector<std::pair<std::string, std::string>> RenderCharts(const CalibrationResult& result);

// `bank` is the chosen configuration's bank (nullptr when nothing is rebuilt).
std::string RenderReport(const CalibrationResult& result, const RetentionPolicy& policy,
                         const PredictorBank* bank);

std::string ResultToJson(const CalibrationResult& result, const RetentionPolicy& policy);

}  // namespace riskkv
