// Training data for the CPU runtime: token sources (a seeded Markov chain with a known entropy
// floor; a text file as byte-level tokens) and a loader that shards each step's global batch over
// data-parallel ranks the way PyTorch's DistributedSampler does.
//
// Global batch order (defined once, independent of dp): sequences are indexed 0..N-1 (N =
// source.num_sequences(T)). Epoch e visits them in the permutation P_e drawn from seed + e
// (Fisher-Yates, xoshiro256**); the trailing N mod G sequences of an epoch are dropped, G = B*dp.
// Call k of next_batch() (k = 0, 1, ...) uses epoch e = k / S and global slots g = (k mod S)*G + j,
// j in [0, G), S = floor(N / G) calls per epoch. Rank r takes the slots j = i*dp + r, i in [0, B)
// (DistributedSampler's rank::dp stride), as rows i of its micro-batch. Hence the union over dp
// ranks of call k is exactly the serial (dp = 1, B' = B*dp) call k, and serial row i*dp + r is row
// i of rank r.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace orrery::runtime {

class TokenSource {
 public:
  virtual ~TokenSource() = default;
  virtual int vocab() const = 0;  // token ids are in [0, vocab)
  // Sequences of T+1 tokens (inputs and the targets shifted by one) the source offers.
  virtual int64_t num_sequences(int T) const = 0;
  // Writes sequence `index` (T+1 tokens) to out. Deterministic.
  virtual void read_sequence(int64_t index, int T, int32_t* out) const = 0;
  virtual std::string describe() const = 0;
};

// A stationary Markov chain over V tokens: each token has k successors (k uniform in [k_min,
// k_max], one of them token+1 mod V so the chain is irreducible) with random probabilities.
// Sequence i starts from the stationary distribution and walks with its own random stream, so the
// best possible next-token loss is the entropy rate H = sum_s pi(s) H(P(s,.)), in nats.
class MarkovSource : public TokenSource {
 public:
  MarkovSource(int vocab, uint64_t seed, int64_t num_sequences = 1 << 16, int k_min = 4, int k_max = 16);
  int vocab() const override { return vocab_; }
  int64_t num_sequences(int) const override { return num_sequences_; }
  void read_sequence(int64_t index, int T, int32_t* out) const override;
  std::string describe() const override;

  double entropy_rate() const { return entropy_rate_; }  // nats per token
  const std::vector<double>& stationary() const { return stationary_; }
  // Successors of `token` and their probabilities.
  const std::vector<int32_t>& successors(int token) const { return succ_[token]; }
  const std::vector<double>& probabilities(int token) const { return prob_[token]; }

 private:
  int vocab_;
  uint64_t seed_;
  int64_t num_sequences_;
  std::vector<std::vector<int32_t>> succ_;
  std::vector<std::vector<double>> prob_;
  std::vector<std::vector<double>> cdf_;
  std::vector<double> stationary_;
  std::vector<double> stationary_cdf_;
  double entropy_rate_ = 0.0;
};

// A file read whole; every byte is a token (V = 256 suffices). Sequence i is bytes [i*T, i*T+T+1).
// Throws InputError naming the file when it is missing, unreadable or shorter than T+1 bytes, and
// when model_vocab < 256.
class TextFileSource : public TokenSource {
 public:
  TextFileSource(const std::string& path, int model_vocab);
  int vocab() const override { return 256; }
  int64_t num_sequences(int T) const override;
  void read_sequence(int64_t index, int T, int32_t* out) const override;
  std::string describe() const override;
  std::size_t size_bytes() const { return bytes_.size(); }

 private:
  std::string path_;
  std::vector<uint8_t> bytes_;
};

// Builds the source a scenario asks for: "synthetic" (MarkovSource(vocab, seed)) or "text"
// (TextFileSource(path, vocab)); anything else is an InputError.
std::unique_ptr<TokenSource> make_token_source(const std::string& kind, const std::string& path,
                                               int vocab, uint64_t seed);

struct Batch {
  int B = 0;
  int T = 0;
  std::vector<int32_t> inputs;            // (B,T)
  std::vector<int32_t> targets;           // (B,T) inputs shifted by one
  std::vector<int64_t> sequence_indices;  // (B) which source sequences, for checks
};

class DataLoader {
 public:
  // Throws InputError when the source has fewer than B*dp_size sequences of length T+1.
  DataLoader(const TokenSource& source, int T, int B, int dp_rank, int dp_size, uint64_t seed);
  // The next micro-batch of this rank (call k of the file comment); then k advances.
  Batch next_batch();
  void next_batch(Batch& out);
  // The sequence indices of this rank's rows for call k, without reading tokens.
  std::vector<int64_t> sequence_indices(int64_t call) const;
  int64_t calls_per_epoch() const { return calls_per_epoch_; }
  // G = B * dp: global sequences one call (over all dp ranks) consumes.
  int64_t sequences_per_call() const { return static_cast<int64_t>(B_) * dp_size_; }
  int64_t position() const { return call_; }
  void seek(int64_t call) { call_ = call; }

 private:
  const std::vector<int64_t>& permutation(int64_t epoch) const;

  const TokenSource& source_;
  int T_, B_, dp_rank_, dp_size_;
  uint64_t seed_;
  int64_t n_;
  int64_t calls_per_epoch_;
  int64_t call_ = 0;
  mutable int64_t perm_epoch_ = -1;
  mutable std::vector<int64_t> perm_;
};

}  // namespace orrery::runtime
