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
  zero::ShardedAdamW* optimizer = nullptr;  // stage 3: its shard is written
  core::StageModel* model = nullptr;
};

// Sets every chunk's parameters from config.model_init_from (nothing when it is empty) and
// returns the lines to print. Collective over `world`; a bad file is a CollectiveError on every
// rank alike, naming the tensor, the shapes and the config key to change.
std::string init_from_weights(const io::Config& config, parallel::Communicator& world,
                              const std::vector<WeightsChunk>& chunks);

// The reading half of it, for a file already checked (model.init_from's, or a model file
// colossal_eval's --weights names): every rank reads the elements its chunks' layouts hold
// (io::read_weights), straight into a store that keeps its whole flat buffer in host memory,
// else through one host buffer per chunk (ZeRO-3: of its shard's size). A read (or a staging
// buffer) that fails on some rank throws DataFileError(prefix + the lowest failing rank's
// message) on every rank. Collective.
void read_chunk_weights(const std::string& path, const core::ModelSpec& spec,
                        parallel::Communicator& world, const std::vector<WeightsChunk>& chunks,
                        const std::string& prefix);

}  // namespace colossal::apps
