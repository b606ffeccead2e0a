// launch: rank and size from the launcher's environment, a store from an init
// method, and the world from both.
//
// Conventions, first complete one wins: RANK/WORLD_SIZE/LOCAL_RANK (troupe-run,
// torchrun), OMPI_COMM_WORLD_RANK/_SIZE/_LOCAL_RANK (mpirun), SLURM_PROCID/
// SLURM_NTASKS/SLURM_LOCALID (srun). RANK and OMPI_* describe the process
// itself, so when both are set they must agree. SLURM_* are only read when
// neither is set: a batch script's SLURM_PROCID/SLURM_NTASKS describe the
// allocation and are inherited by launchers started inside it (torchrun or
// mpirun under sbatch), so comparing them would refuse legitimate jobs.

#include "troupe/launch.hpp"
#include "troupe/testing.hpp"

#include <charconv>
#include <cstdlib>
#include <optional>

#include "transport/local_address.hpp"
#include "troupe/error.hpp"
#include "troupe/tcp_store.hpp"

namespace troupe {
namespace {

[[noreturn]] void invalid(const std::string& what) {
  throw error(errc::invalid_argument, what);
}

std::optional<std::string> env_var(const char* name) {
  const char* v = std::getenv(name);
  if (!v) return std::nullopt;
  return std::string(v);
}

/// Parses `text` as a whole decimal integer; nullopt when it is not one.
std::optional<long long> parse_int(const std::string& text) {
  long long v = 0;
  const char* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc() || p != end) return std::nullopt;
  return v;
}

/// The integer in variable `name` (nullopt if unset), checked to lie in [lo, hi].
std::optional<int> int_var(const char* name, long long lo, long long hi, const char* range) {
  auto text = env_var(name);
  if (!text) return std::nullopt;
  auto v = parse_int(*text);
  if (!v) invalid(std::string("read_launch_env: ") + name + "='" + *text + "' is not an integer");
  if (*v < lo || *v > hi)
    invalid(std::string("read_launch_env: ") + name + "=" + *text + " is out of range (" + range +
            ")");
  return static_cast<int>(*v);
}

/// One convention's variables: rank, size and (optional) local rank.
struct convention {
  const char* source;
  const char* rank_var;
  const char* size_var;
  const char* local_var;
  std::optional<int> rank, size, local;

  bool any() const { return rank || size || local; }

  /// Reads and checks the variables; a partial set names the missing variable.
  static convention read(const char* source, const char* r, const char* s, const char* l) {
    constexpr long long max = 1 << 30;
    convention c{source, r, s, l, {}, {}, {}};
    c.size = int_var(s, 1, max, "must be at least 1");
    c.rank = int_var(r, 0, max, "must be at least 0");
    c.local = int_var(l, 0, max, "must be at least 0");
    if (!c.any()) return c;
    if (!c.rank)
      invalid(std::string("read_launch_env: ") + (c.size ? s : l) + " is set but " + r + " is not");
    if (!c.size) invalid(std::string("read_launch_env: ") + r + " is set but " + s + " is not");
    if (*c.rank >= *c.size)
      invalid(std::string("read_launch_env: ") + r + "=" + std::to_string(*c.rank) +
              " is not below " + s + "=" + std::to_string(*c.size));
    if (c.local && *c.local >= *c.size)
      invalid(std::string("read_launch_env: ") + l + "=" + std::to_string(*c.local) +
              " is not below " + s + "=" + std::to_string(*c.size));
    return c;
  }
};

/// Both conventions describe this process: each value they both set must agree.
void check_agree(const convention& a, const convention& b) {
  auto same = [&](const std::optional<int>& x, const char* xn, const std::optional<int>& y,
                  const char* yn) {
    if (x && y && *x != *y)
      invalid(std::string("read_launch_env: contradictory launcher variables: ") + xn + "=" +
              std::to_string(*x) + " but " + yn + "=" + std::to_string(*y));
  };
  same(a.rank, a.rank_var, b.rank, b.rank_var);
  same(a.size, a.size_var, b.size, b.size_var);
  same(a.local, a.local_var, b.local, b.local_var);
}

/// "host:port" (host may be "[v6]") of a tcp:// method; errors name the method.
std::pair<std::string, std::uint16_t> parse_host_port(const std::string& method,
                                                      const std::string& rest) {
  auto bad = [&](const std::string& why) {
    invalid("make_store: init method '" + method + "' is not tcp://host:port: " + why);
  };
  std::string host;
  std::string port_text;
  if (!rest.empty() && rest.front() == '[') {
    auto close = rest.find(']');
    if (close == std::string::npos || close + 1 >= rest.size() || rest[close + 1] != ':')
      bad("an IPv6 host needs the form [addr]:port");
    host = rest.substr(1, close - 1);
    port_text = rest.substr(close + 2);
  } else {
    auto colon = rest.rfind(':');
    if (colon == std::string::npos) bad("no port");
    host = rest.substr(0, colon);
    port_text = rest.substr(colon + 1);
    if (host.find_first_of(":/") != std::string::npos) bad("unexpected ':' or '/' in the host");
  }
  if (host.empty()) bad("empty host");
  auto port = parse_int(port_text);
  if (!port || port_text.front() == '+' || *port < 1 || *port > 65535)
    bad("port '" + port_text + "' is not in 1..65535");
  return {host, static_cast<std::uint16_t>(*port)};
}

/// Whether another process serves the store (TROUPE_STORE_EXTERNAL=1: troupe-run,
/// which sets it for the ranks it starts, or troupe-store) rather than rank 0.
bool external_store() {
  auto v = env_var("TROUPE_STORE_EXTERNAL");
  if (!v || *v == "0" || v->empty()) return false;
  if (*v == "1") return true;
  invalid("make_store: TROUPE_STORE_EXTERNAL='" + *v + "' must be 0 or 1");
}

std::shared_ptr<store> make_tcp_store(const std::string& method, const std::string& host,
                                      std::uint16_t port, const launch_env& env,
                                      std::chrono::milliseconds timeout) {
  if (env.token.empty())
    invalid("make_store(" + method +
            "): no job token; set TROUPE_JOB_TOKEN to the same secret "
            "in every process of the job (every connection to the store must prove it belongs "
            "to the job)");
  tcp_store_options opts;
  opts.is_server = env.rank == 0 && !external_store();
  // The server listens where the clients will connect, unless TROUPE_BIND_ADDR says otherwise.
  opts.bind_address = env_var("TROUPE_BIND_ADDR").value_or(host);
  opts.token = env.token;
  opts.timeout = timeout;
  opts.server_name = "rank " + std::to_string(env.rank);
  return std::make_shared<tcp_store>(host, port, opts);
}

}  // namespace

