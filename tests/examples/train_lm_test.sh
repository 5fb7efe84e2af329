#!/usr/bin/env bash
# End-to-end test of examples/train_lm on the CPU: a tiny model on a small generated corpus
# (byte-level BPE trained by the program) must bring the validation loss down and the
# validation accuracy up; the metrics file must be JSON lines with step, loss, val_loss,
# val_accuracy (a number in [0, 1] on every validation line, as printed), tokens_per_s,
# train_s and eval_s, the step-0 validation included, and examples/plot_loss.py must draw
# it with labelled axes (and an accuracy panel); a
# run stopped at step 6 must say so, and resumed from its checkpoint must log exactly the
# losses of an uninterrupted run; only the newest --keep_checkpoints checkpoints may stay,
# with the temporary folders of interrupted saves gone and nothing else touched; every bad
# flag value must fail with an error naming the flag; --ranks=2 and 3 (CPU threads) must
# give one rank's losses and resume exactly, and so must --ranks=1 --force_communicator (with and
# without --zero1: the data-parallel trainer over a 1-rank group); without --data, a data/fortunes
# folder above the binary is the corpus, and with none there nor Debian's, a clear error.
set -euo pipefail

TRAIN_LM=$1
# examples/plot_loss.py, when given (with //tools:svg_chart.py in the runfiles): the loss
# plot's axis labels are checked too.
PLOT_LOSS=${2:-}
WORK=${TEST_TMPDIR:-$(mktemp -d)}
fail() { echo "FAIL: $*" >&2; exit 1; }

# A corpus with structure to learn: repeated sentences with varying words.
CORPUS=${WORK}/corpus.txt
python3 - "${CORPUS}" <<'PY'
import random, sys
rng = random.Random(7)
subjects = ["the cat", "a dog", "my friend", "the old man", "a small bird", "the teacher"]
verbs = ["sees", "likes", "finds", "follows", "hears", "wants"]
objects = ["the ball", "a red apple", "the river", "a quiet house", "the moon", "a book"]
with open(sys.argv[1], "w") as out:
    for _ in range(6000):
        out.write(f"{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(objects)}.\n")
PY

MODEL=(--device=cpu --vocab=320 --layers=2 --heads=2 --width=32 --context=32 --batch=8
       --steps=12 --lr=3e-3 --warmup=2 --eval_interval=4 --eval_batches=2 --log_interval=4
       --sample_length=20 --seed=5)
COMMON=(--data="${CORPUS}" "${MODEL[@]}")
TOKENS_PER_STEP=$((8 * 32))

# 1. Uninterrupted run: the validation loss falls; the metrics hold the step-0 validation
#    and training-only tokens/s; the plot has axis labels.
"${TRAIN_LM}" "${COMMON[@]}" --metrics="${WORK}/straight.jsonl" > "${WORK}/straight.log" 2>&1 ||
  { cat "${WORK}/straight.log"; fail "train_lm exited non-zero"; }
grep -q "^done: 12 steps, $((12 * TOKENS_PER_STEP)) tokens in " "${WORK}/straight.log" ||
  { cat "${WORK}/straight.log"; fail "no summary of 12 steps"; }
grep -q -- "---- sample at step 12" "${WORK}/straight.log" || fail "no sample printed"
python3 - "${WORK}/straight.jsonl" "${WORK}/straight.log" "${TOKENS_PER_STEP}" <<'PY' ||
import json, re, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
log = open(sys.argv[2]).read()
tokens_per_step = int(sys.argv[3])
for r in rows:
    assert set(r) == {"step", "loss", "val_loss", "val_accuracy", "tokens_per_s", "train_s",
                      "eval_s"}, r
    # The accuracy is there exactly where the validation loss is, a number in [0, 1].
    if r["val_loss"] is None:
        assert r["val_accuracy"] is None, r
    else:
        a = r["val_accuracy"]
        assert isinstance(a, float) and 0 <= a <= 1, r
