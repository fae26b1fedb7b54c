#include "apps/init_weights.hpp"

#include <exception>

#include "apps/errors.hpp"
#include "apps/on_root.hpp"
#include "apps/trainer.hpp"
#include "core/parameter_store.hpp"
#include "io/init_from.hpp"

namespace colossal::apps {

std::string init_from_weights(const io::Config& config, parallel::Communicator& world,
                              const std::vector<WeightsChunk>& chunks) {
  const std::string& path = config.model_init_from;
  if (path.empty()) return {};
  const auto logical = core::parameter_table(config.model);
  const std::string notes = on_root<DataFileError>(world, "model.init_from: ", [&](auto&) {
    return io::check_weights(path, config.model, logical);
  });

  read_chunk_weights(path, config.model, world, chunks, "model.init_from: ");
  return notes;
}

void read_chunk_weights(const std::string& path, const core::ModelSpec& spec,
                        parallel::Communicator& world, const std::vector<WeightsChunk>& chunks,
                        const std::string& prefix) {
  const auto logical = core::parameter_table(spec);
  // Each chunk's flat buffer, filled where its layout holds logical elements (padding stays 0):
  // the store's own where it is whole in host memory (its padding is zero since it was made:
  // a trainer's stores start at zero, and init_parameters zeroes padding), else a host copy;
  // under ZeRO-3 a copy of this rank's shard alone, in state order.
  std::vector<std::vector<float>> host(chunks.size());
  std::string error;
  try {
    std::vector<io::TensorRun> runs;
    for (std::size_t c = 0; c < chunks.size(); ++c) {
      core::StageModel& model = *chunks[c].model;
      core::ParameterStore& store = model.store();
      std::vector<io::FlatRange> at;
      if (chunks[c].optimizer->stage() == 3) {
        host[c].assign(chunks[c].optimizer->shard_size(), 0.0f);
        for (const auto& r : chunks[c].optimizer->state_ranges())
          at.push_back({r.begin, r.length, host[c].data() + r.at});
      } else {
        float* flat = core::host_writable_params(store);
        if (flat == nullptr) {
          host[c].assign(model.flat_size(), 0.0f);
          flat = host[c].data();
        }
        at.push_back({0, model.flat_size(), flat});
      }
      const auto mine = io::tensor_runs(model.logical_runs(), at, false);
      runs.insert(runs.end(), mine.begin(), mine.end());
    }
    io::read_weights(path, spec, logical, runs);
  } catch (const std::exception& e) {
    error = e.what();
  }
  // A read that fails on some rank fails every rank, with the lowest failing rank's message.
  std::vector<float> failed(std::size_t(world.size()), 0.0f);
  failed[std::size_t(world.rank())] = error.empty() ? 0.0f : 1.0f;
  world.all_reduce_sum(failed);
  for (int r = 0; r < world.size(); ++r) {
    if (failed[std::size_t(r)] == 0.0f) continue;
    world.broadcast_string(error, r);
    throw DataFileError(prefix + error);
  }
  for (std::size_t c = 0; c < chunks.size(); ++c) {
    if (host[c].empty()) continue;  // read in place
    if (chunks[c].optimizer->stage() == 3) {
      chunks[c].optimizer->set_owned_parameters(host[c].data());
    } else {
      set_store_parameters(chunks[c].model->store(), host[c]);
    }
  }
}

}  // namespace colossal::apps
