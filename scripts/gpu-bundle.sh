#!/usr/bin/env bash
# Builds the GPU bundle: a self-contained folder to copy to a bare GPU machine (CUDA 13
# runtime libraries and python3, none of Debian's -dev packages, no internet) and run
# t/gpu/run.sh there.
#
#   scripts/gpu-bundle.sh            (make gpu-bundle)  -> $BUILD/gpu-bundle/
#
#   bin/kvgate-engine bin/kvgate-generate bin/kvgate-gpu-check bench/gpu_bench bench/tiers_gpu_bench
#   models/stories260K/{stories260K.bin,tok512.bin,golden-greedy.json,README.md}
#   run.sh torch_ref.py README.md BUILD-INFO
#
# Linking: jansson, utf8proc and libcrypto statically (Debian's .a files), libgcc and
# libstdc++ statically, cudart statically (libcudart_static.a: the bundle then needs
# only the driver's libcuda.so, loaded by cudart itself, plus cuBLAS and cuDNN; a toolkit
# installed without the static runtime gets cudart dynamically, its libcudart.so copied into the
# bundle's lib/ so that the GPU machine's own runtime is not needed); cublas/cublasLt and
# cudnn (attention) dynamically (they are large; the toolkit's or PyTorch's), found through
# rpath $ORIGIN/../lib then the standard CUDA library folders. ldd shows glibc and CUDA
# libraries only (t/gpu-bundle.t checks).
#
# The CUDA backend is whatever engine/cuda/*.c + kernels/*.cu hold: the Makefile's own
# rules build them (nvcc) into a separate build folder, $BUILD/gpu-bundle-obj (or
# KVG_BUNDLE_OBJ, e.g. an existing build folder to reuse its objects); while engine/cuda
# has only absent.c, the stub is linked and --backend cuda says so.
#
# Environment: BUILD (default build), KVG_BUNDLE_OBJ, KVG_SHARED (default ../shared beside
# the repository), JOBS (make -j, default 2), NVCC.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
build=${BUILD:-build}
out=$build/gpu-bundle
objb=${KVG_BUNDLE_OBJ:-$build/gpu-bundle-obj}
shared=${KVG_SHARED:-$root/../shared}
jobs=${JOBS:-2}
nvcc=${NVCC:-$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)}
CC=${CC:-gcc}
CXX=${CXX:-g++}

if [ ! -x "$nvcc" ]; then
    echo "gpu-bundle: nvcc not found (set NVCC, or install the CUDA toolkit): the bundle is built with CUDA" >&2
    exit 1
fi
# The toolkit's root: CUDA_HOME, else where nvcc says it lives (the nvcc on PATH may be a
# wrapper script in /usr/local/bin).
if ! cuda_home=$(scripts/cuda-home.sh "$nvcc"); then
    echo "gpu-bundle: no CUDA toolkit (include/cuda_runtime.h) found for $nvcc: set CUDA_HOME" >&2
    exit 1
fi
for a in libjansson.a libutf8proc.a libcrypto.a; do
    if ! "$CC" -print-file-name="$a" | grep -q /; then
        echo "gpu-bundle: $a not found (Debian: libjansson-dev, libutf8proc-dev, libssl-dev)" >&2
        exit 1
    fi
done
stories=$shared/models/stories260K
for f in stories260K.bin tok512.bin golden-greedy.json README.md; do
    [ -f "$stories/$f" ] || { echo "gpu-bundle: $stories/$f missing (KVG_SHARED)" >&2; exit 1; }
done