# The step-0 validation is the first line, as printed.
m = re.search(r"step 0: val loss ([0-9.]+), accuracy ([0-9.]+)%", log)
start, start_accuracy = float(m.group(1)), float(m.group(2)) / 100
first = rows[0]
assert first["step"] == 0 and first["loss"] is None and first["tokens_per_s"] is None, first
assert first["train_s"] is None and first["eval_s"] > 0, first
assert abs(first["val_loss"] - start) < 1e-4, (first, start)
assert abs(first["val_accuracy"] - start_accuracy) < 1e-4, (first, start_accuracy)
# Every progress line with a validation prints its accuracy beside its loss, as logged.
printed = [float(a) / 100 for a in re.findall(r"\| val [0-9.]+ acc +([0-9.]+)% \(eval", log)]
assert len(printed) == len(rows) - 1, (printed, rows)
for p, r in zip(printed, rows[1:]):
    assert abs(p - r["val_accuracy"]) <= 6e-5, (printed, rows)  # printed to 0.01%
# The summary names the last validation's accuracy and the step-0 one.
m = re.search(r"val accuracy ([0-9.]+)% \(from ([0-9.]+)%\)", log)
assert m, "no val accuracy in the summary"
assert abs(float(m.group(1)) / 100 - rows[-1]["val_accuracy"]) < 1e-4, (m.group(0), rows[-1])
assert abs(float(m.group(2)) / 100 - start_accuracy) < 1e-4, (m.group(0), start_accuracy)
# One line per progress line: steps 4, 8, 12, each with a validation.
assert [r["step"] for r in rows] == [0, 4, 8, 12], [r["step"] for r in rows]
previous = 0
for r in rows[1:]:
    assert r["val_loss"] is not None and r["eval_s"] > 0, r
    # tokens/s counts the interval's training time only.
    tokens = (r["step"] - previous) * tokens_per_step
    assert r["train_s"] > 0, r
    assert abs(r["tokens_per_s"] * r["train_s"] - tokens) <= 0.01 * tokens + 0.1, (r, tokens)
    previous = r["step"]
vals = [r["val_loss"] for r in rows]
print("val loss", start, "->", vals[-1])
assert vals[-1] < start - 0.5, (start, vals)
accuracies = [r["val_accuracy"] for r in rows]
print("val accuracy", accuracies[0], "->", accuracies[-1])
assert accuracies[-1] > accuracies[0] + 0.05, accuracies
PY
  fail "bad metrics"
if [[ -n "${PLOT_LOSS}" ]]; then
  python3 "${PLOT_LOSS}" "${WORK}/straight.jsonl" "${WORK}/loss.svg" || fail "plot_loss.py failed"
  grep -q 'rotate(-90.*>cross-entropy loss' "${WORK}/loss.svg" || fail "the plot has no y-axis label"
  grep -q '>optimizer step</text>' "${WORK}/loss.svg" || fail "the plot has no x-axis label"
  grep -q 'rotate(-90.*>accuracy (% of tokens)' "${WORK}/loss.svg" ||
    fail "the plot has no accuracy panel"
  # The step-0 validation is a point of the curve: its first polyline point is at x = 0.
  python3 - "${WORK}/loss.svg" <<'PY' || fail "the plot does not start at step 0"
import re, sys
svg = open(sys.argv[1]).read()
x0 = float(re.search(r'<line x1="([0-9.]+)" y1="[0-9.]+" x2="[0-9.]+" y2="[0-9.]+" stroke="#ddd"/>\s*<text[^>]*>0</text>', svg).group(1))
firsts = [float(p.split(",")[0]) for p in re.findall(r'<polyline points="([0-9.]+,[0-9.]+)', svg)]
assert x0 in firsts, (x0, firsts)
PY
fi

# 2. Stopped at step 6 with checkpoints every 2 steps, 2 kept, in a folder holding other
#    files and what an interrupted save left; then resumed: the same losses for steps 7-12.
CKPT=${WORK}/ckpt
mkdir -p "${CKPT}/step-00000001.tmp" "${CKPT}/step-old" "${CKPT}/step-00000003.bak"
echo "not ours" > "${CKPT}/README"
echo "not ours" > "${CKPT}/step-old/keep"
echo "half" > "${CKPT}/step-00000001.tmp/model.safetensors"
"${TRAIN_LM}" "${COMMON[@]}" --stop_at_step=6 --checkpoint_dir="${CKPT}" --checkpoint_interval=2 \
  --keep_checkpoints=2 --metrics="${WORK}/resumed.jsonl" > "${WORK}/first.log" 2>&1 ||
  { cat "${WORK}/first.log"; fail "first half failed"; }
grep -q "^done: 6 steps (1-6 of 12), $((6 * TOKENS_PER_STEP)) tokens in " "${WORK}/first.log" ||
  { cat "${WORK}/first.log"; fail "the stopped run does not report 6 steps"; }
