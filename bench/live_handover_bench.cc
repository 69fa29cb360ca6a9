// riskkv-live-bench: stop-and-copy against live (pre-copy) migration between running nodes, in
// one run. For each link (a source node started with that --link-mbps), each history length,
// each mode and each hand-over (stop-and-copy, live) it starts a session of that history on the
// source and migrates it to the target while a Generate stream runs on it (up to --gen-tokens, or
// the context) and follows it to the target (histories from --reuse-from prefill once per link
// and come back to the source after each run). The source's decode rate during a live run's
// pre-copy is set against an idle source's over the same positions: a session of the same history
// that generates with no migration (for a reused session, the tokens it generates idle just
// before). It prints downtime, total time, bytes, the decode rates, the live/stop-and-copy ratios,
// and writes CSV, JSON and an SVG chart of downtime against history length.
// bench/live_handover.sh starts the nodes and runs it.
//   riskkv-live-bench --sources 20=HOST:PORT,100=HOST:PORT --target HOST:PORT --out DIR
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <future>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "riskkv/v1/node.grpc.pb.h"
#include "services/calibrate/svg_plot.h"
#include "services/cli_args.h"
#include "services/client/follow_generate.h"

ABSL_FLAG(std::string, sources, "",
          "source nodes as MBPS=HOST:PORT,... (each started with that --link-mbps)");
ABSL_FLAG(std::string, target, "", "the target node");
ABSL_FLAG(std::string, histories, "128,512,2048,8000", "history lengths, tokens");
ABSL_FLAG(std::string, modes, "full_kv,reconstruct,token_replay", "migration modes");
ABSL_FLAG(std::string, text, "/usr/share/common-licenses/GPL-3,/usr/share/common-licenses/GPL-2",
          "text files whose tokens make the histories");
ABSL_FLAG(int, gen_tokens, 256,
          "tokens the session generates from the start of each migration (at most: the context)");
ABSL_FLAG(int64_t, context, 8192, "the model's context length, which bounds the tokens generated");
ABSL_FLAG(int, idle_tokens, 24,
          "tokens a reused session generates idle just before its live run, timing the idle rate");
ABSL_FLAG(int64_t, reuse_from, 4096,
          "histories from this length prefill once per link: after each run the session comes "
          "back to the source (FULL_KV, stop-and-copy, over the target's unlimited link) and the "
          "next run starts from where it ended, generating at most --reuse-gen-tokens");
ABSL_FLAG(int, reuse_gen_tokens, 28, "tokens a live run of a reused session generates");
ABSL_FLAG(std::string, out, "", "directory for live_handover.{csv,json,svg} (empty: none)");

