#!/usr/bin/env python3
"""Hugging Face transformers peer for the slice3 decode benchmark (run on the GPU host).

Random bf16 weights of a DSV4 config, a prompt of --prompt-len random tokens per sequence,
then greedy decode through the cache; prints decode ms/step and tok/s per batch size, timed
with CUDA events after a warm-up step. Usage:
  python3 bench/hf_decode_bench.py CONFIG.json [--batches 1,8] [--prompt-len 1024] [--steps 16]
"""
import argparse
import json
import os
import shutil
import tempfile
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--prompt-len", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=16)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp()
    shutil.copy(a.config, os.path.join(tmp, "config.json"))
    cfg = AutoConfig.from_pretrained(tmp)
    torch.manual_seed(0)
    t0 = time.time()
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.bfloat16,
                                                 attn_implementation="eager")
    model.eval()
    params = sum(p.numel() for p in model.parameters())
    print(f"transformers model: {params / 1e9:.2f} B params, built in {time.time() - t0:.1f} s")
    print(f"{'batch':>6} {'prompt':>7} {'prefill_ms':>11} {'decode_ms/step':>15} {'decode_tok/s':>13}")
    for batch in [int(b) for b in a.batches.split(",")]:
        ids = torch.randint(0, cfg.vocab_size, (batch, a.prompt_len), device="cuda")
        with torch.no_grad():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = model(ids, use_cache=True)
            end.record()
            torch.cuda.synchronize()
            prefill_ms = start.elapsed_time(end)
            past = out.past_key_values
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            times = []
            for step in range(a.steps + 1):
                start.record()
                out = model(nxt, past_key_values=past, use_cache=True)
                end.record()
                torch.cuda.synchronize()
                if step > 0:
                    times.append(start.elapsed_time(end))
                past = out.past_key_values
                nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        ms = sorted(times)[len(times) // 2]
        print(f"{batch:>6} {a.prompt_len:>7} {prefill_ms:>11.1f} {ms:>15.3f} {batch * 1000 / ms:>13.1f}")
        print(json.dumps({"peer": "transformers", "batch": batch, "decode_ms": ms,
                          "prefill_ms": prefill_ms}))


if __name__ == "__main__":
    main()
