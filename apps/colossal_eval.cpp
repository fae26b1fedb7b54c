// colossal_eval: validation loss of a saved model, and multiple-choice accuracy (HellaSwag).
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "apps/cli.hpp"
#include "apps/on_root.hpp"
#include "apps/trainer.hpp"

using namespace colossal;

namespace {

// One row per completion, written whole then renamed into place (never a partial file).
void write_choice_rows(const std::string& path, const std::vector<io::ChoiceExample>& examples,
                       const apps::ChoiceScores& s) {
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "w");
  if (f == nullptr) {
    throw std::runtime_error("cannot write '" + tmp + "'; give a path in a writable directory");
  }
  std::fprintf(f, "example,index,label,completion,tokens,loss,loss_per_token,chosen_per_token,"
                  "chosen_total\n");
  for (int64_t e = 0; e < s.examples(); ++e) {
    const int by_token = s.best(e, apps::ChoiceMeasure::per_token);
    const int by_total = s.best(e, apps::ChoiceMeasure::total);
    for (std::size_t c = s.first[e]; c < s.first[e + 1]; ++c) {
      const int k = int(c - s.first[e]);
      std::fprintf(f, "%lld,%d,%d,%d,%d,%.9g,%.9g,%d,%d\n", (long long)e,
                   examples[std::size_t(e)].index, s.labels[std::size_t(e)], k, s.tokens[c],
                   s.loss[c], s.loss[c] / s.tokens[c], k == by_token, k == by_total);
    }
  }
  const bool ok = std::fflush(f) == 0 && std::ferror(f) == 0;
  if (std::fclose(f) != 0 || !ok) {
    std::filesystem::remove(tmp);
    throw std::runtime_error("writing '" + tmp + "' failed (a full disk?)");
  }
  std::filesystem::rename(tmp, path);
}

}  // namespace

int main(int argc, char** argv) {
  apps::ProgramInfo info{
      "colossal_eval",
      "usage: colossal_eval CONFIG [--weights MODEL.h5] [--choices FILE [--choices-out CSV]]\n"
      "                    [--set KEY=VALUE ...]\n\n"
      "Prints the mean cross-entropy of MODEL.h5 over the windows of data.val_path (capped by\n"
      "data.val_windows) as \"val loss X (X to 9 digits)\". The config must describe the\n"
      "same model. Without --weights, the config's model.init_from (a Hugging Face directory,\n"
      "safetensors, model.h5 or checkpoint) is evaluated.\n\n"
      "--choices FILE scores a multiple-choice file in llm.c's format (HellaSwag: made by\n"
      "scripts/make_choices.py from hellaswag_val.jsonl, or llm.c's dev/data/hellaswag.py): each\n"
      "completion's cross-entropy after its context, train.micro_batch completions per\n"
      "forward, spread over the data-parallel ranks. It prints \"choices accuracy A (R/N) per\n"
      "token, B (R/N) total\": an example is right when its labelled completion has the least\n"
      "loss per token (llm.c's HellaSwag measure) or the least total loss (lm-evaluation-\n"
      "harness's acc). The validation loss is printed too when data.val_path is set.\n"
      "Without --choices, the config's eval.choices (its first eval.choices_examples) is\n"
      "scored, if set.\n"
      "--choices-out CSV writes one row per completion (its loss, loss per token, and which\n"
      "completion each measure chose). The rows are scored in the shortest window that holds\n"
      "the longest of them (rounded up; train.seq_len when none shorter fits the layout):\n"
      "the same losses up to rounding, faster when the rows are shorter than train.seq_len.\n",
      {"--weights", "--choices", "--choices-out"},
      {}};
  return apps::run_program(argc, argv, info, [](apps::Invocation& inv) {
    const std::string weights = inv.flag("--weights");
    std::string choices = inv.flag("--choices");
    const std::string choices_out = inv.flag("--choices-out");
    if (weights.empty() && inv.config.model_init_from.empty())
      throw apps::UsageError("missing --weights MODEL.h5 (or model.init_from); see --help");
    if (!choices_out.empty() && choices.empty() && inv.config.eval.choices.empty())
      throw apps::UsageError("--choices-out needs --choices FILE (or eval.choices); see --help");
    // --choices, or else the config's eval.choices (its first eval.choices_examples): read on
    // rank 0, checked on every rank alike (the same bytes), so a bad file stops every rank
    // before the model is built.
    const std::string key = choices.empty() ? "eval.choices" : "--choices";
    if (choices.empty()) choices = inv.config.eval.choices;
    const int64_t first_n = key == "eval.choices" ? inv.config.eval.choices_examples : 0;
    const std::vector<io::ChoiceExample> examples =
        choices.empty() ? std::vector<io::ChoiceExample>{}
                        : apps::load_choices(*inv.world, choices, key, inv.config, first_n);
    // The parameters and a forward's activations only (no gradients or AdamW state), checked
    // against the node's memory before anything is allocated.
    std::unique_ptr<apps::Trainer> trainer;
    // Scored in the shortest window that holds every row (the same losses up to rounding):
    // another trainer when it is shorter than train.seq_len, made after the first is freed.
    const io::Config scoring = choices.empty() ? inv.config
                                               : apps::choice_window_config(inv.config, examples);
    const bool same_window = scoring.train.seq_len == inv.config.train.seq_len;
    if (choices.empty() || !inv.config.data.val_path.empty()) {
      // (It scores the choices too when their window is train.seq_len: priced so.)
      trainer = apps::inference_trainer(inv.config, inv.world, weights,
                                        {.scores = !choices.empty() && same_window});
      const double loss = trainer->evaluate();
      if (inv.rank == 0) std::printf("val loss %.6g (%.9g)\n", loss, loss);
    }
    if (choices.empty()) return 0;
    if (trainer == nullptr || !same_window) {
      trainer.reset();
      trainer = apps::inference_trainer(scoring, inv.world, weights, {.scores = true});
    }
    if (inv.rank == 0 && scoring.train.seq_len != inv.config.train.seq_len) {
      std::printf("choices: scored in a window of %d positions, enough for every row "
                  "(train.seq_len %d)\n",
                  scoring.train.seq_len, inv.config.train.seq_len);
    }

    using Clock = std::chrono::steady_clock;
    const auto start = Clock::now();
    auto last = start;
    const auto progress = [&](int64_t done, int64_t of) {
      const auto now = Clock::now();
      if (now - last < std::chrono::seconds(10) || done == of) return;
      last = now;
      const double s = std::chrono::duration<double>(now - start).count();
      std::fprintf(stderr, "scored %lld/%lld completions (rank 0's share), %.1f/s, ETA %.0f s\n",
                   (long long)done, (long long)of, double(done) / s,
                   double(of - done) * s / double(done));
    };
    const apps::ChoiceScores s = trainer->score_choices(examples, progress);
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    if (!choices_out.empty()) {
      apps::on_root<apps::DataFileError>(*inv.world, "--choices-out: ", [&](auto&) {
        write_choice_rows(choices_out, examples, s);
        return std::string();
      });
    }
    if (inv.rank == 0) {
      std::printf("choices %s: %lld examples, %zu completions, %.2f s\n", choices.c_str(),
                  (long long)s.examples(), s.loss.size(), seconds);
      if (s.cut > 0) {
        std::printf("note: %lld context%s kept only %s last tokens to fit train.seq_len = %d\n",
                    (long long)s.cut, s.cut == 1 ? "" : "s", s.cut == 1 ? "its" : "their",
                    inv.config.train.seq_len);
      }
      std::printf("%s\n", apps::choice_accuracy_line(s).c_str());
    }
    return 0;
  });
}
