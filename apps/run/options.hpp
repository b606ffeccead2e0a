#pragma once
/// troupe-run's command line: what to start and how, checked before anything
/// is started.

#include <stdexcept>
#include <string>
#include <vector>

namespace troupe_run {

struct options {
  int nproc = 0;                          ///< -n: processes on this node (required)
  int nnodes = 1;                         ///< --nnodes
  int node_rank = 0;                      ///< --node-rank
  std::string master_addr = "127.0.0.1";  ///< --master-addr
  int master_port = 0;                    ///< --master-port; 0: pick a free one
  double grace_seconds = 5.0;             ///< --grace-seconds
  std::string bind = "auto";              ///< --bind: auto, core or none
  bool keep_going = false;                ///< --keep-going: a failed rank does not stop the others
  bool help = false;                      ///< -h / --help
  std::vector<std::string> program;       ///< the program and its arguments
};

/// A bad command line; the message names the option and the value.
class usage_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Parses the arguments after argv[0]. Options end at "--" or at the first
/// argument that does not start with '-': the rest is the program and its
/// arguments, passed on untouched. Throws usage_error.
options parse_options(const std::vector<std::string>& args);

/// The short synopsis printed after a usage error.
std::string usage();

/// The full --help text.
std::string help_text();

}  // namespace troupe_run
