#include "algorithms/topology.hpp"

#include "algorithms/cost_model.hpp"

#include <algorithm>
#include <atomic>
#include <map>

namespace troupe::detail {
namespace {

std::uint64_t next_id() {
  static std::atomic<std::uint64_t> last{0};
  return ++last;
}

}  // namespace

std::shared_ptr<const group_topology> group_topology::flat(
    int size, std::shared_ptr<const cost_model> costs) {
  auto t = std::make_shared<group_topology>();
  t->id = next_id();
  t->costs = std::move(costs);
  t->host_of.assign(static_cast<std::size_t>(size), 0);
  t->ranks_on.resize(1);
  for (int r = 0; r < size; ++r) t->ranks_on[0].push_back(r);
  return t;
}

std::shared_ptr<const group_topology> group_topology::of_hosts(
    const std::vector<std::string>& names, std::shared_ptr<const cost_model> costs,
    bool processes) {
  auto t = std::make_shared<group_topology>();
  t->id = next_id();
  t->costs = std::move(costs);
  t->processes = processes;
  std::map<std::string, int> index;
  for (std::size_t r = 0; r < names.size(); ++r) {
    auto [it, fresh] = index.emplace(names[r], static_cast<int>(index.size()));
    if (fresh) t->ranks_on.emplace_back();
    t->host_of.push_back(it->second);
    t->ranks_on[static_cast<std::size_t>(it->second)].push_back(static_cast<int>(r));
  }
  return t;
}

const cost_model& group_topology::model() const noexcept {
  return costs ? *costs : cost_model::of_process();
}

bool group_topology::uniform() const noexcept {
  return std::all_of(ranks_on.begin(), ranks_on.end(),
                     [&](const auto& v) { return v.size() == ranks_on.front().size(); });
}

int group_topology::most_on_a_host() const noexcept {
  std::size_t m = 0;
  for (const auto& v : ranks_on) m = std::max(m, v.size());
  return static_cast<int>(m);
}

int group_topology::local_index(int r) const {
  const auto& mine = ranks_on[static_cast<std::size_t>(host_of[static_cast<std::size_t>(r)])];
  return static_cast<int>(std::find(mine.begin(), mine.end(), r) - mine.begin());
}

std::vector<int> group_topology::host_order() const {
  std::vector<int> order;
  for (const auto& v : ranks_on) order.insert(order.end(), v.begin(), v.end());
  return order;
}

std::vector<int> chain_order(const group_topology& t, int size, int root) {
  std::vector<int> order;
  order.reserve(static_cast<std::size_t>(size));
  if (t.hosts() < 2 || t.size() != size) {
    for (int d = 0; d < size; ++d) order.push_back((root + d) % size);
    return order;
  }
  const int first = t.host_of[static_cast<std::size_t>(root)];
  order.push_back(root);
  for (int d = 0; d < t.hosts(); ++d)
    for (int r : t.ranks_on[static_cast<std::size_t>((first + d) % t.hosts())])
      if (r != root) order.push_back(r);
  return order;
}

chain_tree chain_links(const group_topology& t, int size, int root, bool through_leaders) {
  const auto order = chain_order(t, size, root);
  const bool known = t.hosts() >= 1 && t.size() == size;
  auto host = [&](int r) { return known ? t.host_of[static_cast<std::size_t>(r)] : 0; };
  chain_tree c;
  c.deepest = root;
  c.parent.assign(static_cast<std::size_t>(size), -1);
  c.children.resize(static_cast<std::size_t>(size));
  std::vector<int> depth(static_cast<std::size_t>(size), 1);
  int entry = order[0];  // the first rank of the host the chain is in
  for (int p = 1; p < size; ++p) {
    const int r = order[static_cast<std::size_t>(p)],
              before = order[static_cast<std::size_t>(p - 1)];
    int& parent = c.parent[static_cast<std::size_t>(r)];
    if (!through_leaders || host(r) == host(before)) {
      parent = before;
    } else {  // a host's first rank: from the last host's first
      parent = entry;
      entry = r;
    }
    depth[static_cast<std::size_t>(r)] = depth[static_cast<std::size_t>(parent)] + 1;
    if (depth[static_cast<std::size_t>(r)] > c.depth) {
      c.depth = depth[static_cast<std::size_t>(r)];
      c.deepest = r;
    }
  }
  // Children in chain order, those on other hosts first (the chain's
  // critical path goes on before the host's own ranks are served).
  for (bool across : {true, false})
    for (int r : order)
      if (const int p = c.parent[static_cast<std::size_t>(r)];
          p >= 0 && (host(p) != host(r)) == across)
        c.children[static_cast<std::size_t>(p)].push_back(r);
  return c;
}

host_columns::host_columns(const group_topology& t, int rank)
    : t(t),
      mine(t.ranks_on[static_cast<std::size_t>(t.host_of[static_cast<std::size_t>(rank)])]),
      me(t.local_index(rank)),
      local(static_cast<int>(mine.size())),
      hosts(t.hosts()) {}

std::vector<int> host_columns::column(int q) const {
  std::vector<int> c;
  for (int h = 0; h < hosts; ++h) c.push_back(at(h, q));
  return c;
}

host_leaders::host_leaders(const group_topology& t, int root)
    : root_host(t.host_of[static_cast<std::size_t>(root)]), t_(t), root_(root) {}

int host_leaders::of(int h) const {
  return h == root_host ? root_ : t_.ranks_on[static_cast<std::size_t>(h)].front();
}

std::vector<int> host_leaders::all() const {
  std::vector<int> leaders;
  for (int h = 0; h < t_.hosts(); ++h) leaders.push_back(of(h));
  return leaders;
}

}  // namespace troupe::detail
