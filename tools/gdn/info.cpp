// gdn info: what this build of gdnkit contains and which devices it sees.
#include <cstdio>

#include "commands.hpp"
#include "gdnkit/backend.hpp"

int cmd_info(const std::vector<std::string>& args) {
  if (!args.empty()) {
    const bool help = args[0] == "--help" || args[0] == "-h";
    std::fprintf(help ? stdout : stderr, "usage: gdn info\n");
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
