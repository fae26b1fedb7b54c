#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "io/choice_file.hpp"
#include "io/dataset.hpp"
#include "token_files.hpp"

using namespace colossal::io;
using colossal::test::write_llmc;

namespace {

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("colossal_test_" + name)).string();
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const DataError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(TokenFile, RawTextIsBytes) {
  const auto path = temp_path("raw.txt");
  write_text(path, "hello\xff");
  TokenFile f(path, "data.path");
  EXPECT_EQ(f.format(), TokenFile::Format::raw_bytes);
  ASSERT_EQ(f.size(), 6u);
  EXPECT_EQ(f[0], uint32_t('h'));
  EXPECT_EQ(f[5], 255u);
}

TEST(TokenFile, LlmcHeaderAndUint16Tokens) {
  const auto path = temp_path("tokens.bin");
  write_llmc(path, {50256, 1, 2, 3, 40000});
  TokenFile f(path, "data.path");
  EXPECT_EQ(f.format(), TokenFile::Format::llmc_uint16);
  ASSERT_EQ(f.size(), 5u);
  EXPECT_EQ(f[0], 50256u);
  EXPECT_EQ(f[4], 40000u);
  EXPECT_EQ(f.max_token(), 50256u);
}

// Llama 3's vocabulary (128256) does not fit uint16: llm.c's llama-3 files hold uint32 tokens.
TEST(TokenFile, LlmcLlama3HeaderAndUint32Tokens) {
  const auto path = temp_path("tokens32.bin");
  colossal::test::write_llmc32(path, {128000, 1, 65536, 128255, 7});
  TokenFile f(path, "data.path");
  EXPECT_EQ(f.format(), TokenFile::Format::llmc_uint32);
  ASSERT_EQ(f.size(), 5u);
  EXPECT_EQ(f[0], 128000u);
  EXPECT_EQ(f[2], 65536u);
  EXPECT_EQ(f[3], 128255u);
  EXPECT_EQ(f.max_token(), 128255u);
  EXPECT_NO_THROW(f.check(128256, 5, ""));
  EXPECT_NE(message_of([&] { f.check(128255, 1, ""); })
                .find("token id 128255 but model.vocab is 128255"),
            std::string::npos);
  const auto version = temp_path("version32.bin");
  colossal::test::write_llmc32(version, {1, 2}, 1);
  EXPECT_NE(message_of([&] { TokenFile g(version, "data.path"); })
                .find("has the llm.c magic 20240801 but version 1 (with that magic only version "
                      "7, uint32 tokens, is read)"),
            std::string::npos)
      << message_of([&] { TokenFile g(version, "data.path"); });
  const auto truncated = temp_path("truncated32.bin");
  colossal::test::write_llmc32(truncated, {1, 2, 3}, 7, 4);
  EXPECT_NE(message_of([&] { TokenFile g(truncated, "data.path"); })
                .find("header says 4 tokens but the file holds 3"),
            std::string::npos);
  const auto extra = temp_path("extra32.bin");
  colossal::test::write_llmc32(extra, {1, 2, 3, 4}, 7, 3);
  EXPECT_NE(message_of([&] { TokenFile g(extra, "data.path"); })
                .find("header says 3 uint32 tokens (12 bytes) but 16 bytes follow it"),
            std::string::npos);
}

TEST(TokenFile, BadFilesGiveSpecificMessages) {
  EXPECT_NE(message_of([] { TokenFile f(temp_path("missing.bin"), "data.path"); })
                .find("data.path: cannot open"),
            std::string::npos);
  const auto empty = temp_path("empty.txt");
  write_text(empty, "");
  EXPECT_NE(message_of([&] { TokenFile f(empty, "data.val_path"); }).find("data.val_path: '" + empty + "' is empty"),
            std::string::npos);
  const auto short_file = temp_path("short.txt");
  write_text(short_file, "abc");
  const std::string msg = message_of([&] {
    TokenFile f(short_file, "data.path");
    f.check(256, 130, "train.seq_len + 1 tokens");
  });
  EXPECT_NE(msg.find("holds 3 tokens, fewer than the 130 needed"), std::string::npos) << msg;
  const auto truncated = temp_path("truncated.bin");
  write_llmc(truncated, {1, 2, 3}, 1, 1000);
  EXPECT_NE(message_of([&] { TokenFile f(truncated, "data.path"); }).find("header says 1000 tokens"),
            std::string::npos);
  // More bytes than the header's tokens: uint32 tokens (each id then read as it and a 0).
  const auto wide = temp_path("wide.bin");
  write_llmc(wide, {7, 0, 8, 0, 9, 0}, 1, 3);
  EXPECT_NE(message_of([&] { TokenFile f(wide, "data.path"); })
                .find("data.path: '" + wide + "' header says 3 uint16 tokens (6 bytes) but 12 "
                      "bytes follow it (uint32 tokens, or a corrupt file?)"),
            std::string::npos) << message_of([&] { TokenFile f(wide, "data.path"); });
  const auto version = temp_path("version.bin");
  write_llmc(version, {1, 2, 3}, 7);
  EXPECT_NE(message_of([&] { TokenFile f(version, "data.path"); }).find("version 7"), std::string::npos);
  const auto big = temp_path("big.bin");
  write_llmc(big, {1, 2, 3000});
  const std::string vocab = message_of([&] {
    TokenFile f(big, "data.path");
    f.check(256, 1, "");
  });
  EXPECT_NE(vocab.find("token id 3000 but model.vocab is 256"), std::string::npos) << vocab;
}

