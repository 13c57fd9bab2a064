// Token sources (seeded Markov chain, byte-level text file) and the data-parallel loader; the
// global batch order is documented in data.hpp.
#include "orrery/runtime/data.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <numeric>
#include <sstream>

#include "orrery/common/error.hpp"
#include "random.hpp"

namespace orrery::runtime {

// ---------------------------------------------------------------- Markov chain

MarkovSource::MarkovSource(int vocab, uint64_t seed, int64_t num_sequences, int k_min, int k_max)
    : vocab_(vocab), seed_(seed), num_sequences_(num_sequences) {
  if (vocab < 2) throw InputError("data: synthetic source needs vocab >= 2, got " + std::to_string(vocab));
  if (num_sequences < 1) throw InputError("data: synthetic source needs at least one sequence");
  k_min = std::clamp(k_min, 1, vocab);
  k_max = std::clamp(k_max, k_min, vocab);
  detail::Rng rng(seed, "markov.chain");
  succ_.resize(static_cast<std::size_t>(vocab));
  prob_.resize(static_cast<std::size_t>(vocab));
  cdf_.resize(static_cast<std::size_t>(vocab));
  for (int s = 0; s < vocab; ++s) {
    const int k = k_min + static_cast<int>(rng.below(static_cast<uint64_t>(k_max - k_min + 1)));
    auto& succ = succ_[static_cast<std::size_t>(s)];
    succ.push_back((s + 1) % vocab);  // a cycle through all tokens: irreducible
    while (static_cast<int>(succ.size()) < k) {
      const auto t = static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab)));
      if (std::find(succ.begin(), succ.end(), t) == succ.end()) succ.push_back(t);
    }
    // Dirichlet(1) probabilities: normalised exponential draws.
    auto& p = prob_[static_cast<std::size_t>(s)];
    double total = 0.0;
    for (int i = 0; i < k; ++i) {
      p.push_back(-std::log(rng.uniform()));
      total += p.back();
    }
    auto& cdf = cdf_[static_cast<std::size_t>(s)];
    double acc = 0.0;
    for (auto& x : p) {
      x /= total;
      acc += x;
      cdf.push_back(acc);
    }
    cdf.back() = 1.0;
  }
  // Stationary distribution by power iteration on the lazy chain (I + P) / 2, which has the same
  // fixed point and converges whatever the period.
  std::vector<double> pi(static_cast<std::size_t>(vocab), 1.0 / vocab), next(static_cast<std::size_t>(vocab));
  for (int it = 0; it < 200000; ++it) {
    for (int s = 0; s < vocab; ++s) next[static_cast<std::size_t>(s)] = 0.5 * pi[static_cast<std::size_t>(s)];
    for (int s = 0; s < vocab; ++s) {
      const auto& succ = succ_[static_cast<std::size_t>(s)];
      const auto& p = prob_[static_cast<std::size_t>(s)];
      const double w = 0.5 * pi[static_cast<std::size_t>(s)];
      for (std::size_t i = 0; i < succ.size(); ++i) next[static_cast<std::size_t>(succ[i])] += w * p[i];
    }
    double diff = 0.0;
    for (int s = 0; s < vocab; ++s) diff += std::abs(next[static_cast<std::size_t>(s)] - pi[static_cast<std::size_t>(s)]);
    pi.swap(next);
    if (diff < 1e-14) break;
  }
  const double sum = std::accumulate(pi.begin(), pi.end(), 0.0);
  stationary_.resize(pi.size());
  stationary_cdf_.resize(pi.size());
  double acc = 0.0;
  for (std::size_t s = 0; s < pi.size(); ++s) {
    stationary_[s] = pi[s] / sum;
    acc += stationary_[s];
    stationary_cdf_[s] = acc;
  }
  stationary_cdf_.back() = 1.0;
  entropy_rate_ = 0.0;
  for (std::size_t s = 0; s < pi.size(); ++s) {
    double h = 0.0;
    for (double p : prob_[s]) h -= p * std::log(p);
    entropy_rate_ += stationary_[s] * h;
  }
}

void MarkovSource::read_sequence(int64_t index, int T, int32_t* out) const {
  detail::Rng rng(seed_ ^ (0xA5A5A5A5A5A5A5A5ull + static_cast<uint64_t>(index) * 0x9E3779B97F4A7C15ull),
                  "markov.sequence");
  const double u0 = rng.uniform();
  int32_t s = static_cast<int32_t>(std::lower_bound(stationary_cdf_.begin(), stationary_cdf_.end(), u0) -
                                   stationary_cdf_.begin());
  s = std::min(s, vocab_ - 1);
  out[0] = s;
  for (int t = 1; t <= T; ++t) {
    const auto& cdf = cdf_[static_cast<std::size_t>(s)];
    const double u = rng.uniform();
    std::size_t i = 0;
    while (i + 1 < cdf.size() && u > cdf[i]) ++i;
    s = succ_[static_cast<std::size_t>(s)][i];
    out[t] = s;
  }
}

