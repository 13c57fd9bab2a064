// Data sources and the data-parallel loader: the Markov chain's stationary distribution and
// entropy rate, text-file tokens and errors, and the sharding contract of data.hpp (ranks
// disjoint, their union equal to the serial global batch, row i of rank r = serial row i*dp + r).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "orrery/common/error.hpp"
#include "orrery/runtime/data.hpp"

namespace orrery::runtime {
namespace {

TEST(MarkovSource, StationaryDistributionIsAFixedPoint) {
  MarkovSource src(64, 5);
  const auto& pi = src.stationary();
  double total = 0.0;
  std::vector<double> next(64, 0.0);
  for (int s = 0; s < 64; ++s) {
    total += pi[s];
    const auto& succ = src.successors(s);
    const auto& p = src.probabilities(s);
    EXPECT_GE(succ.size(), 4u);
    EXPECT_LE(succ.size(), 16u);
    double ps = 0.0;
    for (std::size_t i = 0; i < succ.size(); ++i) {
      next[succ[i]] += pi[s] * p[i];
      ps += p[i];
    }
    EXPECT_NEAR(ps, 1.0, 1e-12);
  }
  EXPECT_NEAR(total, 1.0, 1e-12);
  for (int s = 0; s < 64; ++s) EXPECT_NEAR(next[s], pi[s], 1e-10);
  EXPECT_GT(src.entropy_rate(), 0.5);
  EXPECT_LT(src.entropy_rate(), std::log(16.0));
}

// The empirical mean of -log P(x_{t+1} | x_t) over sampled sequences converges to the entropy rate.
TEST(MarkovSource, SampledSequencesHaveTheEntropyRate) {
  MarkovSource src(32, 9);
  const int T = 256;
  std::vector<int32_t> seq(T + 1);
  double nll = 0.0;
  long count = 0;
  for (int64_t i = 0; i < 400; ++i) {
    src.read_sequence(i, T, seq.data());
    for (int t = 0; t < T; ++t) {
      const auto& succ = src.successors(seq[t]);
      const auto it = std::find(succ.begin(), succ.end(), seq[t + 1]);
      ASSERT_NE(it, succ.end()) << "transition outside the chain";
      nll -= std::log(src.probabilities(seq[t])[static_cast<std::size_t>(it - succ.begin())]);
      ++count;
    }
  }
  // About 100k transitions: the standard error is below 0.01 nats.
  EXPECT_NEAR(nll / count, src.entropy_rate(), 0.03);
  // Deterministic per index.
  std::vector<int32_t> again(T + 1);
  src.read_sequence(7, T, seq.data());
  src.read_sequence(7, T, again.data());
  EXPECT_EQ(seq, again);
}

TEST(DataLoader, ShardsAreDisjointAndFormTheSerialBatch) {
  MarkovSource src(32, 1, /*num_sequences=*/1000);
  const int T = 8, B = 3, dp = 4;
  DataLoader serial(src, T, B * dp, 0, 1, 42);
  std::vector<DataLoader> ranks;
  for (int r = 0; r < dp; ++r) ranks.emplace_back(src, T, B, r, dp, 42);
  EXPECT_EQ(serial.calls_per_epoch(), 1000 / (B * dp));
  std::set<int64_t> seen_in_epoch;
  for (int64_t call = 0; call < serial.calls_per_epoch() + 3; ++call) {
    const Batch s = serial.next_batch();
    std::multiset<int64_t> uni;
    for (int r = 0; r < dp; ++r) {
      const Batch b = ranks[static_cast<std::size_t>(r)].next_batch();
      for (int i = 0; i < B; ++i) {
        const int64_t idx = b.sequence_indices[static_cast<std::size_t>(i)];
        uni.insert(idx);
        // Row i of rank r is serial row i*dp + r, tokens included.
        ASSERT_EQ(idx, s.sequence_indices[static_cast<std::size_t>(i * dp + r)]);
        ASSERT_TRUE(std::equal(b.inputs.begin() + i * T, b.inputs.begin() + (i + 1) * T,
                               s.inputs.begin() + (i * dp + r) * T));
        ASSERT_TRUE(std::equal(b.targets.begin() + i * T, b.targets.begin() + (i + 1) * T,
                               s.targets.begin() + (i * dp + r) * T));
      }
    }
    EXPECT_EQ(uni, std::multiset<int64_t>(s.sequence_indices.begin(), s.sequence_indices.end()));
    if (call < serial.calls_per_epoch()) {
      for (int64_t idx : uni) EXPECT_TRUE(seen_in_epoch.insert(idx).second) << "sequence repeated in an epoch";
    }
  }
  // The next epoch is a different order.
  DataLoader probe(src, T, B * dp, 0, 1, 42);
  EXPECT_NE(probe.sequence_indices(0), probe.sequence_indices(probe.calls_per_epoch()));
  // Targets are the inputs shifted by one.
  const Batch b = probe.next_batch();
  std::vector<int32_t> seq(T + 1);
  src.read_sequence(b.sequence_indices[0], T, seq.data());
  EXPECT_TRUE(std::equal(seq.begin(), seq.end() - 1, b.inputs.begin()));
  EXPECT_TRUE(std::equal(seq.begin() + 1, seq.end(), b.targets.begin()));
}

TEST(TextFileSource, BytesAreTokens) {
  const auto path = std::filesystem::temp_directory_path() / "orrery_test_text_source.txt";
  {
    std::ofstream out(path, std::ios::binary);
    out << "hello, world! \xff";
  }
  TextFileSource src(path.string(), 256);
  EXPECT_EQ(src.size_bytes(), 15u);
  EXPECT_EQ(src.num_sequences(4), 3);  // (15 - 1) / 4
  std::vector<int32_t> seq(5);
  src.read_sequence(1, 4, seq.data());
  EXPECT_EQ(seq, (std::vector<int32_t>{'o', ',', ' ', 'w', 'o'}));
  src.read_sequence(2, 4, seq.data());
  EXPECT_EQ(seq, (std::vector<int32_t>{'o', 'r', 'l', 'd', '!'}));
  std::vector<int32_t> last(8);
  src.read_sequence(1, 7, last.data());  // bytes [7, 15): bytes are unsigned tokens
  EXPECT_EQ(last.back(), 255);
  EXPECT_THROW(DataLoader(src, 16, 1, 0, 1, 1), InputError);  // not even one sequence
  std::filesystem::remove(path);
}

TEST(TextFileSource, ErrorsNameTheFile) {
  try {
    TextFileSource src("/nonexistent/corpus.txt", 256);
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/corpus.txt"), std::string::npos) << e.what();
  }
  EXPECT_THROW(TextFileSource("/nonexistent/corpus.txt", 128), InputError);
  EXPECT_THROW(make_token_source("images", "", 256, 1), InputError);
  EXPECT_NO_THROW(make_token_source("synthetic", "", 64, 1));
}

}  // namespace
}  // namespace orrery::runtime