launch_env read_launch_env() {
  launch_env env;
  auto torch = convention::read("troupe-run/torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK");
  auto mpi = convention::read("mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                              "OMPI_COMM_WORLD_LOCAL_RANK");
  std::optional<convention> chosen;
  if (torch.any()) {
    if (mpi.any()) check_agree(torch, mpi);
    chosen = torch;
  } else if (mpi.any()) {
    chosen = mpi;
  } else {
    auto slurm = convention::read("srun", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID");
    if (!slurm.any())
      invalid(
          "read_launch_env: RANK and WORLD_SIZE are not set (nor OMPI_COMM_WORLD_RANK/_SIZE "
          "from mpirun, nor SLURM_PROCID/SLURM_NTASKS from srun); start the process with a "
          "launcher or set them");
    chosen = slurm;
  }
  env.rank = *chosen->rank;
  env.world_size = *chosen->size;
  env.local_rank = chosen->local.value_or(-1);
  env.source = chosen->source;
  env.master_addr = env_var("MASTER_ADDR").value_or("");
  if (auto port = int_var("MASTER_PORT", 1, 65535, "must be in 1..65535"))
    env.master_port = static_cast<std::uint16_t>(*port);
  env.token = env_var("TROUPE_JOB_TOKEN").value_or("");
  return env;
}

std::shared_ptr<store> make_store(const std::string& init_method, const launch_env& env,
                                  std::chrono::milliseconds timeout) {
  if (init_method == "env://") {
    const bool no_addr = env.master_addr.empty(), no_port = env.master_port == 0;
    if (no_addr || no_port)
      invalid(std::string("make_store(env://): ") +
              (no_addr && no_port ? "MASTER_ADDR and MASTER_PORT are"
               : no_addr          ? "MASTER_ADDR is"
                                  : "MASTER_PORT is") +
              " not set; env:// reaches the store at MASTER_ADDR:MASTER_PORT");
    return make_tcp_store(init_method, env.master_addr, env.master_port, env, timeout);
  }
  if (init_method.rfind("tcp://", 0) == 0) {
    auto [host, port] = parse_host_port(init_method, init_method.substr(6));
    return make_tcp_store(init_method, host, port, env, timeout);
  }
  if (init_method.rfind("file://", 0) == 0) {
    const auto path = init_method.substr(7);
    if (path.empty() || path.front() != '/')
      invalid("make_store: init method '" + init_method +
              "' is not file:///absolute/path (the path must start with '/')");
    return std::make_shared<file_store>(path, timeout);
  }
  invalid("make_store: unknown init method '" + init_method +
          "' (expected env://, tcp://host:port or file:///path)");
}

std::unique_ptr<world> init_world(const init_options& opts) {
  const auto env = read_launch_env();
  world_options wo;
  wo.backend = opts.backend;
  wo.store = make_store(opts.init_method, env, opts.timeout);
  wo.rank = env.rank;
  wo.world_size = env.world_size;
  wo.timeout = opts.timeout;
  wo.transport = env_var("TROUPE_TRANSPORT").value_or("auto");
  // The data plane listens where this host reaches the store from (unless
  // TROUPE_BIND_ADDR or TROUPE_SOCKET_IFNAME say otherwise).
  std::string store_host = env.master_addr;
  if (opts.init_method.rfind("tcp://", 0) == 0)
    store_host = parse_host_port(opts.init_method, opts.init_method.substr(6)).first;
  wo.bind_address = detail::choose_bind_address("", store_host, "init_world");
  wo.token = env.token;
  return std::make_unique<world>(std::move(wo));
}

bool launched_by_launcher() {
  return env_var("RANK") || env_var("OMPI_COMM_WORLD_RANK") || env_var("SLURM_PROCID");
}

void run_job(int ranks, const std::function<void(world&, bool launched)>& body,
             const init_options& opts) {
  if (launched_by_launcher()) {
    auto w = init_world(opts);
    body(*w, true);
    w->default_group().barrier().wait();
    return;
  }
  testing::run_options o;
  o.backend = opts.backend;
  o.timeout = opts.timeout;
  testing::run_ranks(
      ranks, [&](world& w) { body(w, false); }, o);
}

}  // namespace troupe
