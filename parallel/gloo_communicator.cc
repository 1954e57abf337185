#include "parallel/gloo_communicator.h"

#include <signal.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <system_error>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/common/logging.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "parallel/gloo_store.h"

namespace dsv4 {
namespace {

// Runs a Gloo call and turns what it throws into a Status whose message starts with `what`.
// Gloo reports a peer that went away as an IoException ("Connection closed by peer", "Read
// error") and a stalled one as an IoException naming a timeout.
template <typename F>
absl::Status RunGloo(const std::string& what, F&& f) {
  try {
    f();
    return absl::OkStatus();
  } catch (const RendezvousStoreError& e) {
    return Annotate(e.status(), what);
  } catch (const gloo::IoException& e) {
    const bool timeout = absl::StrContains(e.what(), "imeout") ||
                         absl::StrContains(e.what(), "imed out");
    const std::string msg = absl::StrCat(what, ": ", e.what());
    return timeout ? absl::DeadlineExceededError(msg) : absl::UnavailableError(msg);
  } catch (const gloo::InvalidOperationException& e) {
    return absl::FailedPreconditionError(absl::StrCat(what, ": ", e.what()));
  } catch (const gloo::EnforceNotMet& e) {
    return absl::InternalError(absl::StrCat(what, ": gloo check failed: ", e.what()));
  } catch (const std::system_error& e) {
    return absl::UnavailableError(absl::StrCat(what, ": ", e.what()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(what, ": ", e.what()));
  }
}

// A peer that closes its socket must give this rank an error, not SIGPIPE's default (exit).
void IgnoreSigpipeIfDefault() {
  struct sigaction old {};
  if (sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) {
    struct sigaction ign {};
    ign.sa_handler = SIG_IGN;
    sigemptyset(&ign.sa_mask);
    sigaction(SIGPIPE, &ign, nullptr);
  }
}

// bf16 sums: each partial sum in fp32, rounded to bf16 (the ring adds one rank at a time; every
// rank ends with the same bits because the ring's last phase copies the reduced segments).
void SumBf16(void* c, const void* a, const void* b, size_t n) {
  auto* out = static_cast<uint16_t*>(c);
  const auto* x = static_cast<const uint16_t*>(a);
  const auto* y = static_cast<const uint16_t*>(b);
  for (size_t i = 0; i < n; ++i) out[i] = F32ToBf16(Bf16ToF32(x[i]) + Bf16ToF32(y[i]));
}

std::string Neighbours(int rank, int n) {
  if (n <= 1) return "";
  return absl::StrCat(" (ring neighbours: ranks ", (rank + n - 1) % n, " and ", (rank + 1) % n,
                      ")");
}

absl::Status CheckBytes(size_t count, DType dtype, size_t factor, const std::string& what,
                        size_t* bytes) {
  const size_t esize = static_cast<size_t>(DTypeSize(dtype));
  if (count > std::numeric_limits<size_t>::max() / esize / factor) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": count ", count, " overflows"));
  }
  *bytes = count * esize;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<GlooCommunicator>> GlooCommunicator::Connect(
    const GlooOptions& options, const RendezvousEndpoint& endpoint) {
  ASSIGN_OR_RETURN(auto client,
                   RendezvousClient::Create(endpoint, options.rank, options.world_size));
  GlooRendezvousStore store(std::move(client), options.connect_timeout);
  return Create(options, store);
}

absl::StatusOr<std::unique_ptr<GlooCommunicator>> GlooCommunicator::Create(
    const GlooOptions& o, gloo::rendezvous::Store& store) {
  if (o.world_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("world_size must be >= 1, got ", o.world_size));
  }
  if (o.rank < 0 || o.rank >= o.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", o.rank, " is out of range [0, ", o.world_size, ")"));
  }
  if (o.hostname.empty() && o.interface.empty()) {
    return absl::InvalidArgumentError("gloo: set hostname or interface (where this rank listens)");
  }
  if (o.connect_timeout.count() <= 0 || o.op_timeout.count() <= 0) {
    return absl::InvalidArgumentError("gloo: connect_timeout and op_timeout must be positive");
  }
  if (o.name.empty()) return absl::InvalidArgumentError("gloo: name must not be empty");
  IgnoreSigpipeIfDefault();

  const std::string what = absl::StrCat("gloo: forming '", o.name, "' as rank ", o.rank, " of ",
                                        o.world_size, " (listening on ",
                                        o.hostname.empty() ? o.interface : o.hostname, ")");
  std::shared_ptr<gloo::rendezvous::Context> context;
  RETURN_IF_ERROR(RunGloo(what, [&] {
    gloo::transport::tcp::attr attr;
    if (!o.hostname.empty()) {
      attr.hostname = o.hostname;
    } else {
      attr.iface = o.interface;
    }
    auto device = gloo::transport::tcp::CreateDevice(attr);
    context = std::make_shared<gloo::rendezvous::Context>(o.rank, o.world_size);
    context->setTimeout(o.connect_timeout);
    gloo::rendezvous::PrefixStore prefixed(o.name, store);
    context->connectFullMesh(prefixed, device);
  }));
  context->setTimeout(o.op_timeout);
  return std::unique_ptr<GlooCommunicator>(new GlooCommunicator(std::move(context), o));
}

GlooCommunicator::GlooCommunicator(std::shared_ptr<gloo::Context> context,
                                   const GlooOptions& options)
    : context_(std::move(context)),
      rank_(options.rank),
      world_size_(options.world_size),
      op_timeout_(options.op_timeout) {}

GlooCommunicator::~GlooCommunicator() = default;