# The libraries, through the Makefile's rules, in their own build folder.
cuda_host=$(ls engine/cuda/*.c 2>/dev/null | grep -v '/absent\.c$' || true)
if [ -n "$cuda_host" ]; then
    cuda_part=$objb/cuda/libkvgate-cuda.a
    backend=real
else
    cuda_part=$objb/obj/engine/cuda/absent.o
    backend="absent (engine/cuda has no host sources yet: --backend cuda reports that)"
fi
make -s -j"$jobs" BUILD="$objb" CUDA=1 NVCC="$nvcc" \
    "$objb/libkvgate.a" "$objb/libkvgate-engine.a" "$cuda_part"

cflags=(-std=gnu11 -O2 -g -fPIC -D_GNU_SOURCE -Isrc -Iengine $(pkg-config --cflags jansson libcrypto libutf8proc 2>/dev/null)
        -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wmissing-prototypes)
rpath='$ORIGIN/../lib'
for d in "$cuda_home/lib64" /usr/local/cuda/lib64 /usr/local/cuda-13/lib64; do
    case ":$rpath:" in *":$d:"*) ;; *) rpath=$rpath:$d ;; esac
done
# The CUDA runtime: static where the toolkit has it, else the shared one, shipped in lib/.
cudart=(-lcudart_static)
cudart_so=
if [ ! -f "$cuda_home/lib64/libcudart_static.a" ]; then
    cudart_so=$(ls "$cuda_home"/lib64/libcudart.so.[0-9]* 2>/dev/null | head -1 || true)
    if [ -z "$cudart_so" ]; then
        echo "gpu-bundle: neither libcudart_static.a nor libcudart.so.N in $cuda_home/lib64" >&2
        exit 1
    fi
    cudart=(-lcudart)
fi
ldflags=(-Wl,--start-group "$objb/libkvgate-engine.a" "$cuda_part" -Wl,--end-group "$objb/libkvgate.a"
         -Wl,-Bstatic -ljansson -lutf8proc -lpcre2-8 -lcrypto -Wl,-Bdynamic
         -L"$cuda_home/lib64" -Wl,--as-needed -lcudnn -lcublasLt -lcublas -Wl,--no-as-needed
         "${cudart[@]}" -static-libgcc -static-libstdc++ -lpthread -ldl -lrt -lm
         -Wl,--gc-sections -Wl,-rpath,"$rpath")

rm -rf "$out.tmp"
mkdir -p "$out.tmp/bin" "$out.tmp/bench" "$out.tmp/models/stories260K" "$objb/cmd"
link() {                              # link SRC DEST
    local src=$1 dst=$2 o
    o=$objb/cmd/$(basename "${src%.c}").o
    "$CC" "${cflags[@]}" -c "$src" -o "$o"
    # g++ as the driver so that -static-libstdc++ applies to the CUDA objects' C++ runtime.
    "$CXX" -o "$dst" "$o" "${ldflags[@]}"
    # Debug sections are most of the size; the symbol table stays for backtraces.
    objcopy --strip-debug "$dst"
}
for c in kvgate-engine kvgate-generate kvgate-gpu-check; do
    link "engine/cmd/$c.c" "$out.tmp/bin/$c"
done
link t/bench/gpu_bench.c "$out.tmp/bench/gpu_bench"
# the host tier's TTFT (the tiers-8k and tiers-32k steps)
link t/bench/tiers_gpu_bench.c "$out.tmp/bench/tiers_gpu_bench"
# the model families' step writes its tiny GGUFs on the GPU machine (36 MiB each in F32;
# 0.7 MiB of vocabulary here)
link t/bench/synth_gguf.c "$out.tmp/bench/synth_gguf"

if [ -n "$cudart_so" ]; then
    mkdir -p "$out.tmp/lib"
    soname=$(objdump -p "$cudart_so" | awk '/SONAME/ {print $2}')
    cp -L "$cudart_so" "$out.tmp/lib/${soname:-$(basename "$cudart_so")}"
fi
cp "$stories"/{stories260K.bin,tok512.bin,golden-greedy.json,README.md} "$out.tmp/models/stories260K/"
mkdir -p "$out.tmp/models/vocab"
cp "$shared/tokenizers/vectors/ggml-vocab-llama-spm.gguf" "$out.tmp/models/vocab/"
chmod u+w "$out.tmp/models/stories260K/"* "$out.tmp/models/vocab/"*
cp t/gpu/run.sh "$out.tmp/run.sh"
# the torch step's PyTorch reference (python3; stdlib, plus torch and transformers where present)
cp t/gpu/torch_ref.py "$out.tmp/torch_ref.py"
cp t/gpu/README.md "$out.tmp/README.md"
chmod +x "$out.tmp/run.sh" "$out.tmp/torch_ref.py"
{
    echo "built: $(date -u +%Y-%m-%dT%H:%MZ) on $(uname -n)"
    echo "source: $(git describe --always --dirty 2>/dev/null || echo unknown)"
    echo "nvcc: $("$nvcc" --version | tail -1)"
    echo "cuda backend: $backend"
    if [ -n "$cudart_so" ]; then echo "cudart: shared, in lib/ (from $cudart_so)"; else echo "cudart: static"; fi
    echo "kernels: $(ls kernels/*.cu 2>/dev/null | tr '\n' ' ')"
} >"$out.tmp/BUILD-INFO"

rm -rf "$out"
mv "$out.tmp" "$out"
size=$(du -sb "$out" | cut -f1)
if [ "$size" -ge $((64 * 1024 * 1024)) ]; then
    echo "gpu-bundle: $out is $size bytes, over the 64 MiB limit" >&2
    exit 1
fi
echo "gpu-bundle: $out ($((size / 1024)) KiB; cuda backend: ${backend%% *})"
