// Tests of the trainer: checkpoints resume exactly (the same losses as an
// uninterrupted run), gradient accumulation matches one large batch, the
// checkpoint files are valid safetensors, pruning keeps exactly the newest
// checkpoints and removes what interrupted saves left (and nothing else),
// sampling is deterministic, and the evaluation's accuracy is the argmax's.
#include "graph/trainer.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "graph/sampling.h"
#include "gtest/gtest.h"
#include "runtime/safetensors.h"
#include "tests/gpu_test_util.h"
#include "tests/graph/op_test_util.h"

namespace lossrt {
namespace graph {
namespace {

namespace fs = std::filesystem;

GptConfig SmallConfig() {
  GptConfig config;
  config.layers = 2;
  config.heads = 2;
  config.width = 32;
  config.context = 16;
  config.vocab = 64;
  return config;
}

std::vector<int32_t> Tokens(int64_t count, uint64_t seed) {
  std::mt19937_64 engine(seed);
  std::vector<int32_t> tokens(count);
  for (int32_t& t : tokens) t = static_cast<int32_t>(engine() % 64);
  return tokens;
}

TrainerOptions Options(int64_t micro_batches = 1) {
  TrainerOptions options;
  options.schedule = {2e-3f, 2e-4f, 2, 8};
  options.micro_batches = micro_batches;
  return options;
}

fs::path TempDir(const std::string& name) {
  const fs::path dir = fs::path(::testing::TempDir()) / name;
  fs::remove_all(dir);
  return dir;
}

TEST(TrainerTest, ResumeGivesTheSameLosses) {
  const uint64_t seed = test::TestSeed();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> context,
                       Context::Create(Device::Cpu()));
  const BatchShape shape{2, 16};
  auto batch = [&](int step, uint64_t salt) {
    return Tokens(shape.rows(), seed + 100 * step + salt);
  };
  // Uninterrupted: 8 steps.
  std::vector<float> straight;
  {
    ASSERT_OK_AND_ASSIGN(
        auto model, Gpt::Create(*context, SmallConfig(), shape, DType::kF32,
                                GptHead::kFusedLoss));
    ASSERT_OK(model->Initialize(seed));
    ASSERT_OK_AND_ASSIGN(auto trainer, Trainer::Create(*model, Options()));
    for (int step = 0; step < 8; ++step) {
      ASSERT_OK_AND_ASSIGN(auto stats,
                           trainer->Step(batch(step, 1), batch(step, 2)));
      straight.push_back(stats.loss);
    }
  }
  // 4 steps, a checkpoint, and 4 more steps in a fresh model and trainer.
  const fs::path dir = TempDir("resume");
  {
    ASSERT_OK_AND_ASSIGN(
        auto model, Gpt::Create(*context, SmallConfig(), shape, DType::kF32,
                                GptHead::kFusedLoss));
    ASSERT_OK(model->Initialize(seed));
    ASSERT_OK_AND_ASSIGN(auto trainer, Trainer::Create(*model, Options()));
    for (int step = 0; step < 4; ++step) {
      ASSERT_OK_AND_ASSIGN(auto stats,
                           trainer->Step(batch(step, 1), batch(step, 2)));
      EXPECT_EQ(stats.loss, straight[step]);
    }
    ASSERT_OK_AND_ASSIGN(std::string folder,
                         trainer->Save(dir.string(), {{"data_position", "4"}}));
    EXPECT_TRUE(fs::exists(fs::path(folder) / "model.safetensors"));
  }
  {
    ASSERT_OK_AND_ASSIGN(
        auto model, Gpt::Create(*context, SmallConfig(), shape, DType::kF32,
                                GptHead::kFusedLoss));
    ASSERT_OK(model->Initialize(seed + 999));  // overwritten by the load
    ASSERT_OK_AND_ASSIGN(auto trainer, Trainer::Create(*model, Options()));
    ASSERT_OK_AND_ASSIGN(auto extra, trainer->Load(dir.string()));
    EXPECT_EQ(extra["data_position"], "4");
    EXPECT_EQ(trainer->step(), 4);
    for (int step = 4; step < 8; ++step) {
      ASSERT_OK_AND_ASSIGN(auto stats,
                           trainer->Step(batch(step, 1), batch(step, 2)));
      EXPECT_EQ(stats.loss, straight[step]) << "step " << step;
    }
  }
  // No temporary folders are left behind, and `latest` names the checkpoint.
  for (const auto& entry : fs::directory_iterator(dir)) {
    EXPECT_EQ(entry.path().string().find(".tmp"), std::string::npos)
        << entry.path();
  }
  ASSERT_OK_AND_ASSIGN(std::string latest, LatestCheckpoint(dir.string()));
  EXPECT_EQ(fs::path(latest).filename(), "step-00000004");
}

TEST(TrainerTest, CheckpointHoldsNamedWeightsAndConfig) {
  const uint64_t seed = test::TestSeed();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> context,
                       Context::Create(Device::Cpu()));
  GptConfig config = SmallConfig();
  config.tied_head = false;
  config.norm = NormKind::kRmsNorm;
  ASSERT_OK_AND_ASSIGN(
      auto model,
      Gpt::Create(*context, config, {1, 8}, DType::kF32, GptHead::kFusedLoss));
  ASSERT_OK(model->Initialize(seed));
  ASSERT_OK_AND_ASSIGN(auto trainer, Trainer::Create(*model, Options()));
  const fs::path dir = TempDir("named");
  ASSERT_OK_AND_ASSIGN(std::string folder, trainer->Save(dir.string(), {}));
  ASSERT_OK_AND_ASSIGN(SafetensorsFile file,
                       SafetensorsFile::Read(folder + "/model.safetensors"));
  ASSERT_OK_AND_ASSIGN(auto wte, file.Find("transformer.wte.weight"));
  EXPECT_EQ(wte.shape, (Shape{64, 32}));
  ASSERT_OK_AND_ASSIGN(auto qkv,
                       file.Find("transformer.h.1.attn.c_attn.weight"));
  EXPECT_EQ(qkv.shape, (Shape{96, 32}));
  EXPECT_TRUE(file.Find("lm_head.weight").ok());
  ASSERT_OK_AND_ASSIGN(
      std::vector<double> values,
      test::ToHost(*context,
                   model->graph().master(model->named_parameters()[0].value)));
  EXPECT_EQ(
      static_cast<double>(reinterpret_cast<const float*>(wte.bytes.data())[5]),
      values[5]);
  ASSERT_OK_AND_ASSIGN(GptConfig saved, ReadCheckpointConfig(folder));
  EXPECT_EQ(GptConfigToMetadata(saved), GptConfigToMetadata(config));
  // A model of another shape refuses the checkpoint.
  GptConfig other = config;
  other.width = 64;
  ASSERT_OK_AND_ASSIGN(
      auto wrong,
      Gpt::Create(*context, other, {1, 8}, DType::kF32, GptHead::kFusedLoss));
  ASSERT_OK_AND_ASSIGN(auto wrong_trainer, Trainer::Create(*wrong, Options()));
  EXPECT_EQ(wrong_trainer->Load(folder).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// The names in `dir` (files, folders and links alike).
std::set<std::string> Names(const fs::path& dir) {
  std::set<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) {
    names.insert(entry.path().filename().string());
  }
  return names;
}

void Touch(const fs::path& path) { std::ofstream(path) << "not ours\n"; }

TEST(TrainerTest, PruneKeepsTheNewestCheckpointsAndNothingElseGoes) {
  const uint64_t seed = test::TestSeed();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> context,
                       Context::Create(Device::Cpu()));
  const BatchShape shape{1, 16};
  ASSERT_OK_AND_ASSIGN(auto model,
                       Gpt::Create(*context, SmallConfig(), shape, DType::kF32,
                                   GptHead::kFusedLoss));
  ASSERT_OK(model->Initialize(seed));
  ASSERT_OK_AND_ASSIGN(auto trainer, Trainer::Create(*model, Options()));
  const fs::path dir = TempDir("prune");
  fs::create_directories(dir);
  // What is not ours: files, folders of other names, a link to a folder named
  // like a checkpoint, a file named like a temporary folder.
  const fs::path outside = TempDir("prune_outside");
  fs::create_directories(outside / "step-00000001");
  Touch(outside / "step-00000001" / "keep.txt");
  fs::create_directory_symlink(outside / "step-00000001",
                               dir / "step-00000000");
  Touch(dir / "notes.txt");
  Touch(dir / "step-00000011.tmp");
  for (const char* other :
       {"step-7", "step-000000007", "step-00000008.bak", "mystep-00000001",
        "step-0000000x", "step-+0000009", "step-00000009.tmp.old", "tmp"}) {
    fs::create_directories(dir / other);
    Touch(dir / other / "keep.txt");
  }
  const std::set<std::string> foreign = Names(dir);
  // What an interrupted save leaves: a temporary folder, half written.
  fs::create_directories(dir / "step-00000009.tmp");
  Touch(dir / "step-00000009.tmp" / "model.safetensors");

