// Sweep files (YAML list and grid, the line format), their errors, and the run summary.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "apps/sweep.hpp"

namespace colossal::apps::sweep {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> texts(const std::vector<Override>& overrides) {
  std::vector<std::string> out;
  for (const Override& o : overrides) out.push_back(o.text());
  return out;
}

// The message of the SweepError `f` throws ("" when it throws none).
template <typename F>
std::string error_of(F&& f, int* code = nullptr) {
  try {
    f();
  } catch (const SweepError& e) {
    if (code) *code = e.code();
    return e.what();
  }
  return "";
}

TEST(Sweep, GridIsTheCartesianProductLastKeyFastest) {
  const Sweep s = parse_yaml_sweep(R"(base: configs/quickstart.yaml
grid:
  train.optimizer.lr: [1.0e-3, 3.0e-3]
  train.seed: [1, 2, 3]
)", "g.yaml");
  EXPECT_EQ(s.base, "configs/quickstart.yaml");
  ASSERT_EQ(s.count(), 6u);
  EXPECT_EQ(texts(s.point(0)), (std::vector<std::string>{"train.optimizer.lr=1.0e-3", "train.seed=1"}));
  EXPECT_EQ(texts(s.point(2)), (std::vector<std::string>{"train.optimizer.lr=1.0e-3", "train.seed=3"}));
  EXPECT_EQ(texts(s.point(3)), (std::vector<std::string>{"train.optimizer.lr=3.0e-3", "train.seed=1"}));
  EXPECT_EQ(texts(s.point(5)), (std::vector<std::string>{"train.optimizer.lr=3.0e-3", "train.seed=3"}));
  const std::string e = error_of([&] { s.point(6); });
  EXPECT_NE(e.find("g.yaml has 6 points (indices 0-5); there is no point 6"), std::string::npos) << e;
}

TEST(Sweep, PointsWithSetNestedKeysAndListValues) {
  const Sweep s = parse_yaml_sweep(R"(base: b.yaml
set: {train.steps: 100, train: {seed: 7}}
points:
  - {train.optimizer.lr: 1.0e-3}
  - train: {optimizer: {lr: 2.0e-3, betas: [0.9, 0.99]}, seed: 8}
  - {data.path: "a file: with punctuation #1"}
)", "p.yaml");
  ASSERT_EQ(s.count(), 3u);
  EXPECT_EQ(texts(s.point(0)), (std::vector<std::string>{"train.steps=100", "train.seed=7",
                                                         "train.optimizer.lr=1.0e-3"}));
  // The point's own seed replaces set's.
  EXPECT_EQ(texts(s.point(1)),
            (std::vector<std::string>{"train.steps=100", "train.optimizer.lr=2.0e-3",
                                      "train.optimizer.betas=[0.9, 0.99]", "train.seed=8"}));
  EXPECT_EQ(s.point(2).back().text(), "data.path=\"a file: with punctuation #1\"");
}

TEST(Sweep, LineFormatStillWorks) {
  const Sweep s = parse_line_sweep(
      "base: configs/quickstart.yaml\n# comment\n\n--set train.optimizer.lr=1.0e-3 "
      "--set=train.seed=2  # trailing comment\n--set train.steps=3\n",
      "q.sweep");
  EXPECT_EQ(s.base, "configs/quickstart.yaml");
  ASSERT_EQ(s.count(), 2u);
  EXPECT_EQ(texts(s.point(0)), (std::vector<std::string>{"train.optimizer.lr=1.0e-3", "train.seed=2"}));
  EXPECT_EQ(texts(s.point(1)), (std::vector<std::string>{"train.steps=3"}));
}

TEST(Sweep, BadFilesNameTheLineKeyAndWhatIsAllowed) {
  auto yaml_error = [](const std::string& text) {
    return error_of([&] { parse_yaml_sweep(text, "s.yaml"); });
  };
  std::string e = yaml_error("base: b.yaml\npointz: [{train.seed: 1}]\n");
  EXPECT_NE(e.find("s.yaml:2:1: unknown key 'pointz' (keys of a sweep file: base, set, points, grid)"),
            std::string::npos) << e;
  e = yaml_error("base: b.yaml\ngrid: {train.seed: 3}\n");
  EXPECT_NE(e.find("s.yaml:2:8: grid: train.seed: expected a non-empty list of values, got '3'"),
            std::string::npos) << e;
  e = yaml_error("base: b.yaml\npoints: [{train.seed: 1}]\ngrid: {train.seed: [1]}\n");
  EXPECT_NE(e.find("either points or grid, not both"), std::string::npos) << e;
  e = yaml_error("base: b.yaml\n");
  EXPECT_NE(e.find("no points: add 'points:' or 'grid:'"), std::string::npos) << e;
  e = yaml_error("grid: {train.seed: [1]}\n");
  EXPECT_NE(e.find("base: missing"), std::string::npos) << e;
  e = yaml_error("base: b.yaml\npoints: [{train.seed: }]\n");
  EXPECT_NE(e.find("train.seed: empty value"), std::string::npos) << e;
  e = yaml_error("base: b.yaml\npoints: [{train.seed: 1, train: {seed: 2}}]\n");
  EXPECT_NE(e.find("points[0]: train.seed is given twice"), std::string::npos) << e;
  e = yaml_error("base: b.yaml\npoints: [{train seed: 1}]\n");
  EXPECT_NE(e.find("'train seed' is not a key"), std::string::npos) << e;
  e = yaml_error("base: b.yaml\npoints: [3]\n");
  EXPECT_NE(e.find("points[0]: expected a non-empty mapping of KEY: VALUE, got '3'"),
            std::string::npos) << e;
  e = yaml_error("base: b.yaml\ngrid:\n  train.seed: [1, 2\n");
  EXPECT_NE(e.find("s.yaml:4:1: YAML syntax error"), std::string::npos) << e;
  e = yaml_error("- a\n- b\n");
  EXPECT_NE(e.find("a sweep file is a mapping"), std::string::npos) << e;

  e = error_of([] { parse_line_sweep("base: b.yaml\n--set train.seed=1 --profile\n", "l.sweep"); });
  EXPECT_NE(e.find("l.sweep:2: '--profile' is not an override (allowed: --set KEY=VALUE"),
            std::string::npos) << e;
  e = error_of([] { parse_line_sweep("--set train.seed=1\n", "l.sweep"); });
  EXPECT_NE(e.find("l.sweep:1: the first line must be 'base: CONFIG'"), std::string::npos) << e;
  e = error_of([] { parse_line_sweep("base: b.yaml\n--set train.seed\n", "l.sweep"); });
  EXPECT_NE(e.find("'train.seed' is not KEY=VALUE"), std::string::npos) << e;
}

class SweepFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = fs::temp_directory_path() / "colossal_test_sweep";
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  void write(const fs::path& path, const std::string& text) {
    fs::create_directories(path.parent_path());
    std::ofstream(path) << text;
  }
  fs::path dir;
};

