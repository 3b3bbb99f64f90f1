#include "tf/kernel.h"

#include <utility>

#include "tf/huge_pages.h"

namespace kerasdist_tf {

namespace errors = tensorflow::errors;

tensorflow::Status ToTensorFlowStatus(int32_t code, const char* message) {
  const std::string m = message ? message : "";
  switch (code) {
    case KERASDIST_OK: return tensorflow::Status();
    case KERASDIST_INVALID_ARGUMENT: return errors::InvalidArgument(m);
    // Ranks disagree on a tensor's dtype, shape, op or root: the call is
    // valid on each rank alone, so this is Horovod's FailedPrecondition.
    case KERASDIST_MISMATCH: return errors::FailedPrecondition(m);
    case KERASDIST_TIMEOUT: return errors::Unavailable(m);
    case KERASDIST_ABORTED: return errors::Aborted(m);
    case KERASDIST_SHUTDOWN: return errors::FailedPrecondition(m);
    case KERASDIST_PRECONDITION: return errors::FailedPrecondition(m);
    case KERASDIST_INTERNAL: return errors::Internal(m);
  }
  return errors::Unknown(m);
}

bool ToDataType(OpKernelContext* ctx, tensorflow::DataType dt, int32_t* out) {
  switch (dt) {
    case tensorflow::DT_HALF: *out = KERASDIST_FLOAT16; return true;
    case tensorflow::DT_BFLOAT16: *out = KERASDIST_BFLOAT16; return true;
    case tensorflow::DT_FLOAT: *out = KERASDIST_FLOAT32; return true;
    case tensorflow::DT_DOUBLE: *out = KERASDIST_FLOAT64; return true;
    case tensorflow::DT_INT32: *out = KERASDIST_INT32; return true;
    case tensorflow::DT_INT64: *out = KERASDIST_INT64; return true;
    case tensorflow::DT_UINT8: *out = KERASDIST_UINT8; return true;
    case tensorflow::DT_INT8: *out = KERASDIST_INT8; return true;
    case tensorflow::DT_UINT16: *out = KERASDIST_UINT16; return true;
    case tensorflow::DT_INT16: *out = KERASDIST_INT16; return true;
    case tensorflow::DT_BOOL: *out = KERASDIST_BOOL; return true;
    default: break;
  }
  ctx->SetStatus(errors::InvalidArgument("Unsupported dtype for a kerasdist collective: ",
                                         tensorflow::DataTypeString(dt)));
  return false;
}

int32_t AllocateOutput(void* user, int32_t index, int32_t ndim, const int64_t* shape,
                       void** data) {
  auto* ctx = static_cast<OpKernelContext*>(user);
  TensorShape ts;
  for (int32_t d = 0; d < ndim; ++d) ts.AddDim(shape[d]);
  Tensor* out = nullptr;
  if (!ctx->allocate_output(index, ts, &out).ok()) return 1;
  *data = const_cast<char*>(out->tensor_data().data());
  AdviseHugePages(*data, out->tensor_data().size());
  return 0;
}

namespace {

// What a kernel's completion needs; freed by the completion.
struct Pending {
  OpKernelContext* ctx;
  AsyncOpKernel::DoneCallback done;
  std::vector<Tensor> held;
  bool own_fault;
};

void OnDone(void* user, int32_t code, const char* message) {
  auto* p = static_cast<Pending*>(user);
  if (code == KERASDIST_MISMATCH && p->own_fault) code = KERASDIST_INVALID_ARGUMENT;
  if (code != KERASDIST_OK) p->ctx->SetStatus(ToTensorFlowStatus(code, message));
  AsyncOpKernel::DoneCallback done = std::move(p->done);
  delete p;
  done();
}

}  // namespace

void Enqueue(OpKernelContext* ctx, AsyncOpKernel::DoneCallback done,
             const std::vector<kerasdist_request>& requests, const char* group_name,
             bool inline_wait, std::vector<Tensor> held, bool own_fault) {
  auto* p = new Pending{ctx, std::move(done), std::move(held), own_fault};
  kerasdist_enqueue(requests.data(), static_cast<int32_t>(requests.size()), group_name,
                    inline_wait ? KERASDIST_INLINE : 0, OnDone, p);
}

CollectiveKernel::CollectiveKernel(OpKernelConstruction* c) : AsyncOpKernel(c) {
  OP_REQUIRES_OK(c, c->GetAttr("tensor_name", &tensor_name_));
  OP_REQUIRES_OK(c, c->GetAttr("process_set_id", &process_set_id_));
}

kerasdist_request CollectiveKernel::NewRequest(int32_t op) const {
  kerasdist_request r{};
  r.struct_size = sizeof(kerasdist_request);
  r.op = op;
  r.name = BaseName().c_str();
  r.process_set = process_set_id_;
  r.device = KERASDIST_DEVICE_CPU;
  r.prescale = r.postscale = 1.0;
  return r;
}

bool CollectiveKernel::Describe(OpKernelContext* ctx, const Tensor& t, kerasdist_request* r,
                                std::vector<int64_t>* dims) const {
  if (!ToDataType(ctx, t.dtype(), &r->dtype)) return false;
  dims->resize(t.dims());
  for (int d = 0; d < t.dims(); ++d) (*dims)[d] = t.dim_size(d);
  r->ndim = t.dims();
  r->shape = dims->data();
  r->input = t.tensor_data().data();
  return true;
}

bool CollectiveKernel::ProcessSetInfo(OpKernelContext* ctx, int32_t* rank,
                                      int32_t* size) const {
  char err[512];
  int32_t code = kerasdist_check_process_set(process_set_id_, err, sizeof(err));
  if (code != KERASDIST_OK) {
    ctx->SetStatus(ToTensorFlowStatus(code, err));
    return false;
  }
  kerasdist_process_set_info(process_set_id_, rank, size);
  return true;
}

}  // namespace kerasdist_tf
