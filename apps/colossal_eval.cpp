// colossal_eval: validation loss of a saved model.
#include <cstdio>

#include "apps/cli.hpp"
#include "apps/trainer.hpp"

using namespace colossal;

int main(int argc, char** argv) {
  apps::ProgramInfo info{
      "colossal_eval",
      "usage: colossal_eval CONFIG --weights MODEL.h5 [--set KEY=VALUE ...]\n\n"
      "Prints the mean cross-entropy of MODEL.h5 over the windows of data.val_path (capped by\n"
      "data.val_windows) as \"val loss X\". The config must describe the same model.\n",
      {"--weights"},
      {}};
  return apps::run_program(argc, argv, info, [](apps::Invocation& inv) {
    const std::string weights = inv.flag("--weights");
    if (weights.empty()) throw apps::UsageError("missing --weights MODEL.h5; see --help");
    apps::Trainer trainer(inv.config, nullptr, inv.world);
    trainer.load_weights(weights);
    const double loss = trainer.evaluate();
    if (inv.rank == 0) std::printf("val loss %.6g\n", loss);
    return 0;
  });
}
