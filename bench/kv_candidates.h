// Candidate quantizers of a layer's keys or values, beyond the wire forms themselves, for
// riskkv-kv-wire-bench to compare by NRMSE, bytes and ΔNLL before one becomes a wire form: the
// grouping (keys per channel over token groups; values per token and head, or per channel), a
// Walsh-Hadamard rotation of each token's head before it is quantized, and rows kept exact at the
// start of the history (attention sinks) and at its end (the most recent tokens).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/kvcodec/group_quant.h"
#include "kernels/backend.h"

namespace riskkv::bench {

struct Candidate {
  std::string name;
  int bits = 4;
  int value_bits = 0;               // the values' bits when not 0 (else `bits` for both)
  bool with_min = true;             // scale + min (group_quant.h), or symmetric
  DType param_dtype = DType::kF16;  // of the scales and mins
  bool fit_range = false;           // least-squares ranges (QuantScheme::fit_range)
  // Keys: per channel over groups of `group` tokens. Values: per token and run of `group` values
  // of a head (group divides head_dim), or, with per_channel, like keys.
  int64_t key_group = 32;
  int64_t value_group = 64;
  bool value_per_channel = false;
  bool rotate_values = false;  // values: each token's head through a normalised Hadamard first
  bool rotate_keys = false;    // keys: the same per token before the per-channel groups
  int64_t sink = 0;            // the first `sink` rows stay exact (f16)
  int64_t recent = 0;          // the last `recent` rows stay exact (f16)
  // Keys: returned to pre-RoPE coordinates (inverse RoPE at each row's position) before they are
  // grouped, and rotated back after decoding, as a target would (KVQuant's pre-RoPE keys: RoPE
  // turns a channel's values with position, which widens its groups' ranges).
  bool pre_rope_keys = false;
};

// The candidates the bench measures.
std::vector<Candidate> Candidates();

// The model's RoPE, for candidates with pre_rope_keys: rows [0, n) sit at positions [0, n).
struct KeyRope {
  Backend* backend = nullptr;
  RopeParams params;
};

// rows ([n, heads * dim] f32) := what `c` decodes them to. dim must be a power of two when a
// rotation is asked for; rope must be given for a candidate with pre_rope_keys.
void Apply(const Candidate& c, bool values, float* rows, int64_t n, int64_t heads, int64_t dim,
           const KeyRope* rope = nullptr);

// Bytes `c` sends for n rows of keys or values (f16 for exact rows).
double Bytes(const Candidate& c, bool values, int64_t n, int64_t heads, int64_t dim);

}  // namespace riskkv::bench
