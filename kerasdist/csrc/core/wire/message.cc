#include "wire/message.h"

#include <cstring>
#include <type_traits>

namespace kerasdist {

bool TensorMeta::operator==(const TensorMeta& o) const {
  return type == o.type && dtype == o.dtype && reduce_op == o.reduce_op &&
         root == o.root && prescale == o.prescale && postscale == o.postscale &&
         shape == o.shape && splits == o.splits;
}

std::string TensorMeta::Describe() const {
  std::string s = OpTypeName(type);
  if (type == OpType::kAllreduce || type == OpType::kReducescatter)
    s += std::string("(") + ReduceOpName(reduce_op) + ")";
  if (type == OpType::kBroadcast) s += "(root " + std::to_string(root) + ")";
  s += std::string(" ") + DataTypeName(dtype) + " " + ShapeString(shape);
  if (type == OpType::kAlltoall)
    s += splits.empty() ? " splits none" : " splits " + ShapeString(splits);
  if (prescale != 1.0 || postscale != 1.0)
    s += " prescale=" + std::to_string(prescale) +
         " postscale=" + std::to_string(postscale);
  return s;
}

namespace {

class Writer {
 public:
  template <typename T>
  void Put(T v) {
    static_assert(std::is_trivially_copyable<T>::value, "POD only");
    out_.append(reinterpret_cast<const char*>(&v), sizeof(v));
  }
  void PutString(const std::string& s) {
    Put<uint32_t>(static_cast<uint32_t>(s.size()));
    out_.append(s);
  }
  template <typename T>
  void PutVector(const std::vector<T>& v) {
    static_assert(std::is_trivially_copyable<T>::value, "POD only");
    Put<uint32_t>(static_cast<uint32_t>(v.size()));
    if (!v.empty()) out_.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
  }
  void PutMeta(const TensorMeta& m) {
    Put(m.type); Put(m.dtype); Put(m.reduce_op); Put(m.root);
    Put(m.prescale); Put(m.postscale); PutVector(m.shape); PutVector(m.splits);
  }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

class Reader {
 public:
  explicit Reader(const std::string& s) : p_(s.data()), end_(s.data() + s.size()) {}
  template <typename T>
  bool Get(T* v) {
    if (static_cast<size_t>(end_ - p_) < sizeof(T)) return false;
    std::memcpy(v, p_, sizeof(T));
    p_ += sizeof(T);
    return true;
  }
  bool GetString(std::string* s) {
    uint32_t n;
    if (!Get(&n) || static_cast<size_t>(end_ - p_) < n) return false;
    s->assign(p_, n);
    p_ += n;
    return true;
  }
  template <typename T>
  bool GetVector(std::vector<T>* v) {
    static_assert(std::is_trivially_copyable<T>::value, "POD only");
    uint32_t n;
    if (!Get(&n) || static_cast<size_t>(end_ - p_) / sizeof(T) < n) return false;
    v->resize(n);
    if (n) std::memcpy(v->data(), p_, size_t{n} * sizeof(T));
    p_ += size_t{n} * sizeof(T);
    return true;
  }
  bool GetMeta(TensorMeta* m) {
    return Get(&m->type) && Get(&m->dtype) && Get(&m->reduce_op) &&
           Get(&m->root) && Get(&m->prescale) && Get(&m->postscale) &&
           GetVector(&m->shape) && GetVector(&m->splits);
  }
  bool done() const { return p_ == end_; }
  size_t left() const { return static_cast<size_t>(end_ - p_); }
  const char* here() const { return p_; }
  void Skip(size_t n) { p_ += n; }
  // Whether `n` items of at least `min_bytes` each can still follow: checked
  // before any container is sized from a count read off the wire.
  bool CanHold(uint32_t n, size_t min_bytes) const {
    return static_cast<size_t>(end_ - p_) / min_bytes >= n;
  }

