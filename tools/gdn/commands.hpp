// The gdn tool's subcommands; each takes the words after its name and
// returns the process exit code (0 ok, 1 a check failed, 2 bad usage).
#pragma once

#include <string>
#include <vector>

#include "gdnkit/gdnkit.hpp"

int cmd_verify(const std::vector<std::string>& args);
int cmd_run(const std::vector<std::string>& args);
int cmd_info(const std::vector<std::string>& args);