grep -q -- "---- sample at step 6 " "${WORK}/first.log" || fail "no sample at step 6"
! grep -q "sample at step 12" "${WORK}/first.log" || fail "the stopped run claims step 12"
[[ -f "${CKPT}/step-00000006/model.safetensors" ]] || fail "no model.safetensors"
[[ -f "${CKPT}/step-00000006/tokenizer.txt" ]] || fail "no tokenizer saved"
listing() { (cd "$1" && ls -A | sort | tr '\n' ' '); }
want="README latest step-00000003.bak step-00000004 step-00000006 step-old "
[[ "$(listing "${CKPT}")" == "${want}" ]] ||
  fail "after --keep_checkpoints=2: '$(listing "${CKPT}")', want '${want}'"
[[ -f "${CKPT}/step-old/keep" ]] || fail "a folder that is not ours lost its file"
"${TRAIN_LM}" "${COMMON[@]}" --resume --checkpoint_dir="${CKPT}" \
  --metrics="${WORK}/resumed.jsonl" > "${WORK}/second.log" 2>&1 ||
  { cat "${WORK}/second.log"; fail "resumed half failed"; }
grep -q "resumed from" "${WORK}/second.log" || fail "did not resume"
grep -q "^done: 6 steps (7-12 of 12), $((6 * TOKENS_PER_STEP)) tokens in " "${WORK}/second.log" ||
  { cat "${WORK}/second.log"; fail "the resumed run does not report steps 7-12"; }
# The default keeps 3.
want="README latest step-00000003.bak step-00000004 step-00000006 step-00000012 step-old "
[[ "$(listing "${CKPT}")" == "${want}" ]] ||
  fail "after the default --keep_checkpoints: '$(listing "${CKPT}")', want '${want}'"
python3 - "${WORK}/straight.jsonl" "${WORK}/resumed.jsonl" <<'PY' || fail "resume is not exact"
import json, sys
a = {r["step"]: r for r in map(json.loads, open(sys.argv[1]))}
b = {r["step"]: r for r in map(json.loads, open(sys.argv[2]))}
assert set(a) <= set(b), (sorted(a), sorted(b))
for step, row in a.items():
    assert row["loss"] == b[step]["loss"], (step, row, b[step])
    assert row["val_loss"] == b[step]["val_loss"], (step, row, b[step])
    assert row["val_accuracy"] == b[step]["val_accuracy"], (step, row, b[step])
print("resumed losses equal the uninterrupted run's at steps", sorted(a))
PY
# Nothing left to train from the checkpoint at step 12.
for bad in --steps=12 --stop_at_step=6; do
  if "${TRAIN_LM}" "${COMMON[@]}" --resume --checkpoint_dir="${CKPT}" "${bad}" > "${WORK}/bad.log" 2>&1; then
    fail "resuming at step 12 with ${bad} was accepted"
  fi
  grep -qF -- "INVALID_ARGUMENT: ${bad} is invalid" "${WORK}/bad.log" || { cat "${WORK}/bad.log"; fail "unclear error for ${bad}"; }
done

# 2b. Data-parallel ranks in one process (--ranks=N, CPU threads): on one global batch of 12
#     rows, 2 and 3 ranks log the per-step training and validation losses of 1 rank (to a
#     relative 1e-4; the gradient sums differ in rounding only), rank 0 alone writes the
#     metrics and reports tokens/s per rank; stopped at step 3 and resumed from rank 0's
#     checkpoint with the same ranks, the losses are exactly those of the uninterrupted run.
DP=(--data="${CORPUS}" "${MODEL[@]}" --batch=12 --steps=6 --log_interval=1 --eval_interval=3
    --sample_length=0)
for n in 1 2 3; do
  "${TRAIN_LM}" "${DP[@]}" --ranks="${n}" --metrics="${WORK}/dp${n}.jsonl" > "${WORK}/dp${n}.log" 2>&1 ||
    { cat "${WORK}/dp${n}.log"; fail "--ranks=${n} failed"; }
