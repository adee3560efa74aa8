// gdn info: what this build of gdnkit contains and which devices it sees;
// with --kernels, every kernel variant each GPU backend was built with.
#include <cstdio>

#include "commands.hpp"
#include "gdnkit/backend.hpp"

namespace {

// `gdn info --kernels`: the variants of each backend that has them.
int list_kernels() {
  const gdn::Backend gpus[] = {gdn::Backend::kCuda, gdn::Backend::kHip};
  for (gdn::Backend b : gpus) {
    const gdn::BackendOps* ops = gdn::backend_ops(b);
    if (ops == nullptr || ops->list_kernels == nullptr) continue;
    const int n = ops->list_kernels(nullptr, nullptr);
    std::printf("%s: %d kernel variants\n", ops->name, n);
    ops->list_kernels([](const char* name, void*) { std::printf("  %s\n", name); }, nullptr);
  }
  return 0;
}

}  // namespace

int cmd_info(const std::vector<std::string>& args) {
  if (args.size() == 1 && args[0] == "--kernels") return list_kernels();
  if (!args.empty()) {
    const bool help = args[0] == "--help" || args[0] == "-h";
    std::fprintf(help ? stdout : stderr, "usage: gdn info [--kernels]\n");
    return help ? 0 : 2;
  }
  std::printf("gdnkit %s\n", gdn::version());
  const gdn::Backend all[] = {gdn::Backend::kHost, gdn::Backend::kCuda, gdn::Backend::kHip};
  for (gdn::Backend b : all) {
    const gdn::BackendOps* ops = gdn::backend_ops(b);
    if (ops == nullptr) {
      std::printf("  %-5s not built\n", gdn::to_string(b));
      continue;
    }
    char why[256] = {};
    const bool ok = ops->available(why, sizeof why);
    std::printf("  %-5s built, %s\n", ops->name, ok ? "available" : why);
    if (ok) {
      char desc[1024] = {};
      ops->describe(desc, sizeof desc);
      std::printf("        %s\n", desc);
    }
  }
  std::printf("auto resolves to: %s\n", gdn::to_string(gdn::resolve_backend(gdn::Backend::kAuto)));
  return 0;
}
