// The safetensors reader and writer: bitwise round trips (one file and sharded with an index),
// exact F16/BF16 widening, element-range reads, and every kind of bad file refused with an error
// naming the file, the tensor and what is wrong.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/safetensors.hpp"

using namespace colossal;
namespace fs = std::filesystem;

namespace {

fs::path scratch(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("colossal_st_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// A file from a raw header text and data bytes (the length field as given, or the true one).
std::string write_raw(const fs::path& path, const std::string& header, const std::string& data,
                      int64_t length_override = -1) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  const uint64_t n = length_override >= 0 ? uint64_t(length_override) : header.size();
  for (int i = 0; i < 8; ++i) out.put(char((n >> (8 * i)) & 0xff));
  out << header << data;
  return path.string();
}

std::string bytes_of(const std::vector<uint16_t>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 2);
}

// The message of the SafetensorsError that `f` throws ("" when it throws none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const io::SafetensorsError& e) {
    return e.what();
  }
  return "";
}

std::vector<float> pattern(std::size_t n, float scale) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = scale * std::sin(float(i) * 0.37f) + float(i % 5);
  return v;
}

}  // namespace

TEST(Safetensors, WriterToReaderIsBitwise) {
  const fs::path d = scratch("roundtrip");
  std::vector<float> a = pattern(12, 1.5f), b = pattern(7, -3.0f), c = {};
  a[3] = -0.0f;
  a[4] = std::numeric_limits<float>::denorm_min();
  b[0] = std::numeric_limits<float>::infinity();
  const std::string path = (d / "m.safetensors").string();
  io::write_safetensors(
      path, {{"w.a", {3, 4}, a.data()}, {"b", {7}, b.data()}, {"empty", {0, 5}, c.data()}},
      {{"format", "pt"}});
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  // Header padded so the data section starts 8-byte aligned.
  std::ifstream raw(path, std::ios::binary);
  uint64_t n = 0;
  raw.read(reinterpret_cast<char*>(&n), 8);
  EXPECT_EQ(n % 8, 0u);

  io::SafetensorsFile f(path);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  ASSERT_EQ(f.tensors().size(), 3u);
  EXPECT_EQ(f.info("w.a").shape, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(f.info("w.a").dtype, io::StDtype::F32);
  const auto back_a = f.read_all("w.a"), back_b = f.read_all("b");
  ASSERT_EQ(back_a.size(), a.size());
  ASSERT_EQ(back_b.size(), b.size());
  EXPECT_EQ(std::memcmp(back_a.data(), a.data(), a.size() * 4), 0);
  EXPECT_EQ(std::memcmp(back_b.data(), b.data(), b.size() * 4), 0);
  EXPECT_TRUE(f.read_all("empty").empty());
  EXPECT_EQ(f.info("empty").shape, (std::vector<int64_t>{0, 5}));
}

TEST(Safetensors, ReadsAnElementRangeOnly) {
  const fs::path d = scratch("range");
  const std::vector<float> a = pattern(1000, 2.0f);
  const std::string path = (d / "m.safetensors").string();
  io::write_safetensors(path, {{"a", {10, 100}, a.data()}});
  io::SafetensorsFile f(path);
  std::vector<float> part(37);
  f.read("a", 250, 37, part.data());
  for (int i = 0; i < 37; ++i) ASSERT_EQ(part[i], a[250 + i]);
  EXPECT_EQ(f.bytes_read(), 37u * 4);  // only the range, never the whole tensor
  EXPECT_NE(error_of([&] { f.read("a", 990, 11, part.data()); }).find("outside its 1000"),
            std::string::npos);
}

TEST(Safetensors, ShardsAboveTheLimitWithAnIndex) {
  const fs::path d = scratch("sharded");
  const auto a = pattern(100, 1.0f), b = pattern(100, 2.0f), c = pattern(30, 3.0f);
  // 400 + 400 + 120 bytes under a 500-byte limit: a shard each (400 + 120 > 500).
  const auto files = io::write_safetensors_dir(d.string(), {{"a", {100}, a.data()},
                                                            {"b", {10, 10}, b.data()},
                                                            {"c", {30}, c.data()}}, 500);
  ASSERT_EQ(files.size(), 4u);
  EXPECT_TRUE(fs::exists(d / "model-00001-of-00003.safetensors"));
  EXPECT_TRUE(fs::exists(d / "model-00003-of-00003.safetensors"));
  EXPECT_FALSE(fs::exists(d / "model.safetensors"));
  std::ifstream in(d / "model.safetensors.index.json");
  const auto index = nlohmann::json::parse(in);
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), 920u);
  EXPECT_EQ(index["weight_map"]["b"].get<std::string>(), "model-00002-of-00003.safetensors");

  for (const std::string& p : {d.string(), (d / "model.safetensors.index.json").string()}) {
    io::SafetensorsSet set(p);
    EXPECT_EQ(set.names(), (std::vector<std::string>{"a", "b", "c"}));
    EXPECT_EQ(set.read_all("a"), a);
    EXPECT_EQ(set.read_all("b"), b);
    EXPECT_EQ(set.read_all("c"), c);
  }
  // Writing again below the limit replaces the shards by one file.
  io::write_safetensors_dir(d.string(), {{"a", {100}, a.data()}}, 0);
  EXPECT_TRUE(fs::exists(d / "model.safetensors"));
  EXPECT_FALSE(fs::exists(d / "model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(d / "model-00001-of-00003.safetensors"));
  EXPECT_EQ(io::SafetensorsSet(d.string()).read_all("a"), a);
}

TEST(Safetensors, WidensF16AndBF16Exactly) {
  // Bit patterns and the values they stand for (normal, subnormal, zero, inf, extremes).
  const std::vector<std::pair<uint16_t, float>> half = {
      {0x3c00, 1.0f},          {0xc000, -2.0f},          {0x3555, 0.333251953125f},
      {0x7bff, 65504.0f},      {0x0400, 6.103515625e-05f}, {0x0001, 5.9604644775390625e-08f},
      {0x03ff, 6.097555160522461e-05f}, {0x8000, -0.0f},   {0x7c00, INFINITY}};
  const std::vector<std::pair<uint16_t, float>> bf = {
      {0x3f80, 1.0f}, {0xc040, -3.0f}, {0x3eab, 0.333984375f}, {0x7f7f, 3.3895313892515355e38f},
      {0x0001, 9.183549615799121e-41f}, {0xff80, -INFINITY}};
  for (const auto& [bits, value] : half)
    EXPECT_EQ(std::bit_cast<uint32_t>(io::f16_to_f32(bits)), std::bit_cast<uint32_t>(value))
        << std::hex << bits;
  for (const auto& [bits, value] : bf)
    EXPECT_EQ(std::bit_cast<uint32_t>(io::bf16_to_f32(bits)), std::bit_cast<uint32_t>(value))
        << std::hex << bits;
  EXPECT_TRUE(std::isnan(io::f16_to_f32(0x7e00)));
  EXPECT_TRUE(std::isnan(io::bf16_to_f32(0x7fc0)));
  // Every finite half converts to the value ldexp gives (the whole 16-bit space).
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff;
    if (e == 0x1f) continue;
    float want = e == 0 ? std::ldexp(float(m), -24) : std::ldexp(float(m | 0x400), int(e) - 25);
    if (h & 0x8000) want = -want;
    ASSERT_EQ(std::bit_cast<uint32_t>(io::f16_to_f32(uint16_t(h))), std::bit_cast<uint32_t>(want))
        << std::hex << h;
  }

  // Through a file: F16 and BF16 tensors read as fp32.
  const fs::path d = scratch("half");
  std::vector<uint16_t> hb, bb;
  for (const auto& p : half) hb.push_back(p.first);
  for (const auto& p : bf) bb.push_back(p.first);
  const std::string header = R"({"h":{"dtype":"F16","shape":[9],"data_offsets":[0,18]},)"
                             R"("g":{"dtype":"BF16","shape":[2,3],"data_offsets":[18,30]}})";
  const std::string path = write_raw(d / "m.safetensors", header, bytes_of(hb) + bytes_of(bb));
  io::SafetensorsFile f(path);
  EXPECT_EQ(f.info("h").dtype, io::StDtype::F16);
  EXPECT_EQ(f.info("g").dtype, io::StDtype::BF16);
  const auto h = f.read_all("h"), g = f.read_all("g");
  for (std::size_t i = 0; i < half.size(); ++i)
    EXPECT_EQ(std::bit_cast<uint32_t>(h[i]), std::bit_cast<uint32_t>(half[i].second));
  for (std::size_t i = 0; i < bf.size(); ++i)
    EXPECT_EQ(std::bit_cast<uint32_t>(g[i]), std::bit_cast<uint32_t>(bf[i].second));
  std::vector<float> part(2);
  f.read("g", 3, 2, part.data());
  EXPECT_EQ(part[0], bf[3].second);
  EXPECT_EQ(part[1], bf[4].second);
}