absl::Status GlooCommunicator::health() const {
  std::lock_guard<std::mutex> lock(state_mu_);
  return broken_;
}

void GlooCommunicator::Abort(const absl::Status& reason) {
  Fail(reason.ok() ? absl::AbortedError("aborted") : reason).IgnoreError();
}

absl::Status GlooCommunicator::Fail(absl::Status status) {
  std::lock_guard<std::mutex> lock(state_mu_);
  if (broken_.ok()) broken_ = status;
  return status;
}

absl::Status GlooCommunicator::Precheck(const std::string& what, void* stream) const {
  if (stream != nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": the Gloo communicator takes host buffers and no stream"));
  }
  const absl::Status broken = health();
  if (!broken.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": the communicator is broken by an earlier error: ", broken.message()));
  }
  return absl::OkStatus();
}

absl::Status GlooCommunicator::AllReduceSum(const void* send, void* recv, size_t count,
                                            DType dtype, void* stream) {
  const std::string what =
      absl::StrCat("gloo AllReduceSum(count=", count, ", ", AV(DTypeName(dtype)), ") on rank ",
                   rank_, " of ", world_size_, Neighbours(rank_, world_size_));
  std::lock_guard<std::mutex> lock(op_mu_);
  RETURN_IF_ERROR(Precheck(what, stream));
  if (dtype != DType::kF32 && dtype != DType::kBF16) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": dtype must be F32 or BF16"));
  }
  size_t bytes = 0;
  RETURN_IF_ERROR(CheckBytes(count, dtype, 1, what, &bytes));
  if (count == 0) return absl::OkStatus();
  if (send == nullptr || recv == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": null buffer"));
  }
  absl::Status s = RunGloo(what, [&] {
    gloo::AllreduceOptions opts(context_);
    opts.setTimeout(op_timeout_);
    if (dtype == DType::kF32) {
      if (send != recv) opts.setInput(const_cast<float*>(static_cast<const float*>(send)), count);
      opts.setOutput(static_cast<float*>(recv), count);
      opts.setReduceFunction(
          static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
    } else {
      if (send != recv) {
        opts.setInput(const_cast<uint16_t*>(static_cast<const uint16_t*>(send)), count);
      }
      opts.setOutput(static_cast<uint16_t*>(recv), count);
      opts.setReduceFunction(&SumBf16);
    }
    gloo::allreduce(opts);
  });
  return s.ok() ? s : Fail(std::move(s));
}

absl::Status GlooCommunicator::AllGather(const void* send, void* recv, size_t count, DType dtype,
                                         void* stream) {
  const std::string what =
      absl::StrCat("gloo AllGather(count=", count, ", ", AV(DTypeName(dtype)), ") on rank ", rank_,
                   " of ", world_size_, Neighbours(rank_, world_size_));
  std::lock_guard<std::mutex> lock(op_mu_);
  RETURN_IF_ERROR(Precheck(what, stream));
  size_t bytes = 0;
  RETURN_IF_ERROR(CheckBytes(count, dtype, static_cast<size_t>(world_size_), what, &bytes));
  if (count == 0) return absl::OkStatus();
  if (send == nullptr || recv == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": null buffer"));
  }
  auto* out = static_cast<uint8_t*>(recv);
  const auto* in = static_cast<const uint8_t*>(send);
  const size_t total = bytes * static_cast<size_t>(world_size_);
  const bool in_place = in == out + static_cast<size_t>(rank_) * bytes;
  if (!in_place && in < out + total && out < in + bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": send overlaps recv other than at recv + rank * count"));
  }
  absl::Status s = RunGloo(what, [&] {
    gloo::AllgatherOptions opts(context_);
    opts.setTimeout(op_timeout_);
    if (!in_place) opts.setInput(const_cast<uint8_t*>(in), bytes);
    opts.setOutput(out, total);
    gloo::allgather(opts);
  });
  return s.ok() ? s : Fail(std::move(s));
}

absl::Status GlooCommunicator::Broadcast(void* buf, size_t count, DType dtype, int root,
                                         void* stream) {
  const std::string what =
      absl::StrCat("gloo Broadcast(count=", count, ", ", AV(DTypeName(dtype)), ", root=", root,
                   ") on rank ", rank_, " of ", world_size_);
  std::lock_guard<std::mutex> lock(op_mu_);
  RETURN_IF_ERROR(Precheck(what, stream));
  if (root < 0 || root >= world_size_) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": root ", root, " is out of range [0, ", world_size_, ")"));
  }
  size_t bytes = 0;
  RETURN_IF_ERROR(CheckBytes(count, dtype, 1, what, &bytes));
  if (count == 0) return absl::OkStatus();
  if (buf == nullptr) return absl::InvalidArgumentError(absl::StrCat(what, ": null buffer"));
  absl::Status s = RunGloo(what, [&] {
    gloo::BroadcastOptions opts(context_);
    opts.setTimeout(op_timeout_);
    opts.setRoot(root);
    opts.setOutput(static_cast<uint8_t*>(buf), bytes);
    gloo::broadcast(opts);
  });
  return s.ok() ? s : Fail(std::move(s));
}

absl::Status GlooCommunicator::Barrier() {
  const std::string what = absl::StrCat("gloo Barrier on rank ", rank_, " of ", world_size_);
  std::lock_guard<std::mutex> lock(op_mu_);
  RETURN_IF_ERROR(Precheck(what, nullptr));
  absl::Status s = RunGloo(what, [&] {
    gloo::BarrierOptions opts(context_);
    opts.setTimeout(op_timeout_);
    gloo::barrier(opts);
  });
  return s.ok() ? s : Fail(std::move(s));
}

}  // namespace dsv4
