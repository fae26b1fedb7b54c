#include "io/choice_file.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>

namespace colossal::io {

namespace {
constexpr std::size_t kHeaderInts = 256;
constexpr uint16_t kStart = 65535;
}  // namespace

std::string read_choice_bytes(const std::string& path, const std::string& key) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw ChoiceFileError(key + ": '" + path + "' cannot be opened: " + std::strerror(errno) +
                          "; make one with scripts/make_choices.py (or llm.c's "
                          "dev/data/hellaswag.py)");
  }
  std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  if (in.bad()) throw ChoiceFileError(key + ": '" + path + "' could not be read");
  return bytes;
}

std::vector<ChoiceExample> read_choice_file(const std::string& path, int vocab,
                                            const std::string& key) {
  return parse_choice_file(read_choice_bytes(path, key), path, vocab, key);
}

std::vector<ChoiceExample> parse_choice_file(std::string_view bytes, const std::string& path,
                                             int vocab, const std::string& key) {
  const std::string where = key + ": '" + path + "'";
  if (bytes.size() < kHeaderInts * sizeof(int32_t)) {
    throw ChoiceFileError(where + " is " + std::to_string(bytes.size()) +
                          " bytes, shorter than the 1024-byte header of a multiple-choice file");
  }
  int32_t header[4];
  std::memcpy(header, bytes.data(), sizeof header);
  if (header[0] != kChoiceMagic) {
    throw ChoiceFileError(where + " starts with " + std::to_string(header[0]) +
                          ", not the multiple-choice magic 20240522 (llm.c's eval files; a "
                          "token file of training data is not one)");
  }
  if (header[1] != kChoiceVersion) {
    throw ChoiceFileError(where + " is version " + std::to_string(header[1]) +
                          " of the multiple-choice format; only version 1 is read");
  }
  if (header[2] <= 0) {
    throw ChoiceFileError(where + " says it holds " + std::to_string(header[2]) + " examples");
  }
  const std::size_t body_bytes = bytes.size() - kHeaderInts * sizeof(int32_t);
  if (body_bytes % 2 != 0) {
    throw ChoiceFileError(where + " has an odd number of bytes after its header (a truncated "
                          "or corrupt file)");
  }
  std::vector<uint16_t> body(body_bytes / 2);
  std::memcpy(body.data(), bytes.data() + kHeaderInts * sizeof(int32_t), body_bytes);

  std::vector<ChoiceExample> examples;
  // (the smallest example is 11 values: a header that claims more than fit is caught below)
  examples.reserve(std::min(std::size_t(header[2]), body.size() / 11));
  std::size_t at = 0;
  for (int e = 0; e < header[2]; ++e) {
    const std::string which = where + ", example " + std::to_string(e) + " of " +
                              std::to_string(header[2]) + " (at value " +
                              std::to_string(at) + " after the header)";
    if (at + 5 > body.size()) {
      throw ChoiceFileError(which + ": the file ends (truncated, or the header's count of " +
                            "examples is wrong)");
    }
    if (body[at] != kStart) {
      throw ChoiceFileError(which + ": " + std::to_string(body[at]) + " where the example's " +
                            "start 65535 should be (a corrupt file)");
    }
    const std::size_t size = body[at + 1];  // bytes of the whole example
    if (size % 2 != 0 || size / 2 < 6 || at + size / 2 > body.size()) {
      throw ChoiceFileError(which + ": its size of " + std::to_string(size) +
                            " bytes does not fit the file (truncated or corrupt)");
    }
    const std::size_t end = at + size / 2;
    ChoiceExample ex;
    ex.index = body[at + 2];
    ex.label = body[at + 3];
    const int completions = body[at + 4];
    std::size_t p = at + 5;
    // One length-prefixed run of tokens inside this example.
    const auto run = [&](const std::string& what) {
      if (p >= end) {
        throw ChoiceFileError(which + ": " + what + " runs past the example's " +
                              std::to_string(size) + " bytes (a corrupt file)");
      }
      const std::size_t n = body[p++];
      if (n == 0) throw ChoiceFileError(which + ": " + what + " has no tokens");
      if (p + n > end) {
        throw ChoiceFileError(which + ": " + what + "'s " + std::to_string(n) +
                              " tokens run past the example's " + std::to_string(size) +
                              " bytes (a corrupt file)");
      }
      std::vector<int32_t> tokens(body.begin() + std::ptrdiff_t(p),
                                  body.begin() + std::ptrdiff_t(p + n));
      p += n;
      const auto high = std::max_element(tokens.begin(), tokens.end());
      if (*high >= vocab) {
        throw ChoiceFileError(which + ": " + what + " holds token id " + std::to_string(*high) +
                              " but model.vocab is " + std::to_string(vocab) +
                              "; the file must be tokenized for this model");
      }
      return tokens;
    };
    if (completions < 2) {
      throw ChoiceFileError(which + ": " + std::to_string(completions) +
                            " completion(s); a multiple-choice example needs at least 2");
    }
    if (ex.label >= completions) {
      throw ChoiceFileError(which + ": label " + std::to_string(ex.label) + " but only " +
                            std::to_string(completions) + " completions");
    }
    ex.context = run("the context");
    for (int c = 0; c < completions; ++c) {
      ex.completions.push_back(run("completion " + std::to_string(c)));
    }
    if (p != end) {
      throw ChoiceFileError(which + ": " + std::to_string(end - p) + " values left over after " +
                            "its completions (a corrupt file)");
    }
    examples.push_back(std::move(ex));
    at = end;
  }
  if (at != body.size()) {
    throw ChoiceFileError(where + ": " + std::to_string(body.size() - at) + " values follow its " +
                          std::to_string(header[2]) + " examples (the header's count is wrong, " +
                          "or a corrupt file)");
  }
  return examples;
}

