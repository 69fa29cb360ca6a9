// A sampled session's state survives the wire: encode on one node, serialize, parse and decode
// on another, and the resumed sampler draws exactly the tokens the source would have drawn.
#include "services/session_codec.h"

#include <gtest/gtest.h>

namespace riskkv {
namespace {

std::vector<float> Logits(int step) {
  std::vector<float> l(50);
  for (int i = 0; i < 50; ++i) l[i] = static_cast<float>((i * 7 + step * 3) % 11) * 0.4f;
  return l;
}

TEST(SessionCodec, ResumedSamplerContinuesTheSameStream) {
  auto source = Sampler::Create({.temperature = 0.9f, .top_k = 20, .top_p = 0.9f, .seed = 77});
  ASSERT_TRUE(source.ok());
  std::vector<int32_t> history = {5, 6, 7};
  for (int step = 0; step < 25; ++step) history.push_back(source->Sample(Logits(step)));

  std::string wire;
  ASSERT_TRUE(EncodeDecodingState(history, *source).SerializeToString(&wire));
  v1::DecodingState parsed;
  ASSERT_TRUE(parsed.ParseFromString(wire));
  auto target = DecodeDecodingState(parsed);
  ASSERT_TRUE(target.ok()) << target.status();
  EXPECT_EQ(target->token_ids, history);
  EXPECT_EQ(target->sampler.params().top_k, 20);
  EXPECT_FLOAT_EQ(target->sampler.params().top_p, 0.9f);
  EXPECT_EQ(target->sampler.params().seed, 77u);
  int same = 0;
  for (int step = 25; step < 125; ++step) {
    const int32_t a = source->Sample(Logits(step));
    const int32_t b = target->sampler.Sample(Logits(step));
    EXPECT_EQ(a, b) << "step " << step;
    same += a == b;
  }
  EXPECT_EQ(same, 100);
}

TEST(SessionCodec, RejectsBadFieldsByName) {
  auto sampler = Sampler::Create({.temperature = 1.0f, .seed = 1});
  ASSERT_TRUE(sampler.ok());
  v1::DecodingState good = EncodeDecodingState(std::vector<int32_t>{1, 2}, *sampler);

  v1::DecodingState bad_rng = good;
  bad_rng.set_rng_state("17 not-a-number");
  auto r1 = DecodeDecodingState(bad_rng);
  ASSERT_FALSE(r1.ok());
  EXPECT_NE(r1.status().message().find("rng_state"), std::string::npos);

  v1::DecodingState bad_params = good;
  bad_params.mutable_sampling()->set_top_k(-3);
  auto r2 = DecodeDecodingState(bad_params);
  ASSERT_FALSE(r2.ok());
  EXPECT_NE(r2.status().message().find("sampling"), std::string::npos);

  v1::DecodingState bad_ids = good;
  bad_ids.add_token_ids(-1);
  auto r3 = DecodeDecodingState(bad_ids);
  ASSERT_FALSE(r3.ok());
  EXPECT_NE(r3.status().message().find("token_ids[2]"), std::string::npos);
}

TEST(SessionCodec, GreedyStateWithoutRngRoundTrips) {
  auto sampler = Sampler::Create({});
  ASSERT_TRUE(sampler.ok());
  v1::DecodingState proto = EncodeDecodingState(std::vector<int32_t>{}, *sampler);
  proto.clear_rng_state();
  auto back = DecodeDecodingState(proto);
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(back->token_ids.empty());
  EXPECT_EQ(back->sampler.Sample(Logits(0)), Argmax(Logits(0)));
}

}  // namespace
}  // namespace riskkv
