// onebit-info: what this build of onebit is and what it would do here.
//   onebit-info                 version, CPU kernel sets, the one in force, the verbs transport's
//                               devices, the ONEBIT_* settings
//   onebit-info --env-markdown  the tables of docs/env.md, generated from common/params.h (onebit's own
//                               variables) and common/launcher.h (the launchers' and NCCL's it reads)
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/error.h"
#include "common/launcher.h"
#include "common/params.h"
#include "kernels/cpu/cpu_kernels.h"
#include "onebit/onebit.h"
#ifdef ONEBIT_HAVE_IBVERBS
#include "transport/ibverbs/verbs_api.h"
#endif

int main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], "--env-markdown") == 0) {
    std::fputs(onebit::param::markdown_table().c_str(), stdout);
    std::fputs("\nOther programs' variables onebit reads (common/launcher.h):\n\n", stdout);
    std::fputs(onebit::launcher_markdown_table().c_str(), stdout);
    return 0;
  }
  if (argc != 1) {
    std::fprintf(stderr, "usage: %s [--env-markdown]\n", argv[0]);
    return 2;
  }
  std::printf("onebit %d.%d.%d\n", ONEBIT_VERSION_MAJOR, ONEBIT_VERSION_MINOR, ONEBIT_VERSION_PATCH);
  std::printf("CPU: %s\n", onebit::kernels::cpu_model().c_str());
  std::printf("CPU kernel sets this CPU runs:");
  for (const auto* kernels : onebit::kernels::runnable_cpu_kernels()) std::printf(" %s", kernels->name);
  std::printf("\n");
  try {
    std::printf("CPU kernels in force: %s\n", onebit::kernels::cpu_kernels().name);
  } catch (const onebit::Error& error) {
    std::fprintf(stderr, "onebit-info: error: %s\n", error.what());
    return 1;
  }
#ifdef ONEBIT_HAVE_IBVERBS
  std::string why;
  if (!onebit::transport::ibverbs::verbs_loadable(&why)) {
    std::printf("verbs transport: built; %s\n", why.c_str());
  } else {
    int count = 0;
    const auto& verbs = onebit::transport::ibverbs::verbs();
    ibv_device** list = verbs.get_device_list(&count);
    std::printf("verbs transport: built; RDMA devices:");
    for (int i = 0; i < count; ++i) std::printf(" %s", verbs.get_device_name(list[i]));
    std::printf("%s\n", count == 0 ? " none" : "");
    if (list != nullptr) verbs.free_device_list(list);
  }
#else
  std::printf("verbs transport: not built (configure with -DONEBIT_WITH_IBVERBS=ON)\n");
#endif
  std::printf("Environment:\n");
  for (const auto& d : onebit::param::descriptions()) {
    const char* value = std::getenv(d.env);
    if (value != nullptr) std::printf("  %s=%s\n", d.env, onebit::param::shown(d.env, value).c_str());
  }
  return 0;
}
