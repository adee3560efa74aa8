// gdn — the gdnkit command-line tool.
//
//   gdn verify [--backend B] [FILES|DIRS...]   run golden cases, PASS/FAIL per case
//   gdn run    [--model M] [--batch N] ...     the GDN part of decoding a model
//   gdn info [--kernels]                       backends built in, devices found (kernel variants)
//
// Exit codes: 0 success, 1 a check failed, 2 bad usage.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "commands.hpp"

namespace {

void usage(FILE* out) {
  std::fprintf(out,
               "usage: gdn <command> [options]\n"
               "\n"
               "commands:\n"
               "  verify [--backend B] [FILES|DIRS...]  run golden cases (default: the repository's set)\n"
               "  run [--model M] [--batch N] [--steps S] [--backend B] [--state-dtype T] [--layout L]\n"
               "                                        decode steps over every GDN layer of a model\n"
               "  info [--kernels]                      backends built in and devices found (--kernels: the variants)\n"
               "\n"
               "run 'gdn <command> --help' for the options of one command.\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  const std::string cmd = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  if (cmd == "verify") return cmd_verify(args);
  if (cmd == "run") return cmd_run(args);
  if (cmd == "info") return cmd_info(args);
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    usage(stdout);
    return 0;
  }
  if (cmd == "--version") {
    std::printf("gdn %s\n", gdn::version());
    return 0;
  }
  std::fprintf(stderr, "gdn: unknown command '%s'\n\n", cmd.c_str());
  usage(stderr);
  return 2;
}