std::string MarkovSource::describe() const {
  std::ostringstream os;
  os << "synthetic Markov chain (V=" << vocab_ << ", seed " << seed_ << ", entropy rate " << entropy_rate_
     << " nats/token)";
  return os.str();
}

// ---------------------------------------------------------------- text file

TextFileSource::TextFileSource(const std::string& path, int model_vocab) : path_(path) {
  if (model_vocab < 256) {
    throw InputError("data: text source '" + path + "' uses byte tokens and needs model.vocab >= 256, got " +
                     std::to_string(model_vocab));
  }
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    throw InputError("data: text file '" + path + "' not found (data.path must name a readable file)");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError("data: text file '" + path + "' cannot be opened");
  bytes_.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

int64_t TextFileSource::num_sequences(int T) const {
  if (T < 1 || bytes_.size() < static_cast<std::size_t>(T) + 1) return 0;
  return static_cast<int64_t>((bytes_.size() - 1) / static_cast<std::size_t>(T));
}

void TextFileSource::read_sequence(int64_t index, int T, int32_t* out) const {
  const std::size_t start = static_cast<std::size_t>(index) * static_cast<std::size_t>(T);
  for (int t = 0; t <= T; ++t) out[t] = bytes_[start + static_cast<std::size_t>(t)];
}

std::string TextFileSource::describe() const {
  return "text file '" + path_ + "' (" + std::to_string(bytes_.size()) + " bytes, byte-level tokens)";
}

std::unique_ptr<TokenSource> make_token_source(const std::string& kind, const std::string& path, int vocab,
                                               uint64_t seed) {
  if (kind == "synthetic") return std::make_unique<MarkovSource>(vocab, seed);
  if (kind == "text") return std::make_unique<TextFileSource>(path, vocab);
  throw InputError("data.source: '" + kind + "' is not a data source (expected synthetic or text)");
}

// ---------------------------------------------------------------- loader

DataLoader::DataLoader(const TokenSource& source, int T, int B, int dp_rank, int dp_size, uint64_t seed)
    : source_(source), T_(T), B_(B), dp_rank_(dp_rank), dp_size_(dp_size), seed_(seed) {
  if (T < 1 || B < 1 || dp_size < 1 || dp_rank < 0 || dp_rank >= dp_size) {
    throw InputError("data: loader needs T >= 1, B >= 1 and 0 <= rank < dp");
  }
  n_ = source.num_sequences(T);
  const int64_t G = static_cast<int64_t>(B) * dp_size;
  if (n_ < G) {
    throw InputError("data: " + source.describe() + " has " + std::to_string(n_) + " sequences of " +
                     std::to_string(T + 1) + " tokens, fewer than one global micro-batch (" + std::to_string(G) + ")");
  }
  calls_per_epoch_ = n_ / G;
}

const std::vector<int64_t>& DataLoader::permutation(int64_t epoch) const {
  if (perm_epoch_ != epoch) {
    perm_.resize(static_cast<std::size_t>(n_));
    std::iota(perm_.begin(), perm_.end(), int64_t{0});
    detail::Rng rng(seed_ + static_cast<uint64_t>(epoch), "data.shuffle");
    for (int64_t i = n_ - 1; i > 0; --i) {
      const auto j = static_cast<int64_t>(rng.below(static_cast<uint64_t>(i + 1)));
      std::swap(perm_[static_cast<std::size_t>(i)], perm_[static_cast<std::size_t>(j)]);
    }
    perm_epoch_ = epoch;
  }
  return perm_;
}

std::vector<int64_t> DataLoader::sequence_indices(int64_t call) const {
  const int64_t epoch = call / calls_per_epoch_;
  const int64_t base = (call % calls_per_epoch_) * static_cast<int64_t>(B_) * dp_size_;
  const auto& perm = permutation(epoch);
  std::vector<int64_t> out(static_cast<std::size_t>(B_));
  for (int i = 0; i < B_; ++i) {
    out[static_cast<std::size_t>(i)] =
        perm[static_cast<std::size_t>(base + static_cast<int64_t>(i) * dp_size_ + dp_rank_)];
  }
  return out;
}

void DataLoader::next_batch(Batch& out) {
  out.B = B_;
  out.T = T_;
  out.sequence_indices = sequence_indices(call_);
  ++call_;
  const std::size_t BT = static_cast<std::size_t>(B_) * static_cast<std::size_t>(T_);
  out.inputs.resize(BT);
  out.targets.resize(BT);
  std::vector<int32_t> seq(static_cast<std::size_t>(T_) + 1);
  for (int i = 0; i < B_; ++i) {
    source_.read_sequence(out.sequence_indices[static_cast<std::size_t>(i)], T_, seq.data());
    std::copy(seq.begin(), seq.end() - 1, out.inputs.begin() + static_cast<std::ptrdiff_t>(i) * T_);
    std::copy(seq.begin() + 1, seq.end(), out.targets.begin() + static_cast<std::ptrdiff_t>(i) * T_);
  }
}

Batch DataLoader::next_batch() {
  Batch b;
  next_batch(b);
  return b;
}

}  // namespace orrery::runtime
