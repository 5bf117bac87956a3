#!/bin/sh
# Prints the CUDA toolkit's root folder (the one holding include/cuda_runtime.h and
# lib64/) for the nvcc given as $1 (default: nvcc on PATH, else /usr/local/cuda/bin/nvcc).
#
# CUDA_HOME wins when it names a toolkit. Otherwise nvcc itself is asked (its --dryrun
# prints TOP=): the nvcc found on PATH may be a wrapper script elsewhere (a machine with
# /usr/local/bin/nvcc execing /usr/local/cuda-13.0/bin/nvcc), so the folder above it is
# only the last resort. Prints nothing and exits 1 when no toolkit is found.
nvcc=${1:-$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)}
ok() { [ -n "$1" ] && [ -f "$1/include/cuda_runtime.h" ]; }
if ok "${CUDA_HOME:-}"; then
    echo "$CUDA_HOME"
    exit 0
fi
[ -x "$nvcc" ] || exit 1
top=$("$nvcc" --dryrun -c -x cu /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p' | head -1)
if [ -n "$top" ] && top=$(cd "$top" 2>/dev/null && pwd -P) && ok "$top"; then
    echo "$top"
    exit 0
fi
dir=$(cd "$(dirname "$nvcc")/.." 2>/dev/null && pwd -P)
if ok "$dir"; then
    echo "$dir"
    exit 0
fi
exit 1
