// NVMe offload in one process (zero.offload_optimizer nvme; runtime offload.hpp): the chunked
// store round trip, a run with the moments in a file bit-identical to one without, the trace's
// offload bytes against the closed form (2 moments x 4 bytes x elements, read and written, per
// step) and the memory counters, a checkpoint resumed bit for bit, and the errors: bad keys
// (exit 2 naming the key), a full disk and a vanished file naming the path. The multi-rank cases
// (dp2 ZeRO 1, ZeRO 3 with offload_params) run under mpirun (mpi/test_offload_mpi.cpp).
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "orrery/common/error.hpp"
#include "orrery/model/names.hpp"
#include "orrery/profiler/recorder.hpp"
#include "orrery/runtime/checkpoint.hpp"
#include "orrery/runtime/offload.hpp"
#include "orrery/runtime/trainer.hpp"
#include "orrery/traces/store.hpp"

namespace orrery::runtime {
namespace {
namespace fs = std::filesystem;

fs::path temp_dir(const std::string& name) {
  const fs::path p =
      fs::temp_directory_path() / ("orrery_offload_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

Scenario tiny(int steps, const std::string& nvme_dir) {
  Scenario s;
  s.name = "offload-test";
  s.model.layers = 2;
  s.model.d_model = 32;
  s.model.heads = 2;
  s.model.vocab = 64;
  s.model.seq = 16;
  s.training.steps = steps;
  s.training.global_batch = 4;
  s.training.micro_batch = 2;
  s.training.seed = 11;
  s.training.lr = 1e-3;
  s.parallel.bucket_mb = 0.01;
  if (!nvme_dir.empty()) {
    s.zero.offload_optimizer = "nvme";
    s.zero.nvme_path = nvme_dir;
    s.zero.offload_chunk_mb = 0.01;  // 2621 floats: the model's ~30k elements in 12 chunks
  }
  return s;
}

std::vector<float> losses_of(Trainer& t, int steps) {
  std::vector<float> out;
  for (int i = 0; i < steps; ++i) out.push_back(t.step().loss);
  return out;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(OffloadStore, ChunksStreamEveryElementOnceInOrder) {
  const fs::path dir = temp_dir("store");
  const std::size_t n = 1000;
  OffloadStore st(dir.string(), "t", 2, n, 64, nullptr);
  EXPECT_EQ(st.file_bytes(), 2 * n * sizeof(float));
  EXPECT_EQ(st.buffer_bytes(), 3 * 2 * 64 * sizeof(float));
  std::vector<float> init(n);
  for (std::size_t i = 0; i < n; ++i) init[i] = static_cast<float>(i);
  st.write(0, 0, n, init.data(), -1);
  std::size_t next = 100;
  st.for_each_chunk(100, 850, 0, [&](std::size_t first, std::size_t count, float* const* p) {
    EXPECT_EQ(first, next);
    next += count;
    for (std::size_t i = 0; i < count; ++i) {
      EXPECT_EQ(p[0][i], static_cast<float>(first + i));
      EXPECT_EQ(p[1][i], 0.0f);  // the file starts as zeros
      p[0][i] += 0.5f;
      p[1][i] = -1.0f;
    }
  });
  EXPECT_EQ(next, 950u);
  std::vector<float> m(n), v(n);
  st.read(0, 0, n, m.data(), -1);
  st.read(1, 0, n, v.data(), -1);
  for (std::size_t i = 0; i < n; ++i) {
    const bool in = i >= 100 && i < 950;
    ASSERT_EQ(m[i], static_cast<float>(i) + (in ? 0.5f : 0.0f)) << i;
    ASSERT_EQ(v[i], in ? -1.0f : 0.0f) << i;
  }
  const std::string path = st.path();
  EXPECT_EQ(path.rfind(dir.string(), 0), 0u);
  EXPECT_NE(path.find(std::to_string(::getpid())), std::string::npos);
  fs::remove_all(dir);
}

// O_DIRECT (where the filesystem allows it; the temp directory's usually does): requests of any
// address, offset and size go through the aligned bounce buffer, the bytes around them kept.
TEST(OffloadFile, UnalignedRequestsRoundTripAndKeepTheirNeighbours) {
  const fs::path dir = temp_dir("direct");
  const std::size_t a = OffloadFile::kDirectAlign, size = 5 * a + 123;
  OffloadFile f(dir.string(), "d", size);
  std::vector<char> all(size);
  for (std::size_t i = 0; i < size; ++i) all[i] = static_cast<char>(i * 7 + 1);
  f.write(all.data(), size, 0);  // from a vector: not block-aligned in address or size
  // Within one block, across two blocks, from an odd address, ending at the file's end.
  struct Piece {
    std::size_t offset, bytes;
  };
  for (const Piece pc :
       {Piece{a + 5, 17}, Piece{2 * a - 9, 30}, Piece{3, 3 * a}, Piece{size - 50, 50}}) {
    std::vector<char> buf(pc.bytes + 1);
    for (std::size_t i = 0; i < pc.bytes; ++i) buf[i + 1] = static_cast<char>(~all[pc.offset + i]);
    f.write(buf.data() + 1, pc.bytes, pc.offset);
    for (std::size_t i = 0; i < pc.bytes; ++i) all[pc.offset + i] = buf[i + 1];
    std::vector<char> back(size + 1);
    f.read(back.data() + 1, size, 0);
    ASSERT_EQ(0, std::memcmp(back.data() + 1, all.data(), size)) << pc.offset << " " << pc.bytes;
    f.read(back.data() + 1, pc.bytes, pc.offset);
    ASSERT_EQ(0, std::memcmp(back.data() + 1, all.data() + pc.offset, pc.bytes));
  }
  // Past the end: the file's error, whatever the mode.
  std::vector<char> tail(2 * a);
  EXPECT_NE(error_of([&] { f.read(tail.data(), 2 * a, size - 10 + a); }).find("ends before"),
            std::string::npos);
  std::printf("offload file O_DIRECT: %s\n", f.direct() ? "on" : "off (refused)");
  fs::remove_all(dir);
}

TEST(Offload, NvmeMomentsGiveTheSameBitsAsMemory) {
  const fs::path dir = temp_dir("same");
  auto w0 = make_local_communicator();
  Trainer plain(tiny(3, ""), *w0, nullptr);
  plain.prepare();
  const std::vector<float> want = losses_of(plain, 3);
  auto w1 = make_local_communicator();
  Trainer off(tiny(3, dir.string()), *w1, nullptr);
  off.prepare();
  EXPECT_EQ(losses_of(off, 3), want);
  const std::vector<float> a = plain.parameters(), b = off.parameters();
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
  // Memory: the moments' 8 bytes per element moved to the file, three chunks of each in memory.
  const std::size_t n = off.flat_elems();
  EXPECT_EQ(off.memory().offload_nvme, 8.0 * static_cast<double>(n));
  EXPECT_EQ(off.memory().optimizer, 3.0 * 2 * 2621 * 4);
  EXPECT_EQ(plain.memory().optimizer, 8.0 * static_cast<double>(n));
  EXPECT_EQ(plain.memory().offload_nvme, 0.0);
  fs::remove_all(dir);
}

TEST(Offload, TraceBytesAreTheClosedForm) {
  const fs::path dir = temp_dir("bytes");
  const std::string path = (dir / "t.db").string();
  std::size_t n = 0;
  {
    traces::TraceWriter writer(path);
    profiler::Recorder rec(&writer, 0);
    auto world = make_local_communicator();
    Trainer t(tiny(2, dir.string()), *world, &rec);
    n = t.flat_elems();
    t.prepare();
    t.step();
    t.step();
    rec.flush();
    writer.close();
  }
  const traces::Trace tr = traces::load_trace(path);
  int64_t read[2] = {0, 0}, written[2] = {0, 0}, requests = 0;
  for (const auto& sp : tr.spans) {
    const std::string& name = tr.name_of(sp);
    if (name != model::names::kOffloadRead && name != model::names::kOffloadWrite) continue;
    EXPECT_EQ(sp.stream, model::names::kStreamOffload);
    EXPECT_EQ(sp.kind, traces::SpanKind::Memcpy);
    if (sp.step < 0 || sp.step > 1) continue;
    (name == model::names::kOffloadRead ? read : written)[sp.step] += sp.bytes;
    ++requests;
  }
  for (int step = 0; step < 2; ++step) {
    EXPECT_EQ(read[step], static_cast<int64_t>(2 * 4 * n)) << step;
    EXPECT_EQ(written[step], static_cast<int64_t>(2 * 4 * n)) << step;
  }
  const std::size_t chunks = (n + 2620) / 2621;
  EXPECT_EQ(requests, static_cast<int64_t>(2 * 2 * chunks));  // a read and a write per chunk
  double offload_nvme = -1, optimizer = -1;
  for (const auto& c : tr.counters) {
    if (tr.strings.str(c.name) == model::names::kMemOffloadNvme) offload_nvme = c.value;
    if (tr.strings.str(c.name) == model::names::kMemOptimizer) optimizer = c.value;
  }
  EXPECT_EQ(offload_nvme, 8.0 * static_cast<double>(n));
  EXPECT_EQ(optimizer, 3.0 * 2 * 2621 * 4);
  fs::remove_all(dir);
}

struct RunOut {
  std::vector<float> losses;
  std::vector<float> params;
};

RunOut run_with_checkpoints(const Scenario& s, const std::string& resume = "") {
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

TEST(Offload, ResumedRunIsBitIdentical) {
  const fs::path root = temp_dir("resume");
  Scenario a = tiny(4, root.string());
  a.checkpoint.every = 2;
  a.checkpoint.dir = (root / "a").string();
  const RunOut full = run_with_checkpoints(a);
  Scenario b = a;
  b.checkpoint.dir = (root / "b").string();
  const RunOut resumed = run_with_checkpoints(b, (root / "a" / "step-2").string());
  ASSERT_EQ(resumed.losses.size(), 2u);
  EXPECT_EQ(resumed.losses[0], full.losses[2]);
  EXPECT_EQ(resumed.losses[1], full.losses[3]);
  ASSERT_EQ(resumed.params.size(), full.params.size());
  EXPECT_EQ(0, std::memcmp(resumed.params.data(), full.params.data(),
                           full.params.size() * sizeof(float)));
  // And the same as a run without offload.
  Scenario c = tiny(4, "");
  c.checkpoint.every = 2;
  c.checkpoint.dir = (root / "c").string();
  EXPECT_EQ(run_with_checkpoints(c).losses, full.losses);
  fs::remove_all(root);
}

std::string parse_error(const std::string& yaml) {
  try {
    parse_scenario(yaml, "offload.yaml");
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no InputError)";
}

TEST(Offload, BadKeysAreRefusedNamingTheKey) {
  const std::string base =
      "model: {layers: 2, d_model: 32, heads: 2, vocab: 64, seq: 16}\n"
      "training: {global_batch: 4, micro_batch: 2}\n";
  EXPECT_NE(parse_error(base + "zero: {offload_optimizer: disk}\n")
                .find("key 'zero.offload_optimizer': expected none, host or nvme, got 'disk'"),
            std::string::npos);
  EXPECT_NE(parse_error(base + "zero: {offload_params: host}\n")
                .find("key 'zero.offload_params': expected none or nvme"),
            std::string::npos);
  EXPECT_NE(parse_error(base + "zero: {offload_optimizer: nvme}\n")
                .find("key 'zero.nvme_path': zero.offload_optimizer is nvme but"),
            std::string::npos);
  EXPECT_NE(parse_error(base + "zero: {offload_optimizer: host}\n")
                .find("key 'zero.offload_optimizer': 'host' moves the optimizer state"),
            std::string::npos);
  EXPECT_NE(
      parse_error(base + "parallel: {dp: 2, zero: 1}\ntraining: {global_batch: 4, micro_batch: 2}\n"
                         "zero: {offload_optimizer: nvme, offload_params: nvme, nvme_path: /tmp}\n")
          .find("key 'zero.offload_params': 'nvme' offloads ZeRO 3's parameter shards: "
                "needs parallel.zero 3 (got 1)"),
      std::string::npos);
  EXPECT_NE(parse_error(base + "zero: {offload_chunk_mb: 0}\n").find("key 'zero.offload_chunk_mb'"),
            std::string::npos);
  // The directory is checked when a run starts (a simulation needs none).
  Scenario s = parse_scenario(base + "zero: {offload_optimizer: nvme, nvme_path: /no/such/dir}\n",
                              "offload.yaml");
  EXPECT_EQ(error_of([&] { check_supported(s); }),
            "offload.yaml: key 'zero.nvme_path': '/no/such/dir' is not an existing directory");
}

// A tmpfs of `kib` KiB at a fresh directory (root in a container may mount one); false if not.
bool mount_tmpfs(const fs::path& at, int kib, bool read_only) {
  const std::string opt = "size=" + std::to_string(kib) + "k";
  return ::mount("tmpfs", at.c_str(), "tmpfs", read_only ? MS_RDONLY : 0, opt.c_str()) == 0;
}

TEST(Offload, ReadOnlyDirectoryIsRefusedNamingTheKey) {
  const fs::path dir = temp_dir("ro");
  if (!mount_tmpfs(dir, 64, true)) GTEST_SKIP() << "cannot mount a read-only tmpfs here";
  Scenario s = tiny(1, dir.string());
  const std::string e = error_of([&] { check_supported(s); });
  ::umount(dir.c_str());
  EXPECT_NE(e.find("key 'zero.nvme_path': cannot create files in '" + dir.string() +
                   "': Read-only file system"),
            std::string::npos)
      << e;
  fs::remove_all(dir);
}

TEST(Offload, FullDiskIsAnErrorNamingTheFile) {
  // A 16 KiB tmpfs where the file (8 bytes x ~30k elements) does not fit: ENOSPC. Without the
  // right to mount, a file-size limit of 16 KiB (EFBIG) stands in for the full disk.
  const fs::path dir = temp_dir("full");
  const bool mounted = mount_tmpfs(dir, 16, false);
  rlimit old{};
  ::getrlimit(RLIMIT_FSIZE, &old);
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  if (!mounted) {
    rlimit small = old;
    small.rlim_cur = 16 * 1024;
    ::setrlimit(RLIMIT_FSIZE, &small);
  }
  auto world = make_local_communicator();
  const std::string e = error_of([&] { Trainer t(tiny(1, dir.string()), *world, nullptr); });
  if (!mounted) ::setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, old_handler);
  if (mounted) ::umount(dir.c_str());
  EXPECT_NE(e.find("offload file '" + dir.string() + "/orrery-offload-"), std::string::npos) << e;
  EXPECT_NE(e.find(mounted ? "No space left on device" : "File too large"), std::string::npos) << e;
  fs::remove_all(dir);
}

TEST(Offload, VanishedFileStopsTheRunNamingIt) {
  const fs::path dir = temp_dir("vanish");
  auto world = make_local_communicator();
  Trainer t(tiny(3, dir.string()), *world, nullptr);
  t.prepare();
  t.step();
  const std::string path = t.offload()->path();
  ASSERT_TRUE(fs::exists(path));
  fs::remove(path);
  EXPECT_EQ(
      error_of([&] { t.step(); }),
      "offload file '" + path + "' vanished (removed or replaced while the run was using it)");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace orrery::runtime