  const int64_t steps = 5 + static_cast<int64_t>(seed % 3);  // 5 to 7
  std::vector<int32_t> ids = Tokens(shape.rows(), seed + 1);
  std::vector<int32_t> targets = Tokens(shape.rows(), seed + 2);
  for (int64_t step = 1; step <= steps; ++step) {
    ASSERT_OK(trainer->Step(ids, targets).status());
    ASSERT_OK(trainer->Save(dir.string(), {}).status());
  }
  auto name = [](int64_t step) { return absl::StrFormat("step-%08d", step); };

  // keep = 0 keeps every checkpoint; only the temporary folder goes.
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> removed,
                       PruneCheckpoints(dir.string(), 0));
  EXPECT_EQ(removed,
            std::vector<std::string>{(dir / "step-00000009.tmp").string()});
  std::set<std::string> want = foreign;
  want.insert("latest");
  for (int64_t step = 1; step <= steps; ++step) want.insert(name(step));
  EXPECT_EQ(Names(dir), want);

  // keep = 3: exactly the 3 newest stay.
  ASSERT_OK_AND_ASSIGN(removed, PruneCheckpoints(dir.string(), 3));
  std::vector<std::string> want_removed;
  for (int64_t step = 1; step <= steps - 3; ++step) {
    want_removed.push_back((dir / name(step)).string());
    want.erase(name(step));
  }
  EXPECT_EQ(removed, want_removed);
  EXPECT_EQ(Names(dir), want);
  EXPECT_TRUE(fs::exists(outside / "step-00000001" / "keep.txt"));
  for (const char* other : {"step-7", "step-000000007", "step-00000008.bak"}) {
    EXPECT_TRUE(fs::exists(dir / other / "keep.txt")) << other;
  }

