"""Peers of the fused linear cross-entropy on a GPU machine with PyTorch (and Triton).

For each shape of the issue (bf16 hidden [N, H] and weight [V, H], int64 targets, mean
reduction, loss + gradients of hidden and weight) it measures, in one run and with the same
method as ../shared/anchors/peers.py (triton.testing.do_bench medians, CUDA events):

  - the three plain cuBLAS GEMMs of the same shapes (logits, d_hidden, d_weight; bf16): the
    ceiling every ratio is taken against;
  - PyTorch with full logits (hidden @ weight.T, .float(), F.cross_entropy, backward);
  - Liger's fused linear cross-entropy (liger_kernel; LIGER_OLD=1 for 0.2.x, which has another
    call signature), Apple's Cut Cross-Entropy (cut_cross_entropy) and QuACK's
    chunked_linear_cross_entropy (quack-kernels 0.6.1 with nvidia-cutlass-dsl 4.6.0: later
    versions fail to import it; chunk --quack_chunk, 4096 by default, no bias), when importable.
    QuACK compiles per shape on its first call (a minute or more): the untimed first step
    pays it;

each with the peak device memory beyond inputs and gradients (max_memory_allocated after
reset, minus what was allocated before the step). Peers are imported from the Python path
(e.g. wheels installed with pip --target and PYTHONPATH). With --ours PATH[,PATH...] (the
JSON lines of `bazel run -c opt //bench:linear_cross_entropy -- --json=PATH`, ideally from
the same call; one file with and one without --operand_dtype_logits, say) our fused calls'
columns are printed next to them: f32 d_weight, and bf16 d_weight summed in bf16. The files
are read first, so a wrong path fails before the peers run. --table_from JSON prints the
table of a saved run and runs nothing (no GPU, torch or triton needed).

  python3 bench/peers_linear_cross_entropy.py [--ours a.jsonl,b.jsonl] [--shapes 4096x4096x128256,...]
      [--peers torch,liger,cce,quack] [--quack_chunk 4096] [--table_from peers.json]

Writes $OUT/peers_linear_cross_entropy.json (or ./ without $OUT) after each shape and prints
a table last.
"""
import argparse
import importlib
import json
import os
import traceback

torch = None  # imported by import_torch(): --table_from needs neither torch nor triton
F = None
do_bench = None


def import_torch():
    global torch, F, do_bench
    import torch as torch_module
    import torch.nn.functional as functional
    from triton.testing import do_bench as triton_do_bench
    torch, F, do_bench = torch_module, functional, triton_do_bench

SHAPES = "4096x4096x128256,16384x4096x128256,16384x768x50304,8192x2304x256000"


def median_ms(fn, rep=200):
    return do_bench(fn, warmup=25, rep=rep, return_mode="median")


def load_peers(quack_chunk=4096):
    """Name -> callable(hidden, weight, targets) returning the mean loss (autograd on)."""
    peers = {"torch": lambda h, w, t: F.cross_entropy((h @ w.t()).float(), t)}
    errors = {}
    try:
        module = importlib.import_module("liger_kernel.ops.fused_linear_cross_entropy")
        function = module.LigerFusedLinearCrossEntropyFunction
        if os.environ.get("LIGER_OLD") == "1":
            # 0.2.x: apply(input, weight, target, bias, ignore_index)
            peers["liger021"] = lambda h, w, t: function.apply(h, w, t, None, -100)
        else:
            loss = importlib.import_module(
                "liger_kernel.transformers.fused_linear_cross_entropy"
            ).LigerFusedLinearCrossEntropyLoss()
            peers["liger"] = lambda h, w, t: loss(w, h, t)
    except Exception:  # noqa: BLE001 - any import problem means "not available"
        errors["liger"] = traceback.format_exc()[-400:]
    try:
        from cut_cross_entropy import linear_cross_entropy

        peers["cce"] = lambda h, w, t: linear_cross_entropy(h, w, t)
    except Exception:  # noqa: BLE001
        errors["cce"] = traceback.format_exc()[-400:]
    try:
        from quack.linear_cross_entropy import chunked_linear_cross_entropy

        peers["quack"] = lambda h, w, t: chunked_linear_cross_entropy(
            h, w, t, chunk_size=quack_chunk, reduction="mean")
    except Exception:  # noqa: BLE001
        errors["quack"] = traceback.format_exc()[-400:]
    return peers, errors


def run_shape(n, h, v, peers, rep):
    dev = "cuda"
    torch.manual_seed(0)
    hidden0 = (torch.randn(n, h, device=dev) * 0.5).to(torch.bfloat16)
    weight0 = (torch.randn(v, h, device=dev) / h**0.5).to(torch.bfloat16)
    targets = torch.randint(0, v, (n,), device=dev)
    row = {"N": n, "H": h, "V": v}

    logits = torch.empty(n, v, device=dev, dtype=torch.bfloat16)

    def three_gemms():
        torch.matmul(hidden0, weight0.t(), out=logits)
        logits @ weight0
        logits.t() @ hidden0

    row["gemms_3_ms"] = median_ms(three_gemms, rep)
    del logits
    torch.cuda.empty_cache()

    for name, fn in peers.items():
        try:
            hidden = hidden0.clone().requires_grad_(True)
            weight = weight0.clone().requires_grad_(True)

            def step():
                hidden.grad = None
                weight.grad = None
                fn(hidden, weight, targets).backward()

            step()
            torch.cuda.synchronize()
            # Gradients exist from here on: the peak beyond them and the inputs.
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            step()
            torch.cuda.synchronize()
            row[name + "_peak_extra_mib"] = (torch.cuda.max_memory_allocated() - base) / 2**20
            row[name + "_ms"] = median_ms(step, rep)
            with torch.no_grad():
                row[name + "_loss"] = float(fn(hidden, weight, targets))
            del hidden, weight
        except Exception as error:  # noqa: BLE001 - report and go on with the others
            row[name + "_error"] = repr(error)[:300]
        torch.cuda.empty_cache()
    return row