std::vector<uint8_t> encode_choice_file(const std::vector<ChoiceExample>& examples) {
  if (examples.empty() || examples.size() >= 65536) {
    throw std::invalid_argument("a multiple-choice file holds 1 to 65535 examples, not " +
                                std::to_string(examples.size()));
  }
  std::vector<uint16_t> body;
  int32_t longest = 0;
  const auto value = [](int64_t v, const char* what) {
    if (v < 0 || v >= kStart) {
      throw std::invalid_argument(std::string(what) + " " + std::to_string(v) +
                                  " does not fit the format's uint16 values below 65535");
    }
    return uint16_t(v);
  };
  for (const ChoiceExample& ex : examples) {
    // What parse_choice_file would refuse is not written.
    if (ex.context.empty() || ex.completions.size() < 2 ||
        std::any_of(ex.completions.begin(), ex.completions.end(),
                    [](const auto& c) { return c.empty(); })) {
      throw std::invalid_argument("example " + std::to_string(ex.index) + ": an empty context "
                                  "or completion, or fewer than 2 completions");
    }
    if (ex.label < 0 || std::size_t(ex.label) >= ex.completions.size()) {
      throw std::invalid_argument("example " + std::to_string(ex.index) + ": label " +
                                  std::to_string(ex.label) + " of " +
                                  std::to_string(ex.completions.size()) + " completions");
    }
    const std::size_t start = body.size();
    body.push_back(kStart);
    body.push_back(0);  // the size, below
    body.push_back(value(ex.index, "index"));
    body.push_back(value(ex.label, "label"));
    body.push_back(value(int64_t(ex.completions.size()), "completions"));
    const auto run = [&](const std::vector<int32_t>& tokens) {
      body.push_back(value(int64_t(tokens.size()), "length"));
      for (const int32_t t : tokens) body.push_back(value(t, "token id"));
    };
    run(ex.context);
    for (const auto& c : ex.completions) run(c);
    const int64_t size = int64_t(body.size() - start) * 2;
    body[start + 1] = value(size, "example bytes");
    longest = std::max<int32_t>(longest, int32_t(size));
  }
  std::vector<int32_t> header(kHeaderInts, 0);
  header[0] = kChoiceMagic;
  header[1] = kChoiceVersion;
  header[2] = int32_t(examples.size());
  header[3] = longest;
  std::vector<uint8_t> out(header.size() * sizeof(int32_t) + body.size() * 2);
  std::memcpy(out.data(), header.data(), header.size() * sizeof(int32_t));
  std::memcpy(out.data() + header.size() * sizeof(int32_t), body.data(), body.size() * 2);
  return out;
}

}  // namespace colossal::io
