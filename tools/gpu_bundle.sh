#!/usr/bin/env bash
# The prebuilt bundle for the offline GPU machine: builds the GPU programs HERE and packs
# them, with every non-CUDA library they load, into .gpu_bundle/stabletrain-gpu.tar.xz
# (git-ignored; carry ".gpu_bundle" in the device call: README, "Training on a GPU").
#   stabletrain-gpu/bin/              train, bench, bench_gpu, prepare_data, compare and the
#                                     gpu test programs (RPATH $ORIGIN/../lib)
#   stabletrain-gpu/lib/              yaml-cpp, spdlog, fmt, OpenBLAS (OpenMP), libgfortran,
#                                     libgomp, libcrypto, libstdc++, ... (not glibc)
#   stabletrain-gpu/gpu_programs.txt  the programs gpu_check.sh runs
#   stabletrain-gpu/MANIFEST          commit, sources hash, toolchain, glibc needed, sha256s
# cuBLAS(Lt), NCCL and the driver are not packed: gpu_check.sh takes them from the GPU
# machine's CUDA toolkit or PyTorch's nvidia wheels. gpu_check.sh uses the bundle only when
# its sources hash equals the tree's (rebuild it after changing any C++, CUDA or CMake file).
#
# The build is tools/gpu_check.sh's build stage — the configuration a build on the GPU
# machine gets (sm_90, no -march=native, no MPI) — into build-bundle/. The archive is then
# checked: unpacked into a fresh folder, every program must find every library but the CUDA
# ones in lib/ (ldd, LD_LIBRARY_PATH cleared), and `train --device cpu` from it must run the
# tiny config (20 steps, finite and falling loss). Also makes data_cache/tiny_shakespeare,
# the token shards the train stage needs (carry it too).
#
# Usage: bash tools/gpu_bundle.sh [--build-dir DIR] [--no-check]
# Measured on 2 cores from a clean clone: 6 min 41 s (the build 289 s); about 2 minutes when
# the build is up to date (packing and the check).
# One { } block: bash reads it whole before running it, so editing this file while it runs
# (a long build) cannot change what runs.
{
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$(pwd)"
BUILD=build-bundle
CHECK=1
while (($#)); do
  case "$1" in
    --build-dir) BUILD="$2"; shift 2 ;;
    --no-check) CHECK=0; shift ;;
    *) echo "gpu_bundle: unknown argument '$1' (see the header of $0)" >&2; exit 2 ;;
  esac
done
say() { echo "[gpu_bundle] $*" >&2; }
die() { say "FAILED: $*"; exit 1; }
trap 'say "FAILED at line $LINENO: $BASH_COMMAND"' ERR
# shellcheck source=tools/gpu_lib.sh
source tools/gpu_lib.sh
DEST=.gpu_bundle
ARCHIVE="$DEST/stabletrain-gpu.tar.xz"
WORK="$(mktemp -d /tmp/stabletrain_bundle.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT

# ---- 1. the build (tools/gpu_check.sh's build stage) ------------------------------------
say "building the GPU programs into $BUILD (tools/gpu_check.sh, stage build)"
OUT="$WORK/check_out" GPU_CHECK_STAGES=build GPU_CHECK_BUNDLE=off GPU_CHECK_BUILD_DIR="$BUILD" \
  GPU_CHECK_BUDGET_S="${GPU_BUNDLE_BUDGET_S:-3600}" bash tools/gpu_check.sh >&2 ||
  die "the build stage failed (its log: rerun with OUT=dir GPU_CHECK_STAGES=build bash tools/gpu_check.sh)"
[[ -f "$BUILD/gpu_programs.txt" ]] || die "$BUILD/gpu_programs.txt missing"
mapfile -t programs < <(grep . "$BUILD/gpu_programs.txt")
# The libraries as the build found them (the carried packages' prefix, when it used one).
if [[ -f "$BUILD/stabletrain_env.sh" ]]; then
  # shellcheck disable=SC1090
  source "$BUILD/stabletrain_env.sh"
fi

# ---- 2. bin/, lib/, MANIFEST ------------------------------------------------------------
STAGE="$WORK/stabletrain-gpu"
mkdir -p "$STAGE/bin" "$STAGE/lib"
for p in "${programs[@]}"; do
  cp "$BUILD/bin/$p" "$STAGE/bin/"
  strip --strip-unneeded "$STAGE/bin/$p" 2>/dev/null || true
done
cp "$BUILD/gpu_programs.txt" "$STAGE/"
# The OpenMP OpenBLAS the build linked (the loader's default libopenblas.so.0 may be another).
blas="$(awk -F= '/^ST_BLAS_LIBRARY:/ { print $2 }' "$BUILD/CMakeCache.txt")"
blas_dir="$(dirname "$(readlink -f "${blas:-/nonexistent}")")"
# Every library the programs load, once: "soname path" (path "not" when the loader cannot find it).
needed="$(for p in "${programs[@]}"; do ldd "$BUILD/bin/$p"; done | awk '$2 == "=>" { print $1, $3 }' |
  sort -u -k1,1)"
