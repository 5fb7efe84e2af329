// train_lm: trains a small GPT-style language model end to end — reads a text
// corpus (Debian's fortunes by default) or llm.c token shards, trains or loads
// a byte-level BPE tokenizer, trains with AdamW and the fused linear
// cross-entropy head, evaluates on a held-out split (loss and next-token
// accuracy, from the head's one pass), writes safetensors checkpoints that
// resume exactly, and samples text.
//
//   ./bazelw run -c opt //examples:train_lm                # the default run
//   ./bazelw run -c opt //examples:train_lm -- --steps=2000 --device=cuda
//       --checkpoint_dir=/tmp/ckpt --metrics=/tmp/metrics.jsonl
//   ./bazelw run -c opt //examples:train_lm -- --checkpoint_dir=/tmp/ckpt
//       --resume --steps=3000
//
// Model-size flags left at 0 pick a default that suits the device: a model
// that trains in a few minutes on two CPU cores, or a larger one on a GPU.
// Every flag is checked before anything runs: a value out of its range is an
// InvalidArgument error naming the flag, its value and what it accepts.
//
// The default corpus (no --data) is a data/fortunes folder in the binary's
// folder or a folder above it (tools/stage_gpu.sh stages one beside the GPU
// binaries), else Debian's /usr/share/games/fortunes.
//
// Data parallelism in one process: --ranks=N trains N copies of the model, one
// thread each (CPU: an in-process communicator group; CUDA: GPU i per rank
// over NCCL; --gpus=N is --ranks=N on CUDA), each on --batch / N rows of every
// global batch, with the gradients summed over the ranks; rank 0 alone prints,
// validates, samples, writes the metrics and the checkpoints.
// --force_communicator runs one rank through that same path (a 1-rank NCCL
// group on CUDA, a 1-rank in-process group on the CPU) instead of the plain
// one, so that the data-parallel trainer code runs on one device.
//
// Several processes (one host or several): --rank=R --world_size=W
// --coordinator=HOST:PORT (or RANK, WORLD_SIZE and LOSSRT_COORDINATOR or
// MASTER_ADDR + MASTER_PORT from the environment) makes this process rank R
// of W. On CUDA rank 0 publishes the NCCL unique id through the coordinator
// (runtime/coordinator.h) and every rank joins NCCL on GPU K + LOCAL_RANK; on
// the CPU the ranks talk over TCP (runtime/socket_communicator.h). A rank that
// dies or never arrives makes the others fail within --rank_timeout_s.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "data/batcher.h"
#include "data/bpe_tokenizer.h"
#include "data/corpus.h"
#include "data/shards.h"
#include "data/tokenizer.h"
#include "graph/gpt.h"
#include "graph/ops/attention.h"
#include "graph/sampling.h"
#include "graph/trainer.h"
#include "runtime/communicator.h"
#include "runtime/context.h"
#include "runtime/coordinator.h"
#include "runtime/cpu_communicator.h"
#include "runtime/device.h"
#include "runtime/nccl_communicator.h"
#include "runtime/socket_communicator.h"
#include "runtime/status.h"

ABSL_FLAG(std::string, data, "",
          "Training data: a text file, a folder of text files (fortune files "
          "are recognized), or llm.c token shards (a .bin file or a glob "
          "pattern ending in .bin). Empty: the default corpus: on a GPU a "
          "data/gpu_corpus folder (tools/make_gpu_corpus.sh: fortunes, package "
          "docs and manual pages, about 55 MB) in the binary's folder or one "
          "above it; else, or without one, a data/fortunes folder found the "
          "same way (tools/stage_gpu.sh stages both), else Debian's "
          "/usr/share/games/fortunes.");
ABSL_FLAG(std::string, tokenizer, "bpe",
          "'bpe' (train a byte-level BPE on the data), 'byte', or the path of "
          "a tokenizer file saved earlier. Ignored for token shards.");
ABSL_FLAG(int32_t, vocab, 0,
          "BPE vocabulary size to train, 256 to 2^20 (0: 4096 on the CPU, 8192 "
          "on a GPU).");
ABSL_FLAG(int32_t, layers, 0,
          "Transformer blocks, 1 to 1024 (0: device default).");
ABSL_FLAG(int32_t, heads, 0,
          "Attention heads, 1 to 1024, dividing the width (0: device "
          "default).");
ABSL_FLAG(int32_t, width, 0, "Model width, 1 to 65536 (0: device default).");
ABSL_FLAG(int32_t, context, 0,
          "Sequence length trained on, and the model's context, 1 to 2^20 (0: "
          "device default).");
ABSL_FLAG(std::string, norm, "layernorm", "layernorm or rmsnorm.");
ABSL_FLAG(std::string, mlp, "gelu", "gelu or swiglu.");
ABSL_FLAG(bool, tied, true, "Tie the head to the token embedding.");
ABSL_FLAG(std::string, head, "fused",
          "fused (linear cross-entropy, no logits) or unfused (full logits + "
          "cross-entropy).");
ABSL_FLAG(bool, lce_operand_dtype_logits, false,
          "With --head=fused and --dtype=bf16: the head's cross-entropy on "
          "bf16 logits where its plan runs token chunks, as PyTorch's bf16 "
          "head (LinearCrossEntropyOptions::operand_dtype_logits).");
ABSL_FLAG(int32_t, batch, 0,
          "Sequences per micro-batch, 1 to 65536 (0: device default).");
ABSL_FLAG(int32_t, micro_batches, 1,
          "Micro-batches per optimizer step, 1 to 65536.");
ABSL_FLAG(int32_t, ranks, 1,
          "Data-parallel ranks, 1 to 1024: one process, one thread per rank. "
          "Every rank trains a copy of the model on --batch / --ranks rows of "
          "each micro-batch of the global batch (--batch, which must be a "
          "multiple of it) and the gradients are summed over the ranks, so "
          "the weights stay the same everywhere and the losses are those of "
          "one rank with the whole batch. --device=cpu: in-process CPU ranks; "
          "CUDA: rank i on GPU K + i (K: cuda:K's ordinal, 0 for cuda) over "
          "NCCL. Rank 0 alone prints, validates (on the whole validation "
          "batch), samples, writes --metrics and saves checkpoints; --resume "
          "loads rank 0's checkpoint on every rank. For several processes "
          "see --world_size.");
ABSL_FLAG(int32_t, gpus, 0,
          "One process driving N GPUs: --gpus=N is --ranks=N on CUDA (--device "
          "auto with a GPU, cuda or cuda:K; GPUs K to K + N - 1), 1 to 1024 "
          "(0: see --ranks).");
ABSL_FLAG(bool, force_communicator, false,
          "One rank (--ranks=1 or --gpus=1) over a communicator anyway: the "
          "start-up of --ranks=N / --gpus=N with N = 1 (CUDA: a 1-rank NCCL "
          "group; the CPU: a 1-rank in-process group), so that the "
          "data-parallel code paths (bucketed all-reduce, --zero1's sharded "
          "AdamW) run on one device and can be checked against the plain "
          "run, whose losses they must give. Invalid with more than one rank "
          "(--ranks, --gpus or --world_size above 1), which always has a "
          "communicator.");
ABSL_FLAG(int32_t, rank, -1,
          "This process's rank of --world_size, 0 to --world_size - 1 (-1: "
          "the RANK environment variable, else 0).");
ABSL_FLAG(int32_t, world_size, 0,
          "Processes of a data-parallel run, 1 to 1024 (0: the WORLD_SIZE "
          "environment variable, else 1). Each process is one rank (with "
          "--ranks=1) and trains on its --batch / --world_size rows of every "
          "global batch; rank 0 prints, validates, samples and saves.");
ABSL_FLAG(std::string, coordinator, "",
          "HOST:PORT of rank 0 for --world_size > 1 (empty: "
          "LOSSRT_COORDINATOR, else MASTER_ADDR:MASTER_PORT from the "
          "environment). Rank 0 listens on PORT.");
ABSL_FLAG(int32_t, rank_timeout_s, 300,
          "Several processes: the seconds a rank waits for the others (to "
          "join, or in a collective) before it fails, 1 to 86400. It must "
          "exceed what rank 0 spends alone (validation, samples, "
          "checkpoints) between steps.");
ABSL_FLAG(double, bucket_mib, 25,
          "Data parallel: MiB of gradients per all-reduce bucket (> 0); each "
          "goes as soon as the backward has finished it.");
