"""Side-by-side causal attention table on a GPU machine: PyTorch's
torch.nn.functional.scaled_dot_product_attention with the flash backend
(SDPBackend.FLASH_ATTENTION) and, where this PyTorch has it, cuDNN's (SDPBackend.CUDNN_ATTENTION),
beside our benchmark binary (run through --ours with --json), all on the same GPU in the same run.

  python3 bench/peers_attention.py --ours gpu_stage/bench/attention --json $OUT/attention.json

The shapes are //bench:attention's: bf16, causal, head dims 64 and 128, contexts 1024-8192,
batch = batch_tokens / seq sequences (16384 tokens) and 12 heads. q, k and v are views of one
[batch, seq, 3, heads, head_dim] tensor, as in GPT-2 (and as our op reads its qkv); the
backward is torch.autograd.grad of the output for q, k and v (non-contiguous leaves in that
layout), so it times the backend's backward and its pre- and post-processing, as ours
includes its delta kernel. Two input sets are used in turn (each larger than the H200's L2).

FLOPs follow the FlashAttention convention, as ours: causal forward 2 * 2 * B * H * S^2 * D / 2
(two matmuls, half the square), backward 2.5x the forward (five matmuls against two). Times are
medians of CUDA events around each call after warm-up, in microseconds.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

torch = None  # imported by main() after the arguments, so that --help works anywhere
F = None

BACKWARD_RATIO = 2.5


def forward_flops(batch, heads, seq, head_dim):
    return 2.0 * 2.0 * batch * heads * seq * seq * head_dim / 2.0


def median_us(fn, warmup, repeats):
    """Median microseconds of fn(i) (i: the repetition, to rotate inputs), one event pair each."""
    for i in range(warmup):
        fn(i)
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(repeats)]
    for i, (start, end) in enumerate(events):
        start.record()
        fn(warmup + i)
        end.record()
    torch.cuda.synchronize()
    return 1e3 * statistics.median(start.elapsed_time(end) for start, end in events)


def backends():
    """(name, SDPBackend) pairs this PyTorch has."""
    from torch.nn.attention import SDPBackend
    found = [("sdpa-flash", SDPBackend.FLASH_ATTENTION)]
    if hasattr(SDPBackend, "CUDNN_ATTENTION"):
        found.append(("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION))
    else:
        print("this PyTorch has no SDPBackend.CUDNN_ATTENTION: cuDNN skipped", file=sys.stderr)
    return found


def make_set(batch, seq, heads, head_dim, backend):
    """q, k, v (leaves, [batch, heads, seq, head_dim] views of a [batch, seq, 3, heads, head_dim]
    tensor), the output of the forward with its graph, and a gradient of the output."""
    from torch.nn.attention import sdpa_kernel
    qkv = torch.randn(batch, seq, 3, heads, head_dim, device="cuda", dtype=torch.bfloat16)
    q, k, v = (qkv[:, :, i].transpose(1, 2).detach().requires_grad_(True) for i in range(3))
    with sdpa_kernel(backend):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    grad = torch.randn_like(out)
    return q, k, v, out, grad


def measure_peers(args, seqs, head_dims):
    from torch.nn.attention import sdpa_kernel
    rows = []
    for name, backend in backends():
        for head_dim in head_dims:
            for seq in seqs:
                batch = args.batch_tokens // seq
                flops = forward_flops(batch, args.heads, seq, head_dim)
                try:
                    sets = [make_set(batch, seq, args.heads, head_dim, backend) for _ in range(2)]

                    def forward(i):
                        q, k, v, _, _ = sets[i % len(sets)]
                        with torch.no_grad(), sdpa_kernel(backend):
                            F.scaled_dot_product_attention(q, k, v, is_causal=True)

                    def backward(i):
                        q, k, v, out, grad = sets[i % len(sets)]
                        with sdpa_kernel(backend):
                            torch.autograd.grad(out, (q, k, v), grad, retain_graph=True)

                    fwd = median_us(forward, args.warmup, args.repeats)
                    bwd = median_us(backward, args.warmup, args.repeats)
                    rows.append({"impl": name, "head_dim": head_dim, "seq": seq, "batch": batch,
                                 "heads": args.heads, "fwd_us": fwd, "bwd_us": bwd,
                                 "fwd_tflops": flops / (fwd * 1e-6) / 1e12,
                                 "bwd_tflops": BACKWARD_RATIO * flops / (bwd * 1e-6) / 1e12})
                    del sets
                except Exception as error:  # a backend that cannot take the shape: say so
                    print(f"{name} failed at head_dim {head_dim} seq {seq}: {error}",
                          file=sys.stderr)
                torch.cuda.empty_cache()
    return rows


def measure_ours(args, seqs, head_dims):
    with tempfile.NamedTemporaryFile(suffix=".jsonl", delete=False) as handle:
        path = handle.name
    subprocess.run([args.ours, "--seqs=" + ",".join(map(str, seqs)),
                    "--head_dims=" + ",".join(map(str, head_dims)),
                    f"--batch_tokens={args.batch_tokens}", f"--heads={args.heads}",
                    f"--repeats={args.repeats}", f"--warmup={args.warmup}", f"--json={path}"],
                   check=True)
    ours = {}
    with open(path) as handle:
        for line in handle:
            row = json.loads(line)
            ours[(row["head_dim"], row["seq"], row["op"])] = row
    os.unlink(path)
    return ours


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ours", help="path of our bench binary (bench/attention)")
    parser.add_argument("--seqs", default="1024,2048,4096,8192")
    parser.add_argument("--head_dims", default="64,128")
    parser.add_argument("--batch_tokens", type=int, default=16384)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--json", help="write all rows here")
    args = parser.parse_args()
    global torch, F
    try:
        import torch
        import torch.nn.functional as F
    except ImportError as error:
        sys.exit(f"peers_attention.py needs PyTorch with CUDA (the GPU machine's Python): {error}")
    if not torch.cuda.is_available():
        sys.exit("peers_attention.py needs a CUDA GPU (torch.cuda.is_available() is False); "
                 "run it on the GPU machine")
    seqs = [int(s) for s in args.seqs.split(",")]
    head_dims = [int(d) for d in args.head_dims.split(",")]
    for seq in seqs:
        if args.batch_tokens % seq:
            sys.exit(f"--batch_tokens {args.batch_tokens} is not a multiple of seq {seq}")
    ours = measure_ours(args, seqs, head_dims) if args.ours else {}
    peers = measure_peers(args, seqs, head_dims)
    names = sorted({row["impl"] for row in peers})
    gemm = next((row["gemm_tflops"] for row in ours.values()), 0)
    print(f"\ncausal attention side by side on {torch.cuda.get_device_name()}, bf16, "
          f"{args.batch_tokens} tokens, {args.heads} heads; TF/s (median us); FlashAttention "
          f"FLOPs: fwd 2*2*B*H*S^2*D/2, bwd 2.5x fwd (* = the fastest of the row's op)"
          + (f"; bf16 GEMM {gemm:.0f} TF/s (ours, measured in its run)" if gemm else ""))
    header = ["D", "seq", "batch"]
    for op in ("fwd", "bwd"):
        header += [f"ours {op}"] + [f"{name} {op}" for name in names]
    print("| " + " | ".join(header) + " |")
    print("|" + "---:|" * len(header))
    for head_dim in head_dims:
        for seq in seqs:
            by_impl = {row["impl"]: row for row in peers
                       if row["head_dim"] == head_dim and row["seq"] == seq}
            cells = [str(head_dim), str(seq), str(args.batch_tokens // seq)]
            for op, our_op in (("fwd", "forward"), ("bwd", "backward")):
                mine = ours.get((head_dim, seq, our_op))
                values = [(mine["tflops"], mine["median_us"]) if mine else None]
                values += [(by_impl[n][f"{op}_tflops"], by_impl[n][f"{op}_us"])
                           if n in by_impl else None for n in names]
                best = max((v[0] for v in values if v), default=None)
                cells += ["-" if v is None else
                          f"{v[0]:.0f}{'*' if v[0] == best else ''} ({v[1]:.0f})" for v in values]
            print("| " + " | ".join(cells) + " |")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"peers": peers,
                       "ours": [row for _, row in sorted(ours.items())]}, handle, indent=1)


if __name__ == "__main__":
    main()
