#!/usr/bin/env bash
# The CPU test suite (ctest -L cpu) built with AddressSanitizer and UndefinedBehaviorSanitizer
# into build-asan/ (CUDA off; the SIMT emulator off: its tests have their own ASan variant,
# label emu_asan, in the default suite). Every report is fatal: ASan halts on the first
# error, UBSan does not recover (-fno-sanitize-recover), LeakSanitizer fails a process that
# leaks at exit (tools/lsan.supp lists the third-party libraries' one-time allocations).
# Subprocesses the tests start (train, compare, report, prepare_data, export_weights, under
# mpirun too) are the instrumented binaries of build-asan/ and inherit these options.
# Measured (2026-11-26, 2 cores shared with other builds, load average 5-9): build 37 min
# (no ccache hits), tests about 17 min at -j2 in three parts (ModelFD.WholeGpt2Fp64 not timed:
# over 4 min when it was stopped).
#   SANITIZE_JOBS   build and ctest parallelism (default: nproc)
#   SANITIZE_CTEST  extra ctest arguments (e.g. "-R Checkpoint")
set -euo pipefail
cd "$(dirname "$0")/.."
src=$(pwd)
bdir=build-asan
jobs=${SANITIZE_JOBS:-$(nproc)}

flags="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
t0=$(date +%s)
mkdir -p "$bdir"
# -O1 -g1: a fraction of Release's compile time, line numbers in every report.
cmake -S . -B "$bdir" -DCMAKE_BUILD_TYPE=Release -DSTABLETRAIN_CUDA=OFF -DSTABLETRAIN_SIMT=OFF \
  -DCMAKE_CXX_FLAGS_RELEASE="-O1 -g1 -DNDEBUG" -DCMAKE_C_FLAGS_RELEASE="-O1 -g1 -DNDEBUG" \
  -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_C_FLAGS="$flags" \
  -DCMAKE_EXE_LINKER_FLAGS="$flags" -DCMAKE_SHARED_LINKER_FLAGS="$flags" \
  "${launcher[@]}" >"$bdir/cmake.log" 2>&1 || { cat "$bdir/cmake.log"; exit 1; }
cmake --build "$bdir" -j "$jobs"
# test_tokenizer_node's npm package: copied from build/ when README's build has it.
if [ -d build/npm/node_modules/gpt-3-encoder ] && [ ! -d "$bdir/npm/node_modules/gpt-3-encoder" ]; then
  mkdir -p "$bdir/npm" && cp -r build/npm/node_modules "$bdir/npm/"
fi
t1=$(date +%s)
echo "sanitize: build $((t1 - t0)) s"

# allocator_may_return_null: an allocation too large for ASan's allocator throws
# std::bad_alloc as without ASan (test_fuzz counts it as a defect) instead of aborting.
export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:check_initialization_order=1:allocator_may_return_null=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
export LSAN_OPTIONS="suppressions=$src/tools/lsan.supp:print_suppressions=0"
# OpenMPI under ASan: its memory patcher hooks malloc/munmap, which ASan already owns.
export OMPI_MCA_memory=^patcher
# The numerical tests' OpenMP loops: 2 threads keep the sanitized run's time bounded.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}

# Tests left out, with why:
#   DtypeExhaustive.*AllFloats*: scalar float -> bf16/fp16 conversion of all 2^32 floats (no
#     memory access to check, minutes under the sanitizers); the other DtypeExhaustive cases
#     and the conversions inside every other test still run.
exclude="^DtypeExhaustive\\..*AllFloats"
# The data-parallel tests (DataParallel.*: train under mpirun) run in a second pass without
# LeakSanitizer: its end-of-process scan crashes tracing OpenMPI's threads ("Tracer caught
# signal 11 ... LeakSanitizer has encountered a fatal error"), and the leaks OpenMPI reports
# are in MCA components it has already unloaded (unattributable, "<unknown module>").
# ASan and UBSan stay on for them.
mpi="^DataParallel\\."
ctest_args=(--test-dir "$bdir" -L cpu --output-on-failure -j "$jobs" --timeout 1500)
# shellcheck disable=SC2206
ctest_args+=(${SANITIZE_CTEST:-})
rc=0
ctest "${ctest_args[@]}" -E "${exclude:+$exclude|}$mpi" || rc=$?
ASAN_OPTIONS="$ASAN_OPTIONS:detect_leaks=0" ctest "${ctest_args[@]}" -R "$mpi" || rc=$?
t2=$(date +%s)
echo "sanitize: build $((t1 - t0)) s, tests $((t2 - t1)) s"
exit $rc