ABSL_FLAG(bool, zero1, false,
          "Data parallel: shard the AdamW moments over the ranks (ZeRO-1: "
          "reduce-scatter, update a shard, all-gather).");
ABSL_FLAG(double, single_device_tokens_per_s, 0,
          "Data parallel: the tokens/s of the same model and --batch / ranks "
          "rows on one device, as a run with --ranks=1 (or --gpus=1) and "
          "--batch / N printed it; given, the summary prints the scaling "
          "(tokens/s per rank over it). 0: the scaling is not printed, as "
          "nothing measured it.");
ABSL_FLAG(int32_t, steps, 0, "Optimizer steps in all (0: device default).");
ABSL_FLAG(double, lr, 0, "Peak learning rate, in (0, 1] (0: device default).");
ABSL_FLAG(double, min_lr_ratio, 0.1, "Final learning rate / peak, in [0, 1].");
ABSL_FLAG(int32_t, warmup, -1,
          "Warm-up steps, 0 to --steps (-1: 5% of the steps).");
ABSL_FLAG(double, weight_decay, 0.1, "AdamW decoupled weight decay (>= 0).");
ABSL_FLAG(double, grad_clip, 1.0, "Global gradient-norm clip (0: off).");
ABSL_FLAG(std::string, device, "auto", "auto, cpu, cuda or cuda:N.");
ABSL_FLAG(bool, cuda_graph, true,
          "GPU: replay each micro-batch's forward and backward from a CUDA "
          "graph (fewer launches; small models are launch-bound).");
ABSL_FLAG(std::string, attention, "auto",
          "GPU: the attention kernel, auto (the op's default), flash (ours), "
          "cudnn (cuDNN's fused attention) or cublas.");
ABSL_FLAG(bool, attention_deterministic, true,
          "GPU: cuDNN's deterministic attention backward (false: its atomic "
          "dQ, PyTorch's default; a run's bits then vary from run to run).");
ABSL_FLAG(std::string, dtype, "auto",
          "Activations: auto (bf16 on a GPU, f32 on the CPU), f32 or bf16.");
ABSL_FLAG(uint64_t, seed, 1337, "Seed of the initialization and batches.");
ABSL_FLAG(double, val_fraction, 0.05,
          "Share of the tokens held out, in [0, 1) (0: no validation).");
ABSL_FLAG(int32_t, eval_interval, 0,
          "Steps between validation losses (0: 10 evaluations a run).");
ABSL_FLAG(int32_t, eval_batches, 8, "Validation batches per evaluation.");
ABSL_FLAG(int32_t, log_interval, 0, "Steps between progress lines (0: auto).");
ABSL_FLAG(std::string, checkpoint_dir, "",
          "Folder for checkpoints (empty: none are written).");
ABSL_FLAG(int32_t, checkpoint_interval, 0,
          "Steps between checkpoints (0: only at the end).");
ABSL_FLAG(int32_t, keep_checkpoints, 3,
          "Checkpoints kept in --checkpoint_dir: after each save the older "
          "step-N folders go, and so do the temporary folders of interrupted "
          "saves; nothing else there is touched (0: keep all).");
ABSL_FLAG(bool, resume, false,
          "Continue from the latest checkpoint in --checkpoint_dir.");
ABSL_FLAG(int32_t, stop_at_step, 0,
          "Stop after this step, 1 to --steps (as if interrupted; 0: run all "
          "--steps). The schedule still spans --steps, so a --resume continues "
          "exactly.");
ABSL_FLAG(int32_t, sample_length, 200, "Tokens sampled at the end (0: none).");
ABSL_FLAG(int32_t, sample_interval, 0, "Steps between samples (0: end only).");
ABSL_FLAG(double, temperature, 0.8, "Sampling temperature (0: greedy).");
ABSL_FLAG(int32_t, top_k, 40, "Sample from the k likeliest tokens (0: all).");
ABSL_FLAG(std::string, prompt, "\n", "Text the samples start from.");
ABSL_FLAG(std::string, metrics, "",
          "Write JSON lines {step, loss, val_loss, val_accuracy, "
          "tokens_per_s, train_s, eval_s} here, one per progress line and one "
          "for the step-0 validation (loss, tokens_per_s and train_s null). "
          "val_accuracy is the share of validation tokens whose most likely "
          "next token is the target, in [0, 1] (null, as val_loss, without a "
          "validation). tokens_per_s and train_s count training only, since "
          "the previous line; eval_s is the time of this line's validation "
          "(null: none).");

