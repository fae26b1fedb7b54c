// colossal_generate: continue a prompt with a saved model.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "apps/cli.hpp"
#include "apps/trainer.hpp"

using namespace colossal;

int main(int argc, char** argv) {
  apps::ProgramInfo info{
      "colossal_generate",
      "usage: colossal_generate CONFIG [--weights MODEL.h5] [--prompt TEXT] [--tokens N]\n"
      "                         [--temperature T] [--top-k K] [--top-p P]\n"
      "                         [--stop-token ID[,ID...]] [--samples S] [--seed SEED]\n"
      "                         [--no-cache]\n\n"
      "Samples N tokens (default 200) after TEXT from MODEL.h5 and prints the prompt and them.\n"
      "Each token is drawn from softmax(logits / T) (T = 0: the likeliest), cut to the K\n"
      "likeliest tokens (0: all), then to the fewest likeliest whose probabilities reach P\n"
      "(nucleus sampling; 1: all), renormalised. A drawn --stop-token ends the text (it is\n"
      "printed; --stop-token '' sets none). The defaults are the config's sample.temperature,\n"
      "sample.top_k, sample.top_p and sample.stop_tokens (0.8, 0, 1 and none unless the config\n"
      "sets them: configs/quickstart.yaml has temperature 0.7). --samples S\n"
      "prints S texts drawn independently from the same prompt and seed (default 1), separated\n"
      "by a line of dashes.\nOver the config's data: a text file's tokens\n"
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
      {"--weights", "--prompt", "--tokens", "--temperature", "--top-k", "--top-p", "--stop-token",
       "--samples", "--seed"},
      {"--no-cache"}};
  return apps::run_program(argc, argv, info, [](apps::Invocation& inv) {
    const std::string weights = inv.flag("--weights");
    if (weights.empty() && inv.config.model_init_from.empty())
      throw apps::UsageError("missing --weights MODEL.h5 (or model.init_from); see --help");
    auto number = [&](const char* name, const std::string& fallback) {
      const std::string text = inv.flag(name, fallback);
      char* end = nullptr;
      const double v = std::strtod(text.c_str(), &end);
      if (end == text.c_str() || *end != '\0' || !(v >= 0)) {
        throw apps::UsageError(std::string(name) + ": '" + text +
                               "' is not a non-negative number");
      }
      return v;
    };
    auto whole = [&](const char* name, const std::string& fallback) {
      const double v = number(name, fallback);
      if (v != std::floor(v) || v > 2e9) {
        throw apps::UsageError(std::string(name) + ": '" + inv.flag(name, fallback) +
                               "' is not a whole number from 0 to 2000000000");
      }
      return static_cast<int>(v);
    };
    auto shortest = [](double v) {
      char text[32];
      std::snprintf(text, sizeof text, "%.17g", v);
      return std::string(text);
    };
    const io::SampleConfig& defaults = inv.config.sample;
    const int tokens = whole("--tokens", "200");
    const int samples = whole("--samples", "1");
    if (samples < 1) throw apps::UsageError("--samples: '0' is not a count of texts (>= 1)");
    apps::Sampling how = apps::sampling_of(defaults, static_cast<uint64_t>(number("--seed", "1")));
    how.temperature = number("--temperature", shortest(defaults.temperature));
    how.top_k = whole("--top-k", std::to_string(defaults.top_k));
    how.top_p = number("--top-p", shortest(defaults.top_p));
    if (!(how.top_p > 0.0 && how.top_p <= 1.0)) {
      throw apps::UsageError("--top-p: '" + inv.flag("--top-p") +
                             "' is outside (0, 1] (1 keeps every token)");
    }
    if (inv.has("--stop-token")) {
      // Ids separated by commas (or spaces): "50256" or "10,46"; '' clears the config's.
      how.stop_tokens.clear();
      how.stop_key = "--stop-token";
      std::string list = inv.flag("--stop-token");
      std::replace(list.begin(), list.end(), ',', ' ');
      std::istringstream in(list);
      std::string id;
      while (in >> id) {
        char* end = nullptr;
        const long v = std::strtol(id.c_str(), &end, 10);
        if (*end != '\0' || v < 0 || v > 2000000000L) {
          throw apps::UsageError("--stop-token: '" + id +
                                 "' is not a token id (ids separated by commas, e.g. 50256,198)");
        }
        how.stop_tokens.push_back(int(v));
      }
    }
    // The parameters and a forward's activations only (no gradients or AdamW state), checked
    // against the node's memory before anything is allocated.
    const bool cache = !inv.has("--no-cache");
    const auto held =
        apps::inference_trainer(apps::sampling_config(inv.config), inv.world, weights,
                                {.decode = cache, .samples = true});
    apps::Trainer& trainer = *held;
    const std::string prompt = inv.flag("--prompt", "");
    // Progress on stderr (stdout holds the text alone) every 10 s, and a summary at the end.
    const auto start = apps::Clock::now();
    const int total = tokens * samples;
    int before = 0;  // tokens of the earlier samples
    double said = 0.0;
    const auto progress = [&](int done) {
      const double s = apps::seconds_since(start);
      done += before;
      if (inv.rank != 0 || s - said < 10.0 || done == total) return;
      said = s;
      std::fprintf(stderr, "generated %d/%d tokens, %.2f tokens/s, ETA %.0f s\n", done, total,
                   done / s, (total - done) * s / done);
    };
    for (int n = 0; n < samples; ++n) {
      how.stream = n;
      const std::string text = trainer.generate(prompt, tokens, how, "--prompt", progress);
      before += trainer.generated();
      if (inv.rank == 0) {
        // fwrite, not printf("%s"): a generated 0 byte must not cut the text short.
        std::string out = (n > 0 ? "---------------\n" : "") + prompt + text;
        // A text ended by a newline (--stop-token 10) gets no second one.
        if (out.empty() || out.back() != '\n') out += '\n';
        std::fwrite(out.data(), 1, out.size(), stdout);
        std::fflush(stdout);
      }
    }
    const double seconds = apps::seconds_since(start);
    if (inv.rank == 0 && tokens > 0) {
      // The texts first, then the summary line on stderr.
      std::fprintf(stderr, "colossal_generate: %d token%s%s in %.1f s (%.2f tokens/s; %s)\n",
                   before, before == 1 ? "" : "s",
                   samples > 1 ? (" (" + std::to_string(samples) + " samples)").c_str() : "",
                   seconds, before / std::max(seconds, 1e-9),
                   cache ? "KV cache over the train.seq_len window"
                         : "--no-cache: each a forward over the train.seq_len window");
      if (before < total) {
        std::fprintf(stderr, "colossal_generate: a stop token (--stop-token) ended %s\n",
                     samples > 1 ? "some samples early" : "the text early");
      }
    }
    return 0;
  });
}
