// Fuzz target of the safetensors reader (runtime/safetensors.h): any bytes
// are either refused with DataLossError or accepted as a file whose views lie
// inside it, take the bytes their dtype and shape say, tile the data exactly,
// and survive a write and read back unchanged (names, order, dtypes, shapes,
// bytes, metadata).
#include <algorithm>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "fuzz/fuzz_util.h"
#include "runtime/dtype.h"
#include "runtime/safetensors.h"

namespace lossrt {
namespace {

void CheckRoundTrip(const SafetensorsFile& file,
                    const std::vector<SafetensorsFile::View>& views) {
  const std::vector<std::string> names = file.names();
  std::vector<SafetensorsEntry> entries;
  for (size_t i = 0; i < names.size(); ++i) {
    // The writer refuses empty names, which other writers' files may hold.
    if (names[i].empty()) return;
    entries.push_back(
        {names[i], views[i].dtype, views[i].shape,
         views[i].bytes.empty() ? nullptr : views[i].bytes.data()});
  }
  const std::string path = fuzz::ScratchPath("round_trip.safetensors");
  FUZZ_CHECK_OK(WriteSafetensors(path, entries, file.metadata()));
  absl::StatusOr<SafetensorsFile> again = SafetensorsFile::Read(path);
  FUZZ_CHECK_OK(again.status());
  FUZZ_CHECK(again->names() == names);
  FUZZ_CHECK(again->metadata() == file.metadata());
  for (size_t i = 0; i < names.size(); ++i) {
    absl::StatusOr<SafetensorsFile::View> view = again->Find(names[i]);
    FUZZ_CHECK_OK(view.status());
    FUZZ_CHECK(view->dtype == views[i].dtype);
    FUZZ_CHECK(view->shape == views[i].shape);
    FUZZ_CHECK(view->bytes.size() == views[i].bytes.size());
    FUZZ_CHECK(std::equal(view->bytes.begin(), view->bytes.end(),
                          views[i].bytes.begin()));
  }
}

}  // namespace
}  // namespace lossrt

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using lossrt::SafetensorsFile;
  const std::string contents(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Parse(contents);
  if (!file.ok()) {
    FUZZ_CHECK(file.status().code() == absl::StatusCode::kDataLoss);
    return 0;
  }
  // The data starts after the 8-byte length and the header it gives.
  uint64_t header = 0;
  for (int k = 7; k >= 0; --k) header = (header << 8) | data[k];
  FUZZ_CHECK(header <= size - 8);
  const uint64_t data_start = 8 + header;

  const std::vector<std::string> names = file->names();
  std::vector<SafetensorsFile::View> views;
  for (const std::string& name : names) {
    absl::StatusOr<SafetensorsFile::View> view = file->Find(name);
    FUZZ_CHECK_OK(view.status());
    int64_t expected = lossrt::DTypeSize(view->dtype);
    for (const int64_t d : view->shape) {
      FUZZ_CHECK(d >= 0);
      FUZZ_CHECK(!__builtin_mul_overflow(expected, d, &expected));
    }
    FUZZ_CHECK(static_cast<int64_t>(view->bytes.size()) == expected);
    views.push_back(*view);
  }
  // The non-empty views, in the order of their bytes (all in the reader's one
  // copy of the file), follow each other and spell out the data exactly.
  std::vector<absl::Span<const uint8_t>> spans;
  for (const auto& view : views) {
    if (!view.bytes.empty()) spans.push_back(view.bytes);
  }
  std::sort(spans.begin(), spans.end(), [](const auto& a, const auto& b) {
    return reinterpret_cast<uintptr_t>(a.data()) <
           reinterpret_cast<uintptr_t>(b.data());
  });
  std::string tiled;
  for (size_t i = 0; i < spans.size(); ++i) {
    if (i > 0) {
      FUZZ_CHECK(reinterpret_cast<uintptr_t>(spans[i].data()) ==
                 reinterpret_cast<uintptr_t>(spans[i - 1].data()) +
                     spans[i - 1].size());
    }
    tiled.append(reinterpret_cast<const char*>(spans[i].data()),
                 spans[i].size());
  }
  FUZZ_CHECK(tiled == contents.substr(data_start));
  // Names are unique, and one that is not there (no JSON string decodes to
  // this invalid UTF-8) is NotFound.
  FUZZ_CHECK(std::set<std::string>(names.begin(), names.end()).size() ==
             names.size());
  FUZZ_CHECK(file->Find("\xff not a valid name").status().code() ==
             absl::StatusCode::kNotFound);
  lossrt::CheckRoundTrip(*file, views);
  return 0;
}
