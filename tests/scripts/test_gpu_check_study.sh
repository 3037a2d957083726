#!/usr/bin/env bash
# The study stage of tools/gpu_check.sh (tools/gpu_check_study.sh) without a GPU: the real
# `study` and `prepare_data`, a stand-in `train` (it writes what a run writes, in a few
# lines, and takes SIGTERM as train does: a checkpoint line, exit 143), gpu_check's helpers
# reduced to what the stage uses. Checks: the carried corpus is unpacked and tokenized with
# the carried tokenizer, the seed reaches every run, the three runs start together (jobs: 3),
# the deadline stops them with their checkpoint line, the archive holds the runs' logs and
# CSVs and no checkpoint, and the summary names each run's last step.
#   test_gpu_check_study.sh SOURCE_DIR BIN_DIR SCRATCH
set -euo pipefail
SRC="$1" REAL_BIN="$2" W="$3"
rm -rf "$W"
mkdir -p "$W/root/data_cache/corpus" "$W/bin" "$W/out" "$W/work"
fail() { echo "test_gpu_check_study: FAILED: $*" >&2; exit 1; }

# A corpus and its tokenizer where apps/corpus_linux.sh puts them.
for i in $(seq 1 300); do printf 'static int f%d(void) { return %d; }\n\n\n' "$i" "$i"; done >"$W/text.txt"
xz -c "$W/text.txt" >"$W/root/data_cache/corpus/linux.txt.xz"
cp -r "$SRC/../shared/data/gpt2-tokenizer" "$W/root/data_cache/corpus/gpt2-tokenizer"
ln -s "$SRC/configs" "$W/root/configs"
ln -s "$SRC/tools" "$W/root/tools"
ln -s "$SRC/apps" "$W/root/apps"

ln -s "$REAL_BIN/study" "$W/bin/study"
ln -s "$REAL_BIN/prepare_data" "$W/bin/prepare_data"
cat >"$W/bin/train" <<'EOF'
#!/usr/bin/env bash
# Stand-in for train: run.out_dir, run.seed, train.max_steps from --set; a step every 0.1 s.
dir="" seed="" max=""
while (($#)); do
  case "$1" in
    --set) case "$2" in run.out_dir=*) dir="${2#*=}";; run.seed=*) seed="${2#*=}";; train.max_steps=*) max="${2#*=}";; esac; shift 2;;
    *) shift;;
  esac
done
mkdir -p "$dir"
echo "seed: $seed" >"$dir/config.yaml"
echo "started $(date +%s%N)" >"$dir/train.log"
echo "step,layer,sigma" >"$dir/spectral.csv"
stop=0
trap 'stop=1' TERM
s=0
while ((s < max && !stop)); do
  s=$((s + 1))
  echo "{\"step\":$s,\"loss\":1.0}" >>"$dir/metrics.jsonl"
  sleep 0.1
done
: >"$dir/ckpt_$(printf %08d "$s").bin"
echo "{\"step\":$s,\"checkpoint\":\"ckpt_$(printf %08d "$s").bin\",\"weights_sha256\":\"00\"}" >>"$dir/metrics.jsonl"
((stop)) && exit 143
exit 0
EOF
chmod +x "$W/bin/train"

# gpu_check.sh's helpers, as the stage uses them.
OUT="$W/out" BIN="$W/bin" WORK="$W/work" LOG="$W/out/gpu_check.log"
STAGE_END=0
begin_stage() { STAGE_END=$(($(date +%s) + $1)); }
left() { echo $((STAGE_END - $(date +%s))); }
within() { local cap="$1"; shift; timeout "$cap" "$@"; }
out_of_time_note() { if [[ "$1" == 124 ]]; then echo " (out of time)"; fi; }
logged() { shift; echo "\$ $*" >>"$LOG"; "$@" >>"$LOG" 2>&1; }
say() { echo "[stage] $*" >>"$LOG"; }

cd "$W/root"
# shellcheck source=tools/gpu_check_study.sh
source tools/gpu_check_study.sh
# 52 - 45: the runs get 7 s of their 2400 steps (the stage's floor lowered from 60 s)
export GPU_CHECK_STUDY_SEED=7 GPU_CHECK_STUDY_S=52 GPU_CHECK_STUDY_MIN_S=5
run_study_stage
echo "STUDY: $STUDY"
((STUDY_OK == 1)) || fail "the stage failed: $STUDY; $(tail -20 "$LOG")"
[[ "$STUDY" == *"(study exit status 124 (out of time))"* ]] || fail "the deadline did not stop the study: $STUDY"
compgen -G "data_cache/corpus_linux/linux_train_*.bin" >/dev/null || fail "no token shards"
grep -q "tokenizer gpt2\|gpt2" "$LOG" || fail "prepare_data did not run with the GPT-2 tokenizer"
runs="runs/gpt2_small_one_call_seed-7"
starts=()
for r in baseline flash stabilized_flash; do
  grep -q "^seed: 7$" "$runs/$r/config.yaml" || fail "$r did not get run.seed 7"
  last="$(grep -o '"step":[0-9]*' "$runs/$r/metrics.jsonl" | tail -1 | cut -d: -f2)"
  ((last > 5 && last < 2400)) || fail "$r: last step $last (expected stopped by the deadline)"
  grep -q '"checkpoint"' "$runs/$r/metrics.jsonl" || fail "$r: no checkpoint line after SIGTERM"
  [[ "$STUDY" == *"$r $last;"* ]] || fail "the summary does not name $r's last step $last: $STUDY"
  starts+=("$(awk '{print $2}' "$runs/$r/train.log")")
done
# jobs: 3 -- the three started within 2 s of each other (one at a time: 7 s apart at least).
spread=$(( (${starts[2]} - ${starts[0]}) / 1000000 ))
((spread < 2000)) || fail "the runs did not start together (${spread} ms apart)"
tar -tzf "$OUT/study_seed-7.tar.gz" >"$W/list.txt"
for f in study.yaml baseline/metrics.jsonl flash/train.log stabilized_flash/spectral.csv; do
  grep -qx "gpt2_small_one_call_seed-7/$f" "$W/list.txt" || fail "the archive lacks $f: $(cat "$W/list.txt")"
done
! grep -q '\.bin$' "$W/list.txt" || fail "the archive holds a checkpoint"
echo "test_gpu_check_study: passed (runs stopped at: ${STUDY#*last logged step: })"
