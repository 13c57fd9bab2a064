// Flat, 64-byte aligned, zero-initialised storage for the CPU runtime's parameters, gradients,
// optimizer state and activations. The model carves named pointers out of one such block (llm.c
// style), so data-parallel code can treat parameters and gradients as one contiguous float range.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

namespace orrery::runtime {

template <class T>
class AlignedArray {
 public:
  static constexpr std::size_t kAlignBytes = 64;

  AlignedArray() = default;
  explicit AlignedArray(std::size_t count) { resize(count); }
  AlignedArray(const AlignedArray&) = delete;
  AlignedArray& operator=(const AlignedArray&) = delete;
  AlignedArray(AlignedArray&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  AlignedArray& operator=(AlignedArray&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  ~AlignedArray() { release(); }

  // Drops the old contents; the new storage is zero.
  void resize(std::size_t count) {
    release();
    if (count == 0) return;
    std::size_t bytes = (count * sizeof(T) + kAlignBytes - 1) / kAlignBytes * kAlignBytes;
    data_ = static_cast<T*>(std::aligned_alloc(kAlignBytes, bytes));
    if (data_ == nullptr) throw std::bad_alloc();
    std::memset(static_cast<void*>(data_), 0, bytes);
    size_ = count;
  }
  void zero() {
    if (data_ != nullptr) std::memset(static_cast<void*>(data_), 0, size_ * sizeof(T));
  }

  T* data() { return data_; }
  const T* data() const { return data_; }
  std::size_t size() const { return size_; }
  std::size_t size_bytes() const { return size_ * sizeof(T); }
  T& operator[](std::size_t i) { return data_[i]; }
  const T& operator[](std::size_t i) const { return data_[i]; }
  T* begin() { return data_; }
  T* end() { return data_ + size_; }
  const T* begin() const { return data_; }
  const T* end() const { return data_ + size_; }

 private:
  void release() {
    std::free(data_);
    data_ = nullptr;
    size_ = 0;
  }
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

using FloatArray = AlignedArray<float>;

// A contiguous range of elements of a flat array (parameters, gradients, optimizer state).
struct ParamRange {
  std::size_t offset = 0;
  std::size_t count = 0;
  std::size_t end() const { return offset + count; }
};

}  // namespace orrery::runtime
