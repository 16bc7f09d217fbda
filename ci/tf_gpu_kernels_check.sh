#!/usr/bin/env bash
# Compile-checks the TensorFlow GPU kernels (helpers/csrc/tf/*_gpu.cc) against the installed
# TensorFlow's headers, where TensorFlow is a CPU build and the op library therefore skips them
# (CMake compiles them only when EMBEDLAB_TF_CUDA is ON: a CUDA TensorFlow and nvcc).
#
# How: the pip wheel ships the headers the GPU kernels need (Eigen's GpuDevice, OpKernelContext's
# eigen_device<GPUDevice>()); only the CUDA runtime headers come from the toolkit. The *_gpu.cc
# files are host C++ (their device code lives in csrc/core/*_cuda.cu), so CMake compiles them
# with the C++ compiler; this script does the same, with the op library's flags plus
# GOOGLE_CUDA=1 and EMBEDLAB_WITH_CUDA=1 (what CMake adds on a CUDA build), and -Wall -Wextra
# -Werror on EmbedLab's own code (TensorFlow's headers are -isystem). Each file is compiled to
# an object in a scratch folder; nothing is linked or loaded (no CUDA TensorFlow runs here).
#
# Usage: ci/tf_gpu_kernels_check.sh [file.cc ...]     (default: every helpers/csrc/tf/*_gpu.cc)
# Env:   PY (the Python whose TensorFlow is used; default .venv/bin/python), CUDA_HOME
#        (default /usr/local/cuda), CXX (default g++), OUT (scratch folder; default a mktemp dir).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-$PWD/.venv/bin/python}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
CXX=${CXX:-g++}
if [[ ! -f "$CUDA_HOME/include/cuda_runtime_api.h" ]]; then
  echo "ci/tf_gpu_kernels_check.sh: no CUDA headers in $CUDA_HOME/include (set CUDA_HOME)" >&2
  exit 2
fi
OUT=${OUT:-$(mktemp -d /tmp/tf_gpu_kernels_check.XXXXXX)}
mkdir -p "$OUT"
TF_INC=$(TF_CPP_MIN_LOG_LEVEL=3 "$PY" -c "import tensorflow as tf; print(tf.sysconfig.get_include())" 2>/dev/null)
# tf.sysconfig.get_compile_flags() less its -I (given as -isystem below).
mapfile -t TF_FLAGS < <(TF_CPP_MIN_LOG_LEVEL=3 "$PY" -c \
  "import tensorflow as tf; print('\n'.join(f for f in tf.sysconfig.get_compile_flags() if not f.startswith('-I')))" 2>/dev/null)
FILES=("$@")
if [[ ${#FILES[@]} -eq 0 ]]; then
  FILES=(helpers/csrc/tf/*_gpu.cc)
fi
rc=0
for f in "${FILES[@]}"; do
  obj="$OUT/$(basename "${f%.cc}").o"
  cmd=("$CXX" "${TF_FLAGS[@]}" -isystem "$TF_INC" -isystem "$CUDA_HOME/include" -I helpers/csrc/tf -I helpers/csrc/core
       -DGOOGLE_CUDA=1 -DEMBEDLAB_WITH_CUDA=1 -fPIC -O2 -Wall -Wextra -Wno-unused-parameter -Werror
       -Wno-deprecated-declarations -Wno-sign-compare -Wno-ignored-attributes -c "$f" -o "$obj")
  echo "+ ${cmd[*]}"
  if "${cmd[@]}"; then
    # The kernel registrations must be in the object (an #if that compiled them out would pass).
    syms=$(nm -C "$obj")
    if ! grep -q "::Compute(tensorflow::OpKernelContext\*)" <<<"$syms"; then
      echo "FAIL $f: the object holds no kernel (compiled out?)" >&2
      rc=1
    else
      echo "ok   $f"
    fi
  else
    echo "FAIL $f" >&2
    rc=1
  fi
done
exit $rc