namespace lossrt {
namespace {

namespace fs = std::filesystem;
using graph::Gpt;
using graph::GptConfig;
using graph::Trainer;

constexpr char kTokenizerFile[] = "tokenizer.txt";

// Sizes that differ between a CPU run (minutes on two cores) and a GPU run (a
// 200M-parameter model for a minute or two on the GPU corpus: about 1.7
// passes over its training tokens, where the validation loss still falls).
struct RunDefaults {
  int layers, heads, width, context, batch, steps, vocab;
  double lr;
};

RunDefaults DefaultsFor(const Device& device) {
  if (device.is_cuda()) return {16, 16, 1024, 512, 32, 1500, 8192, 5e-4};
  return {4, 4, 128, 64, 16, 500, 4096, 2e-3};
}

int Pick(int flag, int fallback) { return flag > 0 ? flag : fallback; }

std::string HumanDuration(double seconds) {
  if (!(seconds >= 0) || seconds > 1e7) return "?";
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600) return absl::StrFormat("%dh%02dm", s / 3600, s / 60 % 60);
  if (s >= 60) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrFormat("%ds", s);
}

std::string HumanBytes(int64_t bytes) {
  if (bytes >= (int64_t{1} << 30)) {
    return absl::StrFormat("%.2f GiB", bytes / double(int64_t{1} << 30));
  }
  return absl::StrFormat("%.1f MiB", bytes / double(1 << 20));
}

std::string Printable(const std::string& text) {
  return absl::StrReplaceAll(text, {{"\t", "    "}});
}

absl::StatusOr<Device> ChooseDevice(const std::string& flag) {
  if (flag == "auto") return DefaultDevice();
  return ParseDevice(flag);
}

bool IsShardData(const std::string& path) {
  return absl::EndsWith(path, ".bin");
}

// The tokenizer: from a resumed checkpoint, a saved file, bytes, or trained
// on the text.
absl::StatusOr<std::unique_ptr<data::Tokenizer>> MakeTokenizer(
    const std::string& text, int vocab, const std::string& resume_folder) {
  const std::string choice = absl::GetFlag(FLAGS_tokenizer);
  if (!resume_folder.empty() &&
      fs::exists(fs::path(resume_folder) / kTokenizerFile)) {
    return data::LoadTokenizer(
        (fs::path(resume_folder) / kTokenizerFile).string());
  }
  if (choice == "byte") return std::make_unique<data::ByteTokenizer>();
  if (choice != "bpe") return data::LoadTokenizer(choice);
  const auto start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(data::BpeTokenizer bpe,
                   data::BpeTokenizer::Train(text, vocab));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  std::printf("tokenizer: trained a byte-level BPE of %d tokens in %.1f s\n",
              bpe.vocab_size(), seconds);
  return std::unique_ptr<data::Tokenizer>(
      std::make_unique<data::BpeTokenizer>(std::move(bpe)));
}

// A JSON number with `digits` decimals, or null.
std::string JsonNumber(std::optional<double> value, int digits) {
  return value ? absl::StrFormat("%.*f", digits, *value) : "null";
}

// One line of the --metrics file (see the flag's help).
struct MetricsLine {
  int64_t step = 0;
  std::optional<double> loss, val_loss, val_accuracy, tokens_per_s, train_s,
      eval_s;
};

// The line is formatted by Abseil and written as one string, with no numeric
// operator<< on the stream: on the GPU machine the staged binary's stream went
// bad at its first number (badbit, no errno; the file held `{"step": `), on
// --device=cpu and cuda alike, while the same binary's runs here do not; the
// cause there is not known.
absl::Status WriteMetricsLine(std::ofstream& out, const MetricsLine& line) {
  out << absl::StrCat("{\"step\": ", line.step,
                      ", \"loss\": ", JsonNumber(line.loss, 6),
                      ", \"val_loss\": ", JsonNumber(line.val_loss, 6),
                      ", \"val_accuracy\": ", JsonNumber(line.val_accuracy, 6),
                      ", \"tokens_per_s\": ", JsonNumber(line.tokens_per_s, 1),
                      ", \"train_s\": ", JsonNumber(line.train_s, 6),
                      ", \"eval_s\": ", JsonNumber(line.eval_s, 6), "}\n");
  errno = 0;
  out.flush();
  if (!out) {
    return absl::InternalError(absl::StrCat(
        "writing the metrics file failed (",
        errno != 0 ? std::strerror(errno) : "no errno",
        out.bad() ? ", badbit" : "", out.fail() ? ", failbit" : "", ")"));
  }
  return absl::OkStatus();
}

// ---- Flag checks: each error names the flag, its value and what it takes ----

constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();
constexpr double kMaxFloat = std::numeric_limits<float>::max();
constexpr int64_t kMaxRanks = 1024;

absl::Status BadFlag(absl::string_view name, absl::string_view value,
                     absl::string_view allowed) {
  return InvalidArgument("--", name, "=", value, " is invalid: want ", allowed);
}

// `value` in [lo, hi], or 0 when `zero` (what 0 means) is given.
absl::Status CheckInt(absl::string_view name, int64_t value, int64_t lo,
                      int64_t hi, const char* zero = nullptr) {
  if ((value >= lo && value <= hi) || (zero != nullptr && value == 0)) {
    return absl::OkStatus();
  }
  return BadFlag(
      name, absl::StrCat(value),
      absl::StrCat(zero != nullptr ? absl::StrCat("0 (", zero, ") or ") : "",
                   "an integer in [", lo, ", ", hi, "]"));
}

enum class Ends { kClosed, kOpenBelow, kOpenAbove };

// A finite `value` in [lo, hi] (open at one end by `ends`), or 0 when `zero`
// (what 0 means) is given. hi = kMaxFloat: no upper bound but finiteness.
absl::Status CheckReal(absl::string_view name, double value, double lo,
                       double hi, Ends ends = Ends::kClosed,
                       const char* zero = nullptr) {
  const bool above_lo = ends == Ends::kOpenBelow ? value > lo : value >= lo;
  const bool below_hi = ends == Ends::kOpenAbove ? value < hi : value <= hi;
  // NaN fails both comparisons; infinities fail one.
  if ((above_lo && below_hi) || (zero != nullptr && value == 0)) {
    return absl::OkStatus();
  }
  std::string range;
  if (hi == kMaxFloat) {
    range = absl::StrCat("a finite number ",
                         ends == Ends::kOpenBelow ? "> " : ">= ", lo);
  } else {
    range = absl::StrCat("a finite number in ",
                         ends == Ends::kOpenBelow ? "(" : "[", lo, ", ", hi,
                         ends == Ends::kOpenAbove ? ")" : "]");
  }
  return BadFlag(
      name, absl::StrCat(value),
      absl::StrCat(zero != nullptr ? absl::StrCat("0 (", zero, ") or ") : "",
                   range));
}

absl::Status CheckChoice(absl::string_view name, const std::string& value,
                         std::initializer_list<const char*> choices) {
  for (const char* choice : choices) {
    if (value == choice) return absl::OkStatus();
  }
  return BadFlag(name, absl::StrCat("'", value, "'"),
                 absl::StrCat("one of ", absl::StrJoin(choices, ", ")));
}

// The checks that need no device: run before anything else.
// This process's place in a run of several processes: the flags, else the
// environment (RANK, WORLD_SIZE, LOSSRT_COORDINATOR or MASTER_ADDR and
// MASTER_PORT, as torchrun sets them).
struct ProcessGroup {
  int rank = 0;
  int world_size = 1;
  std::string coordinator;  // HOST:PORT, for world_size > 1
};

absl::StatusOr<int> IntFromEnvironment(const char* name, int fallback) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  int value = 0;
  if (!absl::SimpleAtoi(text, &value)) {
    return InvalidArgument("the environment's ", name, "=", text,
                           " is not an integer");
  }
  return value;
}

absl::StatusOr<ProcessGroup> ResolveProcessGroup() {
  ProcessGroup group;
  group.world_size = absl::GetFlag(FLAGS_world_size);
  if (group.world_size == 0) {
    ASSIGN_OR_RETURN(group.world_size, IntFromEnvironment("WORLD_SIZE", 1));
  }
  if (group.world_size < 1 || group.world_size > kMaxRanks) {
    return BadFlag(
        "world_size", absl::StrCat(group.world_size),
        absl::StrCat("1 to ", kMaxRanks, " (0: WORLD_SIZE, else 1)"));
  }
  group.rank = absl::GetFlag(FLAGS_rank);
  if (group.rank < 0) {
    ASSIGN_OR_RETURN(group.rank, IntFromEnvironment("RANK", 0));
  }
  if (group.rank < 0 || group.rank >= group.world_size) {
    return BadFlag(
        "rank", absl::StrCat(group.rank),
        absl::StrCat("0 to --world_size - 1 = ", group.world_size - 1));
  }
  group.coordinator = absl::GetFlag(FLAGS_coordinator);
  if (group.coordinator.empty()) {
    const char* coordinator = std::getenv("LOSSRT_COORDINATOR");
    const char* host = std::getenv("MASTER_ADDR");
    const char* port = std::getenv("MASTER_PORT");
    if (coordinator != nullptr && *coordinator != '\0') {
      group.coordinator = coordinator;
    } else if (host != nullptr && port != nullptr) {
      group.coordinator = absl::StrCat(host, ":", port);
    }
  }
  if (group.world_size > 1) {
    absl::Status parsed = ParseCoordinatorAddress(group.coordinator).status();
    if (!parsed.ok()) {
      return BadFlag(
          "coordinator", group.coordinator,
          absl::StrCat("HOST:PORT of rank 0 with --world_size=",
                       group.world_size, " (", parsed.message(), ")"));
    }
    if (absl::GetFlag(FLAGS_ranks) != 1 || absl::GetFlag(FLAGS_gpus) > 1) {
      return BadFlag("world_size", absl::StrCat(group.world_size),
                     "1 with --ranks or --gpus above 1 (one rank per "
                     "process)");
    }
  }
  return group;
}

