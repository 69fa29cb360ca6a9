// riskkvctl: the command line for people and scripts. Replies print as JSON.
//   riskkvctl --node 127.0.0.1:7070 start --prompt "Once upon a time" [--temperature 0.8]
//   riskkvctl --node 127.0.0.1:7070 generate --session ID -n 32 [--ids]
//   riskkvctl --node 127.0.0.1:7070 migrate --session ID --to 127.0.0.1:7071 --mode reconstruct
//   riskkvctl --node 127.0.0.1:7070 migrate --session ID --to 127.0.0.1:7071 --mode full_kv
//     --wire-form int8 [--live | --nolive]
//   riskkvctl --node 127.0.0.1:7070 score --session ID --tokens '[1,2,3]'
//   riskkvctl --node 127.0.0.1:7070 show --session ID
//   riskkvctl --node 127.0.0.1:7070 list
//   riskkvctl --node 127.0.0.1:7070 close --session ID
//   riskkvctl --control 127.0.0.1:7000 policy-put --policy policy.pb --bank bank.rkvbank
//   riskkvctl --control 127.0.0.1:7000 policy-get --policy-id ID [--version N]
//   riskkvctl --control 127.0.0.1:7000 policy-list
//   riskkvctl --node 127.0.0.1:7070 health; riskkvctl --control 127.0.0.1:7000 control-health
#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <iterator>
#include <optional>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "riskkv/v1/control.grpc.pb.h"
#include "riskkv/v1/node.grpc.pb.h"
#include "services/access/client_token.h"
#include "services/cli_args.h"
#include "services/cli_help.h"
#include "services/client/follow_generate.h"
#include "services/grpc_status.h"
#include "services/migration/wire.h"
#include "services/tls.h"

ABSL_FLAG(std::string, node, "127.0.0.1:7070", "the node to talk to");
ABSL_FLAG(std::string, token_file, "",
          "a file whose first line is the bearer token to present (an identity in the server's "
          "access file); default: $RISKKV_TOKEN_FILE, else none");
ABSL_FLAG(std::string, prompt, "", "start: prompt text");
ABSL_FLAG(std::string, tokens, "",
          "start: token ids as a JSON list instead of a prompt; score: the continuation");
ABSL_FLAG(float, temperature, 0.0f, "start: sampling temperature (0: greedy)");
ABSL_FLAG(int, top_k, 0, "start: top-k (0: all)");
ABSL_FLAG(float, top_p, 1.0f, "start: nucleus mass");
ABSL_FLAG(uint64_t, seed, 0, "start: sampling seed");
ABSL_FLAG(std::string, session, "", "the session id");
ABSL_FLAG(int, n, 32, "generate: tokens to generate");
ABSL_FLAG(bool, follow, true,
          "generate: when the session migrates mid-stream, go on generating on its target");
ABSL_FLAG(bool, ids, false, "generate: print the token ids as a JSON list instead of the text");
ABSL_FLAG(std::string, to, "", "migrate: target node address");
ABSL_FLAG(std::string, mode, "auto", "migrate: reconstruct, full_kv, token_replay or auto");
ABSL_FLAG(std::string, wire_form, "plain",
          "migrate: the form FULL_KV sends the KV in: plain, int8 or int4 (RECONSTRUCT sends its "
          "policy's; with --rebuilt-groups, the form of the rung: plain, int8, int4 or transform)");
ABSL_FLAG(int, rebuilt_groups, -1,
          "migrate: RECONSTRUCT at the rung of the policy's ladder that rebuilds this many groups "
          "of its ranking, in --wire-form (the policy's form when not given); -1: the policy's "
          "own configuration");
ABSL_FLAG(bool, fallback, true, "migrate: fall back to full_kv / token_replay when refused");
ABSL_FLAG(double, timeout, 0, "migrate: deadline in seconds (0: the node's default)");
ABSL_FLAG(bool, live, false,
          "migrate: pre-copy while the session keeps serving (--nolive: stop-and-copy; neither: "
          "the node decides, live for AUTO when the transfer would be long)");
ABSL_FLAG(bool, top, false,
          "score: also print each position's 64 most likely tokens (the reply's `top`), for "
          "--reference on another copy of the session");
ABSL_FLAG(std::string, reference, "",
          "score: a file holding another copy's `score --top` reply (- reads it from standard "
          "input): adds the KL divergence from its distributions and the top-1 agreement");
