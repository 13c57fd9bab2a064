// The GPU trainer: the training loop (runtime/training_loop_impl.hpp) instantiated over the CUDA
// backend (cuda/backend.hpp).
#include "orrery/runtime/cuda/trainer.hpp"

#include "orrery/runtime/training_loop_impl.hpp"

namespace orrery::runtime {
template class TrainingLoop<cuda::CudaBackend>;
}
