"""Side-by-side cross-entropy table on a GPU machine: PyTorch eager and torch.compile always,
Liger-Kernel when importable, and our benchmark binary (run through --ours), all on the same
GPU in the same run. fp32 (and bf16) logits [tokens, vocab], int64 targets, mean reduction.
Apple's Cut Cross-Entropy has no op over given logits (it takes the hidden states and the
classifier), so it is compared in peers_linear_cross_entropy.py.

  python3 bench/peers_cross_entropy.py --ours gpu_stage/bench_cross_entropy --json $OUT/ce.json

"fwd" is the loss alone (logits do not require grad); "fused" is loss + gradient of the logits
(for PyTorch: forward then backward). Times are medians of triton.testing.do_bench (CUDA
events), in microseconds.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F
from triton.testing import do_bench


def median_us(fn, rep_ms=200):
    return 1e3 * do_bench(fn, warmup=25, rep=rep_ms, return_mode="median")


def peer_impls():
    impls = {"torch": lambda l, t: F.cross_entropy(l, t)}
    import torch._dynamo
    torch._dynamo.config.cache_size_limit = 64
    impls["torch.compile"] = torch.compile(lambda l, t: F.cross_entropy(l, t), dynamic=False)
    try:
        from liger_kernel.transformers.cross_entropy import LigerCrossEntropyLoss
        liger = LigerCrossEntropyLoss()
        impls["liger"] = lambda l, t: liger(l, t)
    except Exception as error:  # not installed: say so, keep going
        print(f"liger-kernel not importable: {error}", file=sys.stderr)
    return impls


def measure_peers(tokens, vocabs, dtypes):
    rows = []
    impls = peer_impls()
    for dtype_name in dtypes:
        dtype = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[dtype_name]
        for vocab in vocabs:
            logits = torch.randn(tokens, vocab, device="cuda", dtype=dtype) * 2
            targets = torch.randint(0, vocab, (tokens,), device="cuda")
            for name, fn in impls.items():
                try:
                    with torch.no_grad():
                        fwd = median_us(lambda: fn(logits, targets))
                    leaf = logits.clone().requires_grad_(True)

                    def fused():
                        leaf.grad = None
                        fn(leaf, targets).backward()

                    full = median_us(fused)
                    del leaf
                    rows.append({"impl": name, "dtype": dtype_name, "vocab": vocab, "fwd_us": fwd, "fused_us": full})
                except Exception as error:
                    print(f"{name} failed at vocab {vocab}: {error}", file=sys.stderr)
                torch.cuda.empty_cache()
            del logits, targets
            torch.cuda.empty_cache()
    return rows


def measure_ours(binary, tokens, vocabs, dtypes):
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as handle:
        path = handle.name
    subprocess.run([binary, f"--tokens={tokens}", "--vocabs=" + ",".join(map(str, vocabs)),
                    "--dtypes=" + ",".join(dtypes), f"--json={path}"], check=True)
    ours = {}
    with open(path) as handle:
        for line in handle:
            row = json.loads(line)
            ours[(row["dtype"], row["vocab"], row["op"])] = row["median_us"]
    os.unlink(path)
    return ours


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ours", help="path of our bench binary (bench/cross_entropy)")
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--vocabs", default="4096,8192,16384,32768,65536,131072")
    parser.add_argument("--dtypes", default="f32")
    parser.add_argument("--json", help="write all rows here")
    args = parser.parse_args()
    vocabs = [int(v) for v in args.vocabs.split(",")]
    dtypes = args.dtypes.split(",")
    ours = measure_ours(args.ours, args.tokens, vocabs, dtypes) if args.ours else {}
    peers = measure_peers(args.tokens, vocabs, dtypes)
    names = sorted({row["impl"] for row in peers})
    print(f"\ncross-entropy side by side on {torch.cuda.get_device_name()}, tokens={args.tokens}, median us")
    header = ["dtype", "vocab", "ours fwd"] + [f"{n} fwd" for n in names] + ["ours fused"] + [f"{n} fused" for n in names]
    print(" | ".join(header))
    for dtype in dtypes:
        for vocab in vocabs:
            by_impl = {row["impl"]: row for row in peers if row["dtype"] == dtype and row["vocab"] == vocab}
            cells = [dtype, str(vocab), f"{ours.get((dtype, vocab, 'forward'), float('nan')):.0f}"]
            cells += [f"{by_impl[n]['fwd_us']:.0f}" if n in by_impl else "-" for n in names]
            cells += [f"{ours.get((dtype, vocab, 'fused'), float('nan')):.0f}"]
            cells += [f"{by_impl[n]['fused_us']:.0f}" if n in by_impl else "-" for n in names]
            print(" | ".join(cells))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"peers": peers, "ours": {f"{k[0]}/{k[1]}/{k[2]}": v for k, v in ours.items()}}, handle, indent=1)


if __name__ == "__main__":
    main()