def load_ours(paths):
    """{label: {(N, H, V): record}} from comma-separated JSON-lines files, read before any
    peer runs (a missing file fails at once). Each file's label says whether its fused calls
    ran on 16-bit logits (--operand_dtype_logits)."""
    ours = {}
    for path in filter(None, paths.split(",")):
        records = {}
        with open(path) as lines:
            for line in lines:
                line = line.strip()
                if line:
                    record = json.loads(line)
                    records[(int(record["N"]), int(record["H"]), int(record["V"]))] = record
        label = "ours"
        if any(r.get("operand_dtype_logits") in (True, "true") for r in records.values()):
            label = "ours 16-bit logits"
        while label in ours:
            label += "'"
        ours[label] = records
    return ours


def ours_cells(record, key):
    """ms / MiB / x of one of our fused figures, or '-' where it is missing."""
    if not record or record.get(key + "_ms") is None:
        return "-"
    ms = record[key + "_ms"]
    peak = record.get(key + "_peak_extra_bytes") or 0
    return f"{ms:.2f} / {peak / 2**20:.0f} / {ms / record['gemms_3_ms']:.2f}x"


def print_table(result, ours):
    """The side-by-side table: per shape, the peers' figures against this run's three GEMMs
    and ours (f32 d_weight, and a bf16 d_weight summed in bf16 as the peers' is produced)
    against the three GEMMs of our own bench's process."""
    names = list(result["peers"])
    print(f"\nlinear cross-entropy peers on {result['gpu']} (ms / MiB of peak extra memory; "
          "x = / 3 GEMMs of the same process)")
    header = ["N x H x V", "3 GEMMs"]
    for label in ours:
        header += [f"{label}, f32 dW", f"{label}, bf16 dW sums"]
    header += names
    print(" | ".join(f"{c:>26}" if i else f"{c:<18}" for i, c in enumerate(header)))
    for row in result["rows"]:
        base = row["gemms_3_ms"]
        cells = [f"{row['N']}x{row['H']}x{row['V']}", f"{base:.2f}"]
        for records in ours.values():
            record = records.get((row["N"], row["H"], row["V"]))
            cells += [ours_cells(record, "fused"), ours_cells(record, "fused_dweight_bf16_sums")]
        for name in names:
            if name + "_ms" in row:
                cells.append(f"{row[name + '_ms']:.2f} / {row[name + '_peak_extra_mib']:.0f} "
                             f"/ {row[name + '_ms'] / base:.2f}x")
            else:
                cells.append("error")
        print(" | ".join(f"{c:>26}" if i else f"{c:<18}" for i, c in enumerate(cells)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", default=SHAPES, help="comma-separated NxHxV")
    parser.add_argument("--ours", default="",
                        help="comma-separated JSON-lines files of //bench:linear_cross_entropy "
                        "(e.g. with and without --operand_dtype_logits)")
    parser.add_argument("--table_from", default="",
                        help="print the table of a saved peers_linear_cross_entropy.json "
                        "(with --ours) and run nothing: no GPU, torch or triton needed")
    parser.add_argument("--rep", type=int, default=300, help="do_bench rep (ms of timing)")
    parser.add_argument("--quack_chunk", type=int, default=4096,
                        help="chunk_size of QuACK's chunked_linear_cross_entropy")
    parser.add_argument("--peers", default="",
                        help="comma-separated subset of torch,liger,cce,quack to run "
                        "(default: every importable one)")
    args = parser.parse_args()
    ours = load_ours(args.ours)
    if args.table_from:
        with open(args.table_from) as saved:
            print_table(json.load(saved), ours)
        return

    import_torch()
    peers, errors = load_peers(args.quack_chunk)
    if args.peers:
        wanted = args.peers.split(",")
        peers = {name: fn for name, fn in peers.items() if name in wanted}
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "peers": list(peers), "quack_chunk": args.quack_chunk,
              "import_errors": errors, "rows": []}
    for name, error in errors.items():
        print(f"{name}: not importable ({error.strip().splitlines()[-1]})", flush=True)
    out_dir = os.environ.get("OUT", ".")
    for item in args.shapes.split(","):
        n, h, v = (int(x) for x in item.split("x"))
        row = run_shape(n, h, v, peers, args.rep)
        result["rows"].append(row)
        print(json.dumps(row), flush=True)
        with open(os.path.join(out_dir, "peers_linear_cross_entropy.json"), "w") as out:
            json.dump(result, out, indent=1)

    print_table(result, ours)

if __name__ == "__main__":
    main()
