#!/usr/bin/env python3
"""Per-kernel summary of Nsight Compute's detail sections (scripts/device/ncu_detail.sh).

Reads `ncu --csv --page details` output (optionally .xz) and prints, for the first complete
decode step (the embedding kernel up to the last sampling kernel), each kernel's duration, DRAM
throughput (% of peak), achieved / theoretical occupancy, registers, waves per SM and warp
cycles per issued instruction. Usage: ncu_detail_table.py ncu_detail.csv[.xz]
"""
import collections
import csv
import io
import lzma
import sys


def load(path):
    opener = lzma.open if path.endswith(".xz") else open
    with opener(path, "rt", newline="") as f:
        rows = list(csv.reader(io.StringIO(f.read())))
    start = next(i for i, r in enumerate(rows) if r and r[0] == "ID")
    kernels = collections.OrderedDict()
    for r in rows[start + 1:]:
        if len(r) < 15 or not r[12]:
            continue  # rule rows carry no metric
        k = kernels.setdefault(r[0], {"name": r[4], "grid": r[8], "block": r[7]})
        k[r[12]] = r[14]
    return list(kernels.values())


def num(k, key):
    try:
        return float(k.get(key, "nan").replace(",", ""))
    except ValueError:
        return float("nan")


def main(path):
    ks = load(path)
    e = next(i for i, k in enumerate(ks) if "EmbedKernel" in k["name"])
    end = next((i for i, k in enumerate(ks) if "SampleFinish" in k["name"] and i > e), None)
    if end is not None:
        step = ks[e:end + 1]
    else:
        # The capture holds the end of one step (before e) and the start of the next: find the
        # step length L at which the two agree, then take the start and the rest of the end.
        names = [k["name"] for k in ks]
        head = len(ks) - e
        for length in range(head + 1, e + head + 1):
            shift = length - e  # ks[i] (i < e) is step kernel shift + i
            if all(names[e + p] == names[p - shift] for p in range(max(shift, 0), head)):
                step = ks[e:] + ks[head - shift:e]
                break
        else:
            sys.exit("no complete step in the capture: widen --launch-count")
    print(f"{'kernel':58s} {'grid':>14s} {'us':>7s} {'dram%':>6s} {'occ%':>5s} {'theo%':>5s} "
          f"{'regs':>4s} {'waves':>6s} {'cpi':>5s}")
    for k in step:
        print(f"{k['name'][:58]:58s} {k['grid']:>14s} {num(k, 'Duration') / 1e3:7.2f} "
              f"{num(k, 'DRAM Throughput'):6.1f} {num(k, 'Achieved Occupancy'):5.1f} "
              f"{num(k, 'Theoretical Occupancy'):5.1f} {num(k, 'Registers Per Thread'):4.0f} "
              f"{num(k, 'Waves Per SM'):6.2f} {num(k, 'Warp Cycles Per Issued Instruction'):5.1f}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