ABSL_FLAG(std::string, control, "127.0.0.1:7000", "policy-*: the control plane to talk to");
ABSL_FLAG(std::string, policy, "", "policy-put: the policy file (riskkv-calibrate's policy.pb)");
ABSL_FLAG(std::string, bank, "", "policy-put: the bank file it names (omit if already stored)");
ABSL_FLAG(std::string, policy_id, "", "policy-get: the policy id");
ABSL_FLAG(uint64_t, version, 0, "policy-get: the version (0: latest)");
ABSL_FLAG(bool, assign_version, false,
          "policy-put: let the control plane number it (latest + 1) instead of the file's version");

namespace {

int Fail(const std::string& m) {
  std::fprintf(stderr, "riskkvctl: %s\n", m.c_str());
  return 1;
}

int Print(const grpc::Status& s, const google::protobuf::Message& reply) {
  if (!s.ok()) {
    return Fail(std::to_string(static_cast<int>(s.error_code())) + " " + s.error_message());
  }
  std::string json;
  google::protobuf::util::JsonPrintOptions o;
  o.always_print_primitive_fields = true;
  (void)google::protobuf::util::MessageToJsonString(reply, &json, o);
  std::printf("%s\n", json.c_str());
  return 0;
}

grpc::ClientContext* Deadline(grpc::ClientContext* ctx, double seconds) {
  ctx->set_deadline(std::chrono::system_clock::now() + riskkv::Seconds(seconds));
  return ctx;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "riskkvctl [--node HOST:PORT] start|generate|migrate|score|show|list|close [flags]\n"
      "riskkvctl [--control HOST:PORT] policy-put|policy-get|policy-list [flags]\n"
      "riskkvctl [--node HOST:PORT] health | [--control HOST:PORT] control-health: exit 0 when "
      "serving");
  std::vector<std::string> store;
  riskkv::ExitOnHelp(argc, argv);
  std::vector<char*> args = riskkv::NormalizeFlagNames(argc, argv, &store);
  std::vector<char*> rest = absl::ParseCommandLine(static_cast<int>(args.size()), args.data());
  if (rest.size() != 2) {
    return Fail(
        "one command expected: start, generate, migrate, score, show, list, close, policy-put, "
        "policy-get, policy-list, health, control-health");
  }
  const std::string cmd = rest[1];
  auto tls = riskkv::ChannelCredentialsFor(riskkv::TlsFilesFromFlags());
  if (!tls.ok()) return Fail(tls.status().ToString());
  const std::shared_ptr<grpc::ChannelCredentials> credentials = *tls;
  std::string token_path = absl::GetFlag(FLAGS_token_file);
  if (const char* env = std::getenv("RISKKV_TOKEN_FILE"); token_path.empty() && env != nullptr) {
    token_path = env;
  }
  std::shared_ptr<riskkv::TokenFile> token;
  if (!token_path.empty()) {
    auto t = riskkv::TokenFile::Open(token_path, "token-file");
    if (!t.ok()) return Fail(std::string(t.status().message()));
    token = *std::move(t);
  }
  if (cmd == "health" || cmd == "control-health") {
    const std::string address =
        cmd == "health" ? absl::GetFlag(FLAGS_node) : absl::GetFlag(FLAGS_control);
    auto health =
        grpc::health::v1::Health::NewStub(riskkv::OpenChannel(address, credentials, token));
    grpc::ClientContext ctx;
    grpc::health::v1::HealthCheckResponse reply;
    const grpc::Status s = health->Check(Deadline(&ctx, 5), {}, &reply);
    if (!s.ok()) return Fail(address + ": " + s.error_message());
    std::printf("%s %s\n", address.c_str(),
                grpc::health::v1::HealthCheckResponse::ServingStatus_Name(reply.status()).c_str());
    return reply.status() == grpc::health::v1::HealthCheckResponse::SERVING ? 0 : 1;
  }
  if (cmd.rfind("policy-", 0) == 0) {
    auto control = riskkv::v1::Control::NewStub(
        riskkv::OpenChannel(absl::GetFlag(FLAGS_control), credentials, token));
    if (cmd == "policy-put") {
      riskkv::v1::PutPolicyRequest req;
      auto policy = riskkv::ReadFileToString(absl::GetFlag(FLAGS_policy));
      if (!policy.ok()) return Fail("--policy: " + std::string(policy.status().message()));
      if (!req.mutable_policy()->ParseFromString(*policy)) {
        return Fail("--policy: " + absl::GetFlag(FLAGS_policy) + " is not a retention policy");
      }
      if (absl::GetFlag(FLAGS_assign_version)) req.mutable_policy()->set_version(0);
      grpc::ClientContext ctx;
      riskkv::v1::PolicyRecord rec;
      if (absl::GetFlag(FLAGS_bank).empty()) {
        return Print(control->PutPolicy(Deadline(&ctx, 120), req, &rec), rec);
      }
      // The bank goes in pieces of PutPolicyStream's largest (1 MiB), read as they are sent.
      std::ifstream bank(absl::GetFlag(FLAGS_bank), std::ios::binary | std::ios::ate);
      if (!bank) return Fail("--bank: cannot read " + absl::GetFlag(FLAGS_bank));
      const auto bank_bytes = static_cast<uint64_t>(bank.tellg());
      bank.seekg(0);
      auto writer = control->PutPolicyStream(Deadline(&ctx, 300), &rec);
      riskkv::v1::PutPolicyPart part;
      *part.mutable_head()->mutable_policy() = req.policy();
      part.mutable_head()->set_bank_bytes(bank_bytes);
      bool sent = writer->Write(part);
      std::string piece(size_t{1} << 20, '\0');
      while (sent && bank) {
        bank.read(piece.data(), static_cast<std::streamsize>(piece.size()));
        if (bank.gcount() <= 0) break;
        part.set_bank(piece.data(), static_cast<size_t>(bank.gcount()));
        sent = writer->Write(part);
      }
      if (sent) writer->WritesDone();
      return Print(writer->Finish(), rec);
    }
    if (cmd == "policy-get") {
      riskkv::v1::GetPolicyRequest req;
      req.set_policy_id(absl::GetFlag(FLAGS_policy_id));
      req.set_version(absl::GetFlag(FLAGS_version));
      grpc::ClientContext ctx;
      riskkv::v1::PolicyRecord rec;
      return Print(control->GetPolicy(Deadline(&ctx, 60), req, &rec), rec);
    }
    if (cmd == "policy-list") {
      grpc::ClientContext ctx;
      riskkv::v1::ListPoliciesReply reply;
      return Print(control->ListPolicies(Deadline(&ctx, 60), {}, &reply), reply);
    }
  }
  auto stub =
      riskkv::v1::Node::NewStub(riskkv::OpenChannel(absl::GetFlag(FLAGS_node), credentials, token));
  const std::string session = absl::GetFlag(FLAGS_session);
  auto need_session = [&]() { return session.empty() ? Fail("--session is required") : 0; };
  if (cmd == "start") {
    riskkv::v1::StartSessionRequest req;
    req.set_prompt(absl::GetFlag(FLAGS_prompt));
    if (const std::string t = absl::GetFlag(FLAGS_tokens); !t.empty()) {
      auto ids = riskkv::TokenIdsFromJson(t);
      if (!ids.ok()) return Fail(std::string(ids.status().message()));
      for (int32_t id : *ids) req.add_token_ids(id);
    }
    req.mutable_sampling()->set_temperature(absl::GetFlag(FLAGS_temperature));
    req.mutable_sampling()->set_top_k(absl::GetFlag(FLAGS_top_k));
    req.mutable_sampling()->set_top_p(absl::GetFlag(FLAGS_top_p));
    req.mutable_sampling()->set_seed(absl::GetFlag(FLAGS_seed));
    grpc::ClientContext ctx;
    riskkv::v1::SessionInfo info;
    return Print(stub->StartSession(Deadline(&ctx, 600), req, &info), info);
  }
  if (cmd == "generate") {
    if (int rc = need_session()) return rc;
    // Follows the session when a migration moves it mid-stream (docs/services.md).
    std::vector<int32_t> ids;
    const bool print_ids = absl::GetFlag(FLAGS_ids);
    const bool follow = absl::GetFlag(FLAGS_follow);
    const riskkv::FollowResult r = riskkv::GenerateFollowing(
        absl::GetFlag(FLAGS_node), session, absl::GetFlag(FLAGS_n),
        {.credentials = credentials, .token = token, .follow = follow, .deadline_seconds = 600},
        [&](const riskkv::v1::GenerateReply& t, int) {
          ids.push_back(t.token_id());
          if (!print_ids) {
            std::fwrite(t.text().data(), 1, t.text().size(), stdout);
            std::fflush(stdout);
          }
        },
        [&](const riskkv::v1::SessionMoved& m) {
          std::fprintf(
              stderr, "riskkvctl: the session moved to %s as %s%s\n", m.target_address().c_str(),
              m.session_id().c_str(),
              follow && m.remaining_tokens() > 0
                  ? ("; " + std::to_string(m.remaining_tokens()) + " tokens to go there").c_str()
                  : "");
        });
    if (!r.status.ok()) return Fail(r.status.error_message());
    if (print_ids) {
      std::string list = "[";
      for (size_t i = 0; i < ids.size(); ++i) list += (i ? "," : "") + std::to_string(ids[i]);
      std::printf("%s]\n", list.c_str());
    } else {
      std::printf("\n");
    }
    return 0;
  }
  if (cmd == "migrate") {
    if (int rc = need_session()) return rc;
    if (absl::GetFlag(FLAGS_to).empty()) return Fail("--to is required");
    riskkv::v1::MigrateRequest req;
    req.set_session_id(session);
    req.set_target_address(absl::GetFlag(FLAGS_to));
    const std::string mode = absl::GetFlag(FLAGS_mode);
    riskkv::v1::MigrationMode m;
    std::string upper;
    for (char c : mode) upper += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    if (!riskkv::v1::MigrationMode_Parse(upper, &m) ||
        m == riskkv::v1::MIGRATION_MODE_UNSPECIFIED) {
      return Fail("--mode must be reconstruct, full_kv, token_replay or auto, got '" + mode + "'");
    }
    req.set_mode(m);
    auto form = riskkv::ParseWireForm(absl::GetFlag(FLAGS_wire_form));
    if (!form.ok()) return Fail("--wire-form: " + std::string(form.status().message()));
    const int rebuilt = absl::GetFlag(FLAGS_rebuilt_groups);
    if (rebuilt < -1) return Fail("--rebuilt-groups must be -1 or a number of groups");
    if (rebuilt >= 0) {
      req.set_rebuilt_groups(rebuilt);
      if (riskkv::FlagGiven(store, "wire_form")) req.set_wire_form(riskkv::WireFormToProto(*form));
    } else {
      req.set_wire_form(riskkv::WireFormToProto(*form));
    }
    req.set_allow_fallback(absl::GetFlag(FLAGS_fallback));
    req.set_timeout_seconds(absl::GetFlag(FLAGS_timeout));
    if (riskkv::FlagGiven(store, "live")) {
      req.set_live(absl::GetFlag(FLAGS_live));
    }
    grpc::ClientContext ctx;
    riskkv::v1::MigrateReply reply;
    return Print(stub->Migrate(Deadline(&ctx, 3600), req, &reply), reply);
  }
  if (cmd == "score") {
    if (int rc = need_session()) return rc;
    auto ids = riskkv::TokenIdsFromJson(absl::GetFlag(FLAGS_tokens));
    if (!ids.ok()) return Fail("--tokens: " + std::string(ids.status().message()));
    riskkv::v1::ScoreRequest req;
    req.set_session_id(session);
    for (int32_t id : *ids) req.add_token_ids(id);
    req.set_return_top(absl::GetFlag(FLAGS_top));
    if (const std::string path = absl::GetFlag(FLAGS_reference); !path.empty()) {
      absl::StatusOr<std::string> text;
      if (path == "-") {
        text = std::string(std::istreambuf_iterator<char>(std::cin), {});
      } else {
        text = riskkv::ReadFileToString(path);
      }
      if (!text.ok()) return Fail("--reference: " + std::string(text.status().message()));
      riskkv::v1::ScoreReply reference;
      google::protobuf::util::JsonParseOptions lenient;
      lenient.ignore_unknown_fields = true;
      if (!google::protobuf::util::JsonStringToMessage(*text, &reference, lenient).ok() ||
          reference.top_size() == 0) {
        return Fail("--reference: " + path + " is not a `riskkvctl score --top` reply");
      }
      *req.mutable_reference() = reference.top();
    }
    grpc::ClientContext ctx;
    riskkv::v1::ScoreReply reply;
    return Print(stub->Score(Deadline(&ctx, 600), req, &reply), reply);
  }
  if (cmd == "show") {
    if (int rc = need_session()) return rc;
    riskkv::v1::GetSessionRequest req;
    req.set_session_id(session);
    req.set_with_tokens(true);
    grpc::ClientContext ctx;
    riskkv::v1::SessionInfo info;
    return Print(stub->GetSession(Deadline(&ctx, 60), req, &info), info);
  }
  if (cmd == "list") {
    grpc::ClientContext ctx;
    riskkv::v1::ListSessionsReply reply;
    return Print(stub->ListSessions(Deadline(&ctx, 60), {}, &reply), reply);
  }
  if (cmd == "close") {
    if (int rc = need_session()) return rc;
    riskkv::v1::CloseSessionRequest req;
    req.set_session_id(session);
    grpc::ClientContext ctx;
    riskkv::v1::CloseSessionReply reply;
    return Print(stub->CloseSession(Deadline(&ctx, 60), req, &reply), reply);
  }
  return Fail("unknown command '" + cmd +
              "': start, generate, migrate, score, show, list, close, health, policy-put, "
              "policy-get, policy-list or control-health");
}