TEST(TrainSampler, WindowsArePureFunctionsOfSeedStepAndIndex) {
  const auto path = temp_path("sampler.txt");
  std::string text;
  for (int i = 0; i < 1000; ++i) text.push_back(static_cast<char>('a' + i % 26));
  write_text(path, text);
  TokenFile f(path, "data.path");
  const int T = 8, global = 6;
  TrainSampler s(f, T, 42);
  // The whole global batch at once equals the same batch drawn in micro-batches of 2 or 3.
  std::vector<int32_t> x(global * T), y(global * T), x2(global * T), y2(global * T);
  s.batch(5, 0, global, global, x.data(), y.data());
  for (int first = 0; first < global; first += 2) {
    s.batch(5, first, 2, global, x2.data() + first * T, y2.data() + first * T);
  }
  EXPECT_EQ(x, x2);
  EXPECT_EQ(y, y2);
  for (int i = 0; i < global * T; ++i) {
    // targets are inputs shifted by one token
    EXPECT_EQ(uint32_t(y[i]), (uint32_t(x[i]) - 'a' + 1) % 26 + 'a');
  }
  // A different step or seed gives different windows; every start leaves room for T+1 tokens.
  std::vector<int32_t> x3(global * T), y3(global * T);
  s.batch(6, 0, global, global, x3.data(), y3.data());
  EXPECT_NE(x, x3);
  for (int64_t step = 0; step < 200; ++step) {
    for (int i = 0; i < global; ++i) EXPECT_LT(s.window_start(step, i, global) + T, f.size());
  }
}

TEST(Validation, SequentialWindowsCoverTheFile) {
  const auto path = temp_path("val.txt");
  write_text(path, std::string(33, 'x'));
  TokenFile f(path, "data.val_path");
  EXPECT_EQ(validation_windows(f, 8, 0), 4);  // (33-1)/8
  EXPECT_EQ(validation_windows(f, 8, 2), 2);
  write_text(path, std::string(32, 'x'));
  TokenFile g(path, "data.val_path");
  EXPECT_EQ(validation_windows(g, 8, 0), 3);  // the last window needs one more target token
  std::vector<int32_t> x(16), y(16);
  validation_batch(g, 8, 1, 2, x.data(), y.data());
  EXPECT_EQ(x[0], 'x');
}

