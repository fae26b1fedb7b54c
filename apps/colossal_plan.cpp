// colossal_plan: the symbolic cost of the layout a config describes, without running it.
#include <chrono>
#include <cstdio>

#include "apps/cli.hpp"
#include "apps/trainer.hpp"
#include "planner/step_graph.hpp"

using namespace colossal;

int main(int argc, char** argv) {
  apps::ProgramInfo info{
      "colossal_plan",
      "usage: colossal_plan CONFIG --profile [--stage S] [--set KEY=VALUE ...]\n\n"
      "Builds the symbolic graph of one micro-batch of the config's model and layout as seen by\n"
      "one rank (tensor rank 0, pipeline stage S, default 0) and prints every op of forward and\n"
      "backward: FLOPs, bytes moved, activation bytes kept for backward and the collectives its\n"
      "sharding implies, with totals. Nothing is allocated; no kernel runs. For the memory every\n"
      "rank allocates, run colossal_train CONFIG --memory-plan with the config's ranks.\n\n"
      "Program options:\n"
      "  --profile              print the per-op table (the only mode so far)\n"
      "  --stage S              the pipeline stage to describe (0 .. parallel.pipeline.size-1)\n",
      {"--stage"},
      {"--profile"},
      /*print_threads=*/false,
      /*any_world_size=*/true};
  return apps::run_program(argc, argv, info, [](apps::Invocation& inv) {
    if (!inv.has("--profile")) throw apps::UsageError("nothing to do: give --profile; see --help");
    const io::Config& c = inv.config;
    const auto& p = c.parallel;
    const int stages = p.pipeline * p.pipeline_chunks;
    const std::string stage_text = inv.flag("--stage", "0");
    char* end = nullptr;
    const long stage = std::strtol(stage_text.c_str(), &end, 10);
    if (end == stage_text.c_str() || *end != '\0' || stage < 0 || stage >= stages) {
      throw apps::UsageError("--stage: '" + stage_text + "' must be an integer in [0, " +
                             std::to_string(stages - 1) + "]");
    }
    const auto start = std::chrono::steady_clock::now();
    const std::vector<int> layers = apps::pipeline_layers(c);
    core::StageRange range{0, 0, stage == 0, stage == stages - 1};
    for (int s = 0; s < stage; ++s) range.layer_begin += layers[s];
    range.layer_end = range.layer_begin + layers[stage];
    const planner::Layout layout{c.train.micro_batch, c.train.seq_len, p.tensor, p.sequence_split,
                                 p.sequence, range};
    const planner::StepGraph graph = planner::build_step_graph(c.model, layout);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    if (inv.rank == 0) {
      std::printf("symbolic step of stage %ld (blocks %d..%d), micro-batch %d x %d tokens, tensor "
                  "%d%s, sequence %d: %zu ops in %.2f ms\n\n%s",
                  stage, range.layer_begin, range.layer_end - 1, c.train.micro_batch,
                  c.train.seq_len, p.tensor, p.sequence_split ? " (sequence_split)" : "",
                  p.sequence, graph.ops.size(), ms, planner::format_step_graph(graph).c_str());
    }
    return 0;
  });
}