namespace {

using Clock = std::chrono::steady_clock;
using riskkv::v1::Node;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

int Fail(const std::string& m) {
  std::fprintf(stderr, "riskkv-live-bench: %s\n", m.c_str());
  return 1;
}

std::unique_ptr<Node::Stub> Stub(const std::string& address) {
  return Node::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}

// One Generate request that follows its session; token arrival times, and which node each came
// from (0: where it started).
struct Stream {
  std::vector<double> at;  // seconds since `start`
  std::vector<int> hop;
  std::string error;
};

Stream GenerateFollowing(const std::string& address, const std::string& id, int count,
                         Clock::time_point start, std::atomic<int>* seen) {
  Stream s;
  const riskkv::FollowResult r =
      riskkv::GenerateFollowing(address, id, count, {.deadline_seconds = 3600},
                                [&](const riskkv::v1::GenerateReply&, int moves) {
                                  s.at.push_back(Since(start));
                                  s.hop.push_back(moves);
                                  ++*seen;
                                });
  // The session's length limit ends a stream early; that is not a failure of the run.
  if (!r.status.ok() && r.status.error_code() != grpc::StatusCode::OUT_OF_RANGE) {
    s.error = r.status.error_message();
  }
  return s;
}

// Tokens per second over the arrival times of tokens first..last (the first opens the interval);
// 0 when fewer than 5 tokens say too little.
double Rate(const std::vector<double>& at, size_t first, size_t last) {
  if (last >= at.size() || last < first + 4) return 0;
  return static_cast<double>(last - first) / (at[last] - at[first]);
}

// Tokens a stop-and-copy run of a reused session generates (it pauses at the first).
constexpr int kReuseStopTokens = 4;

struct Row {
  int64_t start_history;  // the session's history when the run began
  double mbps;
  std::string mode;
  bool live;
  int64_t history;
  double downtime, total;
  int64_t bytes, bytes_after_pause;
  int rounds;
  double idle_rate, precopy_rate;  // tokens/s (0: too few tokens to tell)
  bool generating;                 // the session was generating when it paused
};

absl::StatusOr<std::string> Start(Node::Stub& node, const std::vector<int32_t>& ids) {
  grpc::ClientContext ctx;
  riskkv::v1::StartSessionRequest req;
  for (int32_t t : ids) req.add_token_ids(t);
  riskkv::v1::SessionInfo info;
  const grpc::Status st = node.StartSession(&ctx, req, &info);
  if (!st.ok()) return absl::InternalError("StartSession: " + st.error_message());
  return info.session_id();
}

absl::StatusOr<riskkv::v1::MigrateReply> Migrate(Node::Stub& from, const std::string& id,
                                                 const std::string& to, const std::string& mode,
                                                 bool live) {
  grpc::ClientContext ctx;
  riskkv::v1::MigrateRequest req;
  req.set_session_id(id);
  req.set_target_address(to);
  riskkv::v1::MigrationMode m;
  std::string upper;
  for (char c : mode) upper += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (!riskkv::v1::MigrationMode_Parse(upper, &m)) return absl::InvalidArgumentError(mode);
  req.set_mode(m);
  req.set_live(live);
  req.set_timeout_seconds(1800);
  riskkv::v1::MigrateReply reply;
  const grpc::Status st = from.Migrate(&ctx, req, &reply);
  if (!st.ok()) return absl::InternalError("Migrate: " + st.error_message());
  return reply;
}

// The token ids of `files`' text as the source's tokenizer makes them.
absl::StatusOr<std::vector<int32_t>> TextTokens(Node::Stub& node, const std::string& files) {
  std::string text;
  for (absl::string_view f : absl::StrSplit(files, ',')) {
    std::ifstream in{std::string(f)};
    if (!in) return absl::NotFoundError(absl::StrCat("no text file ", std::string(f)));
    text.append(std::istreambuf_iterator<char>(in), {});
  }
  grpc::ClientContext ctx;
  riskkv::v1::StartSessionRequest req;
  req.set_prompt(text);
  riskkv::v1::SessionInfo info;
  // The node's own length limit may refuse the whole text: then half of it, and so on.
  grpc::Status st;
  while (true) {
    grpc::ClientContext c;
    req.set_prompt(text);
    st = node.StartSession(&c, req, &info);
    if (st.ok() || st.error_code() != grpc::StatusCode::OUT_OF_RANGE || text.size() < 1000) break;
    text.resize(text.size() * 3 / 4);
  }
  if (!st.ok()) return absl::InternalError("StartSession: " + st.error_message());
  grpc::ClientContext g;
  riskkv::v1::GetSessionRequest get;
  get.set_session_id(info.session_id());
  get.set_with_tokens(true);
  riskkv::v1::SessionInfo full;
  st = node.GetSession(&g, get, &full);
  if (!st.ok()) return absl::InternalError("GetSession: " + st.error_message());
  grpc::ClientContext cl;
  riskkv::v1::CloseSessionRequest close;
  close.set_session_id(info.session_id());
  riskkv::v1::CloseSessionReply closed;
  (void)node.CloseSession(&cl, close, &closed);
  return std::vector<int32_t>(full.token_ids().begin(), full.token_ids().end());
}

std::string Chart(const std::vector<Row>& rows, const std::vector<double>& links) {
  // Log-log: history (x) against downtime in ms (y), one panel per link, a line per mode and
  // hand-over.
  double ylo = 1e9, yhi = 0, xlo = 1e9, xhi = 0;
  for (const Row& r : rows) {
    ylo = std::min(ylo, r.downtime * 1e3);
    yhi = std::max(yhi, r.downtime * 1e3);
    xlo = std::min<double>(xlo, static_cast<double>(r.start_history));
    xhi = std::max<double>(xhi, static_cast<double>(r.start_history));
  }
  const double ly0 = std::floor(std::log10(std::max(ylo, 0.1))),
               ly1 = std::ceil(std::log10(std::max(yhi, 1.0)));
  const double lx0 = std::log2(std::max(xlo, 1.0)) - 0.3, lx1 = std::log2(xhi) + 0.3;
  const char* colors[] = {"#1f77b4", "#d62728", "#2ca02c"};
  const std::vector<std::string> modes = {"full_kv", "reconstruct", "token_replay"};
  std::string body;
  const double pw = 420, ph = 260, top = 40;
  for (size_t p = 0; p < links.size(); ++p) {
    const double left = 70 + static_cast<double>(p) * (pw + 90);
    auto X = [&](double h) { return left + (std::log2(h) - lx0) / (lx1 - lx0) * pw; };
    auto Y = [&](double ms) {
      return top + ph - (std::log10(std::max(ms, 0.1)) - ly0) / (ly1 - ly0) * ph;
    };
    absl::StrAppend(&body, absl::StrFormat("<text x='%.0f' y='%.0f' class='title'>%g Mbit/s</text>",
                                           left, top - 14, links[p]));
    absl::StrAppend(&body, absl::StrFormat("<rect x='%.0f' y='%.0f' width='%.0f' height='%.0f' "
                                           "fill='none' stroke='#888'/>",
                                           left, top, pw, ph));
    for (double e = ly0; e <= ly1; ++e) {
      const double y = Y(std::pow(10, e));
      absl::StrAppend(&body,
                      absl::StrFormat("<line x1='%.1f' x2='%.1f' y1='%.1f' y2='%.1f' "
                                      "stroke='#ddd'/><text x='%.1f' y='%.1f' "
                                      "text-anchor='end'>%g ms</text>",
                                      left, left + pw, y, y, left - 6, y + 4, std::pow(10, e)));
    }
    for (double h : {128.0, 512.0, 2048.0, 8000.0}) {
      if (h < xlo * 0.9 || h > xhi * 1.1) continue;
      absl::StrAppend(&body, absl::StrFormat("<text x='%.1f' y='%.1f' text-anchor='middle'>%g"
                                             "</text>",
                                             X(h), top + ph + 16, h));
    }
    absl::StrAppend(&body, absl::StrFormat("<text x='%.1f' y='%.1f' text-anchor='middle'>history "
                                           "(tokens)</text>",
                                           left + pw / 2, top + ph + 34));
    for (size_t m = 0; m < modes.size(); ++m) {
      for (bool live : {false, true}) {
        std::vector<std::pair<double, double>> pts;
        for (const Row& r : rows) {
          if (r.mbps == links[p] && r.mode == modes[m] && r.live == live) {
            pts.emplace_back(static_cast<double>(r.start_history), r.downtime * 1e3);
          }
        }
        std::sort(pts.begin(), pts.end());
        std::string path;
        for (const auto& [h, ms] : pts) {
          absl::StrAppend(&path, path.empty() ? "M" : " L",
                          absl::StrFormat("%.1f %.1f", X(h), Y(ms)));
          absl::StrAppend(&body, absl::StrFormat("<circle cx='%.1f' cy='%.1f' r='3' fill='%s'/>",
                                                 X(h), Y(ms), colors[m]));
        }
        if (!path.empty()) {
          absl::StrAppend(&body,
                          absl::StrFormat("<path d='%s' fill='none' stroke='%s' "
                                          "stroke-width='2'%s/>",
                                          path, colors[m], live ? "" : " stroke-dasharray='6 4'"));
        }
      }
    }
  }
  // Legend.
  double ly = top + ph + 56;
  for (size_t m = 0; m < modes.size(); ++m) {
    const double x = 70 + static_cast<double>(m) * 230;
    absl::StrAppend(&body, absl::StrFormat("<line x1='%.0f' x2='%.0f' y1='%.0f' y2='%.0f' "
                                           "stroke='%s' stroke-width='2'/><line x1='%.0f' "
                                           "x2='%.0f' y1='%.0f' y2='%.0f' stroke='%s' "
                                           "stroke-width='2' stroke-dasharray='6 4'/><text "
                                           "x='%.0f' y='%.0f'>%s live / stop-and-copy</text>",
                                           x, x + 20, ly, ly, colors[m], x, x + 20, ly + 14,
                                           ly + 14, colors[m], x + 26, ly + 11, modes[m]));
  }
  return riskkv::report::Svg(70 + static_cast<double>(links.size()) * (pw + 90), ly + 30,
                             "<text x='70' y='18' class='title'>Downtime against history "
                             "length, SmolLM2 on 2 cores</text>" +
                                 body);
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "riskkv-live-bench --sources MBPS=HOST:PORT,... --target HOST:PORT [--out DIR]");
  std::vector<std::string> store;
  std::vector<char*> args = riskkv::NormalizeFlagNames(argc, argv, &store);
  absl::ParseCommandLine(static_cast<int>(args.size()), args.data());
  std::vector<std::pair<double, std::string>> sources;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_sources), ',', absl::SkipEmpty())) {
    std::pair<std::string, std::string> kv = absl::StrSplit(s, absl::MaxSplits('=', 1));
    double mbps = 0;
    if (!absl::SimpleAtod(kv.first, &mbps) || mbps <= 0 || kv.second.empty()) {
      return Fail(absl::StrCat("--sources: '", std::string(s), "' is not MBPS=HOST:PORT"));
    }
    sources.emplace_back(mbps, kv.second);
  }
  const std::string target = absl::GetFlag(FLAGS_target);
  if (sources.empty() || target.empty()) return Fail("--sources and --target are required");
  std::vector<int64_t> histories;
  for (absl::string_view h : absl::StrSplit(absl::GetFlag(FLAGS_histories), ',')) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(h, &v) || v < 8) return Fail("--histories: bad length " + std::string(h));
    histories.push_back(v);
  }
  const std::vector<std::string> modes = absl::StrSplit(absl::GetFlag(FLAGS_modes), ',');
  const int gen = absl::GetFlag(FLAGS_gen_tokens), idle = absl::GetFlag(FLAGS_idle_tokens);
  if (gen < 1 || idle < 3) return Fail("--gen-tokens >= 1 and --idle-tokens >= 3 needed");

  auto first = Stub(sources.front().second);
  auto text = TextTokens(*first, absl::GetFlag(FLAGS_text));
  if (!text.ok()) return Fail(std::string(text.status().message()));
  std::fprintf(stderr, "text: %zu tokens\n", text->size());
  auto tgt = Stub(target);
  std::vector<Row> rows;
  const size_t total_runs = sources.size() * histories.size() * modes.size() * 2;
  std::fprintf(stderr,
               "%zu migrations; each starts a fresh session of its history (from %lld tokens, "
               "one session per link comes back after each run)\n",
               total_runs, static_cast<long long>(absl::GetFlag(FLAGS_reuse_from)));
  const Clock::time_point bench_start = Clock::now();
  const int64_t context = absl::GetFlag(FLAGS_context);
  for (const auto& source : sources) {
    const double mbps = source.first;
    const std::string& address = source.second;
    auto src = Stub(address);
    for (int64_t history : histories) {
      if (history + 16 > context) return Fail(absl::StrCat("history ", history, " does not fit"));
      std::vector<int32_t> ids;
      for (int64_t i = 0; i <= history; ++i) ids.push_back((*text)[i % text->size()]);
      // A long history is prefilled once and reused: every run then fits in the context.
      const bool reuse = history >= absl::GetFlag(FLAGS_reuse_from);
      const int budget = reuse ? absl::GetFlag(FLAGS_reuse_gen_tokens)
                               : static_cast<int>(std::min<int64_t>(gen, context - history - 8));
      std::string kept;  // the reused session's id on the source
      if (reuse) {
        const int64_t need =
            history +
            static_cast<int64_t>(modes.size()) * (kReuseStopTokens + 2 + idle + budget + 2) + 8;
        if (need > context) {
          return Fail(absl::StrCat("history ", history, " reused over ", modes.size() * 2,
                                   " runs needs ", need, " tokens of a ", context,
                                   "-token context; lower --reuse-gen-tokens or --idle-tokens"));
        }
        auto sid = Start(*src, ids);
        if (!sid.ok()) return Fail(std::string(sid.status().message()));
        kept = *sid;
      }
      for (const std::string& mode : modes) {
        for (bool live : {false, true}) {
          // An idle source's decode over the positions a fresh session's live run generates at:
          // the same history, the same greedy tokens, no migration, timed just before the run so
          // that the machine's speed is the same for both.
          Stream control;
          if (!reuse && live) {
            auto sid = Start(*src, ids);
            if (!sid.ok()) return Fail(std::string(sid.status().message()));
            std::atomic<int> seen{0};
            control = GenerateFollowing(address, *sid, budget, Clock::now(), &seen);
            if (!control.error.empty()) return Fail("control generate: " + control.error);
            grpc::ClientContext cl;
            riskkv::v1::CloseSessionRequest close;
            close.set_session_id(*sid);
            riskkv::v1::CloseSessionReply closed;
            (void)src->CloseSession(&cl, close, &closed);
          }
          std::string id = kept;
          if (!reuse) {
            auto sid = Start(*src, ids);
            if (!sid.ok()) return Fail(std::string(sid.status().message()));
            id = *sid;
          }
          std::atomic<int> seen{0};
          // A reused session times its idle rate just before its live run, at the positions
          // next to those it generates at during the pre-copy.
          double idle_rate = 0;
          if (reuse && live) {
            const Stream idle_run = GenerateFollowing(address, id, idle, Clock::now(), &seen);
            if (!idle_run.error.empty()) return Fail("idle generate: " + idle_run.error);
            idle_rate = Rate(idle_run.at, 0, idle_run.at.size() - 1);
            seen = 0;
          }
          const int count = reuse && !live ? kReuseStopTokens : budget;
          const Clock::time_point t0 = Clock::now();
          auto stream = std::async(std::launch::async, [&, id, count] {
            return GenerateFollowing(address, id, count, t0, &seen);
          });
          for (int i = 0; i < 60000 && seen.load() < 1; ++i) {
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
          }
          const double m0 = Since(t0);
          auto reply = Migrate(*src, id, target, mode, live);
          const double m1 = Since(t0);
          const Stream run = stream.get();
          if (!reply.ok()) return Fail(std::string(reply.status().message()));
          if (!run.error.empty()) return Fail("generate: " + run.error);
          // Tokens the source made between the migration's start and its pause.
          const double pause = m1 - reply->downtime_seconds();
          size_t first = run.at.size(), last = 0;
          for (size_t i = 0; i < run.at.size(); ++i) {
            if (run.hop[i] == 0 && run.at[i] >= m0 && run.at[i] <= pause) {
              first = std::min(first, i);
              last = i;
            }
          }
          const double precopy_rate = live ? Rate(run.at, first, last) : 0.0;
          if (live && !reuse) idle_rate = Rate(control.at, first, last);
          const bool generating = !run.hop.empty() && run.hop.back() == 1;
          Row r{history,
                mbps,
                mode,
                live,
                reply->history_tokens(),
                reply->downtime_seconds(),
                reply->total_seconds(),
                reply->kv_bytes_sent(),
                reply->kv_bytes_after_pause(),
                reply->precopy_rounds(),
                idle_rate,
                precopy_rate,
                generating};
          rows.push_back(r);
          std::fprintf(stderr,
                       "[%zu/%zu, %.0f s] %g Mbit/s %5lld tokens %-12s %-13s downtime %8.3f s "
                       "total %8.3f s%s\n",
                       rows.size(), total_runs, Since(bench_start), mbps,
                       static_cast<long long>(r.history), mode.c_str(),
                       live ? "live" : "stop-and-copy", r.downtime, r.total,
                       generating ? ", the stream followed" : "");
          if (reuse) {
            auto back = Migrate(*tgt, reply->target_session_id(), address, "full_kv", false);
            if (!back.ok()) return Fail("back: " + std::string(back.status().message()));
            kept = back->target_session_id();
            continue;
          }
          grpc::ClientContext cl;
          riskkv::v1::CloseSessionRequest close;
          close.set_session_id(reply->target_session_id());
          riskkv::v1::CloseSessionReply closed;
          (void)tgt->CloseSession(&cl, close, &closed);
        }
      }
      if (reuse) {
        grpc::ClientContext cl;
        riskkv::v1::CloseSessionRequest close;
        close.set_session_id(kept);
        riskkv::v1::CloseSessionReply closed;
        (void)src->CloseSession(&cl, close, &closed);
      }
    }
  }
  std::printf("%-6s %-7s %-12s | %-24s | %-22s | %-9s | %-11s | %-6s | %-8s | %s\n", "Mbit/s",
              "history", "mode", "downtime s: stop / live", "total s: stop / live", "live/stop",
              "after pause", "rounds", "moved at",
              "decode during pre-copy / idle at the same positions");
  for (size_t i = 0; i + 1 < rows.size(); i += 2) {
    const Row& s = rows[i];
    const Row& l = rows[i + 1];
    const std::string rate = l.precopy_rate > 0 && l.idle_rate > 0
                                 ? absl::StrFormat("%.1f / %.1f tokens/s (%.2f)", l.precopy_rate,
                                                   l.idle_rate, l.precopy_rate / l.idle_rate)
                                 : absl::StrFormat("- / %.1f tokens/s", l.idle_rate);
    std::printf(
        "%-6g %-7lld %-12s | %9.4f / %9.4f    | %8.3f / %8.3f   | %9.4f | %8.1f KB | %-6d | "
        "%-8lld | %s\n",
        s.mbps, static_cast<long long>(s.start_history), s.mode.c_str(), s.downtime, l.downtime,
        s.total, l.total, l.downtime / s.downtime, static_cast<double>(l.bytes_after_pause) / 1e3,
        l.rounds, static_cast<long long>(l.history), rate.c_str());
  }
  // The floor: the source's decode during the pre-copy against an idle source's.
  int timed = 0, above = 0;
  double lowest = 0;
  for (const Row& r : rows) {
    if (!r.live || r.precopy_rate <= 0 || r.idle_rate <= 0) continue;
    const double ratio = r.precopy_rate / r.idle_rate;
    lowest = timed++ == 0 ? ratio : std::min(lowest, ratio);
    above += ratio >= 0.8;
  }
  std::printf(
      "source decode during the pre-copy / idle: at or above 0.80 in %d of %d timed live "
      "runs, lowest %.2f\n",
      above, timed, lowest);
  const std::string dir = absl::GetFlag(FLAGS_out);
  if (!dir.empty()) {
    std::ofstream csv(dir + "/live_handover.csv");
    csv << "start_history_tokens,link_mbps,history_tokens,mode,handover,downtime_seconds,total_"
           "seconds,kv_bytes,"
           "kv_bytes_after_pause,precopy_rounds,idle_tokens_per_second,"
           "precopy_tokens_per_second,generating_at_pause\n";
    std::ofstream json(dir + "/live_handover.json");
    json << "[\n";
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      csv << absl::StrFormat("%d,%g,%d,%s,%s,%.6f,%.6f,%d,%d,%d,%.3f,%.3f,%d\n", r.start_history,
                             r.mbps, r.history, r.mode, r.live ? "live" : "stop_and_copy",
                             r.downtime, r.total, r.bytes, r.bytes_after_pause, r.rounds,
                             r.idle_rate, r.precopy_rate, r.generating ? 1 : 0);
      json << absl::StrFormat(
          "  {\"start_history_tokens\": %d, \"link_mbps\": %g, \"history_tokens\": %d, \"mode\": "
          "\"%s\", \"handover\": \"%s\", "
          "\"downtime_seconds\": %.6f, \"total_seconds\": %.6f, \"kv_bytes\": %d, "
          "\"kv_bytes_after_pause\": %d, \"precopy_rounds\": %d, \"idle_tokens_per_second\": "
          "%.3f, \"precopy_tokens_per_second\": %.3f, \"generating_at_pause\": %s}%s\n",
          r.start_history, r.mbps, r.history, r.mode, r.live ? "live" : "stop_and_copy", r.downtime,
          r.total, r.bytes, r.bytes_after_pause, r.rounds, r.idle_rate, r.precopy_rate,
          r.generating ? "true" : "false", i + 1 < rows.size() ? "," : "");
    }
    json << "]\n";
    std::vector<double> links;
    for (const auto& s : sources) links.push_back(s.first);
    std::ofstream(dir + "/live_handover.svg") << Chart(rows, links);
    std::fprintf(stderr, "wrote %s/live_handover.{csv,json,svg}\n", dir.c_str());
  }
  return 0;
}
