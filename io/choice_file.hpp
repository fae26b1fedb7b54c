// Multiple-choice evaluation files (HellaSwag and the like) in llm.c's format, so the files
// llm.c's dev/data/hellaswag.py writes are read as they are, and scripts/make_choices.py writes
// the same from a local HellaSwag jsonl with any tokenizer.json:
//   a header of 256 int32: magic 20240522, version 1, the number of examples, the longest
//   example in bytes; then each example as uint16 values:
//     65535 (start of an example), its size in bytes (these fields included), its index in the
//     dataset, the label (the right completion), the number of completions, the context's
//     length and tokens, then each completion's length and tokens.
// Token ids are below 65535 (the delimiter): GPT-2 and OPT vocabularies, not Llama 3's.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace colossal::io {

inline constexpr int32_t kChoiceMagic = 20240522;
inline constexpr int32_t kChoiceVersion = 1;

struct ChoiceExample {
  int index = 0;  // the dataset's index, as the file gives it
  int label = 0;  // which completion is right
  std::vector<int32_t> context;
  std::vector<std::vector<int32_t>> completions;
};

class ChoiceFileError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Every example of the file's `bytes`, checked whole (header, delimiters, sizes, labels, a
// non-empty context and completions, ids below `vocab`). Errors name `key`, `path` and the
// example.
std::vector<ChoiceExample> parse_choice_file(std::string_view bytes, const std::string& path,
                                             int vocab, const std::string& key);
// The file's bytes (one rank reads, every rank parses); an error names `key` and the path.
std::string read_choice_bytes(const std::string& path, const std::string& key);
// Both.
std::vector<ChoiceExample> read_choice_file(const std::string& path, int vocab,
                                            const std::string& key);

// The file's bytes for `examples` (tests, and tools that make files without Python). Throws
// std::invalid_argument on what the format cannot hold and on what parse_choice_file refuses
// (an empty context or completion, fewer than 2 completions, a label out of range).
std::vector<uint8_t> encode_choice_file(const std::vector<ChoiceExample>& examples);

}  // namespace colossal::io
