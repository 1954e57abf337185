#!/usr/bin/env python3
"""Per-kernel table of one decode step from an Nsight Compute CSV (scripts/device/ncu_step.sh).

Reads `ncu --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum` output, finds the first
complete step (the embedding kernel up to the last sampling kernel), prints each kernel's time and
DRAM bytes, then the split: weight-streaming products (our GEMVs, the split-K GEMV, cuBLASLt)
against their time at the HBM spec, and everything else. Usage: ncu_step_table.py ncu.csv
"""
import csv
import sys

HBM_BYTES_PER_US = 4.8e6  # H200 spec, 4.8 TB/s
PRODUCTS = ("StreamKernel", "DownSlots", "SplitGemv", "nvjet", "gemm", "Gemm")


def main(path):
    kernels = {}
    order = []
    header = None
    with open(path, newline="") as f:
        for row in csv.reader(f):
            if row and row[0] == "ID":
                header = row
                continue
            if header is None or len(row) != len(header):
                continue
            d = dict(zip(header, row))
            k = kernels.get(d["ID"])
            if k is None:
                k = kernels[d["ID"]] = {"name": d["Kernel Name"], "grid": d["Grid Size"],
                                        "block": d["Block Size"]}
                order.append(d["ID"])
            k[d["Metric Name"]] = float(d["Metric Value"].replace(",", ""))
    names = [kernels[i]["name"] for i in order]
    starts = [i for i, n in enumerate(names) if "EmbedKernel" in n]
    if not starts:
        sys.exit("no EmbedKernel in the capture: widen --launch-count")
    s0 = starts[0]
    ends = [i for i, n in enumerate(names) if "SampleFinish" in n and i > s0]
    if not ends:
        sys.exit("no complete step after the first EmbedKernel: widen --launch-count")
    prod_us = prod_bytes = other_us = 0.0
    for i in range(s0, ends[0] + 1):
        k = kernels[order[i]]
        us = k.get("gpu__time_duration.sum", 0.0) / 1e3
        b = k.get("dram__bytes_read.sum", 0.0)
        print(f"{k['name'][:64]:64s} {k['grid']:>14s} {k['block']:>12s} {us:8.2f} us "
              f"{b / 1e6:9.2f} MB")
        if any(p in k["name"] for p in PRODUCTS):
            prod_us += us
            prod_bytes += b
        else:
            other_us += us
    n = ends[0] - s0 + 1
    print(f"\n{n} kernels, {prod_us + other_us:.1f} us serialised")
    print(f"products: {prod_us:.1f} us for {prod_bytes / 1e9:.3f} GB "
          f"({prod_bytes / HBM_BYTES_PER_US:.1f} us at 4.8 TB/s)")
    print(f"other kernels: {other_us:.1f} us")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