absl::Status CheckFlags() {
  using absl::GetFlag;
  if (GetFlag(FLAGS_tokenizer).empty()) {
    return BadFlag("tokenizer", "''",
                   "bpe, byte or the path of a saved tokenizer file");
  }
  RETURN_IF_ERROR(CheckInt("vocab", GetFlag(FLAGS_vocab), 256,
                           data::kMaxBpeVocabSize, "the device default"));
  RETURN_IF_ERROR(
      CheckInt("layers", GetFlag(FLAGS_layers), 1, 1024, "the device default"));
  RETURN_IF_ERROR(
      CheckInt("heads", GetFlag(FLAGS_heads), 1, 1024, "the device default"));
  RETURN_IF_ERROR(CheckInt("width", GetFlag(FLAGS_width), 1, 1 << 16,
                           "the device default"));
  RETURN_IF_ERROR(CheckInt("context", GetFlag(FLAGS_context), 1, 1 << 20,
                           "the device default"));
  RETURN_IF_ERROR(
      CheckChoice("norm", GetFlag(FLAGS_norm), {"layernorm", "rmsnorm"}));
  RETURN_IF_ERROR(CheckChoice("mlp", GetFlag(FLAGS_mlp), {"gelu", "swiglu"}));
  RETURN_IF_ERROR(CheckChoice("attention", GetFlag(FLAGS_attention),
                              {"auto", "flash", "cudnn", "cublas"}));
  if (const absl::Status built = ops::AttentionKernelBuilt(
          *ops::ParseAttentionKernel(GetFlag(FLAGS_attention)));
      !built.ok()) {
    return InvalidArgument("--attention=", GetFlag(FLAGS_attention), ": ",
                           built.message());
  }
  RETURN_IF_ERROR(
      CheckChoice("head", GetFlag(FLAGS_head), {"fused", "unfused"}));
  RETURN_IF_ERROR(CheckInt("batch", GetFlag(FLAGS_batch), 1, 1 << 16,
                           "the device default"));
  RETURN_IF_ERROR(
      CheckInt("micro_batches", GetFlag(FLAGS_micro_batches), 1, 1 << 16));
  RETURN_IF_ERROR(CheckInt("ranks", GetFlag(FLAGS_ranks), 1, kMaxRanks));
  RETURN_IF_ERROR(
      CheckInt("rank_timeout_s", GetFlag(FLAGS_rank_timeout_s), 1, 86400));
  if (!(GetFlag(FLAGS_bucket_mib) > 0) ||
      !std::isfinite(GetFlag(FLAGS_bucket_mib))) {
    return BadFlag("bucket_mib", absl::StrCat(GetFlag(FLAGS_bucket_mib)),
                   "a finite number of MiB > 0");
  }
  if (!(GetFlag(FLAGS_single_device_tokens_per_s) >= 0) ||
      !std::isfinite(GetFlag(FLAGS_single_device_tokens_per_s))) {
    return BadFlag("single_device_tokens_per_s",
                   absl::StrCat(GetFlag(FLAGS_single_device_tokens_per_s)),
                   "a finite tokens/s >= 0");
  }
  RETURN_IF_ERROR(
      CheckInt("gpus", GetFlag(FLAGS_gpus), 1, kMaxRanks, "use --ranks"));
  if (GetFlag(FLAGS_gpus) > 0 && GetFlag(FLAGS_ranks) != 1 &&
      GetFlag(FLAGS_ranks) != GetFlag(FLAGS_gpus)) {
    return BadFlag("gpus", absl::StrCat(GetFlag(FLAGS_gpus)),
                   absl::StrCat("0 or --ranks = ", GetFlag(FLAGS_ranks),
                                " (--gpus=N is --ranks=N on CUDA)"));
  }
  if (GetFlag(FLAGS_gpus) > 0 && GetFlag(FLAGS_device) == "cpu") {
    return BadFlag("gpus", absl::StrCat(GetFlag(FLAGS_gpus)),
                   "0 with --device=cpu (use --ranks)");
  }
  RETURN_IF_ERROR(CheckInt("steps", GetFlag(FLAGS_steps), 1, kMaxInt32,
                           "the device default"));
  RETURN_IF_ERROR(CheckReal("lr", GetFlag(FLAGS_lr), 0, 1, Ends::kOpenBelow,
                            "the device default"));
  RETURN_IF_ERROR(CheckReal("min_lr_ratio", GetFlag(FLAGS_min_lr_ratio), 0, 1));
  RETURN_IF_ERROR(
      CheckReal("weight_decay", GetFlag(FLAGS_weight_decay), 0, kMaxFloat));
  RETURN_IF_ERROR(CheckReal("grad_clip", GetFlag(FLAGS_grad_clip), 0, kMaxFloat,
                            Ends::kOpenBelow, "off"));
  const std::string device = GetFlag(FLAGS_device);
  absl::string_view ordinal = device;
  int n = 0;
  if (!(device == "auto" || device == "cpu" || device == "cuda" ||
        (absl::ConsumePrefix(&ordinal, "cuda:") && !ordinal.empty() &&
         std::all_of(ordinal.begin(), ordinal.end(), absl::ascii_isdigit) &&
         absl::SimpleAtoi(ordinal, &n)))) {
    return BadFlag("device", absl::StrCat("'", device, "'"),
                   "auto, cpu, cuda or cuda:N (N >= 0)");
  }
  RETURN_IF_ERROR(
      CheckChoice("dtype", GetFlag(FLAGS_dtype), {"auto", "f32", "bf16"}));
  RETURN_IF_ERROR(CheckReal("val_fraction", GetFlag(FLAGS_val_fraction), 0, 1,
                            Ends::kOpenAbove));
  RETURN_IF_ERROR(CheckInt("eval_interval", GetFlag(FLAGS_eval_interval), 1,
                           kMaxInt32, "10 evaluations a run"));
  RETURN_IF_ERROR(
      CheckInt("eval_batches", GetFlag(FLAGS_eval_batches), 1, kMaxInt32));
  RETURN_IF_ERROR(CheckInt("log_interval", GetFlag(FLAGS_log_interval), 1,
                           kMaxInt32, "auto"));
  RETURN_IF_ERROR(CheckInt("checkpoint_interval",
                           GetFlag(FLAGS_checkpoint_interval), 1, kMaxInt32,
                           "only at the end"));
  RETURN_IF_ERROR(CheckInt("keep_checkpoints", GetFlag(FLAGS_keep_checkpoints),
                           1, kMaxInt32, "keep all"));
  if (GetFlag(FLAGS_resume) && GetFlag(FLAGS_checkpoint_dir).empty()) {
    return InvalidArgument("--resume needs --checkpoint_dir");
  }
  RETURN_IF_ERROR(
      CheckInt("sample_length", GetFlag(FLAGS_sample_length), 0, kMaxInt32));
  RETURN_IF_ERROR(CheckInt("sample_interval", GetFlag(FLAGS_sample_interval), 1,
                           kMaxInt32, "at the end only"));
  RETURN_IF_ERROR(CheckReal("temperature", GetFlag(FLAGS_temperature), 0,
                            kMaxFloat, Ends::kOpenBelow, "greedy"));
  RETURN_IF_ERROR(
      CheckInt("top_k", GetFlag(FLAGS_top_k), 1, kMaxInt32, "all tokens"));
  return absl::OkStatus();
}

// The checks that need the number of steps (which may be the device's).
absl::Status CheckStepFlags(int steps) {
  const int warmup = absl::GetFlag(FLAGS_warmup);
  if (warmup != -1 && !(warmup >= 0 && warmup <= steps)) {
    return BadFlag("warmup", absl::StrCat(warmup),
                   absl::StrCat("-1 (5% of the steps) or an integer in [0, "
                                "--steps = ",
                                steps, "]"));
  }
  const int stop = absl::GetFlag(FLAGS_stop_at_step);
  if (stop != 0 && !(stop >= 1 && stop <= steps)) {
    return BadFlag("stop_at_step", absl::StrCat(stop),
                   absl::StrCat("0 (run all --steps) or an integer in [1, "
                                "--steps = ",
                                steps, "]"));
  }
  return absl::OkStatus();
}

// Tokens per optimizer step must fit an int32 (the batchers' limit).
absl::Status CheckTokensPerStep(int64_t batch, int64_t context, int64_t micro) {
  // No overflow: batch and micro are at most 2^16, context below 2^31.
  const int64_t tokens = batch * context * micro;
  if (tokens <= kMaxInt32) return absl::OkStatus();
  return InvalidArgument(
      "--batch=", batch, " x --context=", context, " x --micro_batches=", micro,
      " = ", tokens, " tokens per step is invalid: want at most ", kMaxInt32);
}

// The default corpus (see --data). On a GPU: a data/gpu_corpus folder (made by
// tools/make_gpu_corpus.sh; tools/stage_gpu.sh stages one) next to the binary
// or in a folder above it. Else, or when there is none: a data/fortunes folder
// found the same way, else Debian's fortunes. `how` says which it is.
absl::StatusOr<std::string> FindDefaultCorpus(bool gpu, std::string* how) {
  std::error_code error;
  // The binary itself, not a symlink to it: where tools/stage_gpu.sh put it.
  const fs::path binary = fs::read_symlink("/proc/self/exe", error);
  const bool know_binary = !error && binary.has_parent_path();
  auto find_above_binary = [&](const char* name) -> std::optional<fs::path> {
    if (!know_binary) return std::nullopt;
    for (fs::path dir = binary.parent_path();; dir = dir.parent_path()) {
      const fs::path candidate = dir / "data" / name;
      if (fs::is_directory(candidate, error)) return candidate;
      if (!dir.has_relative_path()) return std::nullopt;  // the root
    }
  };
  std::string gpu_note;
  if (gpu) {
    if (auto found = find_above_binary("gpu_corpus")) {
      *how =
          "the GPU default corpus (fortunes, package docs and manual pages), "
          "staged with the binary";
      return found->string();
    }
    gpu_note =
        "; no data/gpu_corpus next to the binary (tools/make_gpu_corpus.sh "
        "makes one): a GPU-sized model will memorize this small corpus, so "
        "expect the validation loss to turn up";
  }
  if (auto found = find_above_binary("fortunes")) {
    *how = absl::StrCat("the default corpus, staged with the binary", gpu_note);
    return found->string();
  }
  if (fs::exists(data::kDefaultCorpus, error)) {
    *how = absl::StrCat("the default corpus, Debian's fortunes", gpu_note);
    return std::string(data::kDefaultCorpus);
  }
  return absl::NotFoundError(absl::StrCat(
      "no default corpus: neither a data/", gpu ? "gpu_corpus or data/" : "",
      "fortunes folder in ",
      know_binary ? binary.parent_path().string()
                  : std::string("the binary's folder"),
      " or a folder above it (tools/stage_gpu.sh stages both) nor ",
      data::kDefaultCorpus,
      " (Debian's fortunes-min or fortunes package) exists; pass "
      "--data=PATH"));
}

