// model.init_from for any trainer (io/init_from.hpp, docs/init-from.md): rank 0 checks the file
// against the model; then every rank reads only the elements its layout holds (ZeRO-3: only its
// parameter slices) and sets them in its chunks' stores.
#pragma once

#include <string>
#include <vector>

#include "core/stage_model.hpp"
#include "io/config.hpp"
#include "parallel/communicator.hpp"
#include "zero/sharded_optimizer.hpp"

namespace colossal::apps {

struct WeightsChunk {
  const zero::ShardedAdamW* optimizer = nullptr;
  core::StageModel* model = nullptr;
};

// Sets every chunk's parameters from config.model_init_from (nothing when it is empty) and
// returns the lines to print. Collective over `world`; a bad file is a CollectiveError on every
// rank alike, naming the tensor, the shapes and the config key to change.
std::string init_from_weights(const io::Config& config, parallel::Communicator& world,
                              const std::vector<WeightsChunk>& chunks);

}  // namespace colossal::apps