TEST(Safetensors, RefusesEveryBadFileByWhatIsWrong) {
  const fs::path d = scratch("bad");
  const std::string ok = R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  const std::string eight(8, '\1');
  auto open = [](const std::string& p) { return error_of([&] { io::SafetensorsFile f(p); }); };
  auto expect = [&](const std::string& path, const std::vector<std::string>& parts) {
    const std::string msg = open(path);
    ASSERT_FALSE(msg.empty()) << path << " was accepted";
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << msg;
  };
  ASSERT_EQ(open(write_raw(d / "good.safetensors", ok, eight)), "");

  {  // shorter than the length field
    std::ofstream(d / "tiny.safetensors") << "abc";
    expect((d / "tiny.safetensors").string(), {"shorter than the 8-byte header length"});
  }
  expect(write_raw(d / "trunc_header.safetensors", ok.substr(0, 20), "", int64_t(ok.size())),
         {"header length", "exceeds"});
  expect(write_raw(d / "lying_len.safetensors", ok, eight, 1 << 20), {"header length 1048576"});
  expect(write_raw(d / "trunc_data.safetensors", ok, "\1\1\1"),
         {"tensor 't'", "data_offsets [0, 8]", "beyond the data section of 3 bytes"});
  expect(write_raw(d / "json.safetensors", R"({"t":{"dtype":"F32",)", eight),
         {"not well-formed"});
  expect(write_raw(d / "array.safetensors", "[1,2]", ""), {"not an object"});
  expect(write_raw(d / "out.safetensors",
                   R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", eight),
         {"tensor 't'", "beyond the data section of 8 bytes"});
  expect(write_raw(d / "back.safetensors",
                   R"({"t":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", eight),
         {"tensor 't'", "end before they begin"});
  expect(write_raw(d / "overlap.safetensors",
                   R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                   R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                   eight + eight),
         {"'a'", "'b'", "overlap"});
  expect(write_raw(d / "size.safetensors",
                   R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", eight),
         {"tensor 't'", "shape [3] of F32 needs 12 bytes but data_offsets span 8"});
  expect(write_raw(d / "size16.safetensors",
                   R"({"t":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,8]}})", eight),
         {"shape [2, 3] of BF16 needs 12 bytes"});
  expect(write_raw(d / "unknown.safetensors",
                   R"({"t":{"dtype":"Q7","shape":[2],"data_offsets":[0,8]}})", eight),
         {"tensor 't'", "unknown dtype 'Q7'"});
  expect(write_raw(d / "f64.safetensors",
                   R"({"t":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", eight),
         {"tensor 't'", "dtype F64 is not supported (F32, F16 and BF16 are)"});
  expect(write_raw(d / "noshape.safetensors", R"({"t":{"dtype":"F32","data_offsets":[0,8]}})",
                   eight),
         {"tensor 't'", "\"shape\""});
  expect(write_raw(d / "negshape.safetensors",
                   R"({"t":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", eight),
         {"tensor 't'", "non-negative"});
  expect(write_raw(d / "meta.safetensors", R"({"__metadata__":{"a":1}})", ""),
         {"__metadata__ entry 'a'"});

  // A tensor that is not there, in a file and in a set.
  io::SafetensorsFile good((d / "good.safetensors").string());
  const std::string missing = error_of([&] { good.read_all("nope"); });
  EXPECT_NE(missing.find("good.safetensors"), std::string::npos) << missing;
  EXPECT_NE(missing.find("no tensor named 'nope'"), std::string::npos) << missing;

  // Index problems: a file that is absent, a tensor the shard lacks, no weight_map.
  std::ofstream(d / "a.index.json")
      << R"({"weight_map":{"t":"good.safetensors","u":"good.safetensors"}})";
  EXPECT_NE(error_of([&] { io::SafetensorsSet s((d / "a.index.json").string()); })
                .find("weight_map puts 'u' in good.safetensors, which has no such tensor"),
            std::string::npos);
  std::ofstream(d / "b.index.json") << R"({"weight_map":{"t":"absent.safetensors"}})";
  EXPECT_NE(error_of([&] { io::SafetensorsSet s((d / "b.index.json").string()); })
                .find("absent.safetensors: cannot open"),
            std::string::npos);
  std::ofstream(d / "c.index.json") << R"({"metadata":{}})";
  EXPECT_NE(error_of([&] { io::SafetensorsSet s((d / "c.index.json").string()); })
                .find("no \"weight_map\""),
            std::string::npos);
  const fs::path empty = scratch("empty_dir");
  EXPECT_NE(error_of([&] { io::SafetensorsSet s(empty.string()); })
                .find("neither model.safetensors nor model.safetensors.index.json"),
            std::string::npos);
}

TEST(Safetensors, AFailedWriteLeavesNoFile) {
  const fs::path d = scratch("failed");
  const std::vector<float> a = pattern(4, 1.0f);
  const std::string path = (d / "m.safetensors").string();
  // Refused before anything is written: no file, no temporary.
  EXPECT_NE(error_of([&] {
              io::write_safetensors(path, {{"a", {4}, a.data()}, {"b", {3}, nullptr}});
            }).find("tensor 'b' has no data"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  EXPECT_NE(error_of([&] {
              io::write_safetensors(path, {{"a", {4}, a.data()}, {"a", {4}, a.data()}});
            }).find("tensor 'a' is written twice"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              io::write_safetensors((d / "no" / "such" / "dir.safetensors").string(),
                                    {{"a", {4}, a.data()}});
            }).find("cannot create"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(path));
  // A rename that fails (the target is a non-empty directory) removes the temporary file.
  const fs::path blocked = d / "blocked.safetensors";
  fs::create_directories(blocked / "inside");
  EXPECT_NE(error_of([&] { io::write_safetensors(blocked.string(), {{"a", {4}, a.data()}}); })
                .find("cannot rename"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(blocked.string() + ".tmp"));
}
