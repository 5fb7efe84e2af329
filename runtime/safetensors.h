// Checkpoints in the safetensors format (https://github.com/huggingface/
// safetensors), readable by Python's `safetensors` and `json`, written
// atomically; and the atomic file write they use.
//
//   // Host data: a contiguous row-major [vocab, channels] f32 array.
//   std::vector<lossrt::SafetensorsEntry> entries = {
//       {"wte", lossrt::DType::kF32, {vocab, channels}, host_wte}};
//   RETURN_IF_ERROR(lossrt::WriteSafetensors("model.safetensors", entries,
//                                            {{"step", "1000"}}));
//   ASSIGN_OR_RETURN(lossrt::SafetensorsFile file,
//                    lossrt::SafetensorsFile::Read("model.safetensors"));
//   ASSIGN_OR_RETURN(lossrt::SafetensorsFile::View wte, file.Find("wte"));
//
// The format: an 8-byte little-endian header length N; N bytes of a UTF-8 JSON
// object mapping each tensor name to {"dtype": "F32", "shape": [2, 3],
// "data_offsets": [begin, end]} (byte offsets into the data that follows),
// with an optional "__metadata__" object of string values; then the data,
// every byte of it belonging to exactly one tensor (no holes, no overlaps).
// Supported dtypes: F64, F32, F16, BF16, I64, I32 (little-endian, row-major).
//
// What WriteSafetensors writes: compact JSON ("__metadata__" first when there
// is metadata, then the tensors in the order given, names and values escaped),
// padded with spaces to a multiple of 8 bytes as the reference writer does;
// the data laid out by decreasing element size (then in the order given), so
// that every tensor starts aligned to its element size in the file.
//
// Errors of SafetensorsFile::Read: NotFound when the file does not exist,
// FailedPrecondition when the path is not a regular file, another
// errno-derived status when it cannot be read, and DataLossError for
// every defect of the contents (too short, header length past the end, header
// not valid UTF-8 or JSON, not an object, a dtype this library does not
// support, shapes or offsets that are malformed, overflow, disagree with the
// dtype and shape, overlap, leave holes or run past the data, duplicate
// names). The message names the tensor at fault. A corrupt file never crashes
// the reader.
#ifndef LOSSRT_RUNTIME_SAFETENSORS_H_
#define LOSSRT_RUNTIME_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "runtime/dtype.h"
#include "runtime/tensor.h"

namespace lossrt {

// Writes `contents` to `path` atomically: a new temporary file in the same
// folder, written in full, fsync'ed, then renamed over `path` (and the folder
// fsync'ed), so that readers see the old file or the new one, never a part.
// The temporary file is removed on failure. New files get mode 0666 less the
// umask.
absl::Status WriteFileAtomically(const std::string& path,
                                 absl::string_view contents);

// One tensor to write: `data` points to the host bytes of a contiguous
// row-major tensor of `shape` and `dtype` (may be null when it has no
// elements).
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kF32;
  Shape shape;
  const void* data = nullptr;
};

// Writes `entries` and `metadata` to `path` in the safetensors format (see
// above), atomically. InvalidArgument for empty, duplicate or non-UTF-8 names,
// the reserved name "__metadata__", negative dims, sizes that overflow, null
// data or non-UTF-8 metadata; nothing is written then.
absl::Status WriteSafetensors(
    const std::string& path, absl::Span<const SafetensorsEntry> entries,
    const std::map<std::string, std::string>& metadata);

// The safetensors name of a dtype ("F32", "BF16", ...).
const char* SafetensorsDTypeName(DType dtype);

// A whole safetensors file read into memory and validated.
class SafetensorsFile {
 public:
  // Reads and validates the file at `path` (errors: see above).
  static absl::StatusOr<SafetensorsFile> Read(const std::string& path);
  // Validates `contents`, the bytes of a safetensors file, and keeps them.
  static absl::StatusOr<SafetensorsFile> Parse(std::string contents);

  // The tensors' names in the order the header lists them.
  std::vector<std::string> names() const;
  const std::map<std::string, std::string>& metadata() const {
    return metadata_;
  }

  // A tensor's dtype, shape and bytes (valid while the file object lives; the
  // bytes are aligned to the element size in files WriteSafetensors wrote, not
  // necessarily in others).
  struct View {
    DType dtype;
    Shape shape;
    absl::Span<const uint8_t> bytes;
  };
  // NotFound naming the tensor when the file has none of that name.
  absl::StatusOr<View> Find(absl::string_view name) const;

 private:
  struct Entry {
    std::string name;
    DType dtype;
    Shape shape;
    int64_t begin = 0;  // byte offsets into contents_, data start included
    int64_t end = 0;
  };
  SafetensorsFile() = default;

  std::string contents_;
  std::vector<Entry> entries_;
  absl::flat_hash_map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace lossrt

#endif  // LOSSRT_RUNTIME_SAFETENSORS_H_