  // The checkpoint `latest` names stays even when it is not among the newest.
  ASSERT_OK(
      WriteFileAtomically((dir / "latest").string(), name(steps - 2) + "\n"));
  ASSERT_OK_AND_ASSIGN(removed, PruneCheckpoints(dir.string(), 1));
  EXPECT_EQ(removed,
            std::vector<std::string>{(dir / name(steps - 1)).string()});
  want.erase(name(steps - 1));
  EXPECT_EQ(Names(dir), want);
  ASSERT_OK_AND_ASSIGN(auto extra, trainer->Load(dir.string()));
  EXPECT_EQ(trainer->step(), steps - 2);

  // A negative count is refused and removes nothing.
  fs::create_directories(dir / "step-00000012.tmp");
  EXPECT_EQ(PruneCheckpoints(dir.string(), -1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(fs::exists(dir / "step-00000012.tmp"));
  EXPECT_EQ(PruneCheckpoints((dir / "missing").string(), 1).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(TrainerTest, MicroBatchesMatchOneBatch) {
  const uint64_t seed = test::TestSeed();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> context,
                       Context::Create(Device::Cpu()));
  const std::vector<int32_t> ids = Tokens(64, seed + 1);
  const std::vector<int32_t> targets = Tokens(64, seed + 2);
  std::vector<float> norms;
  for (auto [batch, micro] : {std::pair<int64_t, int64_t>{4, 1}, {2, 2}}) {
    ASSERT_OK_AND_ASSIGN(auto model,
                         Gpt::Create(*context, SmallConfig(), {batch, 16},
                                     DType::kF32, GptHead::kFusedLoss));
    ASSERT_OK(model->Initialize(seed));
    ASSERT_OK_AND_ASSIGN(auto trainer, Trainer::Create(*model, Options(micro)));
    ASSERT_OK_AND_ASSIGN(auto stats, trainer->Step(ids, targets));
    norms.push_back(stats.grad_norm);
  }
  // The mean over two halves of equal size is the mean over the whole.
  EXPECT_NEAR(norms[0], norms[1], 1e-4 * norms[0]);
}

TEST(TrainerTest, SamplingIsDeterministic) {
  const uint64_t seed = test::TestSeed();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Context> context,
                       Context::Create(Device::Cpu()));
  ASSERT_OK_AND_ASSIGN(auto model, Gpt::Create(*context, SmallConfig(), {1, 16},
                                               DType::kF32, GptHead::kLogits));
  ASSERT_OK(model->Initialize(seed));
  SamplingOptions options;
  options.top_k = 5;
  options.seed = seed;
  ASSERT_OK_AND_ASSIGN(auto a, Sample(*model, {1, 2, 3}, 20, options));
  ASSERT_OK_AND_ASSIGN(auto b, Sample(*model, {1, 2, 3}, 20, options));
  EXPECT_EQ(a, b);
  EXPECT_EQ(a.size(), 20u);
  for (int32_t token : a) {
    EXPECT_GE(token, 0);
    EXPECT_LT(token, 64);
  }
  EXPECT_FALSE(Sample(*model, {}, 5, options).ok());
}

struct AccuracyCase {
  bool cuda;
  GptHead head;
};

class EvaluateAccuracyTest : public ::testing::TestWithParam<AccuracyCase> {};

// The head's accuracy against the argmax of the logits that a kLogits model of
// the same weights computes (an unfused GEMM, read back and ranked on the
// host), on targets that hit about half the rows, with ignored rows; the loss
// against the log-softmax of those logits. Rows whose two largest logits lie
// within 1e-2 are ignored, so that rounding cannot change their verdict.
TEST_P(EvaluateAccuracyTest, MatchesTheArgmaxOfTheLogits) {
  const AccuracyCase c = GetParam();
  if (c.cuda) SKIP_WITHOUT_GPU();
  const uint64_t seed = test::TestSeed();
  ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<Context> context,
      Context::Create(c.cuda ? Device::Cuda(0) : Device::Cpu()));
  const GptConfig config = SmallConfig();
  const BatchShape shape{2, 16};
  const int64_t rows = shape.rows(), vocab = config.vocab;
  ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<Gpt> model,
      Gpt::Create(*context, config, shape, DType::kF32, c.head));
  ASSERT_OK(model->Initialize(seed));
  // Larger weights than GPT-2's init, so that the logits are spread apart.
  Graph& g = model->graph();
  for (const GptParameter& p : model->named_parameters()) {
    ASSERT_OK_AND_ASSIGN(std::vector<double> values,
                         test::ToHost(*context, g.master(p.value)));
    const std::vector<double> noise =
        test::RandomValues(values.size(), seed ^ p.value.id, -0.3, 0.3);
    for (size_t i = 0; i < values.size(); ++i) values[i] += noise[i];
    ASSERT_OK_AND_ASSIGN(
        OwnedTensor t,
        test::FromHost(*context, DType::kF32, g.info(p.value).shape, values));
    ASSERT_OK(CopyTensor(t.view, g.master(p.value), *context));
  }
  ASSERT_OK(g.SyncComputeCopy());
  ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<Gpt> reference,
      Gpt::Create(*context, config, shape, DType::kF32, GptHead::kLogits));
  ASSERT_OK(reference->CopyParametersFrom(*model));

  const std::vector<int32_t> ids = Tokens(rows, seed + 1);
  ASSERT_OK(reference->graph().SetInput(reference->ids(), ids));
  ASSERT_OK(reference->graph().Forward(/*training=*/false));
  ASSERT_OK_AND_ASSIGN(
      std::vector<double> logits,  // [rows, vocab]
      test::ToHost(*context, reference->graph().tensor(reference->logits())));
  ASSERT_EQ(static_cast<int64_t>(logits.size()), rows * vocab);

  std::mt19937_64 engine(seed + 2);
  std::vector<int32_t> targets(rows);
  int64_t counted = 0, hits = 0, close = 0;
  double loss_sum = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const double* z = &logits[r * vocab];
    int64_t best = 0;
    for (int64_t v = 1; v < vocab; ++v) best = z[v] > z[best] ? v : best;
    double second = -INFINITY;
    for (int64_t v = 0; v < vocab; ++v) {
      if (v != best) second = std::max(second, z[v]);
    }
    if (z[best] - second < 1e-2 || r == 3) {
      targets[r] = -100;  // ignored
      close += r != 3;
      continue;
    }
    targets[r] = engine() % 2 == 0 ? static_cast<int32_t>(best)
                                   : static_cast<int32_t>(engine() % vocab);
    ++counted;
    hits += targets[r] == best;
    double sum = 0;
    for (int64_t v = 0; v < vocab; ++v) sum += std::exp(z[v] - z[best]);
    loss_sum += z[best] + std::log(sum) - z[targets[r]];
  }
  ASSERT_LT(close, rows / 4) << "too many near ties to test";
  ASSERT_GT(hits, 0);
  ASSERT_LT(hits, counted);

  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Trainer> trainer,
                       Trainer::Create(*model, Options()));
  ASSERT_OK_AND_ASSIGN(Trainer::EvalStats stats,
                       trainer->EvaluateWithAccuracy(ids, targets));
  EXPECT_EQ(stats.tokens, counted);
  EXPECT_NEAR(stats.accuracy, static_cast<double>(hits) / counted, 1e-6)
      << hits << " of " << counted;
  const double loss = loss_sum / counted;
  EXPECT_NEAR(stats.loss, loss, 1e-4 * loss);
  ASSERT_OK_AND_ASSIGN(float evaluated, trainer->Evaluate(ids, targets));
  EXPECT_EQ(evaluated, stats.loss);

  // A training step leaves the accuracy to the next evaluation, which
  // writes it again; with every target ignored it is 0 of 0 tokens.
  ASSERT_OK(trainer->Step(ids, targets).status());
  const std::vector<int32_t> ignored(rows, -100);
  ASSERT_OK_AND_ASSIGN(stats, trainer->EvaluateWithAccuracy(ids, ignored));
  EXPECT_EQ(stats.tokens, 0);
  EXPECT_EQ(stats.accuracy, 0.0f);
  EXPECT_EQ(stats.loss, 0.0f);
}

INSTANTIATE_TEST_SUITE_P(
    Heads, EvaluateAccuracyTest,
    ::testing::Values(AccuracyCase{false, GptHead::kFusedLoss},
                      AccuracyCase{false, GptHead::kUnfusedLoss},
                      AccuracyCase{true, GptHead::kFusedLoss},
                      AccuracyCase{true, GptHead::kUnfusedLoss}),
    [](const ::testing::TestParamInfo<AccuracyCase>& info) {
      return std::string(info.param.cuda ? "Cuda" : "Cpu") +
             (info.param.head == GptHead::kFusedLoss ? "Fused" : "Unfused");
    });

}  // namespace
}  // namespace graph
}  // namespace lossrt
