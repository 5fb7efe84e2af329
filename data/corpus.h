// Reading a text corpus: one text file, or every text file of a folder
// (recursively, in sorted path order), joined into one string. Fortune files
// (Debian's /usr/share/games/fortunes, the project's default corpus) are
// recognized and their "%" separator lines removed.
//
//   using lossrt::data::kDefaultCorpus;  // /usr/share/games/fortunes
//   ASSIGN_OR_RETURN(std::string text,
//                    lossrt::data::ReadTextCorpus(kDefaultCorpus));
//
// Rules:
//  - A folder contributes its regular files whose name has no extension or
//    ends in ".txt" (any case). Skipped: symlinks (Debian's ".u8" links),
//    names starting with "." and other extensions (fortune ".dat" indexes,
//    archives, ...). Subfolders are walked (symlinked ones are not).
//  - A file named directly is read whatever its name (a symlink is followed).
//  - Every file read must be text: no NUL byte and well-formed UTF-8. Else
//    InvalidArgument names the file and the byte offset.
//  - A fortune file (by default: a file with a "<name>.dat" index next to it)
//    is a list of entries separated by lines holding only "%" (or "%\r"):
//    those lines go, blank entries go, each entry loses its leading blank
//    lines and trailing whitespace and ends with one newline, and entries are
//    separated by one blank line.
//  - Each file's text ends with a newline; files are separated by one blank
//    line. Empty files are skipped in folders.
//  - A missing path is NotFound; a corpus with no text (an empty file, a
//    folder with no non-empty text file) is InvalidArgument.
#ifndef LOSSRT_DATA_CORPUS_H_
#define LOSSRT_DATA_CORPUS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace lossrt {
namespace data {

// The project's default corpus (Debian's fortune-mod data).
inline constexpr char kDefaultCorpus[] = "/usr/share/games/fortunes";

enum class FortuneFormat {
  kAuto,    // a file is a fortune file when "<file>.dat" exists next to it
  kAlways,  // every file is a fortune file
  kNever,   // files are plain text
};

struct CorpusOptions {
  FortuneFormat fortune_format = FortuneFormat::kAuto;
};

// The files ReadTextCorpus reads for `path`, in order: `path` itself when it
// is a file, else the text files under the folder (rules above), sorted.
absl::StatusOr<std::vector<std::string>> ListCorpusFiles(
    const std::string& path);

// The corpus at `path` (a file or a folder) as one string (rules above).
absl::StatusOr<std::string> ReadTextCorpus(
    const std::string& path, const CorpusOptions& options = CorpusOptions());

// The text of a fortune file without its "%" lines (rules above). Exposed for
// tests.
std::string StripFortuneSeparators(absl::string_view text);

}  // namespace data
}  // namespace lossrt

#endif  // LOSSRT_DATA_CORPUS_H_