std::string HumanSeconds(double seconds) {
  return seconds < 60 ? absl::StrFormat("%.2fs", seconds)
                      : HumanDuration(seconds);
}

absl::Status Run() {
  RETURN_IF_ERROR(CheckFlags());
  ASSIGN_OR_RETURN(const Device device,
                   ChooseDevice(absl::GetFlag(FLAGS_device)));
  const RunDefaults defaults = DefaultsFor(device);
  const int steps = Pick(absl::GetFlag(FLAGS_steps), defaults.steps);
  RETURN_IF_ERROR(CheckStepFlags(steps));
  if (!absl::GetFlag(FLAGS_resume)) {  // else the model is the checkpoint's
    const int heads = Pick(absl::GetFlag(FLAGS_heads), defaults.heads);
    const int width = Pick(absl::GetFlag(FLAGS_width), defaults.width);
    if (width % heads != 0) {
      return BadFlag("heads", absl::StrCat(heads),
                     absl::StrCat("a divisor of --width = ", width));
    }
    RETURN_IF_ERROR(
        CheckTokensPerStep(Pick(absl::GetFlag(FLAGS_batch), defaults.batch),
                           Pick(absl::GetFlag(FLAGS_context), defaults.context),
                           absl::GetFlag(FLAGS_micro_batches)));
  }
  // The ranks (--ranks, or --gpus on CUDA, or the processes of
  // --world_size); CheckFlags and ResolveProcessGroup checked them.
  ASSIGN_OR_RETURN(const ProcessGroup group, ResolveProcessGroup());
  const bool by_processes = group.world_size > 1;
  const bool by_gpus = absl::GetFlag(FLAGS_gpus) > 0 && !by_processes;
  const int ranks = by_processes ? group.world_size
                    : by_gpus    ? absl::GetFlag(FLAGS_gpus)
                                 : absl::GetFlag(FLAGS_ranks);
  const char* ranks_flag = by_processes ? "world_size"
                           : by_gpus    ? "gpus"
                                        : "ranks";
  const bool force_communicator = absl::GetFlag(FLAGS_force_communicator);
  if (force_communicator && ranks > 1) {
    return BadFlag("force_communicator", "true",
                   absl::StrCat("false with --", ranks_flag, " = ", ranks,
                                " (more than one rank always has a "
                                "communicator)"));
  }
  // Over a communicator: several ranks, or one with --force_communicator.
  const bool data_parallel = ranks > 1 || force_communicator;
  if (by_gpus && !device.is_cuda()) {
    return BadFlag("gpus", absl::StrCat(ranks),
                   absl::StrCat("0 on --device=", absl::GetFlag(FLAGS_device),
                                ", which is the CPU here (use --ranks)"));
  }
  if (ranks > 1 && !by_processes && device.is_cuda() &&
      device.ordinal + ranks > CudaDeviceCount()) {
    const int visible = std::max(0, CudaDeviceCount() - device.ordinal);
    return BadFlag(ranks_flag, absl::StrCat(ranks),
                   absl::StrCat("at most the ", visible, " GPUs visible from ",
                                device.ToString()));
  }
  {
    const int batch = Pick(absl::GetFlag(FLAGS_batch), defaults.batch);
    if (batch % ranks != 0) {
      return BadFlag(
          "batch", absl::StrCat(batch),
          absl::StrCat("a multiple of --", ranks_flag, " = ", ranks));
    }
  }

  const std::string checkpoint_dir = absl::GetFlag(FLAGS_checkpoint_dir);
  std::string resume_folder;
  if (absl::GetFlag(FLAGS_resume)) {
    ASSIGN_OR_RETURN(resume_folder, graph::LatestCheckpoint(checkpoint_dir));
  }

  // ---- Data and tokenizer ----
  std::string data_path = absl::GetFlag(FLAGS_data);
  std::string data_note;
  if (data_path.empty()) {
    std::string how;
    ASSIGN_OR_RETURN(data_path, FindDefaultCorpus(device.is_cuda(), &how));
    data_note = absl::StrCat(" (", how, ")");
  }
  std::vector<int32_t> tokens;
  std::unique_ptr<data::Tokenizer> tokenizer;
  int vocab = 0;
  if (IsShardData(data_path)) {
    ASSIGN_OR_RETURN(tokens, data::ReadTokenShards(data_path));
    vocab = 1 + *std::max_element(tokens.begin(), tokens.end());
    std::printf("data: %s, %zu tokens from llm.c shards\n", data_path.c_str(),
                tokens.size());
  } else {
    ASSIGN_OR_RETURN(const std::string text, data::ReadTextCorpus(data_path));
    std::printf("data: %s%s, %s of text\n", data_path.c_str(),
                data_note.c_str(), HumanBytes(text.size()).c_str());
    ASSIGN_OR_RETURN(
        tokenizer,
        MakeTokenizer(text, Pick(absl::GetFlag(FLAGS_vocab), defaults.vocab),
                      resume_folder));
    tokens = tokenizer->Encode(text);
    vocab = tokenizer->vocab_size();
    std::printf(
        "tokens: %zu (%.2f bytes per token, %s tokenizer of %d)\n",
        tokens.size(),
        static_cast<double>(text.size()) / std::max<size_t>(1, tokens.size()),
        std::string(tokenizer->kind()).c_str(), vocab);
  }

  // ---- Model (shared by the ranks) ----
  GptConfig config;
  const bool resuming = !resume_folder.empty();
  if (resuming) {
    ASSIGN_OR_RETURN(config, graph::ReadCheckpointConfig(resume_folder));
  } else {
    config.layers = Pick(absl::GetFlag(FLAGS_layers), defaults.layers);
    config.heads = Pick(absl::GetFlag(FLAGS_heads), defaults.heads);
    config.width = Pick(absl::GetFlag(FLAGS_width), defaults.width);
    config.context = Pick(absl::GetFlag(FLAGS_context), defaults.context);
    // A multiple of 64 keeps the head's GEMMs on fast paths; the extra rows
    // are never targets.
    config.vocab = (vocab + 63) / 64 * 64;
    // CheckFlags allows only these choices.
    config.norm = absl::GetFlag(FLAGS_norm) == "rmsnorm"
                      ? graph::NormKind::kRmsNorm
                      : graph::NormKind::kLayerNorm;
    config.mlp = absl::GetFlag(FLAGS_mlp) == "swiglu" ? graph::MlpKind::kSwiGlu
                                                      : graph::MlpKind::kGelu;
    config.tied_head = absl::GetFlag(FLAGS_tied);
  }
  if (config.vocab < vocab) {
    return InvalidArgument("the checkpoint's vocabulary (", config.vocab,
                           ") is smaller than the data's (", vocab, ")");
  }
  const int seq = static_cast<int>(config.context);
  // The global batch; each rank's model takes `rows` of its sequences.
  const int batch = Pick(absl::GetFlag(FLAGS_batch), defaults.batch);
  const int rows = batch / ranks;
  const int micro = absl::GetFlag(FLAGS_micro_batches);
  RETURN_IF_ERROR(CheckTokensPerStep(batch, seq, micro));
  const int64_t tokens_per_step = int64_t{batch} * seq * micro;
  const int64_t rank_tokens_per_step = int64_t{rows} * seq * micro;
  std::string dtype_flag = absl::GetFlag(FLAGS_dtype);
  if (dtype_flag == "auto") dtype_flag = device.is_cuda() ? "bf16" : "f32";
  const DType dtype = dtype_flag == "bf16" ? DType::kBF16 : DType::kF32;
  const std::string head_flag = absl::GetFlag(FLAGS_head);
  const bool bf16_logits = absl::GetFlag(FLAGS_lce_operand_dtype_logits);
  if (bf16_logits && dtype != DType::kBF16) {
    return BadFlag("lce_operand_dtype_logits", "true",
                   absl::StrCat("false with --dtype=", dtype_flag,
                                " (it rounds the logits to bf16 operands)"));
  }
  if (bf16_logits && head_flag != "fused") {
    return BadFlag("lce_operand_dtype_logits", "true",
                   absl::StrCat("false with --head=", head_flag));
  }

  // ---- Optimizer (each rank adds its communicator) ----
  graph::TrainerOptions base_options;
  base_options.micro_batches = micro;
  base_options.cuda_graph = absl::GetFlag(FLAGS_cuda_graph);
  base_options.bucket_bytes = std::max<int64_t>(
      4, static_cast<int64_t>(absl::GetFlag(FLAGS_bucket_mib) * (1 << 20)));
  base_options.shard_optimizer_state = absl::GetFlag(FLAGS_zero1);
  base_options.adamw.weight_decay =
      static_cast<float>(absl::GetFlag(FLAGS_weight_decay));
  base_options.adamw.max_grad_norm =
      static_cast<float>(absl::GetFlag(FLAGS_grad_clip));
  const double lr =
      absl::GetFlag(FLAGS_lr) > 0 ? absl::GetFlag(FLAGS_lr) : defaults.lr;
  base_options.schedule.max_lr = static_cast<float>(lr);
  base_options.schedule.min_lr =
      static_cast<float>(lr * absl::GetFlag(FLAGS_min_lr_ratio));
  base_options.schedule.total_steps = steps;
  base_options.schedule.warmup_steps = absl::GetFlag(FLAGS_warmup) >= 0
                                           ? absl::GetFlag(FLAGS_warmup)
                                           : std::max(1, steps / 20);

  // ---- Batches (read-only, shared by the ranks) ----
  const uint64_t seed = absl::GetFlag(FLAGS_seed);
  ASSIGN_OR_RETURN(
      const data::TokenDataset dataset,
      data::TokenDataset::Create(std::move(tokens),
                                 absl::GetFlag(FLAGS_val_fraction), seq));
  std::printf("split: %zu training tokens, %zu validation tokens\n",
              dataset.train.size(), dataset.val.size());
  if (!resuming && !checkpoint_dir.empty() && tokenizer != nullptr) {
    std::error_code error;
    fs::create_directories(checkpoint_dir, error);
  }

  // Rank `rank` of `ranks` on `context`, over `comm` (null: one rank). Rank 0
  // (`lead`) alone prints, validates, samples, writes the metrics and saves.
  auto train_rank = [&](int rank, Context& context_ref,
                        Communicator* comm) -> absl::Status {
    Context* context = &context_ref;
    const bool lead = rank == 0;
    // Nothing to switch off for the CUDA graph: the ops detect the capture.
    LinearCrossEntropyOptions head_options;
    head_options.operand_dtype_logits = bf16_logits;
    ops::CausalAttentionOptions attention;
    ASSIGN_OR_RETURN(attention.kernel,
                     ops::ParseAttentionKernel(absl::GetFlag(FLAGS_attention)));
    attention.deterministic = absl::GetFlag(FLAGS_attention_deterministic);
    ASSIGN_OR_RETURN(
        std::unique_ptr<Gpt> model,
        Gpt::Create(*context, config, {rows, seq}, dtype,
                    head_flag == "fused" ? graph::GptHead::kFusedLoss
                                         : graph::GptHead::kUnfusedLoss,
                    head_options, attention));
    if (lead) {
      std::printf(
          "model: %s\n  %.2fM parameters, %s activations, %s head, on "
          "%s%s%s\n",
          graph::DescribeGptConfig(config).c_str(),
          model->parameter_count() / 1e6, DTypeName(dtype), head_flag.c_str(),
          device.ToString().c_str(),
          device.is_cuda() && absl::GetFlag(FLAGS_layers) == 0
              ? " (the GPU default: larger than the CPU's)"
              : "",
          data_parallel
              ? absl::StrFormat(
                    " x %d data-parallel rank%s (%s%s%s)", ranks,
                    ranks > 1 ? "s" : "",
                    device.is_cuda() ? "NCCL"
                    : by_processes   ? "CPU processes over TCP"
                                     : "CPU threads",
                    force_communicator ? ", 1-rank communicator forced" : "",
                    absl::GetFlag(FLAGS_zero1) ? ", ZeRO-1" : "")
                    .c_str()
              : "");
    }
    graph::TrainerOptions options = base_options;
    options.communicator = comm;
    ASSIGN_OR_RETURN(std::unique_ptr<Trainer> trainer,
                     Trainer::Create(*model, options));

    // Every rank draws the same global batches (same seed) and trains on its
    // rows of them, so the run sees the data of one rank with --batch rows.
    ASSIGN_OR_RETURN(data::Batcher train_batches,
                     data::Batcher::Create(dataset.train, batch, seq, seed));
    std::optional<data::EvalBatcher> val_batches;
    if (lead && !dataset.val.empty()) {
      ASSIGN_OR_RETURN(val_batches, data::EvalBatcher::Create(
                                        dataset.val, batch, seq,
                                        absl::GetFlag(FLAGS_eval_batches)));
    }

    if (resuming) {
      // Every rank loads rank 0's checkpoint: the same weights everywhere.
      ASSIGN_OR_RETURN(auto extra, trainer->Load(resume_folder));
      int64_t position = 0;
      if (!absl::SimpleAtoi(extra["data_position"], &position)) {
        return absl::DataLossError("checkpoint lacks data_position");
      }
      RETURN_IF_ERROR(train_batches.set_position(position));
      if (lead) {
        std::printf("resumed from %s at step %d\n", resume_folder.c_str(),
                    static_cast<int>(trainer->step()));
      }
    } else {
      RETURN_IF_ERROR(model->Initialize(seed));
    }
    // Steps first_step to last_step run here (--stop_at_step may end early).
    const int64_t first_step = trainer->step() + 1;
    const int64_t last_step = absl::GetFlag(FLAGS_stop_at_step) > 0
                                  ? absl::GetFlag(FLAGS_stop_at_step)
                                  : steps;
    if (last_step < first_step) {
      const bool stop = absl::GetFlag(FLAGS_stop_at_step) > 0;
      return BadFlag(
          stop ? "stop_at_step" : "steps", absl::StrCat(last_step),
          absl::StrCat("a step after the checkpoint's (", resume_folder,
                       " is at step ", trainer->step(), ")"));
    }

    // The sampling model: one sequence, f32 logits, the same device.
    std::unique_ptr<Gpt> sampler;
    const int sample_length = absl::GetFlag(FLAGS_sample_length);
    if (lead && sample_length > 0 && tokenizer != nullptr) {
      ASSIGN_OR_RETURN(sampler,
                       Gpt::Create(*context, config, {1, seq}, DType::kF32,
                                   graph::GptHead::kLogits));
    }
    auto sample = [&](int64_t step) -> absl::Status {
      if (sampler == nullptr) return absl::OkStatus();
      RETURN_IF_ERROR(sampler->CopyParametersFrom(*model));
      std::vector<int32_t> prompt =
          tokenizer->Encode(absl::GetFlag(FLAGS_prompt));
      if (prompt.empty()) prompt.push_back(0);
      graph::SamplingOptions sampling;
      sampling.temperature =
          static_cast<float>(absl::GetFlag(FLAGS_temperature));
      sampling.top_k = absl::GetFlag(FLAGS_top_k);
      sampling.seed = seed + static_cast<uint64_t>(step);
      ASSIGN_OR_RETURN(
          std::vector<int32_t> generated,
          graph::Sample(*sampler, prompt, sample_length, sampling));
      for (int32_t& id : generated) id = std::min(id, vocab - 1);
      ASSIGN_OR_RETURN(std::string text, tokenizer->Decode(generated));
      std::printf(
          "---- sample at step %d (temperature %.2f, top-k %d) ----\n%s%s\n"
          "----\n",
          static_cast<int>(step), sampling.temperature,
          static_cast<int>(sampling.top_k),
          Printable(absl::GetFlag(FLAGS_prompt)).c_str(),
          Printable(text).c_str());
      return absl::OkStatus();
    };

    using Clock = std::chrono::steady_clock;
    auto seconds_since = [](Clock::time_point start) {
      return std::chrono::duration<double>(Clock::now() - start).count();
    };
    // The validation loss and next-token accuracy (none without a
    // validation split, and none on the ranks other than 0); its time is
    // added to `seconds`. Rank 0 evaluates each global batch alone, in
    // `ranks` parts of its model's rows: the mean of the parts' means is the
    // batch's mean (equal parts, every target counted), as with one rank.
    // The accuracy is the head's (computed in the loss's pass), averaged over
    // the parts weighted by their counted tokens.
    std::vector<int32_t> val_inputs, val_targets;  // [batch * seq]
    if (val_batches) {
      val_inputs.resize(int64_t{batch} * seq);
      val_targets.resize(int64_t{batch} * seq);
    }
    struct Validation {
      float loss = 0;
      float accuracy = 0;  // in [0, 1]
    };
    auto evaluate =
        [&](double* seconds) -> absl::StatusOr<std::optional<Validation>> {
      if (!val_batches) return std::optional<Validation>();
      const auto start = Clock::now();
      double sum = 0, hits = 0;
      int64_t counted = 0;
      for (int64_t k = 0; k < val_batches->num_batches(); ++k) {
        RETURN_IF_ERROR(val_batches->Fill(k, absl::MakeSpan(val_inputs),
                                          absl::MakeSpan(val_targets)));
        for (int part = 0; part < ranks; ++part) {
          ASSIGN_OR_RETURN(absl::Span<const int32_t> part_inputs,
                           graph::RankRows(val_inputs, seq, part, ranks));
          ASSIGN_OR_RETURN(absl::Span<const int32_t> part_targets,
                           graph::RankRows(val_targets, seq, part, ranks));
          ASSIGN_OR_RETURN(
              const Trainer::EvalStats stats,
              trainer->EvaluateWithAccuracy(part_inputs, part_targets));
          sum += static_cast<double>(stats.loss) / ranks;
          hits += static_cast<double>(stats.accuracy) * stats.tokens;
          counted += stats.tokens;
        }
      }
      *seconds += seconds_since(start);
      Validation result;
      result.loss = static_cast<float>(sum / val_batches->num_batches());
      result.accuracy = counted > 0 ? static_cast<float>(hits / counted) : 0.0f;
      return std::optional<Validation>(result);
    };

    const int keep_checkpoints = absl::GetFlag(FLAGS_keep_checkpoints);
    auto save = [&]() -> absl::Status {
      if (checkpoint_dir.empty()) return absl::OkStatus();
      // Every rank calls Save (with --zero1 it gathers the moments); rank 0
      // alone writes, atomically.
      ASSIGN_OR_RETURN(std::string folder,
                       trainer->Save(checkpoint_dir,
                                     {{"data_position",
                                       absl::StrCat(train_batches.position())},
                                      {"seed", absl::StrCat(seed)},
                                      {"ranks", absl::StrCat(ranks)}}));
      if (!lead) return absl::OkStatus();
      if (tokenizer != nullptr) {
        RETURN_IF_ERROR(
            tokenizer->Save((fs::path(folder) / kTokenizerFile).string()));
      }
      ASSIGN_OR_RETURN(
          std::vector<std::string> removed,
          graph::PruneCheckpoints(checkpoint_dir, keep_checkpoints));
      std::string note;
      if (!removed.empty()) {
        for (std::string& path : removed) {
          path = fs::path(path).filename().string();
        }
        note = absl::StrCat(" (removed ", absl::StrJoin(removed, ", "), ")");
      }
      std::printf("checkpoint: %s%s\n", folder.c_str(), note.c_str());
      return absl::OkStatus();
    };

    std::ofstream metrics;
    if (lead && !absl::GetFlag(FLAGS_metrics).empty()) {
      metrics.open(absl::GetFlag(FLAGS_metrics),
                   resuming ? std::ios::app : std::ios::trunc);
      if (!metrics) {
        return InvalidArgument("cannot write --metrics=",
                               absl::GetFlag(FLAGS_metrics));
      }
    }

    // ---- Training ----
    const int eval_interval =
        Pick(absl::GetFlag(FLAGS_eval_interval), std::max(1, steps / 10));
    const int log_interval =
        Pick(absl::GetFlag(FLAGS_log_interval), std::max(1, steps / 30));
    const int checkpoint_interval = absl::GetFlag(FLAGS_checkpoint_interval);
    const int sample_interval = absl::GetFlag(FLAGS_sample_interval);
    if (lead) {
      std::printf(
          "training: %d steps of %d x %d x %d tokens%s, lr %.2g (warm-up "
          "%d, cosine to %.2g)%s\n",
          steps, micro, batch, seq,
          ranks > 1
              ? absl::StrFormat(" (%d rows on each of %d ranks)", rows, ranks)
                    .c_str()
              : "",
          lr, static_cast<int>(options.schedule.warmup_steps),
          options.schedule.min_lr,
          last_step < steps
              ? absl::StrFormat("; stopping after step %d", last_step).c_str()
              : "");
    }
    // [micro * batch * seq]: the global batch; [micro * rows * seq]: this
    // rank's rows of each of its micro-batches.
    std::vector<int32_t> inputs(tokens_per_step), targets(tokens_per_step);
    std::vector<int32_t> rank_inputs(rank_tokens_per_step),
        rank_targets(rank_tokens_per_step);
    // Training time (batches, forward, backward, update) apart from the time
    // of validations, checkpoints and samples: tokens/s counts training only.
    double train_s = 0, eval_s = 0;
    const auto run_start = Clock::now();
    std::optional<Validation> first_val, last_val;
    if (!resuming) {
      double seconds = 0;
      ASSIGN_OR_RETURN(first_val, evaluate(&seconds));
      eval_s += seconds;
      if (first_val) {
        std::printf("step 0: val loss %.4f, accuracy %.2f%% (eval %s)\n",
                    first_val->loss, 100 * first_val->accuracy,
                    HumanSeconds(seconds).c_str());
        if (metrics.is_open()) {
          MetricsLine line;
          line.val_loss = first_val->loss;
          line.val_accuracy = first_val->accuracy;
          line.eval_s = seconds;
          RETURN_IF_ERROR(WriteMetricsLine(metrics, line));
        }
      }
    }
    const auto loop_start = Clock::now();
    double interval_train_s = 0;
    int64_t interval_tokens = 0;
    float last_loss = 0;
    const int64_t global_micro = int64_t{batch} * seq;
    const int64_t rank_micro = int64_t{rows} * seq;
    for (int64_t step = first_step; step <= last_step; ++step) {
      const auto step_start = Clock::now();
      for (int k = 0; k < micro; ++k) {
        const auto global_inputs =
            absl::MakeSpan(inputs).subspan(k * global_micro, global_micro);
        const auto global_targets =
            absl::MakeSpan(targets).subspan(k * global_micro, global_micro);
        RETURN_IF_ERROR(train_batches.Next(global_inputs, global_targets));
        ASSIGN_OR_RETURN(absl::Span<const int32_t> own_inputs,
                         graph::RankRows(global_inputs, seq, rank, ranks));
        ASSIGN_OR_RETURN(absl::Span<const int32_t> own_targets,
                         graph::RankRows(global_targets, seq, rank, ranks));
        std::copy(own_inputs.begin(), own_inputs.end(),
                  rank_inputs.begin() + k * rank_micro);
        std::copy(own_targets.begin(), own_targets.end(),
                  rank_targets.begin() + k * rank_micro);
      }
      ASSIGN_OR_RETURN(Trainer::StepStats stats,
                       trainer->Step(rank_inputs, rank_targets));
      // Step waits for the device (it reads the loss back): this is its time.
      const double step_s = seconds_since(step_start);
      train_s += step_s;
      interval_train_s += step_s;
      last_loss = stats.loss;
      interval_tokens += tokens_per_step;
      if (!std::isfinite(stats.loss)) {
        return absl::InternalError(absl::StrCat("the loss diverged at step ",
                                                step, " (", stats.loss,
                                                "); try a lower --lr"));
      }
      std::optional<Validation> val;
      double val_s = 0;
      if (step % eval_interval == 0 || step == last_step) {
        ASSIGN_OR_RETURN(val, evaluate(&val_s));
        eval_s += val_s;
        if (val) last_val = val;
      }
      if (lead && (step % log_interval == 0 || step == last_step || val)) {
        // Of the global batch; each rank trains on 1 / ranks of it.
        const double tokens_per_s =
            interval_tokens / std::max(interval_train_s, 1e-9);
        const double elapsed = seconds_since(loop_start);
        const double eta =
            elapsed / (step - first_step + 1) * (last_step - step);
        if (metrics.is_open()) {
          MetricsLine line;
          line.step = step;
          line.loss = stats.loss;
          if (val) {
            line.val_loss = val->loss;
            line.val_accuracy = val->accuracy;
          }
          line.tokens_per_s = tokens_per_s;
          line.train_s = interval_train_s;
          if (val) line.eval_s = val_s;
          RETURN_IF_ERROR(WriteMetricsLine(metrics, line));
        }
        std::printf(
            "step %5d/%d | loss %.4f | val %s | lr %.2e | norm %.2f | "
            "%.1fK tok/s%s | ETA %s | mem %s\n",
            static_cast<int>(step), steps, stats.loss,
            val ? absl::StrFormat("%.4f acc %5.2f%% (eval %s)", val->loss,
                                  100 * val->accuracy, HumanSeconds(val_s))
                      .c_str()
                : "   -  ",
            stats.lr, stats.grad_norm, tokens_per_s / 1e3,
            ranks > 1
                ? absl::StrFormat(" (%.1fK/rank)", tokens_per_s / ranks / 1e3)
                      .c_str()
                : "",
            HumanDuration(eta).c_str(),
            HumanBytes(context->allocator().peak_bytes()).c_str());
        std::fflush(stdout);
        interval_train_s = 0;
        interval_tokens = 0;
      }
      if (checkpoint_interval > 0 && step % checkpoint_interval == 0 &&
          step != last_step) {
        RETURN_IF_ERROR(save());
      }
      if (sample_interval > 0 && step % sample_interval == 0 &&
          step != last_step) {
        RETURN_IF_ERROR(sample(step));
      }
    }
    const double total_s = seconds_since(run_start);
    RETURN_IF_ERROR(save());
    RETURN_IF_ERROR(sample(last_step));
    if (!lead) return absl::OkStatus();
    const int64_t steps_run = last_step - first_step + 1;
    const int64_t tokens_run = steps_run * tokens_per_step;
    const double tokens_per_s = tokens_run / std::max(train_s, 1e-9);
    absl::PrintF(
        "done: %d steps%s, %d tokens in %s (training %s, %.1fK tokens/s%s; "
        "evaluation %s), final train loss %.4f, val loss %s%s, val accuracy "
        "%s%s, peak memory %s\n",
        steps_run,
        first_step == 1 && last_step == steps
            ? ""
            : absl::StrFormat(" (%d-%d of %d)", first_step, last_step, steps),
        tokens_run, HumanSeconds(total_s), HumanSeconds(train_s),
        tokens_per_s / 1e3,
        data_parallel
            ? absl::StrFormat(
                  ", %.1fK per rank of %d%s", tokens_per_s / ranks / 1e3, ranks,
                  absl::GetFlag(FLAGS_single_device_tokens_per_s) > 0
                      ? absl::StrFormat(
                            ", scaling %.2f of one device's %.1fK",
                            tokens_per_s / ranks /
                                absl::GetFlag(FLAGS_single_device_tokens_per_s),
                            absl::GetFlag(FLAGS_single_device_tokens_per_s) /
                                1e3)
                      : "")
            : "",
        HumanSeconds(eval_s), last_loss,
        last_val ? absl::StrFormat("%.4f", last_val->loss) : "-",
        first_val ? absl::StrFormat(" (from %.4f at step 0)", first_val->loss)
                  : "",
        last_val ? absl::StrFormat("%.2f%%", 100 * last_val->accuracy) : "-",
        first_val ? absl::StrFormat(" (from %.2f%%)", 100 * first_val->accuracy)
                  : "",
        HumanBytes(context->allocator().peak_bytes()));
    return absl::OkStatus();
  };

  if (!data_parallel) {
    ASSIGN_OR_RETURN(std::unique_ptr<Context> context, Context::Create(device));
    return train_rank(0, *context, nullptr);
  }
  if (by_processes) {
    // ---- One rank of several processes ----
    const absl::Duration timeout =
        absl::Seconds(absl::GetFlag(FLAGS_rank_timeout_s));
    ASSIGN_OR_RETURN(const CoordinatorAddress address,
                     ParseCoordinatorAddress(group.coordinator));
    ASSIGN_OR_RETURN(const int local_rank, IntFromEnvironment("LOCAL_RANK", 0));
    // cuda:K + LOCAL_RANK (K: --device's ordinal); the CPU for CPU ranks.
    const Device rank_device =
        device.is_cuda() ? Device::Cuda(device.ordinal + local_rank) : device;
    ASSIGN_OR_RETURN(std::unique_ptr<Context> context,
                     Context::Create(rank_device));
    std::unique_ptr<Communicator> comm;
    if (device.is_cuda()) {
      // Rank 0 makes the NCCL id and hands it out through the coordinator.
      std::string id;
      if (group.rank == 0) {
        ASSIGN_OR_RETURN(id, NcclCommunicator::NewUniqueId());
      }
      ASSIGN_OR_RETURN(id, ShareBlob(group.coordinator, group.rank,
                                     group.world_size, id, timeout));
      ASSIGN_OR_RETURN(
          comm, NcclCommunicator::Create(id, group.rank, group.world_size,
                                         *context, timeout));
    } else {
      ASSIGN_OR_RETURN(comm,
                       SocketCommunicator::Create(address, group.rank,
                                                  group.world_size, timeout));
    }
    absl::Status status = train_rank(group.rank, *context, comm.get());
    if (!status.ok()) {
      comm->Abort(absl::StrCat("rank ", group.rank, ": ", status.message()))
          .IgnoreError();
    }
    return status;
  }
  // ---- Data-parallel ranks: one thread each ----
  // (Also the one rank of --force_communicator: a group of one.)
  // CPU: one in-process group. The timeout only bounds a rank waiting for
  // the others while rank 0 validates, samples or saves: a rank that fails
  // aborts the group, so that the others fail at once instead.
  std::vector<std::unique_ptr<Communicator>> cpu_comms;
  std::string nccl_id;
  if (device.is_cuda()) {
    ASSIGN_OR_RETURN(nccl_id, NcclCommunicator::NewUniqueId());
  } else {
    ASSIGN_OR_RETURN(cpu_comms,
                     CpuCommunicatorGroup::Create(ranks, absl::Hours(1)));
  }
  std::vector<absl::Status> results(ranks);
  auto run_rank = [&](int rank) -> absl::Status {
    // cuda:K + rank (K: --device's ordinal); the CPU for every CPU rank.
    const Device rank_device =
        device.is_cuda() ? Device::Cuda(device.ordinal + rank) : device;
    std::unique_ptr<Context> context;
    std::unique_ptr<NcclCommunicator> nccl;
    Communicator* comm = device.is_cuda() ? nullptr : cpu_comms[rank].get();
    absl::Status status = [&]() -> absl::Status {
      ASSIGN_OR_RETURN(context, Context::Create(rank_device));
      if (device.is_cuda()) {
        ASSIGN_OR_RETURN(
            nccl, NcclCommunicator::Create(nccl_id, rank, ranks, *context));
        comm = nccl.get();
      }
      return train_rank(rank, *context, comm);
    }();
    if (!status.ok() && comm != nullptr) {
      comm->Abort(absl::StrCat("rank ", rank, ": ", status.message()))
          .IgnoreError();
    }
    return status;
  };
  std::vector<std::thread> threads;
  for (int rank = 0; rank < ranks; ++rank) {
    threads.emplace_back([&, rank] { results[rank] = run_rank(rank); });
  }
  for (std::thread& thread : threads) thread.join();
  // The cause: the first rank's error that is not another rank's abort.
  for (const absl::Status& status : results) {
    if (!status.ok() && !absl::IsAborted(status)) return status;
  }
  for (const absl::Status& status : results) RETURN_IF_ERROR(status);
  return absl::OkStatus();
}

}  // namespace
}  // namespace lossrt

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Trains a small GPT on a text corpus and samples from it. See the flags "
      "with --helpfull.");
  absl::ParseCommandLine(argc, argv);
  const absl::Status status = lossrt::Run();
  if (!status.ok()) {
    std::fprintf(stderr, "train_lm: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