 private:
  const char* p_;
  const char* end_;
};

// Enum values and counts as the decoder accepts them; anything else is a
// corrupt message, never undefined behaviour further on.
bool ValidMeta(const TensorMeta& m) {
  if (static_cast<uint32_t>(m.type) > static_cast<uint32_t>(OpType::kAlltoall) ||
      static_cast<uint32_t>(m.dtype) > static_cast<uint32_t>(DataType::kBool) ||
      static_cast<uint32_t>(m.reduce_op) > static_cast<uint32_t>(ReduceOp::kAdasum))
    return false;
  for (int64_t d : m.shape)
    if (d < 0) return false;
  return true;
}

bool ValidResponse(const Response& r) {
  TensorMeta m;
  m.type = r.type;
  m.dtype = r.dtype;
  m.reduce_op = r.reduce_op;
  if (!ValidMeta(m) || r.ids.size() != r.counts.size()) return false;
  if (r.type == OpType::kJoin) return true;
  if (r.ids.empty()) return false;
  for (int32_t id : r.ids)
    if (id < 0 || id >= kMaxTensorId) return false;
  for (int64_t c : r.counts)
    if (c < 0) return false;
  for (int64_t d : r.rank_dim0)
    if (d < 0) return false;
  for (int64_t d : r.splits)
    if (d < 0) return false;
  return true;
}

constexpr uint32_t kRequestMagic = 0x4b445251;   // "KDRQ"
constexpr uint32_t kResponseMagic = 0x4b445253;  // "KDRS"

}  // namespace

std::string Serialize(const RequestList& list) {
  Writer w;
  w.Put(kRequestMagic);
  w.Put<uint8_t>(list.shutdown);
  w.Put<uint64_t>(list.seen);
  w.Put<uint32_t>(static_cast<uint32_t>(list.entries.size()));
  for (const auto& e : list.entries) {
    w.Put(e.id);
    if (e.id < 0) {
      const NamedRequest& named = list.Named(e);
      w.PutString(named.name);
      w.PutMeta(named.meta);
    }
  }
  return w.Take();
}

bool Parse(const std::string& bytes, RequestList* list) {
  Reader r(bytes);
  uint32_t magic, n;
  uint8_t shutdown;
  if (!r.Get(&magic) || magic != kRequestMagic || !r.Get(&shutdown) ||
      !r.Get(&list->seen) || !r.Get(&n))
    return false;
  list->shutdown = shutdown != 0;
  if (!r.CanHold(n, sizeof(int32_t))) return false;
  list->entries.resize(n);
  list->named.clear();
  if (r.left() == size_t{n} * sizeof(int32_t)) {
    // Ids only (any entry with a name is longer): the steady state, decoded
    // in one pass. Same verdicts as the loop below.
    const char* p = r.here();
    for (uint32_t i = 0; i < n; ++i) {
      int32_t id;
      std::memcpy(&id, p + size_t{i} * sizeof(int32_t), sizeof(id));
      if (id < 0 || id >= kMaxTensorId) return false;
      list->entries[i] = {id, -1};
    }
    r.Skip(size_t{n} * sizeof(int32_t));
    return true;
  }
  for (auto& e : list->entries) {
    if (!r.Get(&e.id)) return false;
    if (e.id >= kMaxTensorId) return false;
    e.named = -1;
    if (e.id >= 0) continue;
    // A name and metadata take more than their 4-byte entry: bounded by n.
    e.named = static_cast<int32_t>(list->named.size());
    list->named.emplace_back();
    NamedRequest& named = list->named.back();
    if (!(r.GetString(&named.name) && r.GetMeta(&named.meta) && ValidMeta(named.meta)))
      return false;
  }
  return r.done();
}

std::string Serialize(const ResponseList& list) {
  Writer w;
  w.Put(kResponseMagic);
  w.Put<uint8_t>(list.shutdown);
  w.Put<uint8_t>(list.abort);
  w.PutString(list.message);
  w.Put<uint32_t>(static_cast<uint32_t>(list.new_ids.size()));
  for (const auto& p : list.new_ids) {
    w.Put(p.first);
    w.PutString(p.second);
  }
  w.Put<uint32_t>(static_cast<uint32_t>(list.responses.size()));
  for (const auto& resp : list.responses) {
    w.Put(resp.type); w.PutVector(resp.ids); w.Put(resp.dtype);
    w.Put(resp.reduce_op); w.Put(resp.root); w.Put(resp.prescale);
    w.Put(resp.postscale); w.PutVector(resp.rank_dim0); w.PutVector(resp.counts);
    w.PutVector(resp.splits); w.Put(resp.contributors); w.PutString(resp.error);
  }
  w.PutVector(list.evicted);
  w.PutVector(list.direct);
  return w.Take();
}

bool Parse(const std::string& bytes, ResponseList* list) {
  Reader r(bytes);
  uint32_t magic, n;
  uint8_t shutdown, abort;
  if (!r.Get(&magic) || magic != kResponseMagic || !r.Get(&shutdown) ||
      !r.Get(&abort) || !r.GetString(&list->message) || !r.Get(&n))
    return false;
  list->shutdown = shutdown != 0;
  list->abort = abort != 0;
  if (!r.CanHold(n, sizeof(int32_t) + sizeof(uint32_t))) return false;
  list->new_ids.resize(n);
  for (auto& p : list->new_ids)
    if (!r.Get(&p.first) || !r.GetString(&p.second) || p.first < 0 ||
        p.first >= kMaxTensorId)
      return false;
  if (!r.Get(&n) || !r.CanHold(n, 40)) return false;  // a response is >= 40 bytes
  list->responses.resize(n);
  for (auto& resp : list->responses) {
    if (!(r.Get(&resp.type) && r.GetVector(&resp.ids) && r.Get(&resp.dtype) &&
          r.Get(&resp.reduce_op) && r.Get(&resp.root) && r.Get(&resp.prescale) &&
          r.Get(&resp.postscale) && r.GetVector(&resp.rank_dim0) &&
          r.GetVector(&resp.counts) && r.GetVector(&resp.splits) &&
          r.Get(&resp.contributors) &&
          r.GetString(&resp.error) && ValidResponse(resp)))
      return false;
  }
  if (!r.GetVector(&list->evicted)) return false;
  for (int32_t id : list->evicted)
    if (id < 0 || id >= kMaxTensorId) return false;
  if (!r.GetVector(&list->direct) || list->direct.size() % 4) return false;
  for (size_t i = 0; i < list->direct.size(); i += 4)
    if (list->direct[i] < 0 || list->direct[i] >= kMaxTensorId || list->direct[i + 1] < 0 ||
        list->direct[i + 1] >= (1 << 16) || list->direct[i + 2] < 0 ||
        (list->direct[i + 3] != 0 && list->direct[i + 3] != 1))
      return false;
  return r.done();
}

}  // namespace kerasdist
