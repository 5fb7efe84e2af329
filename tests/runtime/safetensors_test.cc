// Tests of the safetensors checkpoints (runtime/safetensors.h): round trips of
// every dtype, odd shapes, awkward names and metadata; empty tensors and empty
// files; the exact bytes of a tiny file, spelled out by hand from the format's
// specification; files as the reference writer makes them (other key orders,
// \u escapes, pretty-printed JSON); the atomic write (no temporary file left
// behind, on success or failure); writer input errors; corrupt files, each
// refused with DataLossError; and a small fuzz (every truncation, random byte
// changes) that must never crash.
#include "runtime/safetensors.h"

#include <dirent.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "runtime/dtype.h"
#include "tests/gpu_test_util.h"
#include "tests/status_assertions.h"

namespace lossrt {
namespace {

// A fresh folder for one test.
std::string MakeTempFolder() {
  std::string pattern = ::testing::TempDir() + "/safetensors_test.XXXXXX";
  char* made = mkdtemp(&pattern[0]);
  EXPECT_NE(made, nullptr) << "mkdtemp " << pattern;
  return pattern;
}

// The names in a folder, sorted, without "." and "..".
std::vector<std::string> ListFolder(const std::string& folder) {
  std::vector<std::string> names;
  DIR* dir = opendir(folder.c_str());
  if (dir == nullptr) return names;
  while (const dirent* entry = readdir(dir)) {
    const std::string name = entry->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  closedir(dir);
  std::sort(names.begin(), names.end());
  return names;
}

std::string ReadFile(const std::string& path) {
  std::string contents;
  FILE* file = fopen(path.c_str(), "rb");
  if (file == nullptr) return contents;
  char buffer[4096];
  size_t got;
  while ((got = fread(buffer, 1, sizeof(buffer), file)) > 0) {
    contents.append(buffer, got);
  }
  fclose(file);
  return contents;
}

// A file of `header` (with its 8-byte little-endian length) and `data`.
std::string MakeFile(const std::string& header, const std::string& data) {
  std::string file(8, '\0');
  const uint64_t n = header.size();
  for (int k = 0; k < 8; ++k) file[k] = static_cast<char>(n >> (8 * k));
  return file + header + data;
}

std::vector<uint8_t> RandomBytes(size_t count, std::mt19937_64& engine) {
  std::vector<uint8_t> bytes(count);
  for (uint8_t& byte : bytes) byte = static_cast<uint8_t>(engine());
  return bytes;
}

// ---- Round trips ----

struct Source {
  std::string name;
  DType dtype;
  Shape shape;
  std::vector<uint8_t> bytes;
};

std::vector<Source> Sources(uint64_t seed) {
  std::mt19937_64 engine(seed);
  auto make = [&](std::string name, DType dtype, Shape shape) {
    int64_t count = 1;
    for (int64_t d : shape) count *= d;
    return Source{std::move(name), dtype, shape,
                  RandomBytes(count * DTypeSize(dtype), engine)};
  };
  // Odd byte counts between wider types: the writer must still align each.
  return {
      make("wte", DType::kF32, {7, 3}),
      make("h.0.ln_1.weight", DType::kBF16, {5}),
      make("step_f64", DType::kF64, {3}),
      make("ids", DType::kI32, {1, 1, 4}),
      make("scalar_i64", DType::kI64, {}),
      make("half", DType::kF16, {7}),
      make("quote\"back\\slash/", DType::kF32, {2}),
      make("control\t\n\r\b\f\x01\x1f\x7f", DType::kBF16, {3}),
      make("unicod\xc3\xa9 \xe2\x9c\x93 \xf0\x9f\x98\x80", DType::kI64, {2}),
      make("empty", DType::kF32, {0}),
      make("empty_2d", DType::kF64, {3, 0}),
  };
}

std::vector<SafetensorsEntry> EntriesOf(const std::vector<Source>& sources) {
  std::vector<SafetensorsEntry> entries;
  for (const Source& s : sources) {
    entries.push_back(
        {s.name, s.dtype, s.shape, s.bytes.empty() ? nullptr : s.bytes.data()});
  }
  return entries;
}

TEST(SafetensorsTest, RoundTripsDTypesShapesNamesAndMetadata) {
  const std::string folder = MakeTempFolder();
  const std::string path = folder + "/model.safetensors";
  const std::vector<Source> sources = Sources(test::TestSeed());
  const std::map<std::string, std::string> metadata = {
      {"step", "42"},
      {"note", "line\nbreak \"quoted\" \\ tab\t \xc3\xa9"},
      {"empty", ""},
      {"format", "pt"}};
  ASSERT_OK(WriteSafetensors(path, EntriesOf(sources), metadata));

  auto file = SafetensorsFile::Read(path);
  ASSERT_TRUE(file.ok()) << file.status();
  std::vector<std::string> expected_names;
  for (const Source& s : sources) expected_names.push_back(s.name);
  EXPECT_EQ(file->names(), expected_names);
  EXPECT_EQ(file->metadata(), metadata);
  for (const Source& s : sources) {
    SCOPED_TRACE(s.name);
    auto view = file->Find(s.name);
    ASSERT_TRUE(view.ok()) << view.status();
    EXPECT_EQ(view->dtype, s.dtype);
    EXPECT_EQ(view->shape, s.shape);
    EXPECT_EQ(std::vector<uint8_t>(view->bytes.begin(), view->bytes.end()),
              s.bytes);
    // Aligned to the element size in memory: the header is padded to 8 bytes
    // and the data laid out by decreasing element size.
    if (!view->bytes.empty()) {
      EXPECT_EQ(
          reinterpret_cast<uintptr_t>(view->bytes.data()) % DTypeSize(s.dtype),
          0u);
    }
  }
  // The header length is a multiple of 8.
  const std::string bytes = ReadFile(path);
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  for (int k = 7; k >= 0; --k) n = (n << 8) | static_cast<uint8_t>(bytes[k]);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(bytes[8], '{');
  // Overwriting with other contents replaces the file.
  ASSERT_OK(WriteSafetensors(path, {}, {}));
  file = SafetensorsFile::Read(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE(file->names().empty());
}

TEST(SafetensorsTest, EmptyFile) {
  const std::string folder = MakeTempFolder();
  const std::string path = folder + "/empty.safetensors";
  ASSERT_OK(WriteSafetensors(path, {}, {}));
  // "{}" padded with six spaces.
  EXPECT_EQ(ReadFile(path), MakeFile("{}      ", ""));
  auto file = SafetensorsFile::Read(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE(file->names().empty());
  EXPECT_TRUE(file->metadata().empty());
  EXPECT_EQ(file->Find("x").status().code(), absl::StatusCode::kNotFound);
}

// The whole file, byte by byte, from the format's definition: the header
// length as a little-endian u64, the compact JSON header ("__metadata__"
// first, then the tensors in the order given) padded with spaces to a
// multiple of 8, then the data (the 4-byte tensor before the 2-byte one).
TEST(SafetensorsTest, ExactBytesOfATinyFile) {
  const std::string folder = MakeTempFolder();
  const std::string path = folder + "/tiny.safetensors";
  const float a[2] = {1.0f, -2.0f};
  const uint16_t b = FloatToBf16Bits(1.5f);  // 0x3fc0
  ASSERT_EQ(b, 0x3fc0);
  const std::vector<SafetensorsEntry> entries = {{"b", DType::kBF16, {}, &b},
                                                 {"a", DType::kF32, {2}, a}};
  ASSERT_OK(WriteSafetensors(path, entries, {{"k", "v"}}));

  const std::string header =
      "{\"__metadata__\":{\"k\":\"v\"},"
      "\"b\":{\"dtype\":\"BF16\",\"shape\":[],\"data_offsets\":[8,10]},"
      "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
  ASSERT_EQ(header.size(), 133u);
  const unsigned char expected[] = {
      // N = 136 = 133 bytes of JSON + 3 spaces, little-endian.
      0x88, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
  std::string want(reinterpret_cast<const char*>(expected), sizeof(expected));
  want += header + "   ";
  // a: 1.0f = 0x3f800000, -2.0f = 0xc0000000; b: 0x3fc0 (little-endian).
  const unsigned char data[] = {0x00, 0x00, 0x80, 0x3f, 0x00,
                                0x00, 0x00, 0xc0, 0xc0, 0x3f};
  want.append(reinterpret_cast<const char*>(data), sizeof(data));
  EXPECT_EQ(ReadFile(path), want);
}

// Files as other writers make them: the example of the reference
// implementation's documentation, and a pretty-printed header listing the
// tensors out of offset order with \u escapes and a null __metadata__.
TEST(SafetensorsTest, ReadsOtherWritersFiles) {
  {
    const std::string header =
        "{\"test\":{\"dtype\":\"I32\",\"shape\":[2,2],\"data_offsets\":[0,"
        "16]}}";
    ASSERT_EQ(header.size(), 60u);  // '<' in the reference's example
    const std::string bytes = MakeFile(header, std::string(16, '\0'));
    ASSERT_EQ(bytes[0], '<');
    auto file = SafetensorsFile::Parse(bytes);
    ASSERT_TRUE(file.ok()) << file.status();
    auto view = file->Find("test");
    ASSERT_TRUE(view.ok()) << view.status();
    EXPECT_EQ(view->dtype, DType::kI32);
    EXPECT_EQ(view->shape, Shape({2, 2}));
    EXPECT_EQ(view->bytes.size(), 16u);
  }
  {
    const std::string header =
        "{\n  \"__metadata__\": null,\n"
        "  \"caf\\u00e9\\ud83d\\ude00\\/\": {\"data_offsets\": [4, 6], "
        "\"shape\": [1], \"dtype\": \"F16\", \"extra\": [true, false, null, "
        "-1.5e+3, {}]},\n"
        "  \"first\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": "
        "[0, 4]}\n}\n\t  ";
    const std::string data = "\x01\x02\x03\x04\x05\x06";
    auto file = SafetensorsFile::Parse(MakeFile(header, data));
    ASSERT_TRUE(file.ok()) << file.status();
    const std::string name = "caf\xc3\xa9\xf0\x9f\x98\x80/";
    EXPECT_EQ(file->names(), std::vector<std::string>({name, "first"}));
    EXPECT_TRUE(file->metadata().empty());
    auto view = file->Find(name);
    ASSERT_TRUE(view.ok()) << view.status();
    EXPECT_EQ(view->dtype, DType::kF16);
    EXPECT_EQ(std::string(view->bytes.begin(), view->bytes.end()), "\x05\x06");
  }
}

TEST(SafetensorsTest, FindMissingIsNotFoundNamingTheTensor) {
  const std::string bytes = MakeFile("{}", "");
  auto file = SafetensorsFile::Parse(bytes);
  ASSERT_TRUE(file.ok()) << file.status();
  const absl::Status status = file->Find("h.3.attn").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(status.message().find("h.3.attn"), std::string::npos) << status;
}

// ---- The atomic write ----

TEST(WriteFileAtomicallyTest, ReplacesTheFileAndLeavesNoTemporaryFile) {
  const std::string folder = MakeTempFolder();
  const std::string path = folder + "/state.bin";
  std::mt19937_64 engine(test::TestSeed());
  const std::vector<uint8_t> big = RandomBytes(3 << 20, engine);
  const std::string contents(big.begin(), big.end());
  ASSERT_OK(WriteFileAtomically(path, contents));
  EXPECT_EQ(ReadFile(path), contents);
  ASSERT_OK(WriteFileAtomically(path, "short"));
  EXPECT_EQ(ReadFile(path), "short");
  ASSERT_OK(WriteFileAtomically(path, ""));
  EXPECT_EQ(ReadFile(path), "");
  EXPECT_EQ(ListFolder(folder), std::vector<std::string>({"state.bin"}));
  // A regular file, not a link to the temporary one.
  struct stat info;
  ASSERT_EQ(lstat(path.c_str(), &info), 0);
  EXPECT_TRUE(S_ISREG(info.st_mode));
}

TEST(WriteFileAtomicallyTest, FailuresLeaveNoTemporaryFile) {
  const std::string folder = MakeTempFolder();
  // The rename fails: the path is a folder.
  ASSERT_EQ(mkdir((folder + "/taken").c_str(), 0755), 0);
  absl::Status status = WriteFileAtomically(folder + "/taken", "data");
  EXPECT_FALSE(status.ok());
  EXPECT_EQ(ListFolder(folder), std::vector<std::string>({"taken"}));
  // The folder does not exist.
  status = WriteFileAtomically(folder + "/missing/file", "data");
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << status;
  // Not a file name.
  EXPECT_EQ(WriteFileAtomically(folder + "/", "data").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ListFolder(folder), std::vector<std::string>({"taken"}));
}

// ---- Writer input errors ----

TEST(SafetensorsTest, WriterRejectsBadEntriesAndWritesNothing) {
  const std::string folder = MakeTempFolder();
  const std::string path = folder + "/bad.safetensors";
  const float data[4] = {1, 2, 3, 4};
  struct Case {
    const char* what;
    std::vector<SafetensorsEntry> entries;
    std::map<std::string, std::string> metadata;
  };
  const std::vector<Case> cases = {
      {"empty name", {{"", DType::kF32, {1}, data}}, {}},
      {"reserved name", {{"__metadata__", DType::kF32, {1}, data}}, {}},
      {"duplicate",
       {{"x", DType::kF32, {1}, data}, {"x", DType::kF32, {2}, data}},
       {}},
      {"negative dim", {{"x", DType::kF32, {-1}, data}}, {}},
      {"overflow", {{"x", DType::kF64, {int64_t{1} << 62, 4}, data}}, {}},
      {"null data", {{"x", DType::kF32, {4}, nullptr}}, {}},
      {"invalid UTF-8 name", {{"bad\xff", DType::kF32, {1}, data}}, {}},
      {"invalid UTF-8 metadata",
       {{"x", DType::kF32, {1}, data}},
       {{"k", "\xc0\xaf"}}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const absl::Status status = WriteSafetensors(path, c.entries, c.metadata);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  }
  EXPECT_TRUE(ListFolder(folder).empty());
}

// ---- Corrupt files ----

TEST(SafetensorsTest, CorruptFilesAreDataLoss) {
  const std::string f32x2 = std::string(8, '\x11');
  struct Case {
    const char* what;
    std::string bytes;
    const char* message;  // a piece the error must contain
  };
  std::string huge_length(8, '\xff');
  std::string past_end = MakeFile("{}", "");
  past_end[0] = 11;
  std::string deep = "{\"__metadata__\":";
  deep += std::string(100000, '[') + std::string(100000, ']') + "}";
  const std::vector<Case> cases = {
      {"empty", "", "shorter"},
      {"short", "abc", "shorter"},
      {"length too large", huge_length, "exceeds"},
      {"length past the end", past_end, "past the end"},
      {"not an object", MakeFile("[]", ""), "start with '{'"},
      {"leading space", MakeFile(" {}", ""), "start with '{'"},
      {"empty header", MakeFile("", ""), "start with '{'"},
      {"truncated JSON", MakeFile("{\"a\":", ""), "JSON"},
      {"missing brace",
       MakeFile("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,"
                "8]}",
                f32x2),
       "JSON"},
      {"trailing garbage", MakeFile("{} x", ""), "data after the value"},
      {"invalid UTF-8", MakeFile("{\"\xff\":1}", ""), "UTF-8"},
      {"raw newline in a string", MakeFile("{\"a\nb\":1}", ""), "control"},
      {"lone surrogate", MakeFile("{\"\\ud800\":1}", ""), "surrogate"},
      {"bad escape", MakeFile("{\"\\x41\":1}", ""), "escape"},
      {"leading zero",
       MakeFile("{\"a\":{\"dtype\":\"F32\",\"shape\":[02],\"data_offsets\":[0,"
                "8]}}",
                f32x2),
       "JSON"},
      {"too deep", MakeFile(deep, ""), "deep"},
      {"unknown dtype",
       MakeFile("{\"a\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,"
                "8]}}",
                f32x2),
       "unsupported dtype 'U8'"},
      {"dtype not a string",
       MakeFile("{\"a\":{\"dtype\":4,\"shape\":[2],\"data_offsets\":[0,8]}}",
                f32x2),
       "dtype"},
      {"missing field",
       MakeFile("{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", f32x2),
       "needs dtype, shape and data_offsets"},
      {"duplicate field",
       MakeFile("{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[2],"
                "\"data_offsets\":[0,8]}}",
                f32x2),
       "duplicate field"},
      {"tensor not an object", MakeFile("{\"a\":[1]}", ""), "not an object"},
      {"negative dim",
       MakeFile("{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,"
                "8]}}",
                f32x2),
       "shape"},
      {"fractional dim",
       MakeFile("{\"a\":{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,"
                "8]}}",
                f32x2),
       "shape"},
      {"exponent dim",
       MakeFile("{\"a\":{\"dtype\":\"F32\",\"shape\":[2e0],\"data_offsets\":[0,"
                "8]}}",
                f32x2),
       "shape"},
      {"dim past int64",
       MakeFile("{\"a\":{\"dtype\":\"F32\",\"shape\":[99999999999999999999],"
                "\"data_offsets\":[0,8]}}",
                f32x2),
       "shape"},
      {"shape overflow",
       MakeFile("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,"
                "4],\"data_offsets\":[0,8]}}",
                f32x2),
       "overflows"},
      {"offsets not a pair",
       MakeFile("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,"
                "8,8]}}",
                f32x2),
       "data_offsets"},
      {"offsets out of range",
       MakeFile("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,"
                "16]}}",
                f32x2),
       "outside the data"},
      {"offsets reversed",
       MakeFile("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,"
                "0]}}",
                f32x2),
       "outside the data"},
      {"size mismatch",
       MakeFile("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,"
                "8]}}",
                f32x2),
       "take 12"},
      {"overlap",
       MakeFile("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,"
                "8]},\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":"
                "[4,12]}}",
                std::string(12, '\0')),
       "overlaps"},
      {"hole",
       MakeFile("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,"
                "8]},\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":"
                "[12,20]}}",
                std::string(20, '\0')),
       "hole"},
      {"uncovered tail",
       MakeFile("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,"
                "8]}}",
                std::string(9, '\0')),
       "cover 8 of the 9"},
      {"duplicate name",
       MakeFile("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,"
                "4]},\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":"
                "[4,8]}}",
                f32x2),
       "twice"},
      {"metadata not strings", MakeFile("{\"__metadata__\":{\"k\":1}}", ""),
       "not a string"},
      {"metadata not an object", MakeFile("{\"__metadata__\":\"x\"}", ""),
       "not an object"},
      {"duplicate metadata",
       MakeFile("{\"__metadata__\":{},\"__metadata__\":{}}", ""), "duplicate"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const absl::Status status = SafetensorsFile::Parse(c.bytes).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
    EXPECT_NE(status.message().find(c.message), std::string::npos) << status;
  }
}

TEST(SafetensorsTest, ReadErrorsNameThePath) {
  const std::string folder = MakeTempFolder();
  const std::string missing = folder + "/missing.safetensors";
  absl::Status status = SafetensorsFile::Read(missing).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << status;
  EXPECT_NE(status.message().find(missing), std::string::npos) << status;
  EXPECT_FALSE(SafetensorsFile::Read(folder).ok());
  const std::string corrupt = folder + "/corrupt.safetensors";
  ASSERT_OK(WriteFileAtomically(corrupt, MakeFile("{\"a\":", "")));
  status = SafetensorsFile::Read(corrupt).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_NE(status.message().find(corrupt), std::string::npos) << status;
}

// ---- Fuzz ----

// Every truncation of a valid file is refused (the tensors must cover the data
// to its end); random byte changes, half of them aimed at the header, give
// either a file whose views all lie within it or an error, never a crash.
TEST(SafetensorsTest, TruncationsAndByteFlipsNeverCrash) {
  const std::string folder = MakeTempFolder();
  const std::string path = folder + "/fuzz.safetensors";
  const uint64_t seed = test::TestSeed();
  const std::vector<Source> sources = Sources(seed);
  ASSERT_OK(WriteSafetensors(path, EntriesOf(sources),
                             {{"step", "7"}, {"escape\"d", "v\\al"}}));
  const std::string valid = ReadFile(path);
  ASSERT_TRUE(SafetensorsFile::Parse(valid).ok());
  uint64_t n = 0;
  for (int k = 7; k >= 0; --k) n = (n << 8) | static_cast<uint8_t>(valid[k]);
  const size_t header_end = 8 + n;

  for (size_t size = 0; size < valid.size(); ++size) {
    const absl::Status status =
        SafetensorsFile::Parse(valid.substr(0, size)).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss)
        << "truncated to " << size << ": " << status;
  }

  std::mt19937_64 engine(seed + 1);
  int accepted = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::string bytes = valid;
    const int changes = 1 + static_cast<int>(engine() % 4);
    for (int k = 0; k < changes; ++k) {
      const size_t limit = engine() % 2 == 0 ? header_end : bytes.size();
      const size_t at = engine() % limit;
      // Half flip one bit, half write a byte JSON cares about.
      static constexpr char kInteresting[] = "{}[]\",:0123456789-.eE\\u \xff";
      if (engine() % 2 == 0) {
        bytes[at] = static_cast<char>(bytes[at] ^ (1u << (engine() % 8)));
      } else {
        bytes[at] = kInteresting[engine() % (sizeof(kInteresting) - 1)];
      }
    }
    auto file = SafetensorsFile::Parse(bytes);
    if (!file.ok()) {
      EXPECT_EQ(file.status().code(), absl::StatusCode::kDataLoss)
          << file.status();
      continue;
    }
    ++accepted;
    for (const std::string& name : file->names()) {
      auto view = file->Find(name);
      ASSERT_TRUE(view.ok()) << view.status();
      int64_t count = DTypeSize(view->dtype);
      for (int64_t d : view->shape) count *= d;
      EXPECT_EQ(static_cast<int64_t>(view->bytes.size()), count);
    }
  }
  // Changes in the data bytes leave a valid file: some trials pass.
  EXPECT_GT(accepted, 0);
}

}  // namespace
}  // namespace lossrt