copied=()
cuda_needed=""
while read -r name path; do
  is_glibc_lib "$name" && continue
  if is_cuda_lib "$name"; then cuda_needed+="$name "; continue; fi
  [[ "$path" == "not" ]] && die "$name not found by the loader here: cannot pack it"
  if [[ "$name" == libopenblas.so.0 && -e "$blas_dir/libopenblas.so.0" ]]; then
    path="$blas_dir/libopenblas.so.0"
  fi
  cp -L "$path" "$STAGE/lib/$name"
  copied+=("$name")
done <<<"$needed"
arch="$(awk -F= '/^CMAKE_CUDA_ARCHITECTURES:/ { print $2 }' "$BUILD/CMakeCache.txt")"
commit="unknown"
dirty="?"
if git rev-parse HEAD >/dev/null 2>&1; then
  commit="$(git rev-parse HEAD)"
  dirty="$(git status --porcelain | wc -l | tr -d ' ')"
fi
{
  echo "stabletrain GPU bundle (tools/gpu_bundle.sh; used by tools/gpu_check.sh)"
  echo "commit: $commit"
  echo "uncommitted: $dirty paths"
  echo "sources: $(source_hash)"
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname), $(. /etc/os-release && echo "$PRETTY_NAME")"
  echo "nvcc: $( (command -v nvcc >/dev/null && nvcc --version || /usr/local/cuda/bin/nvcc --version) | grep -o 'release [0-9.]*')"
  echo "cxx: $(g++ --version | head -1)"
  echo "cuda_arch: $arch"
  echo "flags: STABLETRAIN_NATIVE=OFF STABLETRAIN_MPI=OFF STABLETRAIN_SIMT=OFF Release, RPATH \$ORIGIN/../lib"
  echo "glibc_required: $(glibc_required "$STAGE"/bin/* "$STAGE"/lib/*)"
  echo "cuda_libs: $cuda_needed(from the GPU machine)"
  echo "programs: ${programs[*]}"
  echo "libs: ${copied[*]}"
  echo "sha256:"
  (cd "$STAGE" && sha256sum bin/* lib/* gpu_programs.txt)
} >"$STAGE/MANIFEST"

# ---- 3. the archive ---------------------------------------------------------------------
mkdir -p "$DEST"
say "packing $(du -sh "$STAGE" | cut -f1) with xz -9"
tar -C "$WORK" -cf - stabletrain-gpu | xz -9 -T1 >"$ARCHIVE.tmp"
mv "$ARCHIVE.tmp" "$ARCHIVE"
say "$ARCHIVE: $(du -h "$ARCHIVE" | cut -f1), ${#programs[@]} programs, ${#copied[@]} libraries, commit ${commit:0:12}, sources $(source_hash)"

# ---- 4. the archive checked where nothing else serves it --------------------------------
if ((CHECK)); then
  fresh="$WORK/fresh"
  mkdir -p "$fresh"
  unpack_txz "$ARCHIVE" "$fresh"
  B="$fresh/stabletrain-gpu/bin"
  unset LD_LIBRARY_PATH CPATH LIBRARY_PATH
  L="$(cd "$fresh/stabletrain-gpu/lib" && pwd -P)"
  while read -r p; do
    # Every library but glibc's and the CUDA ones must come from the bundle's lib/.
    while read -r name path; do
      is_glibc_lib "$name" || is_cuda_lib "$name" && continue
      [[ "$path" != not ]] || die "$p from the unpacked bundle: $name not found"
      [[ "$(dirname "$(readlink -f "$path")")" == "$L" ]] ||
        die "$p from the unpacked bundle loads $name from $path, not from the bundle"
    done < <(ldd "$B/$p" | awk '$2 == "=>" { print $1, $3 }')
  done <"$fresh/stabletrain-gpu/gpu_programs.txt"
  say "every program loads every library but glibc's and the CUDA ones ($cuda_needed) from the bundle's lib/"
  resolve_cuda_libs "$B"/* || die "the CUDA libraries are not on this machine: cannot run train from the bundle"
  run="$WORK/tiny_run"
  say "train --device cpu from the bundle: configs/tiny_shakespeare.yaml, 20 steps"
  "$B/train" --config configs/tiny_shakespeare.yaml --set run.out_dir="$run" --set device=cpu \
    --set train.max_steps=20 --set train.eval_every=10 --set train.ckpt_every=20 \
    --set train.log_every=5 --set train.sample_tokens=0 >"$WORK/tiny.log" 2>&1 ||
    { tail -20 "$WORK/tiny.log" >&2; die "train from the bundle failed"; }
  python3 - "$run/metrics.jsonl" <<'PY' || die "the tiny run's losses are not finite and falling"
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
loss = {r["step"]: r["loss"] for r in rows if "loss" in r}
val = [r["val_loss"] for r in rows if "val_loss" in r]
first, last = loss[min(loss)], loss[max(loss)]
ok = max(loss) == 20 and all(math.isfinite(v) for v in loss.values()) and last < first and val
print(f"[gpu_bundle] tiny run from the bundle: loss {first:.4f} (step {min(loss)}) -> {last:.4f} (step 20), val {val[-1]:.4f}", file=sys.stderr)
sys.exit(0 if ok else 1)
PY
  [[ -f "$run/ckpt_00000020.bin" ]] || die "no checkpoint at step 20"
  say "ok: $ARCHIVE checked"
fi
exit
}
