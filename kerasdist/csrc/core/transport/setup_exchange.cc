#include "transport/setup_exchange.h"

#include "transport/mpi_transport.h"

#include <unistd.h>

#include <cstring>
#include <map>
#include <type_traits>

namespace kerasdist {

namespace {

constexpr uint32_t kSetupMagic = 0x4b445354;  // "KDST"

struct Record {
  uint32_t magic;
  int32_t protocol;
  char version[32];
  int64_t segment_bytes;
  int64_t fusion_threshold;
  int64_t fusion_tensor_limit;
  int64_t cycle_time_us;
  int64_t small_allreduce_bytes;
  int64_t direct_allreduce_bytes;
  int64_t direct_group_bytes;
  int32_t hierarchical;
  char host[128];
};

std::string Field(const char* s, size_t n) { return std::string(s, strnlen(s, n)); }

// Appends "NAME is A on rank 0 but B on ranks [..]" when values differ.
template <typename T, typename Get>
void Compare(const std::vector<Record>& all, const char* name, Get get,
             std::string* out) {
  std::map<T, std::vector<int>> by_value;
  for (size_t r = 0; r < all.size(); ++r) by_value[get(all[r])].push_back(static_cast<int>(r));
  if (by_value.size() < 2) return;
  const T ref = get(all[0]);
  std::string s = std::string(name) + " is ";
  auto show = [](const T& v) {
    if constexpr (std::is_same<T, std::string>::value) return "'" + v + "'";
    else return std::to_string(v);
  };
  s += show(ref) + " on rank 0";
  for (const auto& kv : by_value) {
    if (kv.first == ref) continue;
    s += " but " + show(kv.first) + " on rank" + (kv.second.size() > 1 ? "s " : " ");
    for (size_t i = 0; i < kv.second.size() && i < 16; ++i)
      s += (i ? "," : "") + std::to_string(kv.second[i]);
    if (kv.second.size() > 16) s += ",...";
  }
  *out += (out->empty() ? "" : "; ") + s;
}

}  // namespace

Status ExchangeSetup(MpiTransport* mpi, const WireSettings& mine,
                     int64_t timeout_ms, Topology* topo) {
  Record rec{};
  rec.magic = kSetupMagic;
  rec.protocol = kProtocolVersion;
  std::strncpy(rec.version, mine.version.c_str(), sizeof(rec.version) - 1);
  rec.segment_bytes = mine.segment_bytes;
  rec.fusion_threshold = mine.fusion_threshold;
  rec.fusion_tensor_limit = mine.fusion_tensor_limit;
  rec.cycle_time_us = mine.cycle_time_us;
  rec.small_allreduce_bytes = mine.small_allreduce_bytes;
  rec.direct_allreduce_bytes = mine.direct_allreduce_bytes;
  rec.direct_group_bytes = mine.direct_group_bytes;
  rec.hierarchical = mine.hierarchical;
  if (gethostname(rec.host, sizeof(rec.host) - 1) != 0) std::strcpy(rec.host, "unknown");
  const int n = mpi->size();
  std::vector<Record> all(n);
  Status s = mpi->Allgather(&rec, sizeof(rec), all.data(), timeout_ms);
  if (!s.ok()) return s;
  std::string diff;
  for (int r = 0; r < n; ++r) {
    if (all[r].magic != kSetupMagic) {
      return Status(StatusCode::kInvalidArgument,
                    "rank " + std::to_string(r) + " sent an unreadable setup record: "
                    "every rank must run the same kerasdist build");
    }
  }
  Compare<int32_t>(all, "the kerasdist protocol version",
                   [](const Record& x) { return x.protocol; }, &diff);
  Compare<std::string>(all, "the kerasdist version",
                       [](const Record& x) { return Field(x.version, sizeof(x.version)); },
                       &diff);
  Compare<int64_t>(all, "KERASDIST_SEGMENT_BYTES",
                   [](const Record& x) { return x.segment_bytes; }, &diff);
  Compare<int64_t>(all, "KERASDIST_FUSION_THRESHOLD",
                   [](const Record& x) { return x.fusion_threshold; }, &diff);
  Compare<int64_t>(all, "KERASDIST_FUSION_TENSOR_LIMIT",
                   [](const Record& x) { return x.fusion_tensor_limit; }, &diff);
  Compare<int64_t>(all, "KERASDIST_CYCLE_TIME (in microseconds)",
                   [](const Record& x) { return x.cycle_time_us; }, &diff);
  Compare<int64_t>(all, "KERASDIST_SMALL_ALLREDUCE_BYTES",
                   [](const Record& x) { return x.small_allreduce_bytes; }, &diff);
  Compare<int64_t>(all, "KERASDIST_DIRECT_ALLREDUCE_BYTES",
                   [](const Record& x) { return x.direct_allreduce_bytes; }, &diff);
  Compare<int64_t>(all, "KERASDIST_DIRECT_GROUP_BYTES",
                   [](const Record& x) { return x.direct_group_bytes; }, &diff);
  Compare<int32_t>(all, "KERASDIST_HIERARCHICAL_ALLREDUCE",
                   [](const Record& x) { return x.hierarchical; }, &diff);
  if (!diff.empty()) {
    return Status(StatusCode::kInvalidArgument,
                  "rank " + std::to_string(mpi->rank()) + "/" + std::to_string(n) +
                      ": the ranks disagree on settings that shape the wire: " + diff +
                      ". Launch every rank with the same kerasdist and the same "
                      "KERASDIST_* settings.");
  }
  Topology t;
  t.rank = mpi->rank();
  t.size = n;
  for (const Record& x : all) t.hosts.push_back(Field(x.host, sizeof(x.host)));
  // Local ranks share the host name; cross ranks share the local rank.
  std::vector<int> local_rank_of(n, 0);
  std::map<std::string, int> count_on_host;
  for (int r = 0; r < n; ++r) local_rank_of[r] = count_on_host[t.hosts[r]]++;
  t.local_rank = local_rank_of[t.rank];
  t.local_size = count_on_host[t.hosts[t.rank]];
  for (int r = 0; r < n; ++r)
    if (t.hosts[r] == t.hosts[t.rank]) t.local_ranks.push_back(r);
  t.cross_rank = 0;
  t.cross_size = 0;
  for (int r = 0; r < n; ++r) {
    if (local_rank_of[r] != t.local_rank) continue;
    if (r < t.rank) ++t.cross_rank;
    ++t.cross_size;
  }
  for (const auto& kv : count_on_host) t.homogeneous &= kv.second == t.local_size;
  *topo = std::move(t);
  return Status::OK();
}

std::string DescribeRank(const Topology& topology, int rank) {
  std::string s = "rank " + std::to_string(rank);
  if (rank >= 0 && static_cast<size_t>(rank) < topology.hosts.size())
    s += " (host " + topology.hosts[rank] + ")";
  return s;
}

}  // namespace kerasdist
