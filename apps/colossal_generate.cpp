// colossal_generate: continue a prompt with a saved model.
#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "apps/cli.hpp"
#include "apps/trainer.hpp"

using namespace colossal;

int main(int argc, char** argv) {
  apps::ProgramInfo info{
      "colossal_generate",
      "usage: colossal_generate CONFIG [--weights MODEL.h5] [--prompt TEXT] [--tokens N]\n"
      "                         [--temperature T] [--seed S] [--no-cache]\n\n"
      "Samples N tokens (default 200) after TEXT from MODEL.h5 at temperature T (default 0.8;\n"
      "0 = greedy) and prints the prompt and them. Over the config's data: a text file's tokens\n"
      "are bytes, so TEXT is text and so is the output (no --prompt: a newline); a token file's\n"
      "(llm.c .bin) are a tokenizer's ids, so TEXT is ids separated by spaces (e.g. '50256 464';\n"
      "scripts/tokenize.py --encode prints them) and so is the output.\n"
      "Without --weights, the config's model.init_from is used. The model reads the last\n"
      "train.seq_len tokens of the context (a note on stderr says when it is longer); raise\n"
      "train.seq_len, up to model.max_seq, for a longer window. Progress (every 10 s) and a\n"
      "summary line (tokens/s) go to stderr: stdout holds the text alone. Evaluating and\n"
      "sampling hold the parameters only (no gradients or optimizer state).\n"
      "Each block keeps the keys and values of the window (a KV cache, in the memory plan), so\n"
      "a token costs one new position, not a forward over the whole window, until the window\n"
      "is full; past it the window moves by a token and is decoded again whole. --no-cache\n"
      "runs the whole window for every token instead: slower, without the cache's memory, the\n"
      "same logits up to rounding (so the same greedy tokens but at near-ties; bf16 runs differ\n"
      "more: the cache keeps q/k/v in fp32 where the forward rounds them to bf16).\n",
      {"--weights", "--prompt", "--tokens", "--temperature", "--seed"},
      {"--no-cache"}};
  return apps::run_program(argc, argv, info, [](apps::Invocation& inv) {
    const std::string weights = inv.flag("--weights");
    if (weights.empty() && inv.config.model_init_from.empty())
      throw apps::UsageError("missing --weights MODEL.h5 (or model.init_from); see --help");
    auto number = [&](const char* name, const char* fallback) {
      const std::string text = inv.flag(name, fallback);
      char* end = nullptr;
      const double v = std::strtod(text.c_str(), &end);
      if (end == text.c_str() || *end != '\0' || v < 0) {
        throw apps::UsageError(std::string(name) + ": '" + text +
                               "' is not a non-negative number");
      }
      return v;
    };
    const int tokens = static_cast<int>(number("--tokens", "200"));
    const double temperature = number("--temperature", "0.8");
    const auto seed = static_cast<uint64_t>(number("--seed", "1"));
    // The parameters and a forward's activations only (no gradients or AdamW state), checked
    // against the node's memory before anything is allocated.
    const bool cache = !inv.has("--no-cache");
    const auto held =
        apps::inference_trainer(apps::sampling_config(inv.config), inv.world, weights, cache);
    apps::Trainer& trainer = *held;
    const std::string prompt = inv.flag("--prompt", "");
    // Progress on stderr (stdout holds the text alone) every 10 s, and a summary at the end.
    const auto start = apps::Clock::now();
    double said = 0.0;
    const auto progress = [&](int done) {
      const double s = apps::seconds_since(start);
      if (inv.rank != 0 || s - said < 10.0 || done == tokens) return;
      said = s;
      std::fprintf(stderr, "generated %d/%d tokens, %.2f tokens/s, ETA %.0f s\n", done, tokens,
                   done / s, (tokens - done) * s / done);
    };
    const std::string text =
        trainer.generate(prompt, tokens, temperature, seed, "--prompt", progress);
    const double seconds = apps::seconds_since(start);
    if (inv.rank == 0) {
      // fwrite, not printf("%s"): a generated 0 byte must not cut the text short.
      const std::string out = prompt + text + "\n";
      std::fwrite(out.data(), 1, out.size(), stdout);
      std::fflush(stdout);  // the text first, then the summary line on stderr
      if (tokens > 0) {
        std::fprintf(stderr, "colossal_generate: %d tokens in %.1f s (%.2f tokens/s; %s)\n",
                     tokens, seconds, tokens / std::max(seconds, 1e-9),
                     cache ? "KV cache over the train.seq_len window"
                           : "--no-cache: each a forward over the train.seq_len window");
      }
    }
    return 0;
  });
}