TEST_F(SweepFiles, ConfigsAreCheckedPointByPoint) {
  write(dir / "base.yaml",
        "model: {layers: 1, hidden: 16, heads: 2, vocab: 256, max_seq: 16}\n"
        "data: {path: x.txt}\ntrain: {steps: 3, seq_len: 16, global_batch: 4, micro_batch: 2}\n");
  write(dir / "ok.yaml", "base: " + (dir / "base.yaml").string() +
                             "\ngrid: {train.seed: [1, 2], train.steps: [2, 4]}\n");
  EXPECT_EQ(error_of([&] { check_configs(load_sweep((dir / "ok.yaml").string())); }), "");
  write(dir / "typo.yaml", "base: " + (dir / "base.yaml").string() +
                               "\npoints: [{train.seed: 1}, {train.optimizer.lrr: 1}]\n");
  std::string e = error_of([&] { check_configs(load_sweep((dir / "typo.yaml").string())); });
  EXPECT_NE(e.find("point 1 (train.optimizer.lrr=1)"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean 'train.optimizer.lr'?"), std::string::npos) << e;
  write(dir / "range.yaml", "base: " + (dir / "base.yaml").string() +
                                "\npoints: [{train.steps: -1}]\n");
  e = error_of([&] { check_configs(load_sweep((dir / "range.yaml").string())); });
  EXPECT_NE(e.find("point 0 (train.steps=-1)"), std::string::npos) << e;
  write(dir / "nobase.yaml", "base: " + (dir / "missing.yaml").string() +
                                 "\npoints: [{train.seed: 1}]\n");
  e = error_of([&] { check_configs(load_sweep((dir / "nobase.yaml").string())); });
  EXPECT_NE(e.find("nobase.yaml:1:1: base: '"), std::string::npos) << e;
  EXPECT_NE(e.find("missing.yaml' is not a file"), std::string::npos) << e;
  e = error_of([&] { load_sweep((dir / "absent.yaml").string()); });
  EXPECT_NE(e.find("absent.yaml: cannot be opened"), std::string::npos) << e;
}

TEST_F(SweepFiles, SummaryHasOneRowPerRunInNaturalOrder) {
  const std::string header =
      "step,loss,lr,grad_norm,tokens_per_s,mfu,step_seconds,val_loss,peak_tracked_bytes\n";
  write(dir / "s-7" / "10" / "metrics.csv",
        header + "1,5.5,1e-3,1,100,0,0.1,nan,1\n2,5.25,1e-3,1,300,0,0.1,5.4,1\n");
  write(dir / "s-7" / "10" / "point.txt", "train.seed=10\ntrain.optimizer.betas=[0.9,0.95]\n");
  write(dir / "s-7" / "2" / "metrics.csv",
        header + "1,5.5,1e-3,1,200,0,0.1,5.6,1\n2,5.0,1e-3,1,200,0,0.1,5.2,1\n"
                 "3,4.5,1e-3,1,200,0,0.1,5.3,1\n");
  write(dir / "s-7" / "2" / "point.txt", "train.seed=2\n");
  write(dir / "s-7" / "2" / "finished", "step 3\n");
  // eval.choices' passes: the best accuracy per token, as written (nan rows skipped).
  write(dir / "s-7" / "2" / "choices.csv",
        "step,accuracy_per_token,accuracy_total,examples,seconds\n"
        "1,0.25,0.25,100,1.5\n2,0.31,0.3,100,1.5\n3,nan,nan,100,1.5\n");
  // A model.h5 alone is an earlier run's, continued here and stopped (no finished marker).
  write(dir / "s-7" / "10" / "model.h5", "");
  // tokens/s: the tokens over the seconds after the first step (a warm-up), as the trainer's
  // summary counts them: (400 x 0.1 + 100 x 0.3) / 0.4 = 175, not the rates' mean (the
  // mean with step 1 was 6% off a real run's summary).
  write(dir / "s-7" / "3" / "metrics.csv",
        header + "1,5.5,1e-3,1,10,0,1.0,nan,1\n2,5.0,1e-3,1,400,0,0.1,nan,1\n"
                 "3,4.5,1e-3,1,100,0,0.3,nan,1\n");
  const std::vector<RunSummary> runs = summarize((dir / "s-7").string());
  ASSERT_EQ(runs.size(), 3u);
  EXPECT_EQ(runs[1].run, "3");
  EXPECT_DOUBLE_EQ(runs[1].tokens_per_s, 175.0);
  EXPECT_EQ(runs[0].run, "2");
  EXPECT_EQ(runs[0].steps, 3);
  EXPECT_EQ(runs[0].final_loss, "4.5");
  EXPECT_EQ(runs[0].best_val_loss, "5.2");
  EXPECT_DOUBLE_EQ(runs[0].tokens_per_s, 200.0);
  EXPECT_TRUE(runs[0].finished);
  EXPECT_EQ(runs[2].run, "10");
  EXPECT_EQ(runs[2].best_val_loss, "5.4");
  EXPECT_DOUBLE_EQ(runs[2].tokens_per_s, 300.0);
  EXPECT_FALSE(runs[2].finished);
  EXPECT_EQ(runs[0].best_choices_accuracy, "0.31");
  EXPECT_EQ(runs[2].best_choices_accuracy, "");
  EXPECT_EQ(summary_csv(runs),
            "run,overrides,steps,final_loss,best_val_loss,best_choices_accuracy,tokens_per_s,"
            "finished\n"
            "2,train.seed=2,3,4.5,5.2,0.31,200,yes\n"
            "3,,3,4.5,,,175,no\n"
            "10,\"train.seed=10 train.optimizer.betas=[0.9,0.95]\",2,5.25,5.4,,300,no\n");
  const std::string table = summary_table(runs);
  EXPECT_NE(table.find("run  overrides"), std::string::npos) << table;

  write(dir / "bad" / "metrics.csv", "step,loss\n1,2\n");
  int code = 0;
  const std::string e = error_of([&] { summarize((dir / "bad").string()); }, &code);
  EXPECT_NE(e.find("no column 'tokens_per_s'"), std::string::npos) << e;
  EXPECT_EQ(code, 3);
  EXPECT_NE(error_of([&] { summarize((dir / "none").string()); }).find("is not a directory"),
            std::string::npos);
  fs::create_directories(dir / "empty");
  EXPECT_NE(error_of([&] { summarize((dir / "empty").string()); }).find("no run below"),
            std::string::npos);
}

}  // namespace
}  // namespace colossal::apps::sweep
