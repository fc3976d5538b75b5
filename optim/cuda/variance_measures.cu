#include "optim/cuda/variance_measures.h"

#include <vector>

#include "optim/cuda/tiled_sums.h"
#include "optim/variance_measures.h"

namespace onebit::optim::cuda {
namespace {

struct ChangeTerm {
  const float* v;
  const float* v_then;
  __device__ tiled::Sums operator()(std::size_t i) const {
    return variance_measures::variance_change_terms(v[i], v_then[i]);
  }
};

struct DormantTerm {
  const float* v;
  float eps;
  __device__ tiled::Sums operator()(std::size_t i) const { return variance_measures::dormant_terms(v[i], eps); }
};

// The one range's sums of term.
template <typename Term>
tiled::Sums sums_of(std::size_t n, const Term& term, void* workspace, cudaStream_t stream, const char* what) {
  const auto term_of = [&term](std::size_t, std::size_t) { return term; };
  return tiled::cuda::ranges_sums(&n, 1, term_of, workspace, stream, what)[0];
}

}  // namespace

double variance_change(const float* v, const float* v_then, std::size_t n, void* workspace, cudaStream_t stream) {
  return variance_measures::variance_change(
      sums_of(n, ChangeTerm{v, v_then}, workspace, stream, "the variance change"));
}

std::size_t dormant_count(const float* v, std::size_t n, float eps, void* workspace, cudaStream_t stream) {
  return static_cast<std::size_t>(sums_of(n, DormantTerm{v, eps}, workspace, stream, "the dormant count").first);
}

}  // namespace onebit::optim::cuda
