// checkpointing.policy as a value: how a stage chooses which activations its first forward keeps.
// Parsed once from the config (io/config.cpp); the solvers (checkpoint_sched/) and the planner
// compare the enum. The names are the config's words, so plans, YAML and error texts read them
// back unchanged. It lives in core beside the keep types (core/keep.hpp) it chooses between.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace colossal::core {

// none: keep everything; full: keep only block inputs; every_k: the input of every k-th block;
// sqrt: every_k with k = ceil(sqrt(layers)); rotor: the fastest schedule under a memory budget;
// selective: recompute only the attention probabilities; manual: recompute the listed blocks.
enum class CheckpointPolicy : uint8_t { none, full, every_k, sqrt, rotor, selective, manual };

// "none", "full", "every_k", "sqrt", "rotor", "selective", "manual".
inline const char* checkpoint_policy_name(CheckpointPolicy policy) {
  switch (policy) {
    case CheckpointPolicy::none: return "none";
    case CheckpointPolicy::full: return "full";
    case CheckpointPolicy::every_k: return "every_k";
    case CheckpointPolicy::sqrt: return "sqrt";
    case CheckpointPolicy::rotor: return "rotor";
    case CheckpointPolicy::selective: return "selective";
    case CheckpointPolicy::manual: return "manual";
  }
  return "?";
}

// The policy a name stands for; nullopt for any other text.
inline std::optional<CheckpointPolicy> parse_checkpoint_policy(std::string_view name) {
  using P = CheckpointPolicy;
  for (P p : {P::none, P::full, P::every_k, P::sqrt, P::rotor, P::selective, P::manual}) {
    if (name == checkpoint_policy_name(p)) return p;
  }
  return std::nullopt;
}

}  // namespace colossal::core
