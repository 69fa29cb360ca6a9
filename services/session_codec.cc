// riskkv.v1.DecodingState <-> engine types.
#include "services/session_codec.h"

#include <string>

namespace riskkv {

v1::DecodingState EncodeDecodingState(std::span<const int32_t> token_ids, const Sampler& sampler) {
  v1::DecodingState proto;
  proto.mutable_token_ids()->Add(token_ids.begin(), token_ids.end());
  const SamplingParams& p = sampler.params();
  v1::SamplingParams* sp = proto.mutable_sampling();
  sp->set_temperature(p.temperature);
  sp->set_top_k(p.top_k);
  sp->set_top_p(p.top_p);
  sp->set_seed(p.seed);
  proto.set_rng_state(sampler.SaveState());
  return proto;
}

absl::StatusOr<Sampler> DecodeSampling(const v1::SamplingParams& proto) {
  SamplingParams params;
  params.temperature = proto.temperature();
  params.top_k = proto.top_k();
  // proto3 cannot tell an absent top_p from 0; 0 is invalid anyway, so absent means "keep all".
  params.top_p = proto.top_p() == 0.0f ? 1.0f : proto.top_p();
  params.seed = proto.seed();
  auto sampler = Sampler::Create(params);
  if (!sampler.ok()) {
    return absl::InvalidArgumentError("sampling: " + std::string(sampler.status().message()));
  }
  return sampler;
}

absl::StatusOr<DecodingState> DecodeDecodingState(const v1::DecodingState& proto) {
  auto sampler = DecodeSampling(proto.sampling());
  if (!sampler.ok()) {
    return absl::InvalidArgumentError("DecodingState." + std::string(sampler.status().message()));
  }
  if (!proto.rng_state().empty()) {
    if (auto s = sampler->RestoreState(proto.rng_state()); !s.ok()) {
      return absl::InvalidArgumentError("DecodingState.rng_state: " + std::string(s.message()));
    }
  }
  std::vector<int32_t> ids(proto.token_ids().begin(), proto.token_ids().end());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0) {
      return absl::InvalidArgumentError("DecodingState.token_ids[" + std::to_string(i) +
                                        "] is negative");
    }
  }
  return DecodingState{std::move(ids), *std::move(sampler)};
}

}  // namespace riskkv