namespace {

// llm.c's eval file of `values` (uint16) after a header (magic, version, count, longest), written
// by hand from the format's description, not by io::encode_choice_file.
std::string choice_bytes(std::vector<int32_t> header, const std::vector<uint16_t>& values) {
  header.resize(256, 0);
  std::string bytes(header.size() * 4 + values.size() * 2, '\0');
  std::memcpy(bytes.data(), header.data(), header.size() * 4);
  std::memcpy(bytes.data() + header.size() * 4, values.data(), values.size() * 2);
  return bytes;
}

std::string choice_error(const std::string& bytes, int vocab = 1000) {
  try {
    parse_choice_file(bytes, "hs.bin", vocab, "--choices");
  } catch (const ChoiceFileError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

// io::parse_choice_file reads llm.c's multiple-choice layout: the fields of each example in
// order, completions of any number and length; io::encode_choice_file writes those bytes.
TEST(ChoiceFile, ReadsLlmcEvalFiles) {
  // Example 0: index 7, label 1, context {5, 6}, completions {9} and {10, 11, 12}; example 1:
  // index 8, label 2, context {1}, three completions {2} {3} {4}.
  const std::vector<uint16_t> values = {65535, 28, 7, 1, 2, 2, 5, 6, 1, 9, 3, 10, 11, 12,
                                        65535, 26, 8, 2, 3, 1, 1, 1, 2, 1, 3, 1, 4};
  const std::string bytes = choice_bytes({20240522, 1, 2, 28}, values);
  const std::vector<ChoiceExample> got = parse_choice_file(bytes, "hs.bin", 13, "--choices");
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].index, 7);
  EXPECT_EQ(got[0].label, 1);
  EXPECT_EQ(got[0].context, (std::vector<int32_t>{5, 6}));
  ASSERT_EQ(got[0].completions.size(), 2u);
  EXPECT_EQ(got[0].completions[0], (std::vector<int32_t>{9}));
  EXPECT_EQ(got[0].completions[1], (std::vector<int32_t>{10, 11, 12}));
  EXPECT_EQ(got[1].index, 8);
  EXPECT_EQ(got[1].label, 2);
  EXPECT_EQ(got[1].context, (std::vector<int32_t>{1}));
  EXPECT_EQ(got[1].completions,
            (std::vector<std::vector<int32_t>>{{2}, {3}, {4}}));
  // The writer's bytes are those bytes.
  const std::vector<uint8_t> encoded = encode_choice_file(got);
  EXPECT_EQ(std::string(encoded.begin(), encoded.end()), bytes);
  // And through a file.
  const auto path = temp_path("choices.bin");
  write_text(path, bytes);
  EXPECT_EQ(read_choice_file(path, 13, "--choices").size(), 2u);
}

TEST(ChoiceFile, BadFilesGiveSpecificMessages) {
  const auto has = [](const std::string& message, const std::string& part) {
    return message.find(part) != std::string::npos;
  };
  const std::vector<uint16_t> one = {65535, 22, 0, 1, 2, 1, 5, 1, 6, 1, 7};
  EXPECT_EQ(choice_error(choice_bytes({20240522, 1, 1, 22}, one)), "");
  EXPECT_TRUE(has(choice_error("short"), "--choices: 'hs.bin' is 5 bytes, shorter than"));
  EXPECT_TRUE(has(choice_error(choice_bytes({20240520, 1, 1}, one)),
                  "starts with 20240520, not the multiple-choice magic 20240522"));
  EXPECT_TRUE(has(choice_error(choice_bytes({20240522, 2, 1}, one)), "version 2"));
  // The header counts one example more than the file holds.
  EXPECT_TRUE(has(choice_error(choice_bytes({20240522, 1, 2}, one)),
                  "example 1 of 2 (at value 11 after the header): the file ends"));
  // One example fewer: the rest is left over.
  std::vector<uint16_t> two = one;
  two.insert(two.end(), one.begin(), one.end());
  EXPECT_TRUE(has(choice_error(choice_bytes({20240522, 1, 1}, two)),
                  "11 values follow its 1 examples"));
  std::vector<uint16_t> bad = one;
  bad[0] = 3;
  EXPECT_TRUE(has(choice_error(choice_bytes({20240522, 1, 1}, bad)),
                  "3 where the example's start 65535 should be"));
  bad = one;
  bad[3] = 2;  // label 2 of 2 completions
  EXPECT_TRUE(has(choice_error(choice_bytes({20240522, 1, 1}, bad)),
                  "label 2 but only 2 completions"));
  bad = one;
  bad[4] = 1;  // one completion: the second's values are left over
  EXPECT_TRUE(has(choice_error(choice_bytes({20240522, 1, 1}, bad)),
                  "1 completion(s); a multiple-choice example needs at least 2"));
  bad = one;
  bad[7] = 0;  // an empty completion
  EXPECT_TRUE(has(choice_error(choice_bytes({20240522, 1, 1}, bad)), "completion 0 has no tokens"));
  bad = one;
  bad[7] = 4;  // completion 0 runs past the example
  EXPECT_TRUE(has(choice_error(choice_bytes({20240522, 1, 1}, bad)),
                  "completion 0's 4 tokens run past the example's 22 bytes"));
  bad = one;
  bad[1] = 40;  // the size runs past the file
  EXPECT_TRUE(has(choice_error(choice_bytes({20240522, 1, 1}, bad)),
                  "its size of 40 bytes does not fit the file"));
  EXPECT_TRUE(has(choice_error(choice_bytes({20240522, 1, 1}, one), 7),
                  "example 0 of 1 (at value 0 after the header): completion 1 holds token id 7 "
                  "but model.vocab is 7"));
  try {
    read_choice_file(temp_path("no-such-choices.bin"), 10, "--choices");
    ADD_FAILURE();
  } catch (const ChoiceFileError& e) {
    EXPECT_TRUE(has(e.what(), "cannot be opened")) << e.what();
    EXPECT_TRUE(has(e.what(), "scripts/make_choices.py")) << e.what();
  }
  EXPECT_THROW(encode_choice_file({}), std::invalid_argument);
  ChoiceExample huge;
  huge.context = {65535};
  huge.completions = {{1}, {2}};
  EXPECT_THROW(encode_choice_file({huge}), std::invalid_argument);
  ChoiceExample one_completion;
  one_completion.context = {1};
  one_completion.completions = {{2}};
  EXPECT_THROW(encode_choice_file({one_completion}), std::invalid_argument);
  ChoiceExample bad_label = huge;
  bad_label.context = {1};
  bad_label.label = 2;
  EXPECT_THROW(encode_choice_file({bad_label}), std::invalid_argument);
  // A header claiming far more examples than the file holds: the error, not an allocation.
  EXPECT_TRUE(has(choice_error(choice_bytes({20240522, 1, 2000000000}, one)),
                  "example 1 of 2000000000"));
}
