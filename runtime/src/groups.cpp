// The rank's groups (groups.hpp).
#include "orrery/runtime/groups.hpp"

#include "orrery/model/moe.hpp"
#include "orrery/model/names.hpp"

namespace orrery::runtime {

RankGroups split_rank_groups(Communicator& world, const Layout& L) {
  RankGroups g;
  g.dp = world.split(L.tp_rank + L.tp * L.pp_rank, L.dp_rank, traces::CommKind::DP,
                     names::dp_group(L.tp_rank, L.pp_rank));
  g.tp = world.split(L.dp_rank + L.dp * L.pp_rank, L.tp_rank, traces::CommKind::TP,
                     names::tp_group(L.dp_rank, L.pp_rank));
  g.pp = world.split(L.tp_rank + L.tp * L.dp_rank, L.pp_rank, traces::CommKind::PP,
                     names::pp_group(L.dp_rank, L.tp_rank));
  if (L.pp > 1) {
    const bool ends = L.pp_rank == 0 || L.pp_rank == L.pp - 1;
    const int color = ends ? L.tp_rank + L.tp * L.dp_rank : L.tp * L.dp + world.rank();
    g.embed = world.split(color, L.pp_rank, traces::CommKind::Other,
                          names::embed_group(L.dp_rank, L.tp_rank));
  }
  if (L.ep > 1) {
    const int r = model::moe::ep_rank(L.dp_rank, L.ep);
    const int gi = model::moe::ep_group_index(L.dp_rank, L.ep);
    const int tp_pp = L.tp_rank + L.tp * L.pp_rank;
    g.ep = world.split(gi + (L.dp / L.ep) * tp_pp, r, traces::CommKind::Other,
                       names::ep_group(gi, L.tp_rank, L.pp_rank));
    g.edp = world.split(r + L.ep * tp_pp, L.dp_rank, traces::CommKind::DP,
                        names::edp_group(r, L.tp_rank, L.pp_rank));
  }
  return g;
}

DeviceGroups host_device_groups(const RankGroups& groups) {
  auto many = [](const std::unique_ptr<Communicator>& c) {
    return c && c->size() > 1 ? c.get() : nullptr;
  };
  return DeviceGroups{many(groups.dp),    many(groups.tp), many(groups.pp),
                      many(groups.embed), many(groups.ep), many(groups.edp)};
}

}  // namespace orrery::runtime