done
for n in 2 3; do
  grep -q "x ${n} data-parallel ranks (CPU threads)" "${WORK}/dp${n}.log" ||
    { cat "${WORK}/dp${n}.log"; fail "--ranks=${n}: the model line does not name the ranks"; }
  grep -q "K tok/s (.*K/rank)" "${WORK}/dp${n}.log" || fail "--ranks=${n}: no tokens/s per rank"
  grep -q "^done: 6 steps, $((6 * 12 * 32)) tokens in .*K per rank of ${n};" "${WORK}/dp${n}.log" ||
    { cat "${WORK}/dp${n}.log"; fail "--ranks=${n}: no summary with tokens/s per rank"; }
  [[ $(grep -c "^step     1/6" "${WORK}/dp${n}.log") == 1 ]] || fail "--ranks=${n}: more than rank 0 prints"
done
python3 - "${WORK}/dp1.jsonl" "${WORK}/dp2.jsonl" "${WORK}/dp3.jsonl" <<'PY' || fail "the ranks' losses differ from one rank's"
import json, sys
runs = [[json.loads(l) for l in open(path)] for path in sys.argv[1:]]
one = runs[0]
assert [r["step"] for r in one] == list(range(7)), [r["step"] for r in one]
for path, rows in zip(sys.argv[2:], runs[1:]):
    # Rank 0 alone writes: one line per step, as with one rank.
    assert [r["step"] for r in rows] == [r["step"] for r in one], (path, rows)
    for a, b in zip(one, rows):
        for key in ("loss", "val_loss"):
            assert (a[key] is None) == (b[key] is None), (path, key, a, b)
            if a[key] is not None:
                assert abs(a[key] - b[key]) <= 1e-4 * abs(a[key]), (path, key, a, b)
        # The same predictions but for near ties that the gradients' rounding may flip.
        assert (a["val_accuracy"] is None) == (b["val_accuracy"] is None), (path, a, b)
        if a["val_accuracy"] is not None:
            assert abs(a["val_accuracy"] - b["val_accuracy"]) <= 0.01, (path, a, b)
print("--ranks=2 and 3 match --ranks=1 at steps", [r["step"] for r in one])
PY
# --force_communicator: one rank through the data-parallel path (a 1-rank in-process group,
# its all-reduces in buckets; --zero1 with 1-element buckets: the sharded AdamW too) logs
# exactly the plain --ranks=1 losses, and the model line says a communicator is used.
FORCED=("--force_communicator" "--force_communicator --zero1 --bucket_mib=0.000004")
for i in 0 1; do
  read -ra flags <<<"${FORCED[i]}"
  "${TRAIN_LM}" "${DP[@]}" --ranks=1 "${flags[@]}" --metrics="${WORK}/forced${i}.jsonl" \
    > "${WORK}/forced${i}.log" 2>&1 || { cat "${WORK}/forced${i}.log"; fail "${FORCED[i]} failed"; }
  grep -q "x 1 data-parallel rank (CPU threads, 1-rank communicator forced" "${WORK}/forced${i}.log" ||
    { cat "${WORK}/forced${i}.log"; fail "${FORCED[i]}: the model line names no communicator"; }
done
grep -q "communicator forced, ZeRO-1)" "${WORK}/forced1.log" || fail "--zero1: the model line omits ZeRO-1"
! grep -q "data-parallel rank" "${WORK}/dp1.log" || fail "plain --ranks=1 claims a communicator"
python3 - "${WORK}/dp1.jsonl" "${WORK}/forced0.jsonl" "${WORK}/forced1.jsonl" <<'PY' ||
import json, sys
one, *forced = [[json.loads(l) for l in open(path)] for path in sys.argv[1:]]
for path, rows in zip(sys.argv[2:], forced):
    assert [r["step"] for r in rows] == [r["step"] for r in one], (path, rows)
    for a, b in zip(one, rows):
        for key in ("loss", "val_loss", "val_accuracy"):  # the same bits, as written
            assert a[key] == b[key], (path, key, a, b)
print("--ranks=1 --force_communicator (and --zero1) equals --ranks=1")
PY
  fail "--force_communicator differs from --ranks=1"
DPCKPT=${WORK}/dp_ckpt
"${TRAIN_LM}" "${DP[@]}" --ranks=2 --stop_at_step=3 --checkpoint_dir="${DPCKPT}" \
  --metrics="${WORK}/dp_resumed.jsonl" > "${WORK}/dp_first.log" 2>&1 ||
  { cat "${WORK}/dp_first.log"; fail "--ranks=2 first half failed"; }
[[ "$(listing "${DPCKPT}")" == "latest step-00000003 " ]] ||
  fail "--ranks=2 checkpoints: '$(listing "${DPCKPT}")'"
