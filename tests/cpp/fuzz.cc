// Decoder fuzzing of the control messages (single process, no MPI).
//
// Valid random RequestList/ResponseList messages must round-trip exactly.
// Every truncation of a valid message, and a valid message with a trailing
// byte, must be rejected. Bit flips, random bytes and huge counts written at
// every offset must never crash or allocate without bound (ASAN reports
// either; the test also caps single allocations); whatever Parse accepts
// must serialize and parse back to the same message.
#include <string>
#include <vector>

#include "driver_util.h"
#include "wire/message.h"

namespace kdt {

namespace {

using kerasdist::RequestEntry;
using kerasdist::RequestList;
using kerasdist::Response;
using kerasdist::ResponseList;
using kerasdist::TensorMeta;

// Fields that newer versions of the messages carry, set and compared only
// where they exist.
template <typename L>
auto SetSeen(L* l, uint64_t v, int) -> decltype(l->seen = v, void()) { l->seen = v; }
template <typename L>
void SetSeen(L*, uint64_t, long) {}
template <typename L>
auto SeenOf(const L& l, int) -> decltype(uint64_t(l.seen)) { return l.seen; }
template <typename L>
uint64_t SeenOf(const L&, long) { return 0; }
template <typename L>
auto AddEvicted(L* l, int32_t id, int) -> decltype(l->evicted.push_back(id), void()) {
  l->evicted.push_back(id);
}
template <typename L>
void AddEvicted(L*, int32_t, long) {}
template <typename L>
auto EvictedOf(const L& l, int) -> decltype(std::vector<int32_t>(l.evicted)) { return l.evicted; }
template <typename L>
std::vector<int32_t> EvictedOf(const L&, long) { return {}; }
template <typename L>
auto AddDirect(L* l, int32_t id, int32_t slot, int)
    -> decltype(l->direct.push_back(id), void()) {
  l->direct.push_back(id);
  l->direct.push_back(slot);
  l->direct.push_back(64 * (1 + slot));  // capacity
  l->direct.push_back(slot & 1);         // a group's slot
}
template <typename L>
void AddDirect(L*, int32_t, int32_t, long) {}
template <typename L>
auto DirectOf(const L& l, int) -> decltype(std::vector<int32_t>(l.direct)) { return l.direct; }
template <typename L>
std::vector<int32_t> DirectOf(const L&, long) { return {}; }

std::string RandomString(Rng& rng, int max_len) {
  std::string s(rng.Int(0, max_len), '\0');
  for (char& c : s) c = static_cast<char>(rng.Next());
  return s;
}

double RandomScale(Rng& rng) {
  static const double v[] = {1.0, 0.5, 2.0, -3.25, 1e-300, 1e300, 0.0};
  return v[rng.Next() % 7];
}

TensorMeta RandomMeta(Rng& rng) {
  TensorMeta m;
  m.type = static_cast<OpType>(rng.Int(0, 4));
  m.dtype = static_cast<DataType>(rng.Int(0, 7));
  m.reduce_op = static_cast<ReduceOp>(rng.Int(0, 4));
  m.root = static_cast<int32_t>(rng.Next());
  m.prescale = RandomScale(rng);
  m.postscale = RandomScale(rng);
  const int dims = rng.Int(0, 5);
  for (int d = 0; d < dims; ++d)
    m.shape.push_back(static_cast<int64_t>(rng.Next() % (rng.Int(0, 1) ? 10 : (1ULL << 62))));
  return m;
}

RequestList RandomRequests(Rng& rng) {
  RequestList l;
  l.shutdown = rng.Int(0, 3) == 0;
  SetSeen(&l, rng.Int(0, 1) ? rng.Next() : rng.Int(0, 100), 0);
  const int n = rng.Int(0, 8);
  for (int i = 0; i < n; ++i) {
    const int kind = rng.Int(0, 3);
    const int32_t id = kind == 0 ? rng.Int(0, 1000)
           : kind == 1 ? static_cast<int32_t>(rng.Next() % kerasdist::kMaxTensorId)
           : kind == 2 ? -1 : -static_cast<int32_t>(1 + rng.Next() % 1000000);
    if (id >= 0) {
      l.AddId(id);
    } else {
      l.AddNamed(RandomString(rng, 40), RandomMeta(rng));
      l.entries.back().id = id;  // any negative id means "named"
    }
  }
  return l;
}

ResponseList RandomResponses(Rng& rng) {
  ResponseList l;
  l.shutdown = rng.Int(0, 3) == 0;
  l.abort = rng.Int(0, 3) == 0;
  l.message = RandomString(rng, 60);
  const int ids = rng.Int(0, 5);
  for (int i = 0; i < ids; ++i)
    l.new_ids.emplace_back(static_cast<int32_t>(rng.Next() % kerasdist::kMaxTensorId),
                           RandomString(rng, 30));
  const int n = rng.Int(0, 5);
  for (int i = 0; i < n; ++i) {
    Response r;
    TensorMeta m = RandomMeta(rng);
    r.type = m.type;
    r.dtype = m.dtype;
    r.reduce_op = m.reduce_op;
    r.root = m.root;
    r.prescale = m.prescale;
    r.postscale = m.postscale;
    const int k = r.type == OpType::kJoin ? rng.Int(0, 2) : rng.Int(1, 6);
    for (int j = 0; j < k; ++j) {
      r.ids.push_back(static_cast<int32_t>(rng.Next() % kerasdist::kMaxTensorId));
      r.counts.push_back(static_cast<int64_t>(rng.Next() >> 2));
    }
    const int d = rng.Int(0, 4);
    for (int j = 0; j < d; ++j) r.rank_dim0.push_back(rng.Int(0, 100000));
    r.contributors = static_cast<int32_t>(rng.Next());
    r.error = rng.Int(0, 2) == 0 ? RandomString(rng, 50) : "";
    l.responses.push_back(r);
  }
  const int evicted = rng.Int(0, 1) ? rng.Int(0, 4) : 0;
  for (int i = 0; i < evicted; ++i)
    AddEvicted(&l, static_cast<int32_t>(rng.Next() % kerasdist::kMaxTensorId), 0);
  const int direct = rng.Int(0, 1) ? rng.Int(0, 3) : 0;
  for (int i = 0; i < direct; ++i)
    AddDirect(&l, static_cast<int32_t>(rng.Next() % kerasdist::kMaxTensorId),
              rng.Int(0, 63), 0);
  return l;
}

// Doubles compare bitwise: a bit flip may decode to a NaN.
bool Same(double a, double b) { return std::memcmp(&a, &b, sizeof(a)) == 0; }

bool Equal(const TensorMeta& x, const TensorMeta& y) {
  return x.type == y.type && x.dtype == y.dtype && x.reduce_op == y.reduce_op &&
         x.root == y.root && Same(x.prescale, y.prescale) && Same(x.postscale, y.postscale) &&
         x.shape == y.shape;
}

bool Equal(const RequestList& a, const RequestList& b) {
  if (a.shutdown != b.shutdown || SeenOf(a, 0) != SeenOf(b, 0) ||
      a.entries.size() != b.entries.size())
    return false;
  for (size_t i = 0; i < a.entries.size(); ++i) {
    const RequestEntry &x = a.entries[i], &y = b.entries[i];
    if (x.id != y.id) return false;
    if (x.id < 0 && (a.Named(x).name != b.Named(y).name ||
                     !Equal(a.Named(x).meta, b.Named(y).meta)))
      return false;
  }
  return true;
}

bool Equal(const Response& x, const Response& y) {
  return x.type == y.type && x.ids == y.ids && x.dtype == y.dtype &&
         x.reduce_op == y.reduce_op && x.root == y.root && Same(x.prescale, y.prescale) &&
         Same(x.postscale, y.postscale) && x.rank_dim0 == y.rank_dim0 && x.counts == y.counts &&
         x.contributors == y.contributors && x.error == y.error;
}

bool Equal(const ResponseList& a, const ResponseList& b) {
  if (a.shutdown != b.shutdown || a.abort != b.abort || a.message != b.message ||
      a.new_ids != b.new_ids || EvictedOf(a, 0) != EvictedOf(b, 0) ||
      DirectOf(a, 0) != DirectOf(b, 0) ||
      a.responses.size() != b.responses.size())
    return false;
  for (size_t i = 0; i < a.responses.size(); ++i)
    if (!Equal(a.responses[i], b.responses[i])) return false;
  return true;
}

// Whatever the decoder accepts must be a fixed point of serialize + parse.
template <typename List>
void CheckAccepted(const std::string& bytes, const char* what) {
  List parsed;
  if (!kerasdist::Parse(bytes, &parsed)) return;
  const std::string again = kerasdist::Serialize(parsed);
  List reparsed;
  KDT_CHECK(kerasdist::Parse(again, &reparsed), "%s: accepted message does not re-parse", what);
  KDT_CHECK(Equal(parsed, reparsed), "%s: accepted message changes on re-parse", what);
}

void Put32(std::string* s, size_t off, uint32_t v) { std::memcpy(&(*s)[off], &v, 4); }


// Valid message checks shared by both list types.
template <typename List>
void CheckValid(Rng& rng, const List& list, const std::vector<size_t>& count_offsets,
                long* checks) {
  const std::string wire = kerasdist::Serialize(list);
  List back;
  KDT_CHECK(kerasdist::Parse(wire, &back), "valid message of %zu bytes rejected", wire.size());
  KDT_CHECK(Equal(list, back), "valid message of %zu bytes parsed differently", wire.size());
  for (size_t len = 0; len < wire.size(); ++len) {
    List t;
    KDT_CHECK(!kerasdist::Parse(wire.substr(0, len), &t), "truncation to %zu of %zu accepted",
              len, wire.size());
  }
  {
    List t;
    KDT_CHECK(!kerasdist::Parse(wire + std::string(1, '\x07'), &t), "trailing byte accepted");
  }
  for (int f = 0; f < 48 && !wire.empty(); ++f) {
    std::string bad = wire;
    const int flips = rng.Int(1, 3);
    for (int k = 0; k < flips; ++k) {
      const size_t bit = rng.Next() % (bad.size() * 8);
      bad[bit / 8] = static_cast<char>(bad[bit / 8] ^ (1 << (bit % 8)));
    }
    CheckAccepted<List>(bad, "bit flip");
  }
  static const uint32_t huge[] = {0xffffffffu, 0x80000000u, 0x7fffffffu, 0x01000000u,
                                  0x00100000u};
  for (size_t off = 0; off + 4 <= wire.size(); ++off) {
    for (uint32_t v : huge) {
      std::string bad = wire;
      Put32(&bad, off, v);
      CheckAccepted<List>(bad, "huge count");
      for (size_t c : count_offsets) {
        if (c != off) continue;
        List t;
        KDT_CHECK(!kerasdist::Parse(bad, &t), "count 0x%x at offset %zu accepted", v, off);
      }
    }
  }
  *checks += static_cast<long>(wire.size() * 6 + 50);
}

// Offset of the first byte where two encodings differ: appending one item
// to a list changes only its count before the new item's bytes, so this is
// where that count is written (little-endian, low byte first).
size_t FirstDifference(const std::string& a, const std::string& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  return i;
}

std::vector<size_t> RequestCountOffsets(const RequestList& l) {
  RequestList more = l;
  more.AddId(0);
  return {FirstDifference(kerasdist::Serialize(l), kerasdist::Serialize(more))};
}

std::vector<size_t> ResponseCountOffsets(const ResponseList& l) {
  const std::string wire = kerasdist::Serialize(l);
  ResponseList more_ids = l, longer = l, more_resp = l;
  more_ids.new_ids.emplace_back(0, "");
  longer.message += "x";
  Response r;
  r.ids.push_back(0);
  r.counts.push_back(0);
  more_resp.responses.push_back(r);
  return {FirstDifference(wire, kerasdist::Serialize(more_ids)),
          FirstDifference(wire, kerasdist::Serialize(longer)),
          FirstDifference(wire, kerasdist::Serialize(more_resp))};
}

// The engine parses every worker's list into one reused RequestList: it
// must hold that message alone, whatever was parsed into it before.
bool SameAsReused(const RequestList& want, const RequestList& got) {
  return Equal(want, got) && got.named.size() == want.named.size();
}

}  // namespace

int RunFuzz(uint64_t seed, int iterations) {
  Rng rng(seed);
  long checks = 0;
  RequestList reused;
  for (int it = 0; it < iterations; ++it) {
    RequestList ql = RandomRequests(rng);
    CheckValid(rng, ql, RequestCountOffsets(ql), &checks);
    KDT_CHECK(kerasdist::Parse(kerasdist::Serialize(ql), &reused) && SameAsReused(ql, reused),
              "a valid request parsed into a reused list differs (iteration %d)", it);
    ++checks;
    ResponseList rl = RandomResponses(rng);
    CheckValid(rng, rl, ResponseCountOffsets(rl), &checks);
  }
  // Random bytes, bare and behind a valid header (everything an empty list
  // encodes before its first count).
  const RequestList empty_req;
  const ResponseList empty_resp;
  const std::string req_head = kerasdist::Serialize(empty_req).substr(0, RequestCountOffsets(empty_req)[0]);
  const std::string resp_head =
      kerasdist::Serialize(empty_resp).substr(0, ResponseCountOffsets(empty_resp)[1]);
  for (int it = 0; it < iterations * 20; ++it) {
    const std::string junk = RandomString(rng, rng.Int(0, 3) == 0 ? 4096 : 64);
    CheckAccepted<RequestList>(junk, "random bytes");
    CheckAccepted<ResponseList>(junk, "random bytes");
    CheckAccepted<RequestList>(req_head + junk, "random request body");
    CheckAccepted<ResponseList>(resp_head + junk, "random response body");
    checks += 4;
  }
  // Maximal claimed counts right after the header, with little data after.
  for (uint32_t n : {0xffffffffu, 0x10000000u, 1000000u}) {
    std::string req = req_head + std::string(4 + 64, '\0');
    Put32(&req, req_head.size(), n);
    RequestList l;
    KDT_CHECK(!kerasdist::Parse(req, &l), "request count %u accepted", n);
    std::string resp = resp_head + std::string(4 + 64, '\0');
    Put32(&resp, resp_head.size(), n);  // the message's length
    ResponseList rl;
    KDT_CHECK(!kerasdist::Parse(resp, &rl), "response message length %u accepted", n);
    checks += 2;
  }
  std::printf("PASS fuzz: %d valid messages per type, %ld decoder checks\n", iterations, checks);
  return 0;
}

}  // namespace kdt
