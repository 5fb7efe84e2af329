#!/usr/bin/env bash
# End-to-end test of examples/train_lm on the CPU: a tiny model on a small generated corpus
# (byte-level BPE trained by the program) must bring the validation loss down; a run stopped
# at step 6 and resumed from its checkpoint must log exactly the losses of an uninterrupted
# run; the metrics file must be JSON lines with step, loss, val_loss and tokens_per_s; bad
# input must fail with a clear message.
set -euo pipefail

TRAIN_LM=$1
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

COMMON=(--data="${CORPUS}" --device=cpu --vocab=320 --layers=2 --heads=2 --width=32
        --context=32 --batch=8 --steps=12 --lr=3e-3 --warmup=2 --eval_interval=4
        --eval_batches=2 --log_interval=4 --sample_length=20 --seed=5)

# 1. Uninterrupted run: the validation loss falls.
"${TRAIN_LM}" "${COMMON[@]}" --metrics="${WORK}/straight.jsonl" > "${WORK}/straight.log" 2>&1 ||
  { cat "${WORK}/straight.log"; fail "train_lm exited non-zero"; }
grep -q "^done: 12 steps" "${WORK}/straight.log" || { cat "${WORK}/straight.log"; fail "no summary"; }
grep -q -- "---- sample at step 12" "${WORK}/straight.log" || fail "no sample printed"
python3 - "${WORK}/straight.jsonl" "${WORK}/straight.log" <<'PY' || fail "loss did not fall"
import json, re, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
for r in rows:
    assert set(r) == {"step", "loss", "val_loss", "tokens_per_s"}, r
vals = [r["val_loss"] for r in rows if r["val_loss"] is not None]
start = float(re.search(r"step 0: val loss ([0-9.]+)", open(sys.argv[2]).read()).group(1))
print("val loss", start, "->", vals[-1])
assert vals[-1] < start - 0.5, (start, vals)
PY

# 2. Stopped at step 6 with a checkpoint, then resumed: the same losses for steps 7-12.
"${TRAIN_LM}" "${COMMON[@]}" --stop_at_step=6 --checkpoint_dir="${WORK}/ckpt" \
  --metrics="${WORK}/resumed.jsonl" > "${WORK}/first.log" 2>&1 ||
  { cat "${WORK}/first.log"; fail "first half failed"; }
[[ -f "${WORK}/ckpt/latest" ]] || fail "no checkpoint written"
[[ -f "${WORK}/ckpt/step-00000006/model.safetensors" ]] || fail "no model.safetensors"
[[ -f "${WORK}/ckpt/step-00000006/tokenizer.txt" ]] || fail "no tokenizer saved"
"${TRAIN_LM}" "${COMMON[@]}" --resume --checkpoint_dir="${WORK}/ckpt" \
  --metrics="${WORK}/resumed.jsonl" > "${WORK}/second.log" 2>&1 ||
  { cat "${WORK}/second.log"; fail "resumed half failed"; }
grep -q "resumed from" "${WORK}/second.log" || fail "did not resume"
python3 - "${WORK}/straight.jsonl" "${WORK}/resumed.jsonl" <<'PY' || fail "resume is not exact"
import json, sys
a = {r["step"]: r for r in map(json.loads, open(sys.argv[1]))}
b = {r["step"]: r for r in map(json.loads, open(sys.argv[2]))}
assert set(a) <= set(b), (sorted(a), sorted(b))
for step, row in a.items():
    assert row["loss"] == b[step]["loss"], (step, row, b[step])
    if row["val_loss"] is not None:
        assert row["val_loss"] == b[step]["val_loss"], (step, row, b[step])
print("resumed losses equal the uninterrupted run's at steps", sorted(a))
PY

# 3. Bad input: a clear error, no crash.
if "${TRAIN_LM}" --data="${WORK}/missing" --device=cpu > "${WORK}/bad.log" 2>&1; then
  fail "a missing corpus was accepted"
fi
grep -q "train_lm: NOT_FOUND" "${WORK}/bad.log" || { cat "${WORK}/bad.log"; fail "unclear error"; }
if "${TRAIN_LM}" "${COMMON[@]}" --heads=3 > "${WORK}/bad2.log" 2>&1; then
  fail "3 heads for width 32 were accepted"
fi
grep -q "INVALID_ARGUMENT" "${WORK}/bad2.log" || { cat "${WORK}/bad2.log"; fail "unclear error"; }
echo "PASS"