"${TRAIN_LM}" "${DP[@]}" --ranks=2 --resume --checkpoint_dir="${DPCKPT}" \
  --metrics="${WORK}/dp_resumed.jsonl" > "${WORK}/dp_second.log" 2>&1 ||
  { cat "${WORK}/dp_second.log"; fail "--ranks=2 resumed half failed"; }
python3 - "${WORK}/dp2.jsonl" "${WORK}/dp_resumed.jsonl" <<'PY' || fail "--ranks=2 resume is not exact"
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert [r["step"] for r in a] == [r["step"] for r in b], (a, b)
for x, y in zip(a, b):
    assert x["loss"] == y["loss"] and x["val_loss"] == y["val_loss"], (x, y)
    assert x["val_accuracy"] == y["val_accuracy"], (x, y)
print("--ranks=2 resumed at step 3 equals the uninterrupted run")
PY

# 2c. Several processes (--rank/--world_size/--coordinator, CPU: TCP between processes): two
#     processes log the losses of --ranks=2 exactly (the same sums in the same order);
#     --zero1 and 1-element buckets stay within rounding of it; a checkpoint of the two
#     processes resumes on --ranks=3 --zero1 with the uninterrupted losses (to 1e-4); a rank
#     alone (its peer never starts) fails with DEADLINE_EXCEEDED within --rank_timeout_s.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
PORT=$(free_port)
MPCKPT=${WORK}/mp_ckpt
for r in 0 1; do
  "${TRAIN_LM}" "${DP[@]}" --world_size=2 --rank="${r}" --coordinator="127.0.0.1:${PORT}" \
    --rank_timeout_s=60 --stop_at_step=3 --checkpoint_dir="${MPCKPT}" \
    --metrics="${WORK}/mp${r}.jsonl" > "${WORK}/mp${r}.log" 2>&1 &
done
wait %1 || { cat "${WORK}/mp0.log"; fail "--world_size=2 rank 0 failed"; }
wait %2 || { cat "${WORK}/mp1.log"; fail "--world_size=2 rank 1 failed"; }
grep -q "x 2 data-parallel ranks (CPU processes over TCP)" "${WORK}/mp0.log" ||
  { cat "${WORK}/mp0.log"; fail "--world_size=2: the model line does not name the processes"; }
[[ ! -s "${WORK}/mp1.jsonl" ]] || fail "--world_size=2: rank 1 wrote metrics"
[[ "$(listing "${MPCKPT}")" == "latest step-00000003 " ]] ||
  fail "--world_size=2 checkpoints: '$(listing "${MPCKPT}")'"
"${TRAIN_LM}" "${DP[@]}" --ranks=2 --zero1 --bucket_mib=0.000004 \
  --metrics="${WORK}/zero.jsonl" > "${WORK}/zero.log" 2>&1 ||
  { cat "${WORK}/zero.log"; fail "--ranks=2 --zero1 failed"; }
"${TRAIN_LM}" "${DP[@]}" --ranks=3 --zero1 --resume --checkpoint_dir="${MPCKPT}" \
  --metrics="${WORK}/mp0.jsonl" > "${WORK}/mp_resumed.log" 2>&1 ||
  { cat "${WORK}/mp_resumed.log"; fail "--ranks=3 resuming the processes' checkpoint failed"; }
python3 - "${WORK}/dp2.jsonl" "${WORK}/mp0.jsonl" "${WORK}/zero.jsonl" <<'PY' || fail "several processes differ from --ranks=2"
import json, sys
dp, mp, zero = [[json.loads(l) for l in open(path)] for path in sys.argv[1:]]
assert [r["step"] for r in mp] == [r["step"] for r in dp], (mp, dp)
for a, b, c in zip(dp, mp, zero):
    for key in ("loss", "val_loss"):
        if a["step"] <= 3:  # the two processes: the same bits
            assert a[key] == b[key], (key, a, b)
        elif a[key] is not None:  # resumed on 3 ranks with ZeRO-1
            assert abs(a[key] - b[key]) <= 1e-4 * abs(a[key]), (key, a, b)
        if a[key] is not None:
            assert abs(a[key] - c[key]) <= 1e-4 * abs(a[key]), (key, a, c)
print("--world_size=2 equals --ranks=2; --zero1 and a resume on 3 ranks match it")
PY
START=$(date +%s)
if "${TRAIN_LM}" "${DP[@]}" --world_size=2 --rank=0 --coordinator="127.0.0.1:$(free_port)" \
    --rank_timeout_s=2 > "${WORK}/alone.log" 2>&1; then
  fail "a rank without its peer succeeded"
