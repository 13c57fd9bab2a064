// Checkpoints in one process: CRC32C against its published check value, a save/restore round trip
// that continues bit for bit, damaged and partial checkpoints refused or skipped with a message
// naming the file, a tp change refused, and resharding reads (a ZeRO state in 2 ranges read as 1,
// and 1 read as 2) on hand-built checkpoints. The multi-rank cases run under mpirun
// (tests/runtime/mpi/checkpoint_checks.sh).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "orrery/common/error.hpp"
#include "orrery/runtime/checkpoint.hpp"
#include "orrery/runtime/trainer.hpp"

namespace orrery::runtime {
namespace {
namespace fs = std::filesystem;

fs::path temp_dir(const std::string& name) {
  const fs::path p =
      fs::temp_directory_path() / ("orrery_ckpt_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

Scenario tiny(int steps, const std::string& dir, bool background = false) {
  Scenario s;
  s.name = "ckpt-test";
  s.model.layers = 2;
  s.model.d_model = 32;
  s.model.heads = 2;
  s.model.vocab = 64;
  s.model.seq = 16;
  s.training.steps = steps;
  s.training.global_batch = 4;
  s.training.micro_batch = 2;
  s.training.seed = 9;
  s.training.lr = 1e-3;
  s.parallel.bucket_mb = 0.01;
  s.checkpoint.every = 2;
  s.checkpoint.dir = dir;
  s.checkpoint.background = background;
  return s;
}

struct RunOut {
  std::vector<float> losses;
  std::vector<float> params;
};

// Runs s (resuming from `resume` when given) to s.training.steps with checkpoints.
RunOut run(const Scenario& s, const std::string& resume = "") {
  auto world = make_local_communicator();
  Trainer t(s, *world, nullptr);
  CheckpointSession ck(s, t, *world, nullptr, s.checkpoint.dir);
  if (!resume.empty()) restore_trainer(t, s, resume, verify_checkpoint(resume));
  t.prepare();
  RunOut out;
  while (t.steps_done() < s.training.steps) {
    out.losses.push_back(t.step().loss);
    ck.after_step();
  }
  ck.finish();
  out.params = t.parameters();
  return out;
}

void flip_byte(const fs::path& p, std::size_t at) {
  std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(at));
  char c = 0;
  f.get(c);
  f.seekp(static_cast<std::streamoff>(at));
  f.put(static_cast<char>(c ^ 0x10));
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no InputError)";
}

TEST(Checkpoint, Crc32cCheckValue) {
  const std::string s = "123456789";
  EXPECT_EQ(crc32c(s.data(), s.size()), 0xE3069283u);
  // In pieces, continuing from the previous value.
  EXPECT_EQ(crc32c(s.data() + 4, 5, crc32c(s.data(), 4)), 0xE3069283u);
  EXPECT_EQ(crc32c(nullptr, 0), 0u);
}

class RoundTrip : public ::testing::TestWithParam<bool> {};

TEST_P(RoundTrip, ResumedRunIsBitIdentical) {
  const bool background = GetParam();
  const fs::path root = temp_dir(background ? "rt_bg" : "rt_fg");
  const RunOut full = run(tiny(4, (root / "a").string(), background));
  ASSERT_TRUE(fs::exists(root / "a" / "step-2" / "manifest.json"));
  ASSERT_TRUE(fs::exists(root / "a" / "step-4" / "manifest.json"));

  const RunOut resumed =
      run(tiny(4, (root / "b").string(), background), (root / "a" / "step-2").string());
  ASSERT_EQ(resumed.losses.size(), 2u);
  EXPECT_EQ(resumed.losses[0], full.losses[2]);
  EXPECT_EQ(resumed.losses[1], full.losses[3]);
  ASSERT_EQ(resumed.params.size(), full.params.size());
  EXPECT_EQ(0, std::memcmp(resumed.params.data(), full.params.data(),
                           full.params.size() * sizeof(float)));
  // Both runs' step-4 checkpoints hold the same bytes.
  const CheckpointManifest a = verify_checkpoint((root / "a" / "step-4").string());
  const CheckpointManifest b = verify_checkpoint((root / "b" / "step-4").string());
  ASSERT_EQ(a.files.size(), 1u);
  ASSERT_EQ(b.files.size(), 1u);
  EXPECT_EQ(a.files[0].crc32c, b.files[0].crc32c);
  EXPECT_EQ(a.files[0].bytes, 12 * full.params.size());
  EXPECT_EQ(a.adamw_steps, 4);
  EXPECT_EQ(a.data_calls, 8);  // 2 micro-batches per step
  fs::remove_all(root);
}

INSTANTIATE_TEST_SUITE_P(ForegroundAndBackground, RoundTrip, ::testing::Values(false, true),
                         [](const auto& p) { return p.param ? "background" : "foreground"; });

TEST(Checkpoint, DamageIsDetectedAndNamed) {
  const fs::path root = temp_dir("damage");
  run(tiny(2, (root / "a").string()));
  const fs::path good = root / "a" / "step-2";
  const std::string shard = "tp0-pp0-dp0.bin";
  auto copy = [&](const std::string& name) {
    const fs::path d = root / name;
    fs::copy(good, d, fs::copy_options::recursive);
    return d;
  };
  const fs::path flipped = copy("flipped");
  flip_byte(flipped / shard, 1234);
  std::string e = error_of([&] { verify_checkpoint(flipped.string()); });
  EXPECT_NE(e.find(shard), std::string::npos) << e;
  EXPECT_NE(e.find("fails its checksum"), std::string::npos) << e;

  const fs::path cut = copy("cut");
  fs::resize_file(cut / shard, fs::file_size(cut / shard) - 100);
  e = error_of([&] { verify_checkpoint(cut.string()); });
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;
  EXPECT_NE(e.find(shard), std::string::npos) << e;

  const fs::path gone = copy("gone");
  fs::remove(gone / shard);
  e = error_of([&] { verify_checkpoint(gone.string()); });
  EXPECT_NE(e.find("missing"), std::string::npos) << e;

  const fs::path bad_json = copy("bad_json");
  std::ofstream(bad_json / "manifest.json") << "{\"format\": \"orrery-checkpoint\", \"step\": ";
  e = error_of([&] { verify_checkpoint(bad_json.string()); });
  EXPECT_NE(e.find("manifest.json"), std::string::npos) << e;
  EXPECT_NE(e.find("not valid JSON"), std::string::npos) << e;

  const fs::path partial = copy("partial");
  fs::remove(partial / "manifest.json");
  e = error_of([&] { verify_checkpoint(partial.string()); });
  EXPECT_NE(e.find("partial"), std::string::npos) << e;
  fs::remove_all(root);
}

TEST(Checkpoint, LatestCompleteIsChosenNewerPartialSkipped) {
  const fs::path root = temp_dir("latest");
  run(tiny(6, (root / "a").string()));                       // step-2, step-4, step-6
  fs::remove(root / "a" / "step-6" / "manifest.json");       // partial
  flip_byte(root / "a" / "step-4" / "tp0-pp0-dp0.bin", 77);  // damaged
  const ResumePoint rp = find_resume_point((root / "a").string());
  EXPECT_EQ(fs::path(rp.step_dir).filename(), "step-2");
  ASSERT_EQ(rp.skipped.size(), 2u);
  EXPECT_NE(rp.skipped[0].find("step-6"), std::string::npos) << rp.skipped[0];
  EXPECT_NE(rp.skipped[0].find("no manifest.json"), std::string::npos) << rp.skipped[0];
  EXPECT_NE(rp.skipped[1].find("step-4"), std::string::npos) << rp.skipped[1];
  EXPECT_NE(rp.skipped[1].find("checksum"), std::string::npos) << rp.skipped[1];
  // Nothing usable at all: refused, each reason listed.
  fs::remove(root / "a" / "step-2" / "manifest.json");
  const std::string e = error_of([&] { find_resume_point((root / "a").string()); });
  EXPECT_NE(e.find("no complete checkpoint"), std::string::npos) << e;
  EXPECT_NE(e.find("step-2"), std::string::npos) << e;
  fs::remove_all(root);
}

TEST(Checkpoint, OtherTensorParallelSizeIsRefused) {
  const fs::path root = temp_dir("tp");
  run(tiny(2, (root / "a").string()));
  const CheckpointManifest m = verify_checkpoint((root / "a" / "step-2").string());
  Scenario s = tiny(4, "");
  s.parallel.tp = 2;
  std::string e = error_of([&] { check_resume_compatible(m, s, "tiny.yaml"); });
  EXPECT_NE(e.find("tiny.yaml: key 'parallel.tp'"), std::string::npos) << e;
  EXPECT_NE(e.find("written with parallel.tp=1, the scenario has 2"), std::string::npos) << e;
  s = tiny(4, "");
  s.model.d_model = 64;
  e = error_of([&] { check_resume_compatible(m, s, "tiny.yaml"); });
  EXPECT_NE(e.find("model.d_model"), std::string::npos) << e;
  s = tiny(2, "");
  e = error_of([&] { check_resume_compatible(m, s, "tiny.yaml"); });
  EXPECT_NE(e.find("nothing left to run"), std::string::npos) << e;
  s = tiny(4, "");
  s.parallel.dp = 2;  // dp may change
  EXPECT_NO_THROW(check_resume_compatible(m, s, "tiny.yaml"));
  fs::remove_all(root);
}

// A hand-built checkpoint of an n-element flat array: params[i] = i, m[i] = -i, v[i] = i/2, in the
// files and ranges given.
CheckpointManifest build(const fs::path& dir, std::size_t n,
                         const std::vector<std::vector<CheckpointRange>>& files) {
  fs::create_directories(dir);
  CheckpointManifest m;
  m.scenario = "hand";
  m.files.clear();
  int dp = 0;
  for (const auto& ranges : files) {
    std::vector<float> data;
    for (const auto& r : ranges) {
      for (int f = 0; f < 3; ++f) {
        for (uint64_t i = r.offset; i < r.offset + r.count; ++i) {
          const float x = static_cast<float>(i);
          data.push_back(f == 0 ? x : f == 1 ? -x : 0.5f * x);
        }
      }
    }
    CheckpointFile cf;
    cf.name = "tp0-pp0-dp" + std::to_string(dp) + ".bin";
    cf.dp = dp++;
    cf.flat_elems = n;
    cf.ranges = ranges;
    const WrittenFile w =
        write_file_atomic((dir / cf.name).string(), {{data.data(), data.size() * sizeof(float)}});
    cf.bytes = w.bytes;
    cf.crc32c = w.crc32c;
    m.files.push_back(cf);
  }
  const std::string text = manifest_to_json(m);
  write_file_atomic((dir / "manifest.json").string(), {{text.data(), text.size()}});
  return verify_checkpoint(dir.string());  // and back through the parser
}

void expect_range(const CheckpointReader& r, uint64_t offset, uint64_t count) {
  using F = CheckpointReader::Field;
  std::vector<float> p(count), m(count), v(count);
  r.read(0, 0, F::Params, offset, count, p.data());
  r.read(0, 0, F::M, offset, count, m.data());
  r.read(0, 0, F::V, offset, count, v.data());
  for (uint64_t i = 0; i < count; ++i) {
    const float x = static_cast<float>(offset + i);
    ASSERT_EQ(p[i], x) << "element " << offset + i;
    ASSERT_EQ(m[i], -x) << "element " << offset + i;
    ASSERT_EQ(v[i], 0.5f * x) << "element " << offset + i;
  }
}

TEST(Checkpoint, ReshardsZeroRangesTwoToOneAndOneToTwo) {
  const fs::path root = temp_dir("reshard");
  const std::size_t n = 1001, k = (n + 1) / 2;  // ZeRO over 2: [0, 501) and [501, 1001)
  // 2 -> 1: a dp-2 ZeRO checkpoint read whole (a dp-1 run) and in ZeRO-3-like segment pieces.
  const CheckpointManifest two = build(root / "two", n, {{{0, k}}, {{k, n - k}}});
  CheckpointReader r2((root / "two").string(), two);
  expect_range(r2, 0, n);
  expect_range(r2, 400, 200);  // across the two files
  // 1 -> 2: a whole-array checkpoint read as the two owned shards of a dp-2 ZeRO run.
  const CheckpointManifest one = build(root / "one", n, {{{0, n}}});
  CheckpointReader r1((root / "one").string(), one);
  expect_range(r1, 0, k);
  expect_range(r1, k, n - k);
  // 3 -> 2: files of several ranges each (ZeRO 3 segments), read as 2 shards.
  const CheckpointManifest three =
      build(root / "three", n, {{{0, 100}, {500, 100}}, {{100, 400}}, {{600, 401}}});
  CheckpointReader r3((root / "three").string(), three);
  expect_range(r3, 0, k);
  expect_range(r3, k, n - k);
  // A hole: refused, naming what is missing.
  const CheckpointManifest hole = build(root / "hole", n, {{{0, 500}}, {{501, 500}}});
  CheckpointReader rh((root / "hole").string(), hole);
  std::vector<float> buf(n);
  const std::string e =
      error_of([&] { rh.read(0, 0, CheckpointReader::Field::Params, 0, n, buf.data()); });
  EXPECT_NE(e.find("elements [0, 1001)"), std::string::npos) << e;
  EXPECT_NE(e.find("1000 of 1001 found"), std::string::npos) << e;
  fs::remove_all(root);
}

// Another micro-batch size (as another dp size would): the data position moves by sequences, so the
// first resumed step sees the same global batch as the uninterrupted run (its loss equal to
// rounding: the micro-batches group it differently).
TEST(Checkpoint, DataPositionMapsOntoAnotherMicroBatch) {
  const fs::path root = temp_dir("data");
  const RunOut full = run(tiny(4, (root / "a").string()));
  Scenario s = tiny(4, (root / "b").string());
  s.training.micro_batch = 4;  // 1 micro-batch per step instead of 2
  auto world = make_local_communicator();
  Trainer t(s, *world, nullptr);
  const std::string step2 = (root / "a" / "step-2").string();
  restore_trainer(t, s, step2, verify_checkpoint(step2));
  EXPECT_EQ(t.loader().position(), 2);  // 4 calls of 2 sequences = 2 calls of 4
  t.prepare();
  const float loss = t.step().loss;
  EXPECT_NEAR(loss, full.losses[2], 1e-6 * std::abs(full.losses[2]));
  fs::remove_all(root);
}

}  // namespace
}  // namespace orrery::runtime
