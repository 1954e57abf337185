#include "tests/parallel/collective_checks.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace dsv4::testing {
namespace {

std::string Ctx(const Communicator& comm, std::string_view op, size_t count) {
  return absl::StrCat(AV(op), " count=", count, " on rank ", comm.rank(), "/", comm.world_size());
}

// Rank r's bf16 input for the rounding check: values whose sums need more than 8 mantissa bits.
float RoundingValue(int rank, size_t i) {
  return 1.0f + static_cast<float>((i * 7 + static_cast<size_t>(rank) * 13) % 97) / 96.0f;
}

}  // namespace

float RankValue(int rank, size_t i) {
  // Integers with |value| <= 21 for ranks below 8: sums over up to 8 ranks stay below 2^8 in
  // magnitude, exact in bf16's 8 significant bits whatever the order of the additions.
  const int v = static_cast<int>((i * 31 + static_cast<size_t>(rank) * 17) % 29) - 14;
  return static_cast<float>(v + rank);
}

std::vector<size_t> CheckSizes() {
  return {0, 1, 2, 3, 7, 255, 4097, (1u << 18) + 3, 4 * 4096 * 16};
}

absl::Status CheckAllReduce(Communicator& comm, size_t count, DType dtype, bool in_place) {
  const std::string ctx = Ctx(comm, absl::StrCat("AllReduceSum ", AV(DTypeName(dtype)),
                                                 in_place ? " in place" : ""), count);
  const int n = comm.world_size();
  const size_t esize = static_cast<size_t>(DTypeSize(dtype));
  std::vector<uint8_t> send(count * esize + 1), recv(count * esize + 1, 0xAB);
  for (size_t i = 0; i < count; ++i) {
    const float v = RankValue(comm.rank(), i);
    if (dtype == DType::kF32) {
      std::memcpy(send.data() + i * 4, &v, 4);
    } else {
      const uint16_t b = F32ToBf16(v);
      std::memcpy(send.data() + i * 2, &b, 2);
    }
  }
  uint8_t* out = in_place ? send.data() : recv.data();
  RETURN_IF_ERROR_CTX(comm.AllReduceSum(send.data(), out, count, dtype, nullptr), ctx);
  for (size_t i = 0; i < count; ++i) {
    float want = 0;
    for (int r = 0; r < n; ++r) want += RankValue(r, i);
    float got;
    if (dtype == DType::kF32) {
      std::memcpy(&got, out + i * 4, 4);
    } else {
      uint16_t b;
      std::memcpy(&b, out + i * 2, 2);
      got = Bf16ToF32(b);
    }
    if (got != want) {
      return absl::InternalError(absl::StrCat(ctx, ": element ", i, " is ", got, ", want ", want));
    }
  }
  // One byte past the end stays as it was.
  if (!in_place && recv[count * esize] != 0xAB) {
    return absl::InternalError(absl::StrCat(ctx, ": wrote past the end of recv"));
  }
  return absl::OkStatus();
}

absl::Status CheckAllReduceBf16Rounding(Communicator& comm, size_t count) {
  const std::string ctx = Ctx(comm, "AllReduceSum bf16 rounding", count);
  const int n = comm.world_size();
  std::vector<uint16_t> buf(count);
  for (size_t i = 0; i < count; ++i) buf[i] = F32ToBf16(RoundingValue(comm.rank(), i));
  RETURN_IF_ERROR_CTX(comm.AllReduceSum(buf.data(), buf.data(), count, DType::kBF16, nullptr), ctx);
  for (size_t i = 0; i < count; ++i) {
    double exact = 0;
    for (int r = 0; r < n; ++r) exact += Bf16ToF32(F32ToBf16(RoundingValue(r, i)));
    const double got = Bf16ToF32(buf[i]);
    // One rounding (half an ulp of at most 2^-7 relative) per addition.
    const double tol = std::abs(exact) * (n - 1) * std::ldexp(1.0, -8);
    if (std::abs(got - exact) > tol) {
      return absl::InternalError(
          absl::StrCat(ctx, ": element ", i, " is ", got, ", exact sum ", exact));
    }
  }
  std::vector<uint16_t> all(count * static_cast<size_t>(n));
  RETURN_IF_ERROR_CTX(comm.AllGather(buf.data(), all.data(), count, DType::kBF16, nullptr), ctx);
  for (int r = 0; r < n; ++r) {
    if (std::memcmp(all.data() + static_cast<size_t>(r) * count, buf.data(), count * 2) != 0) {
      return absl::InternalError(
          absl::StrCat(ctx, ": rank ", r, "'s sum differs in its bits from this rank's"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckAllGather(Communicator& comm, size_t count, bool in_place) {
  const std::string ctx = Ctx(comm, in_place ? "AllGather in place" : "AllGather", count);
  const int n = comm.world_size();
  const size_t me = static_cast<size_t>(comm.rank());
  std::vector<float> mine(count), all(count * static_cast<size_t>(n), -1000.0f);
  for (size_t i = 0; i < count; ++i) mine[i] = RankValue(comm.rank(), i);
  const float* send = mine.data();
  if (in_place) {
    std::copy(mine.begin(), mine.end(), all.begin() + static_cast<std::ptrdiff_t>(me * count));
    send = all.data() + me * count;
  }
  RETURN_IF_ERROR_CTX(comm.AllGather(send, all.data(), count, DType::kF32, nullptr), ctx);
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < count; ++i) {
      const float got = all[static_cast<size_t>(r) * count + i];
      if (got != RankValue(r, i)) {
        return absl::InternalError(absl::StrCat(ctx, ": rank ", r, "'s element ", i, " is ", got,
                                                ", want ", RankValue(r, i)));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CheckBroadcast(Communicator& comm, size_t count, int root) {
  const std::string ctx = Ctx(comm, absl::StrCat("Broadcast root=", root), count);
  std::vector<uint8_t> buf(count);
  for (size_t i = 0; i < count; ++i) {
    buf[i] = comm.rank() == root ? static_cast<uint8_t>(i * 7 + static_cast<size_t>(root) * 3)
                                 : static_cast<uint8_t>(0xEE);
  }
  RETURN_IF_ERROR_CTX(comm.Broadcast(buf.data(), count, DType::kU8, root, nullptr), ctx);
  for (size_t i = 0; i < count; ++i) {
    const auto want = static_cast<uint8_t>(i * 7 + static_cast<size_t>(root) * 3);
    if (buf[i] != want) {
      return absl::InternalError(absl::StrCat(ctx, ": byte ", i, " is ", buf[i], ", want ", want));
    }
  }
  return absl::OkStatus();
}

}  // namespace dsv4::testing
