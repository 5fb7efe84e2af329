"""Side-by-side cross-entropy table on a GPU machine: PyTorch eager and torch.compile always,
Liger-Kernel and QuACK (Dao-AILab's CuTe-DSL kernels) when importable, and our benchmark binary
(run through --ours), all on the same GPU in the same run. fp32 (and bf16) logits [tokens, vocab], int64 targets, mean reduction.
Apple's Cut Cross-Entropy has no op over given logits (it takes the hidden states and the
classifier), so it is compared in peers_linear_cross_entropy.py.

  python3 bench/peers_cross_entropy.py --ours gpu_stage/bench_cross_entropy --json $OUT/ce.json

"fwd" is the loss alone (logits do not require grad); "fused" is loss + gradient of the logits
(for PyTorch: forward then backward; for QuACK its one-pass cross_entropy_fwd(return_dx=True));
"bwd" is the gradient from a saved lse (ours and QuACK's cross_entropy_bwd only). QuACK returns
per-token losses (no mean); ours includes the mean and its target scan. Times are medians of
triton.testing.do_bench (CUDA events), in microseconds. QuACK compiles per (dtype, vocab): the
warm-up of do_bench pays that before the timed calls.
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


def quack_impl():
    """QuACK's forward, one pass and backward, or None when it is not importable."""
    try:
        from quack.cross_entropy import cross_entropy_bwd, cross_entropy_fwd
    except Exception as error:
        print(f"quack not importable: {error}", file=sys.stderr)
        return None
    return cross_entropy_fwd, cross_entropy_bwd


def measure_quack(tokens, vocabs, dtypes):
    impl = quack_impl()
    if impl is None:
        return []
    fwd_fn, bwd_fn = impl
    rows = []
    for dtype_name in dtypes:
        dtype = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[dtype_name]
        for vocab in vocabs:
            logits = torch.randn(tokens, vocab, device="cuda", dtype=dtype) * 2
            targets = torch.randint(0, vocab, (tokens,), device="cuda")
            try:
                fwd = median_us(lambda: fwd_fn(logits, targets, return_lse=True))
                fused = median_us(lambda: fwd_fn(logits, targets, return_dx=True))
                _, lse = fwd_fn(logits, targets, return_lse=True)
                dloss = torch.full((tokens,), 1.0 / tokens, device="cuda")
                bwd = median_us(lambda: bwd_fn(logits, targets, dloss, lse))
                rows.append({"impl": "quack", "dtype": dtype_name, "vocab": vocab, "fwd_us": fwd,
                             "fused_us": fused, "bwd_us": bwd})
            except Exception as error:
                print(f"quack failed at {dtype_name} vocab {vocab}: {error}", file=sys.stderr)
            del logits, targets
            torch.cuda.empty_cache()
    return rows


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
    peers = measure_peers(args.tokens, vocabs, dtypes) + measure_quack(args.tokens, vocabs, dtypes)
    names = sorted({row["impl"] for row in peers})
    bwd_names = sorted({row["impl"] for row in peers if "bwd_us" in row})
    print(f"\ncross-entropy side by side on {torch.cuda.get_device_name()}, tokens={args.tokens}, median us"
          " (* = the fastest of the row's op)")
    ops = [("fwd", "forward", names), ("fused", "fused", names), ("bwd", "backward", bwd_names)]
    header = ["dtype", "vocab"]
    for op, _, impls in ops:
        header += [f"ours {op}"] + [f"{n} {op}" for n in impls]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for dtype in dtypes:
        for vocab in vocabs:
            by_impl = {row["impl"]: row for row in peers if row["dtype"] == dtype and row["vocab"] == vocab}
            cells = [dtype, str(vocab)]
            for op, our_op, impls in ops:
                values = [ours.get((dtype, vocab, our_op), float("nan"))]
                values += [by_impl[n].get(f"{op}_us", float("nan")) if n in by_impl else float("nan")
                           for n in impls]
                best = min((v for v in values if v == v), default=None)
                cells += ["-" if v != v else f"{v:.0f}{'*' if v == best else ''}" for v in values]
            print("| " + " | ".join(cells) + " |")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"peers": peers, "ours": {f"{k[0]}/{k[1]}/{k[2]}": v for k, v in ours.items()}}, handle, indent=1)


if __name__ == "__main__":
    main()
