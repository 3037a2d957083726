# Step 2 of tools/gpu_check.sh, sourced by it (its helpers: say, within, logged; its
# variables OUT, LOG, WORK, BUILD, JOBS, SRC_HASH; gpu_lib.sh's unpack_txz, version_ge,
# cuda_lib_dirs, resolve_cuda_libs, missing_libs): get_programs takes the programs from the
# bundle .gpu_bundle/stabletrain-gpu.tar.xz when it was built from these sources, else builds
# them here (installed packages, the carried .gpu_deps, else apt-get; NCCL from the toolkit or
# PyTorch's wheel), then checks that every program loads. It sets BIN, PROGRAMS_FROM,
# PROGRAMS (the paths) and PROGRAMS_OK (1: every program there and loading).

get_programs() {
  BIN=""
  PROGRAMS_FROM=""
  BUNDLE_MODE="${GPU_CHECK_BUNDLE:-auto}"
  BUNDLE_FILE=.gpu_bundle/stabletrain-gpu.tar.xz
  if [[ "$BUNDLE_MODE" != off && -f "$BUNDLE_FILE" ]]; then
    say "unpacking $BUNDLE_FILE"
    if unpack_txz "$BUNDLE_FILE" "$WORK" 2>>"$LOG" && [[ -f "$WORK/stabletrain-gpu/MANIFEST" ]]; then
      manifest="$WORK/stabletrain-gpu/MANIFEST"
      cat "$manifest" >>"$LOG"
      b_hash="$(awk '$1 == "sources:" { print $2 }' "$manifest")"
      b_glibc="$(awk '$1 == "glibc_required:" { print $2 }' "$manifest")"
      have_glibc="$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{ print $2 }')"
      if [[ "$b_hash" != "$SRC_HASH" ]]; then
        say "the bundle was built from other sources (bundle $b_hash, this tree $SRC_HASH): not used"
      elif [[ -n "$b_glibc" && -n "$have_glibc" ]] && ! version_ge "$have_glibc" "$b_glibc"; then
        say "the bundle needs glibc $b_glibc, this machine has $have_glibc: not used"
      else
        BIN="$WORK/stabletrain-gpu/bin"
        PROGRAMS_FROM="bundle ($(awk '$1 == "commit:" { print $2 }' "$manifest"), sources $b_hash)"
      fi
    else
      say "cannot unpack $BUNDLE_FILE (see the log)"
    fi
  fi
  if [[ -z "$BIN" && "$BUNDLE_MODE" == require ]]; then
    say "GPU_CHECK_BUNDLE=require and no usable bundle: build one here with tools/gpu_bundle.sh and carry .gpu_bundle"
  elif [[ -z "$BIN" ]]; then
    # The build's dependencies: installed packages, else the carried .debs, else apt-get (an
    # offline machine may hang on it, so it comes last and under a short timeout).
    mapfile -t devpkgs < <(grep -v '^#' tools/debian-packages-gpu.txt | tr ' ' '\n' | grep -- '-dev$')
    missing=()
    for p in "${devpkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
    if ((${#missing[@]})) && ! compgen -G ".gpu_deps/*.deb" >/dev/null &&
      command -v apt-get >/dev/null 2>&1 && [[ "$(id -u)" == 0 ]]; then
      say "no .gpu_deps carried: trying apt-get for ${missing[*]}"
      if logged - within 60 env DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
        logged - within 300 env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"; then
        missing=()
      else
        say "apt-get could not install them (offline?)"
      fi
    fi
    CMAKE_DEP_ARGS=()
    DEPS_OK=1
    if ((${#missing[@]})); then
      if compgen -G ".gpu_deps/*.deb" >/dev/null; then
        DEPS="${GPU_CHECK_DEPS_PREFIX:-/tmp/stabletrain_deps}"
        rm -rf "$DEPS"
        mkdir -p "$DEPS"
        for deb in .gpu_deps/*.deb; do
          if command -v dpkg-deb >/dev/null 2>&1; then
            dpkg-deb -x "$deb" "$DEPS" 2>>"$LOG" || { say "cannot unpack $deb"; DEPS_OK=0; }
          else  # a .deb is an ar archive holding data.tar.{xz,zst,gz}
            member="$(ar t "$deb" | grep '^data\.tar' || true)"
            (ar p "$deb" "$member" | tar -xa -C "$DEPS" -f - 2>/dev/null ||
              ar p "$deb" "$member" | tar -xJ -C "$DEPS") 2>>"$LOG" || { say "cannot unpack $deb"; DEPS_OK=0; }
          fi
        done
        ARCH=x86_64-linux-gnu
        ARCHLIB="$DEPS/usr/lib/$ARCH"
        # Debian keeps some headers under the multiarch folder (openssl/opensslconf.h, the
        # OpenMP OpenBLAS's cblas.h): both folders go on the include path.
        export CPATH="$DEPS/usr/include:$DEPS/usr/include/$ARCH${CPATH:+:$CPATH}"
        export LIBRARY_PATH="$ARCHLIB${LIBRARY_PATH:+:$LIBRARY_PATH}"
        export LD_LIBRARY_PATH="$ARCHLIB:$ARCHLIB/openblas-openmp${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        CMAKE_DEP_ARGS=(-DCMAKE_PREFIX_PATH="$DEPS/usr" -DOPENSSL_ROOT_DIR="$DEPS/usr"
          -DST_OPENBLAS_DIR="$ARCHLIB/openblas-openmp" -DCBLAS_INCLUDE_DIR="$DEPS/usr/include/$ARCH/openblas-openmp")
        still=()
        for p in "${missing[@]}"; do compgen -G ".gpu_deps/${p}_*.deb" >/dev/null || still+=("$p"); done
        if ((${#still[@]})); then
          say "MISSING: .gpu_deps lacks ${still[*]} (tools/debian-packages-gpu.txt lists them; rerun tools/gpu_deps.sh)"
          DEPS_OK=0
        fi
        say "using the carried Debian packages, unpacked in $DEPS"
      else
        say "MISSING build dependencies ${missing[*]}: carry .gpu_deps (tools/gpu_deps.sh) or a bundle (tools/gpu_bundle.sh)"
        DEPS_OK=0
      fi
    fi
    # NCCL: the toolkit's, else the one in PyTorch's nvidia-nccl wheel.
    if ! compgen -G "/usr/local/cuda/include/nccl.h" >/dev/null; then
      while IFS= read -r d; do
        if [[ -f "$d/libnccl.so.2" && -f "$d/../include/nccl.h" ]]; then
          CMAKE_DEP_ARGS+=(-DST_NCCL_LIBRARY="$d/libnccl.so.2" -DST_NCCL_INCLUDE_DIR="$(cd "$d/../include" && pwd)")
          say "NCCL from $d"
          break
        fi
      done < <(cuda_lib_dirs)
    fi
    GEN=()
    command -v ninja >/dev/null 2>&1 && GEN=(-G Ninja)
    if [[ -f "$BUILD/CMakeCache.txt" ]]; then  # an existing build folder keeps its generator
      GEN=(-G "$(awk -F= '/^CMAKE_GENERATOR:/ { print $2 }' "$BUILD/CMakeCache.txt")")
    fi
    # The same configuration as a bundle (tools/gpu_bundle.sh packs this build folder):
    # no -march=native (the programs may run on another CPU), no MPI (the GPU image has no
    # launcher; NCCL ids travel by file or TCP), RPATH $ORIGIN/../lib (the bundle's lib/, set
    # as DT_RPATH so the libraries it loads find theirs too), gtest discovery at test time (a
    # build never runs a GPU program), no SIMT emulator (CPU-only tests; it needs Boost.Context).
    CONFIG=(-DCMAKE_BUILD_TYPE=Release -DSTABLETRAIN_CUDA=ON
      -DCMAKE_CUDA_ARCHITECTURES="${GPU_CHECK_CUDA_ARCH:-90}" -DSTABLETRAIN_NATIVE=OFF
      -DSTABLETRAIN_MPI=OFF -DBUILD_TESTING=ON -DSTABLETRAIN_SIMT=OFF
      -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON "-DCMAKE_INSTALL_RPATH=\$ORIGIN/../lib"
      -DCMAKE_EXE_LINKER_FLAGS=-Wl,--disable-new-dtags
      -DCMAKE_GTEST_DISCOVER_TESTS_DISCOVERY_MODE=PRE_TEST)
    if ((DEPS_OK)); then
      say "configure + build the GPU programs ($BUILD, ${GEN[*]:-default generator}, -j$JOBS)"
      : >"$OUT/build.log"
      t_build="$(date +%s)"
      if logged "$OUT/build.log" within 900 cmake -S . -B "$BUILD" ${GEN[@]+"${GEN[@]}"} "${CONFIG[@]}" \
        ${CMAKE_DEP_ARGS[@]+"${CMAKE_DEP_ARGS[@]}"} &&
        logged "$OUT/build.log" within 1800 cmake --build "$BUILD" -j "$JOBS" --target gpu_programs; then
        BIN="$BUILD/bin"
        PROGRAMS_FROM="build here ($BUILD, $(($(date +%s) - t_build)) s)"
        # What a later script (tools/gpu_bundle.sh) needs to find the same libraries.
        {
          for v in CPATH LIBRARY_PATH LD_LIBRARY_PATH; do
            [[ -n "${!v:-}" ]] && printf 'export %s=%q\n' "$v" "${!v}"
          done
        } >"$BUILD/stabletrain_env.sh"
      else
        say "BUILD FAILED (the end of build.log follows)"
        tail -25 "$OUT/build.log" >&2 || true
      fi
    fi
  fi

  # Every program must load: the CUDA libraries it misses are looked up (toolkit, wheels);
  # anything else missing means the build or the bundle is incomplete.
  PROGRAMS_OK=0
  PROGRAMS=()
  if [[ -n "$BIN" ]]; then
    list="$BIN/../gpu_programs.txt"  # written by CMake beside bin/; a bundle keeps it there
    if [[ -f "$list" ]]; then
      for p in $(cat "$list"); do PROGRAMS+=("$BIN/$p"); done
      PROGRAMS_OK=1
      for p in "${PROGRAMS[@]}"; do
        [[ -x "$p" ]] || { say "MISSING program $p"; PROGRAMS_OK=0; }
      done
      if ((PROGRAMS_OK)); then
        resolve_cuda_libs "${PROGRAMS[@]}" || PROGRAMS_OK=0
        still="$(missing_libs "${PROGRAMS[@]}" | tr '\n' ' ')"
        if [[ -n "${still// /}" ]]; then
          say "the programs cannot load: missing $still"
          PROGRAMS_OK=0
        fi
      fi
      if ((PROGRAMS_OK)); then
        for p in "${PROGRAMS[@]}"; do
          if [[ "$(basename "$p")" == test_* ]]; then
            logged - within 60 "$p" --gtest_list_tests || { say "$p does not start (see the log)"; PROGRAMS_OK=0; }
          fi
        done
        logged - within 60 "$BIN/train" --help-config || { say "train does not start"; PROGRAMS_OK=0; }
      fi
    else
      say "no gpu_programs.txt beside $BIN"
    fi
  fi
  if ((PROGRAMS_OK)); then
    say "programs: ${#PROGRAMS[@]} from the $PROGRAMS_FROM, all load (LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-})"
  else
    say "NO PROGRAMS: the later stages cannot run"
  fi
}
