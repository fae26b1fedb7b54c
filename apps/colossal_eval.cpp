// colossal_eval: validation loss of a saved model.
#include <cstdio>

#include "apps/cli.hpp"
#include "apps/trainer.hpp"

using namespace colossal;

int main(int argc, char** argv) {
  apps::ProgramInfo info{
      "colossal_eval",
      "usage: colossal_eval CONFIG [--weights MODEL.h5] [--set KEY=VALUE ...]\n\n"
      "Prints the mean cross-entropy of MODEL.h5 over the windows of data.val_path (capped by\n"
      "data.val_windows) as \"val loss X (X to 9 digits)\". The config must describe the\n"
      "same model. Without --weights, the config's model.init_from (a Hugging Face directory,\n"
      "safetensors, model.h5 or checkpoint) is evaluated.\n",
      {"--weights"},
      {}};
  return apps::run_program(argc, argv, info, [](apps::Invocation& inv) {
    const std::string weights = inv.flag("--weights");
    if (weights.empty() && inv.config.model_init_from.empty())
      throw apps::UsageError("missing --weights MODEL.h5 (or model.init_from); see --help");
    // The parameters and a forward's activations only (no gradients or AdamW state), checked
    // against the node's memory before anything is allocated.
    const auto held = apps::inference_trainer(inv.config, inv.world, weights);
    apps::Trainer& trainer = *held;
    const double loss = trainer.evaluate();
    if (inv.rank == 0) std::printf("val loss %.6g (%.9g)\n", loss, loss);
    return 0;
  });
}
