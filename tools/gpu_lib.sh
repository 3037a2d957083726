# Shell functions shared by tools/gpu_check.sh and tools/gpu_bundle.sh (sourced, not run).
# Callers set ROOT (the repository root) and define say().

# A hash of the sources the programs are compiled from (C++, CUDA, CMake files). Computed
# without git: a device call carries the working tree, not necessarily its history.
# A bundle records it; gpu_check.sh uses a bundle only when the tree it runs in has the same.
source_hash() {
  (cd "$ROOT" && find CMakeLists.txt core layers attention optim backends model data train dist io analysis \
    cuda apps tools tests -type f \( -name '*.c' -o -name '*.cc' -o -name '*.cpp' -o -name '*.h' \
    -o -name '*.hpp' -o -name '*.cu' -o -name '*.cuh' -o -name 'CMakeLists.txt' \
    -o -name '*.cmake' \) -print0 2>/dev/null | LC_ALL=C sort -z | xargs -0 sha256sum |
    sha256sum | cut -c1-16)
}

# The CUDA libraries our programs load but do not carry: the driver's, cuBLAS(Lt), NCCL,
# cuDNN, the CUDA runtime. Everything else a program needs is in a bundle's lib/.
is_cuda_lib() {
  [[ "$1" =~ ^lib(cuda|cudart|cublas|cublasLt|nccl|cudnn[a-z_]*|nvrtc[a-z-]*|nvJitLink)\.so ]]
}

# glibc's own libraries (and the kernel's vDSO): every Linux has them, a bundle never packs them.
is_glibc_lib() {
  [[ " linux-vdso.so.1 ld-linux-x86-64.so.2 libc.so.6 libm.so.6 libpthread.so.0 libdl.so.2 librt.so.1 libresolv.so.2 libutil.so.1 libanl.so.1 libnsl.so.1 " == *" $1 "* ]]
}

# Folders that may hold CUDA libraries on a GPU image: the toolkit, and the NVIDIA wheels
# of the Python that holds PyTorch (nvidia/cublas/lib, nvidia/nccl/lib, ...).
cuda_lib_dirs() {
  local d sub
  for d in ${CUDA_HOME:-} ${CUDA_PATH:-} /usr/local/cuda /usr/local/cuda-*; do
    for sub in lib64 lib targets/x86_64-linux/lib; do
      [[ -d "$d/$sub" ]] && echo "$d/$sub"
    done
  done
  if command -v python3 >/dev/null 2>&1; then
    timeout 60 python3 - <<'PY' 2>/dev/null || true
import glob, os, site, sys
roots = list(site.getsitepackages()) + [site.getusersitepackages()] + sys.path
seen = set()
for r in roots:
    for d in glob.glob(os.path.join(r, "nvidia", "*", "lib")):
        if d not in seen:
            seen.add(d)
            print(d)
PY
  fi
}

# find_lib SONAME: the folder holding SONAME (the loader's cache first, then the CUDA
# folders); nothing if none does.
find_lib() {
  local name="$1" f d
  f="$(ldconfig -p 2>/dev/null | awk -v n="$name" '$1 == n { print $NF; exit }')"
  if [[ -n "$f" && -e "$f" ]]; then dirname "$f"; return 0; fi
  while IFS= read -r d; do
    if [[ -e "$d/$name" ]]; then echo "$d"; return 0; fi
  done < <(cuda_lib_dirs)
  return 0
}

# missing_libs BIN...: the sonames the loader cannot find for these programs, one a line.
missing_libs() {
  local b
  for b in "$@"; do ldd "$b" 2>/dev/null | awk '/=> not found/ { print $1 }'; done | sort -u
}

# resolve_cuda_libs BIN...: puts the folders of the CUDA libraries these programs miss on
# LD_LIBRARY_PATH. Prints what it found; returns 1 (naming them) if a library stays missing.
resolve_cuda_libs() {
  local lib dir ok=0
  while IFS= read -r lib; do
    [[ -n "$lib" ]] || continue
    if ! is_cuda_lib "$lib"; then
      say "MISSING library $lib (not a CUDA library: the build or the bundle is incomplete)"
      ok=1
      continue
    fi
    dir="$(find_lib "$lib")"
    if [[ -n "$dir" ]]; then
      export LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
      say "$lib: $dir"
    else
      say "MISSING CUDA library $lib (not in the loader cache, /usr/local/cuda*, or python3's nvidia wheels)"
      ok=1
    fi
  done < <(missing_libs "$@")
  return "$ok"
}

# The highest glibc symbol version a set of ELF files requires ("2.34"; objdump, binutils).
glibc_required() {
  local f
  for f in "$@"; do
    if command -v objdump >/dev/null 2>&1; then
      objdump -T "$f" 2>/dev/null | grep -oE 'GLIBC_[0-9]+(\.[0-9]+)+' | sed 's/GLIBC_//'
    fi
  done | sort -uV | tail -1
}

# version_ge A B: A >= B (dotted versions).
version_ge() { [[ "$(printf '%s\n%s\n' "$1" "$2" | sort -V | head -1)" == "$2" ]]; }

# unpack_txz ARCHIVE DIR: tar -xJ, or python3's tarfile where the image has no xz.
unpack_txz() {
  if command -v xz >/dev/null 2>&1; then
    tar -xJf "$1" -C "$2"
  else
    python3 - "$1" "$2" <<'PY'
import sys, tarfile
t = tarfile.open(sys.argv[1], "r:xz")
try:
    t.extractall(sys.argv[2], filter="data")
except TypeError:  # a Python without extraction filters
    t.extractall(sys.argv[2])
PY
  fi
}
