// Runtime choice of the CPU kernel set: CPUID (through the compiler's cpu_supports, which also
// checks that the OS saves the wide registers), overridable with ONEBIT_SIMD.
#include <cpuid.h>

#include <cstring>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/log.h"
#include "common/params.h"
#include "kernels/cpu/scalar.h"

namespace onebit::kernels {

#ifndef ONEBIT_HAVE_AVX2
// Not compiled: never selected (compiled = false), defined so the table below links.
const CpuKernels& avx2_kernels() { return scalar_kernels(); }
constexpr bool kAvx2Compiled = false;
#else
constexpr bool kAvx2Compiled = true;
#endif
#ifndef ONEBIT_HAVE_AVX512
const CpuKernels& avx512_kernels() { return scalar_kernels(); }
constexpr bool kAvx512Compiled = false;
#else
constexpr bool kAvx512Compiled = true;
#endif

namespace {

struct KernelSet {
  const char* name;
  bool compiled;
  const char* needs;  // what the CPU must have, for the error message
  bool (*cpu_has)();
  const CpuKernels& (*table)();
};

// F16C from CPUID leaf 1 (ECX bit 29): not every compiler's cpu_supports knows it. It uses the
// AVX registers, whose OS support cpu_supports("avx2") has already checked.
bool cpu_has_f16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29)) != 0;
}

bool cpu_has_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
}

bool cpu_has_avx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") && cpu_has_avx2();
}

bool always() { return true; }

// Best last.
const KernelSet kSets[] = {
    {"scalar", true, "nothing", always, scalar_kernels},
    {"avx2", kAvx2Compiled, "AVX2, FMA and F16C", cpu_has_avx2, avx2_kernels},
    {"avx512", kAvx512Compiled, "AVX-512 F, BW, VL and DQ", cpu_has_avx512, avx512_kernels},
};

const KernelSet* find(const std::string& name) {
  for (const KernelSet& set : kSets) {
    if (name == set.name) return &set;
  }
  return nullptr;
}

}  // namespace

std::string cpu_model() {
  // CPUID leaves 0x80000002-4: the brand string, 48 bytes, NUL-padded (and often space-padded).
  unsigned top = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(0x80000000u, &top, &ebx, &ecx, &edx) || top < 0x80000004u) return "unknown CPU";
  char brand[49] = {};
  for (unsigned leaf = 0; leaf < 3; ++leaf) {
    unsigned regs[4] = {};
    __get_cpuid(0x80000002u + leaf, &regs[0], &regs[1], &regs[2], &regs[3]);
    std::memcpy(brand + 16 * leaf, regs, sizeof regs);
  }
  std::string model(brand);
  model.erase(0, model.find_first_not_of(' '));
  model.erase(model.find_last_not_of(' ') + 1);
  return model.empty() ? "unknown CPU" : model;
}

bool cpu_runs(const std::string& name) {
  const KernelSet* set = find(name);
  return set != nullptr && set->compiled && set->cpu_has();
}

const CpuKernels& select_cpu_kernels(const std::string& name) {
  if (name.empty()) {
    const KernelSet* best = &kSets[0];
    for (const KernelSet& set : kSets) {
      if (set.compiled && set.cpu_has()) best = &set;
    }
    return best->table();
  }
  const KernelSet* set = find(name);
  ONEBIT_CHECK(set != nullptr, ONEBIT_INVALID_ARGUMENT, "ONEBIT_SIMD='", name,
               "' is not a kernel set; use scalar, avx2 or avx512 (or leave it unset for the best one)");
  ONEBIT_CHECK(set->compiled, ONEBIT_INVALID_ARGUMENT, "ONEBIT_SIMD=", name,
               ": this build of onebit was compiled without the ", name, " kernels (the compiler lacked them)");
  ONEBIT_CHECK(set->cpu_has(), ONEBIT_INVALID_ARGUMENT, "ONEBIT_SIMD=", name, ": this CPU cannot run it (it needs ",
               set->needs, ")");
  return set->table();
}

const CpuKernels& cpu_kernels() {
  static const CpuKernels& chosen = []() -> const CpuKernels& {
    const CpuKernels& kernels = select_cpu_kernels(param::Simd());
    ONEBIT_LOG(INFO, "CPU kernels: ", kernels.name, " on ", cpu_model());
    return kernels;
  }();
  return chosen;
}

std::vector<const CpuKernels*> runnable_cpu_kernels() {
  std::vector<const CpuKernels*> sets;
  for (const KernelSet& set : kSets) {
    if (set.compiled && set.cpu_has()) sets.push_back(&set.table());
  }
  return sets;
}

}  // namespace onebit::kernels
