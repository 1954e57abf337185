// Checks of the Communicator's collectives against values computed here, shared by the in-process
// tests (ranks as threads) and the rank helper binary (ranks as processes). Each check returns a
// Status naming the op, the element and the values that differ.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "parallel/communicator.h"

namespace dsv4::testing {

// The element i of rank r's input: distinct per rank and element, exactly representable in fp32
// and bf16, and the sum over ranks stays exact (small integers times powers of two).
float RankValue(int rank, size_t i);

// AllReduceSum of `count` fp32 or bf16 elements (in place or not), checked exactly.
absl::Status CheckAllReduce(Communicator& comm, size_t count, DType dtype, bool in_place);
// bf16 sums that round: every rank must end with the same bits (checked with an AllGather of the
// results) and each element within one bf16 rounding per addition of the exact sum.
absl::Status CheckAllReduceBf16Rounding(Communicator& comm, size_t count);
// AllGather of `count` fp32 elements per rank (in place or not).
absl::Status CheckAllGather(Communicator& comm, size_t count, bool in_place);
// Broadcast of `count` bytes from `root`.
absl::Status CheckBroadcast(Communicator& comm, size_t count, int root);
// The sizes the suites run: 0, 1, odd ones, one over a Gloo segment (1 MiB), a prefill-sized one.
std::vector<size_t> CheckSizes();

}  // namespace dsv4::testing