fi
(( $(date +%s) - START < 30 )) || fail "a rank without its peer took too long to fail"
grep -q "DEADLINE_EXCEEDED.*rank(s) 1 of 2 did not join" "${WORK}/alone.log" ||
  { cat "${WORK}/alone.log"; fail "a rank without its peer: unclear error"; }

# 3. Bad input: a clear error naming the flag and its value, exit status 1 (no crash), and
#    nothing written. Each case: the flags as given, then what the message must hold.
if "${TRAIN_LM}" --data="${WORK}/missing" --device=cpu > "${WORK}/bad.log" 2>&1; then
  fail "a missing corpus was accepted"
fi
grep -q "train_lm: NOT_FOUND" "${WORK}/bad.log" || { cat "${WORK}/bad.log"; fail "unclear error"; }
BAD_FLAGS=(
  "--lr=-1|--lr=-1 is invalid: want 0 (the device default) or a finite number in (0, 1]"
  "--lr=nan|--lr=nan is invalid" "--lr=inf|--lr=inf is invalid" "--lr=2|--lr=2 is invalid"
  "--steps=-5|--steps=-5 is invalid: want 0 (the device default) or an integer in [1, "
  "--norm=bogus|--norm='bogus' is invalid: want one of layernorm, rmsnorm"
  "--mlp=swigl|--mlp='swigl' is invalid: want one of gelu, swiglu"
  "--attention=bogus|--attention='bogus' is invalid: want one of auto, flash, cudnn, cublas"
  "--head=fast|--head='fast' is invalid" "--dtype=f16|--dtype='f16' is invalid"
  "--lce_operand_dtype_logits|--lce_operand_dtype_logits=true is invalid: want false with --dtype=f32"
  "--lce_operand_dtype_logits --dtype=bf16 --head=unfused|--lce_operand_dtype_logits=true is invalid: want false with --head=unfused"
  "--device=gpu|--device='gpu' is invalid" "--device=cuda:-1|--device='cuda:-1' is invalid"
  "--tokenizer=|--tokenizer='' is invalid" "--vocab=100|--vocab=100 is invalid"
  "--layers=-2|--layers=-2 is invalid" "--heads=-1|--heads=-1 is invalid"
  "--heads=3|--heads=3 is invalid: want a divisor of --width = 32"
  "--width=-32|--width=-32 is invalid" "--context=-1|--context=-1 is invalid"
  "--context=2000000|--context=2000000 is invalid" "--batch=-8|--batch=-8 is invalid"
  "--micro_batches=0|--micro_batches=0 is invalid: want an integer in [1, 65536]"
  "--min_lr_ratio=1.5|--min_lr_ratio=1.5 is invalid" "--min_lr_ratio=nan|--min_lr_ratio=nan is invalid"
  "--warmup=13|--warmup=13 is invalid: want -1 (5% of the steps) or an integer in [0, --steps = 12]"
  "--warmup=-2|--warmup=-2 is invalid" "--weight_decay=-0.1|--weight_decay=-0.1 is invalid"
  "--weight_decay=inf|--weight_decay=inf is invalid" "--grad_clip=-1|--grad_clip=-1 is invalid"
  "--grad_clip=nan|--grad_clip=nan is invalid" "--val_fraction=1|--val_fraction=1 is invalid"
  "--val_fraction=-0.1|--val_fraction=-0.1 is invalid"
  "--eval_interval=-1|--eval_interval=-1 is invalid" "--eval_batches=0|--eval_batches=0 is invalid"
  "--log_interval=-4|--log_interval=-4 is invalid"
  "--checkpoint_interval=-1|--checkpoint_interval=-1 is invalid"
  "--keep_checkpoints=-1|--keep_checkpoints=-1 is invalid: want 0 (keep all) or an integer in [1, "
  "--stop_at_step=13|--stop_at_step=13 is invalid: want 0 (run all --steps) or an integer in [1, --steps = 12]"
  "--stop_at_step=-1|--stop_at_step=-1 is invalid" "--sample_length=-1|--sample_length=-1 is invalid"
  "--sample_interval=-1|--sample_interval=-1 is invalid"
  "--temperature=-0.5|--temperature=-0.5 is invalid" "--temperature=nan|--temperature=nan is invalid"
  "--top_k=-1|--top_k=-1 is invalid"
  "--batch=65536 --micro_batches=65536|--batch=65536 x --context=32 x --micro_batches=65536 = 137438953472 tokens per step is invalid: want at most 2147483647"
  "--resume|--resume needs --checkpoint_dir"
  "--ranks=0|--ranks=0 is invalid: want an integer in [1, 1024]"
  "--ranks=1025|--ranks=1025 is invalid: want an integer in [1, 1024]"
  "--ranks=3|--batch=8 is invalid: want a multiple of --ranks = 3"
  "--gpus=-1|--gpus=-1 is invalid: want 0 (use --ranks) or an integer in [1, 1024]"
  "--gpus=2|--gpus=2 is invalid: want 0 with --device=cpu (use --ranks)"
  "--gpus=2 --ranks=4|--gpus=2 is invalid: want 0 or --ranks = 4"
  "--ranks=2 --force_communicator|--force_communicator=true is invalid: want false with --ranks = 2 (more than one rank always has a communicator)"
  "--world_size=2 --coordinator=127.0.0.1:1 --force_communicator|--force_communicator=true is invalid: want false with --world_size = 2"
)
for case in "${BAD_FLAGS[@]}"; do
  flag=${case%%|*}
  message=${case#*|}
  read -ra flags <<<"${flag}"
  rc=0
  "${TRAIN_LM}" "${COMMON[@]}" "${flags[@]}" --metrics="${WORK}/bad.jsonl" > "${WORK}/bad.log" 2>&1 || rc=$?
  [[ ${rc} == 1 ]] || { cat "${WORK}/bad.log"; fail "${flag}: exit status ${rc}, want 1"; }
  grep -qF -- "train_lm: INVALID_ARGUMENT: ${message}" "${WORK}/bad.log" ||
    { cat "${WORK}/bad.log"; fail "${flag}: the error does not say '${message}'"; }
  [[ ! -e "${WORK}/bad.jsonl" ]] || fail "${flag}: a metrics file was written"
done
echo "${#BAD_FLAGS[@]} bad flag values refused"

# 4. No --data: the data/fortunes folder above a copy of the binary (as tools/stage_gpu.sh
#    stages it) is the corpus, and the program says so.
STAGE=${WORK}/stage
mkdir -p "${STAGE}/examples" "${STAGE}/data/fortunes"
cp "${TRAIN_LM}" "${STAGE}/examples/train_lm"
head -n 1500 "${CORPUS}" > "${STAGE}/data/fortunes/sentences"
"${STAGE}/examples/train_lm" "${MODEL[@]}" --steps=2 --sample_length=0 > "${WORK}/default.log" 2>&1 ||
  { cat "${WORK}/default.log"; fail "the run on the staged default corpus failed"; }
grep -qF "data: $(cd "${STAGE}" && pwd -P)/data/fortunes (the default corpus, staged with the binary)" \
  "${WORK}/default.log" || { cat "${WORK}/default.log"; fail "the staged default corpus was not used"; }

# 5. No corpus anywhere: a clear NOT_FOUND naming both places. Hiding Debian's corpus takes a
#    private mount namespace; where user namespaces or mounts are not allowed, this part is
#    skipped (and says so).
rm -r "${STAGE}/data"
rc=99
: > "${WORK}/none.log"
if command -v unshare > /dev/null; then
  rc=0
  unshare -rm bash -c 'mount -t tmpfs none /usr/share/games 2>/dev/null || exit 99; exec "$@"' \
    _ "${STAGE}/examples/train_lm" "${MODEL[@]}" > "${WORK}/none.log" 2>&1 || rc=$?
fi
if [[ ${rc} == 99 ]] || grep -q "^unshare: " "${WORK}/none.log"; then
  echo "skipped the no-corpus case: cannot hide /usr/share/games here"
else
  [[ ${rc} == 1 ]] || { cat "${WORK}/none.log"; fail "no corpus: exit status ${rc}, want 1"; }
  grep -qF "train_lm: NOT_FOUND: no default corpus: neither a data/fortunes folder in $(cd "${STAGE}" && pwd -P)/examples or a folder above it" \
    "${WORK}/none.log" || { cat "${WORK}/none.log"; fail "unclear error without a corpus"; }
  grep -qF "/usr/share/games/fortunes" "${WORK}/none.log" || fail "the error does not name Debian's corpus"
fi
echo "PASS"
