#!/usr/bin/env bash
# The checks and figures on a real GPU, in one run of under 8 minutes on an H200 (and the
# tiers steps, 4b, under 2 x 120 s more):
#
#   0. the machine (nvidia-smi), the binaries start;
#   1. stories260K greedy through --backend cuda equals the golden ids (a BF16 divergence
#      is accepted only where the CPU reference itself has a near tie: kvgate-gpu-check);
#   2. logits vs the CPU backend within the BF16 tolerance: stories260K, synthetic:1B-bf16,
#      synthetic:8B4L-bf16 (Llama 3 8B's shape, 4 layers);
#   2b. torch: the same weights in Hugging Face transformers (BF16, SDPA) when python3 has
#      torch and transformers: logits vs kvgate's within the BF16 tolerance (stories260K and
#      synthetic:8B4L), and torch's prefill/decode speed on the 8B shape (torch_ref.py);
#   3. batch invariance (cache hit vs miss, batch 1/8/64, chunks 1/7/64/whole): bit-identical
#      with --batch-invariant on (a failure otherwise), the differing counts with it off;
#      the same with int8 KV on stories260K (and its logits against the CPU's int8 pool);
#   4. compute-sanitizer memcheck and racecheck on a short run, when it is installed;
#   4b. the KV host tier (bench/tiers_gpu_bench, synthetic:8B4L-bf16): time to first token of
#      an 8k and a 32k prompt (tiers-8k, tiers-32k) recomputed, from the device pool, and
#      copied back from pinned host memory after an eviction, with the H2D copies' time and
#      bandwidth; the host hit's logits must equal the recompute's bit for bit (a failure
#      otherwise);
#   5. the benchmark (bench/gpu_bench: synthetic:1B-bf16, synthetic:110M-bf16, and
#      synthetic:8B4L-bf16 at a 4k context), each configuration twice, the attention paths
#      side by side: bench-N-own (KVGATE_CUDA_ATTENTION=own, --batch-invariant both: the
#      invariant-mode figures and the own kernels' off-mode ones) and bench-N-cudnn
#      (KVGATE_CUDA_ATTENTION=cudnn, --batch-invariant off). Each step's results.json entry
#      says its "attention"; a cudnn step whose cuDNN lacks the paged SDPA op is
#      "unsupported" (the reason in its result), not a failure;
#   6. the model families (docs/model-families.md): each family's tiny GGUF (random weights,
#      a real vocabulary), written here by bench/synth_gguf: logits vs the CPU backend within
#      the family's tolerance (t/engine-families.t's emulated figures), and invariance
#      bit-identical (chunks, cache hit, batch 1 vs 8).
#
#   ./run.sh                  from the bundle folder (make gpu-bundle): bin/, bench/, models/
#   t/gpu/run.sh              from a repository checkout: build/bin, build/bench, ../shared
#   KVG_RUN_EMU=1 t/gpu/run.sh    the same steps on a machine without a GPU: the emulated
#                             binaries (build/emu/bin, make emu) and tiny models, seconds
#
# Results: $OUT/results.json (OUT default ./out) holds every step's status and its tool's
# JSON; a summary goes to stdout. Exit status 0 when no step failed (a skipped step, e.g.
# no compute-sanitizer, is not a failure), 1 otherwise. Every step runs under its own
# timeout (a timeout is a failure) so the whole stays under 8 minutes.
#
# Overrides: KVG_BIN (folder of kvgate-gpu-check), KVG_BENCH (the gpu_bench binary),
# KVG_TIERS_BENCH (the tiers_gpu_bench binary), KVG_MODELS (folder holding stories260K/),
# KVG_STEPS (e.g. "golden logits": the steps to run, of info golden logits torch invariance
# sanitizer tiers bench families), KVG_DEVICE (CUDA ordinal),
# KVG_BACKEND (default cuda; cpu checks the script itself against the CPU backend),
# KVG_BENCH_DEADLINE_S (seconds from the start after which no bench step starts and each one's
# limit is cut to what is left; default 390, leaving the families step its time).
# The torch step: KVG_PYTHON (python3), KVG_TORCH_DEVICE, KVG_TORCH_TOL (see 2b below).
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
emu=${KVG_RUN_EMU:-0}
if [ -d "$here/bin" ]; then                     # the bundle
    bin=$here/bin bench=$here/bench/gpu_bench tiers=$here/bench/tiers_gpu_bench models=$here/models
    synth=$here/bench/synth_gguf vocab=$here/models/vocab/ggml-vocab-llama-spm.gguf
else                                            # t/gpu/ in a checkout
    root=$(cd "$here/../.." && pwd)
    b=${BUILD:-build}
    case $b in /*) ;; *) b=$root/$b ;; esac
    if [ "$emu" = 1 ]; then
        bin=$b/emu/bin bench=$b/emu/bench/gpu_bench tiers=$b/emu/bench/tiers_gpu_bench
    else
        bin=$b/bin bench=$b/bench/gpu_bench tiers=$b/bench/tiers_gpu_bench
    fi
    models=$root/../shared/models
    synth=$b/bench/synth_gguf vocab=$root/../shared/tokenizers/vectors/ggml-vocab-llama-spm.gguf
fi
synth=${KVG_SYNTH:-$synth}
bin=${KVG_BIN:-$bin}
bench=${KVG_BENCH:-$bench}
tiers=${KVG_TIERS_BENCH:-$tiers}
models=${KVG_MODELS:-$models}
OUT=${OUT:-./out}
steps=${KVG_STEPS:-info golden logits torch invariance sanitizer tiers bench families}
dev=(--backend "${KVG_BACKEND:-cuda}" --device "${KVG_DEVICE:-0}")
mkdir -p "$OUT" || exit 1
OUT=$(cd "$OUT" && pwd)
# Per-step logs and JSON in $OUT/steps/, packed into steps.tar.gz at the end (KVG_KEEP_STEPS=1
# keeps the folder): $OUT then holds three files, results.json, summary.txt, steps.tar.gz.
W=$OUT/steps
rm -rf "$W" "$W/steps.tar.gz"
mkdir -p "$W" || exit 1
exec > >(tee "$OUT/summary.txt") 2>&1
check=$bin/kvgate-gpu-check
stories=(--model "$models/stories260K/stories260K.bin" --tokenizer "$models/stories260K/tok512.bin")
threads=$(nproc 2>/dev/null || echo 4)

# Sizes: the real run, or tiny ones for the emulator (every kernel still runs, on the CPU).
if [ "$emu" = 1 ]; then
    big=synthetic:260K
    llama8=                     # the 8B shape is for a GPU only
    golden_args=(--golden-cases 2)
    logits_small=(--prompt-len 24 --decode 2)
    logits_big=(--prompt-len 24 --decode 2)
    inv_args=(--prompt-len 40 --decode 2 --batches 1,8 --chunks 1,7,0)
    san_args=(--prompt-len 20 --decode 1 --batches 1,4 --chunks 7)
    bench_runs=("--model synthetic:260K --quick --batches 1,8")
    # the host tier's steps on the tiny shape, one rep: a prompt of whole blocks (the last
    # one's computed: 2 of 3 copied back) in one step, and one ending in a partial block, in
    # chunks (4 of 4.5 copied back, 3 steps)
    tiers_runs=("8k:--model synthetic:260K --prompt 48 --prefill-chunk 64 --reps 1"
                "32k:--model synthetic:260K --prompt 72 --prefill-chunk 32 --reps 1")
    bench_deadline=${KVG_BENCH_DEADLINE_S:-600}
    # two families here (every kernel of MoE, sinks and windows); t/engine-families.t runs
    # every family on the emulated backend
    fam_list="qwen3moe:0.06 gpt-oss:0.1"
    fam_args=(--prompt-len 24 --decode 2 --batches 1,4 --chunks 7,0 --seed 3)
    t_golden=120 t_logits=120 t_inv=180 t_san=60 t_bench=120 t_fam=180 t_tiers=60
else
    big=synthetic:1B-bf16
    # Llama 3 8B's shape with 4 of its layers (head_dim 128, GQA 4, vocab 128k): the
    # Llama path at its real sizes; logits, invariance on, and the bench at 4k.
    llama8=synthetic:8B4L-bf16
    golden_args=()
    logits_small=(--prompt-len 300 --decode 8)
    logits_big=(--prompt-len 64 --decode 4 --threads "$threads")
    inv_args=(--prompt-len 300 --decode 8)
    san_args=(--prompt-len 40 --decode 2 --batches 1,8 --chunks 7)
    # each configuration runs twice (own, cudnn): the 110M point is the cheap one, one rep
    # and no 32k prefill, so that the bench stays within its share of the 8 minutes
    bench_runs=("--model synthetic:1B-bf16 --reps 2" "--model synthetic:110M-bf16 --reps 1 --prefill 4096"
                "--model synthetic:8B4L-bf16 --reps 2 --prefill 4096 --batches 1,32 --decode-ctx 4096 --ttft-prefix 8192")
    # The host tier on the 8B shape: synthetic:8B4L-bf16's KV block is 16 tokens x 4 layers
    # x 8 KV heads x 128 x 2 (K and V) x 2 bytes (BF16) = 256 KiB, so a 32k prompt is 2048
    # blocks, 512 MiB: --kv-memory 1G (4096 blocks) holds it and the warm-up's, and so does
    # the pinned --kv-host-memory 1G; the 8k prompt's 512 blocks (128 MiB) fit 256M of each.
    # With the weights (BF16: 2 x 128256 x 4096 x 2 B of embedding and output = 2.1 GB, 4
    # layers x 218M x 2 B = 1.7 GB) and a 512-token step's scratch, under 6 GB of an H100's
    # 80; 1 GiB pinned of the host's memory. Prefill chunks of 512 (the engine's default
    # --max-batch-tokens), 3 reps.
    tiers_runs=("8k:--model synthetic:8B4L-bf16 --prompt 8192 --kv-memory 256M --kv-host-memory 256M"
                "32k:--model synthetic:8B4L-bf16 --prompt 32768 --kv-memory 1G --kv-host-memory 1G")
    fam_list="llama:0.03 qwen2:0.07 qwen3:0.06 qwen3moe:0.06 gemma2:0.05 gemma3:0.13 phi3:0.08 mistral3:0.06 gpt-oss:0.1"
    fam_args=(--prompt-len 100 --decode 4 --batches 1,8 --chunks 1,7,0 --threads "$threads" --seed 3)
    t_golden=60 t_logits=150 t_inv=120 t_san=150 t_bench=150 t_fam=60 t_tiers=120
    bench_deadline=${KVG_BENCH_DEADLINE_S:-390}
fi
# the cudnn bench steps run one mode (off) where the own ones run two
t_bench_cudnn=$(( (t_bench * 2 + 2) / 3 ))

declare -a names statuses secs attns
# step_attn: the attention path the next step's figures are for ("" for none), written
# beside its status; unsup_re: a log line that makes a failing step "unsupported" (the op
# is missing on this machine) instead of a failure.
step_attn='' unsup_re=''
failed=0
start_all=$(date +%s)

# results.json: every step so far (status, seconds, the JSON its tool wrote), rewritten
# after each step, so that a run killed midway keeps the figures of the steps it finished.
write_results() {
    local k n f total_now=$(( $(date +%s) - start_all ))
    {
        printf '{\n  "emulated": %s,\n  "seconds": %s,\n  "ok": %s,\n  "steps": [\n' \
            "$([ "$emu" = 1 ] && echo true || echo false)" "$total_now" "$([ $failed = 0 ] && echo true || echo false)"
        for k in "${!names[@]}"; do
            n=${names[$k]}
            f=$W/$n.json
            [ -s "$f" ] || f=
            printf '    {"name": "%s", "status": "%s", "seconds": %s,%s "result": %s}%s\n' "$n" "${statuses[$k]}" \
                "${secs[$k]}" "$([ -n "${attns[$k]:-}" ] && printf ' "attention": "%s",' "${attns[$k]}")" \
                "$([ -n "$f" ] && cat "$f" || echo null)" "$([ $k -lt $(( ${#names[@]} - 1 )) ] && echo ,)"
        done
        printf '  ]\n}\n'
    } >"$OUT/results.json.tmp" && mv "$OUT/results.json.tmp" "$OUT/results.json"
}

# step NAME TIMEOUT JSONFILE CMD...: runs CMD under timeout, logs to $OUT/NAME.log.
step() {
    local name=$1 limit=$2 json=$3 t0 rc st
    shift 3
    t0=$(date +%s)
    echo "== $name: $*" >>"$W/commands.log"
    timeout --kill-after=10 "$limit" "$@" >"$W/$name.log" 2>&1
    rc=$?
    if [ $rc -eq 0 ]; then st=pass
    elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then st=timeout
    elif [ -n "$unsup_re" ] && grep -q -- "$unsup_re" "$W/$name.log"; then
        st=unsupported
        # the reason, as the step's result (JSON string: backslashes and quotes escaped)
        [ -z "$json" ] || printf '{"unsupported": "%s"}\n' "$(grep -m1 -- "$unsup_re" "$W/$name.log" |
            tr -d '\000-\037' | sed 's/\\/\\\\/g; s/"/\\"/g')" >"$json"
    else st=fail
    fi
    names+=("$name") statuses+=("$st") secs+=("$(( $(date +%s) - t0 ))") attns+=("$step_attn")
    [ "$st" = pass ] || [ "$st" = unsupported ] || failed=1
    printf '%-28s %-11s %4ss%s\n' "$name" "$st" "$(( $(date +%s) - t0 ))" "${step_attn:+  (attention: $step_attn)}"
    [ "$st" != unsupported ] || grep -m1 -- "$unsup_re" "$W/$name.log" | sed 's/^/    /'
    case $name in bench-*|info) ;; *) sed 's/^/    /' "$W/$name.log" | grep -E 'first divergence|FAIL|max\|diff\||differ|error|Error|ERROR|: (pass|fail|error)|TTFT|H2D|D2H|tok/s|share|batch-invariant|CUDA|cuda' | head -40 ;; esac
    [ -z "$json" ] || [ -s "$json" ] || echo "{}" >"$json"
    write_results
}

skip() {                                        # skip NAME WHY
    names+=("$1") statuses+=(skipped) secs+=(0) attns+=("$step_attn")
    printf '%-28s %-8s (%s)\n' "$1" skipped "$2"
    echo "$2" >"$W/$1.log"
    write_results
}

want() { case " $steps " in *" $1 "*) return 0 ;; esac; return 1; }

echo "kvgate GPU run ($([ "$emu" = 1 ] && echo "EMULATED: $bin" || echo "$bin")), $(date -u +%Y-%m-%dT%H:%MZ), results in $OUT"
: >"$W/commands.log"

# The CUDA libraries. The binaries' rpath names the toolkit's lib64 folders; machines with
# PyTorch for CUDA 13 have cuBLAS, cuBLASLt and cuDNN in its Python packages (nvidia-cublas,
# nvidia-cudnn-cu13, ...) instead: those folders go first on LD_LIBRARY_PATH. Then every
# library a binary needs must resolve, or the run stops here, naming what is missing.
torch_libs() {
    local py
    for py in python3 /usr/bin/python3; do
        command -v "$py" >/dev/null 2>&1 || continue
        "$py" - <<'PY' 2>/dev/null && return 0
import glob, os, sys
try:
    import nvidia
except Exception:
    sys.exit(1)
dirs = []
for base in list(getattr(nvidia, "__path__", [])):
    for pat in ("libcublasLt.so*", "libcublas.so*", "libcudnn.so*", "libcudart.so*"):
        for f in sorted(glob.glob(os.path.join(base, "**", pat), recursive=True)):
            d = os.path.dirname(os.path.abspath(f))
            if d not in dirs:
                dirs.append(d)
if not dirs:
    sys.exit(1)
print(":".join(dirs))
PY
    done
    return 1
}
if [ "$emu" != 1 ]; then
    if libs=$(torch_libs); then
        export LD_LIBRARY_PATH=$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
        echo "  CUDA libraries from Python's nvidia packages: $libs"
    fi
    command -v nvidia-smi >/dev/null 2>&1 &&
        echo "  driver: $(nvidia-smi 2>/dev/null | grep -o 'Driver Version: [0-9.]*\|CUDA Version: [0-9.]*' | tr '\n' ' ')"
    missing=$(for x in "$check" "$bench" "$tiers" "$synth"; do [ -x "$x" ] && ldd "$x" 2>&1; done | awk '/not found/ {print $1}' | sort -u | tr '\n' ' ')
    if [ -n "$missing" ]; then
        echo "FAILED before any step: the binaries need $missing which neither their rpath (the CUDA" \
             "toolkit's lib64) nor LD_LIBRARY_PATH nor Python's nvidia packages provide. Install the" \
             "CUDA 13 runtime libraries and cuDNN 9 (or PyTorch's nvidia-cublas and nvidia-cudnn packages), or set LD_LIBRARY_PATH."
        names+=(libraries) statuses+=(fail) secs+=(0)
        failed=1
        write_results
        exit 1
    fi
    ldd "$check" 2>/dev/null | awk '/cublas|cudart|cudnn/ {print "  loads " $1 " from " $3}'
fi

if want info; then
    {
        uname -a
        [ -f "$here/BUILD-INFO" ] && cat "$here/BUILD-INFO"
        if command -v nvidia-smi >/dev/null 2>&1; then
            nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv
            nvidia-smi
        else
            echo "nvidia-smi: not found"
        fi
        ldd "$check" 2>&1 || true
    } >"$W/machine.txt" 2>&1
    command -v nvidia-smi >/dev/null 2>&1 &&
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/  GPU: /'
    step info 20 "" "$check" --help
fi

# A machine without a usable GPU (no driver, no device, a driver too old for CUDA 13):
# the steps would all fail the same way, so the run stops here, saying why.
if [ "$emu" != 1 ] && [ "${KVG_BACKEND:-cuda}" = cuda ]; then
    probe_out=$(timeout --kill-after=5 60 "$check" "${stories[@]}" "${dev[@]}" --check golden --golden-cases 1 2>&1)
    if [ $? -ne 0 ] && printf '%s' "$probe_out" | grep -qi 'cuda'; then
        echo "FAILED: no usable GPU here: $(printf '%s' "$probe_out" | grep -i -m1 'cuda')"
        printf '%s\n' "$probe_out" >"$W/device.log"
        names+=(device) statuses+=(fail) secs+=(0)
        failed=1
        write_results
        [ "${KVG_KEEP_STEPS:-0}" = 1 ] || { tar czf "$OUT/steps.tar.gz" -C "$OUT" steps && rm -rf "$W"; }
        exit 1
    fi
fi

# 1. golden greedy (stories260K).
if want golden; then
    step golden "$t_golden" "$W/golden.json" "$check" "${stories[@]}" "${dev[@]}" --check golden \
        "${golden_args[@]}" --json "$W/golden.json"
fi

# 2. logits vs the CPU backend.
if want logits; then
    step logits-stories260K "$t_logits" "$W/logits-stories260K.json" "$check" "${stories[@]}" "${dev[@]}" \
        --check logits "${logits_small[@]}" --json "$W/logits-stories260K.json"
    step "logits-${big#synthetic:}" "$t_logits" "$W/logits-${big#synthetic:}.json" "$check" --model "$big" "${dev[@]}" \
        --check logits "${logits_big[@]}" --json "$W/logits-${big#synthetic:}.json"
    [ -z "$llama8" ] || step logits-8B4L "$t_logits" "$W/logits-8B4L.json" "$check" --model "$llama8" "${dev[@]}" \
        --check logits "${logits_big[@]}" --json "$W/logits-8B4L.json"
fi

# 2b. the PyTorch reference (torch_ref.py beside run.sh; torch and transformers from this
# machine's python3): the same weights, exported by kvgate-generate --export-llama2c (F32)
# and checked (header, sizes, the q/k row permutation: stdlib only), in transformers'
# LlamaForCausalLM in BF16 with SDPA on the GPU. Its logits at the last of 64 prompt ids vs
# kvgate's on the device (--prompt-logits), within the logits step's BF16 tolerance
# (KVG_TORCH_TOL, default 0.03 of max(1, max|logit|)); kvgate's CPU logits (F32) beside as a
# figure. On the 8B shape (the 7.7 GB export only where torch can use it) also torch's
# prefill of 4k and decode at batch 1 and 32 at a 4k context, beside the bench's figures.
# torch-mapping-stories260K computes the same in double precision with transformers'
# conventions in plain Python (torch_ref.py --stdlib-forward): a wrong mapping shows there
# too, with torch or without. Without torch or transformers (or a device torch can see)
# each torch-MODEL step is skipped, "not available" with the reason in its log and result,
# never a failure.
if want torch; then
    py=${KVG_PYTHON:-python3}
    tref=$here/torch_ref.py
    tgen=$bin/kvgate-generate
    ttok=$models/stories260K/tok512.bin
    tbe=${KVG_BACKEND:-cuda}
    if [ "$emu" = 1 ]; then
        tdev=${KVG_TORCH_DEVICE:-cpu}       # a machine with torch but no GPU: torch on the CPU
        torch_models="stories260K"
        t_texp=60 t_tkv=120 t_torch=300 t_tall=300
    else
        tdev=${KVG_TORCH_DEVICE:-cuda:${KVG_DEVICE:-0}}
        torch_models="stories260K 8B4L"
        t_texp=150 t_tkv=150 t_torch=150 t_tall=240
    fi
    # The whole step stays within KVG_TORCH_BUDGET_S: each part's limit is cut to what is left,
    # and a model whose export could not finish in what is left is skipped, saying so.
    torch_t0=$(date +%s)
    torch_budget=${KVG_TORCH_BUDGET_S:-$t_tall}
    tcap() {                                    # tcap LIMIT: LIMIT, or what is left if less (>= 1)
        local left=$(( torch_budget - ($(date +%s) - torch_t0) ))
        [ "$left" -ge 1 ] || left=1
        [ "$left" -lt "$1" ] && echo "$left" || echo "$1"
    }
    tids=$(awk 'BEGIN { for (i = 0; i < 64; i++) printf "%s%d", (i ? " " : ""), 3 + (i * 37 + 11) % 500 }')
    torch_ok=0
    if ! command -v "$py" >/dev/null 2>&1; then
        torch_why="there is no $py"
        printf '{"available": false, "reason": "%s"}\n' "$torch_why" >"$W/torch-probe.json"
    elif torch_why=$("$py" "$tref" --probe --device "$tdev" --json "$W/torch-probe.json" 2>&1); then
        torch_ok=1
        echo "  PyTorch reference: $torch_why on $tdev"
    fi
    td=$(mktemp -d "${TMPDIR:-/tmp}/kvgate-torch-XXXXXX")
    for tag in $torch_models; do
        if [ "$tag" = stories260K ]; then
            tsrc=(--model "$models/stories260K/stories260K.bin" --tokenizer "$ttok")
        else
            tsrc=(--model "synthetic:$tag")
        fi
        if [ "$(tcap 30)" -lt 30 ]; then
            skip "torch-$tag" "the torch step's time budget is spent (KVG_TORCH_BUDGET_S=$torch_budget)"
            continue
        fi
        # kvgate's CPU logits (F32) beside: on stories260K (the logits step compares the 8B
        # shape's CPU and device logits already)
        tcpu=0
        [ "$tag" = stories260K ] && tcpu=1
        if [ $torch_ok = 1 ] || [ "$tag" = stories260K ]; then
            step "torch-export-$tag" "$(tcap "$t_texp")" "$W/torch-export-$tag.json" bash -c \
                'set -e; g=$1 p=$2 r=$3 f=$4 j=$5; shift 5; "$g" "$@" --export-llama2c "$f"; "$p" "$r" --check-export "$f" --json "$j"' \
                _ "$tgen" "$py" "$tref" "$td/$tag.bin" "$W/torch-export-$tag.json" "${tsrc[@]}"
            [ -s "$td/$tag.bin" ] && step "torch-kvgate-$tag" "$(tcap "$t_tkv")" "" bash -c \
                'set -e; g=$1 be=$2 d=$3 thr=$4 o=$5 cpu=$6; shift 6
                 "$g" "$@" --backend "$be" --device "$d" --prompt-logits "$o.kvgate.txt"
                 [ "$cpu" = 0 ] || "$g" "$@" --backend cpu --threads "$thr" --prompt-logits "$o.cpu.txt"' \
                _ "$tgen" "$tbe" "${KVG_DEVICE:-0}" "$threads" "$td/$tag" "$tcpu" --model "$td/$tag.bin" --tokenizer "$ttok" \
                --prompt-ids "$tids" --ids --max-tokens 0 --stop none
        fi
        # the mapping torch_ref.py gives transformers (permuted q/k rows, rotate_half, its
        # GQA grouping), in double precision without torch: tiny models only
        if [ "$tag" = stories260K ] && [ -s "$td/$tag.kvgate.txt" ] && [ -s "$td/$tag.cpu.txt" ]; then
            step "torch-mapping-$tag" "$(tcap "$t_texp")" "$W/torch-mapping-$tag.json" "$py" "$tref" --stdlib-forward "$td/$tag.bin" \
                --ids "$tids" --tol "${KVG_TORCH_TOL:-0.03}" --compare "kvgate-$tbe=$td/$tag.kvgate.txt" \
                --compare "kvgate-cpu=$td/$tag.cpu.txt" --json "$W/torch-mapping-$tag.json"
        fi
        if [ $torch_ok = 0 ]; then
            cp "$W/torch-probe.json" "$W/torch-$tag.json"
            skip "torch-$tag" "not available: $torch_why"
        elif [ ! -s "$td/$tag.kvgate.txt" ] || { [ $tcpu = 1 ] && [ ! -s "$td/$tag.cpu.txt" ]; }; then
            skip "torch-$tag" "no kvgate logits to compare with (torch-export-$tag or torch-kvgate-$tag failed)"
        else
            targs=(--model "$td/$tag.bin" --ids "$tids" --device "$tdev" --tol "${KVG_TORCH_TOL:-0.03}"
                   --logits-out "$td/$tag.torch.txt" --compare "kvgate-$tbe=$td/$tag.kvgate.txt"
                   --json "$W/torch-$tag.json")
            [ $tcpu = 0 ] || targs+=(--compare "kvgate-cpu=$td/$tag.cpu.txt")
            [ "$tag" = stories260K ] || targs+=(--bench-prefill 4096 --bench-decode 32 --bench-batches 1,32 --bench-ctx 4096)
            step "torch-$tag" "$(tcap "$t_torch")" "$W/torch-$tag.json" "$py" "$tref" "${targs[@]}"
        fi
        rm -f "$td/$tag".*
    done
    rm -rf "$td"
    # the bench's deadline counts from the run's start: the time spent here is not taken
    # from its figures (the run grows by this step's time, KVG_TORCH_BUDGET_S at most)
    [ -z "${bench_deadline:-}" ] || bench_deadline=$(( bench_deadline + $(date +%s) - torch_t0 ))
fi

# 3. invariance, on (must be exact) and off (counts reported; not a failure).
if want invariance; then
    for m in stories "$big"; do
        # tags name files: letters, digits, '.', '_' and '-' only
        if [ "$m" = stories ]; then margs=("${stories[@]}") tag=stories260K; else margs=(--model "$m") tag=${m#synthetic:}; fi
        step "invariance-on-$tag" "$t_inv" "$W/invariance-on-$tag.json" "$check" "${margs[@]}" "${dev[@]}" \
            --check invariance --batch-invariant on "${inv_args[@]}" --json "$W/invariance-on-$tag.json"
        step "invariance-off-$tag" "$t_inv" "$W/invariance-off-$tag.json" "$check" "${margs[@]}" "${dev[@]}" \
            --check invariance --batch-invariant off "${inv_args[@]}" --json "$W/invariance-off-$tag.json"
    done
    [ -z "$llama8" ] || step invariance-on-8B4L "$t_inv" "$W/invariance-on-8B4L.json" "$check" --model "$llama8" \
        "${dev[@]}" --check invariance --batch-invariant on "${inv_args[@]}" --json "$W/invariance-on-8B4L.json"
    # int8 KV (--kv-dtype int8, layers past the first int8): invariance exact, the logits
    # against the CPU backend's int8 pool within 0.06 (a K/V value whose BF16-path float
    # rounds to the other int8 level moves by its scale, max/127: up to 4x BF16's step;
    # emulated, stories260K measures 0.032)
    step int8-stories260K "$t_inv" "$W/int8-stories260K.json" "$check" "${stories[@]}" "${dev[@]}" \
        --check logits,invariance --kv-dtype int8 --kv-full-precision-layers 1 --tol 0.06 "${inv_args[@]}" \
        --json "$W/int8-stories260K.json"
fi

# 4. compute-sanitizer on a short run.
if want sanitizer; then
    san=$(command -v compute-sanitizer 2>/dev/null || true)
    for d in /usr/local/cuda/bin /usr/local/cuda-13/bin /opt/cuda/bin; do
        [ -n "$san" ] || { [ -x "$d/compute-sanitizer" ] && san=$d/compute-sanitizer; }
    done
    if [ "$emu" = 1 ]; then
        skip sanitizer "emulated run: compute-sanitizer needs a GPU"
    elif [ -z "$san" ]; then
        skip sanitizer "compute-sanitizer is not installed on this machine"
    else
        for tool in memcheck racecheck; do
            step "sanitizer-$tool" "$t_san" "" "$san" --tool "$tool" --error-exitcode 9 \
                "$check" "${stories[@]}" "${dev[@]}" --check invariance "${san_args[@]}"
        done
    fi
fi

# 5. the benchmark, one run per model (so one slow model does not cost the other's figures)
# and attention path: the own kernels (--batch-invariant both: on is invariant mode, which
# always runs them; off) and cuDNN's SDPA (off only), the same configuration side by side.
# KVGATE_CUDA_ATTENTION=cudnn makes a cuDNN without the paged SDPA op a startup error
# ("cuda: KVGATE_CUDA_ATTENTION=cudnn: <why>"): that step is "unsupported", not a failure.
# No bench step starts after bench_deadline seconds into the run, and each one's limit is
# cut to what is left of it.
bench_step() {                                  # bench_step NAME LIMIT ATTENTION ARGS...
    local name=$1 limit=$2 left
    step_attn=$3
    shift 3
    left=$(( bench_deadline - ($(date +%s) - start_all) ))
    if [ "$left" -lt 10 ]; then
        skip "$name" "the run's time budget is spent (KVG_BENCH_DEADLINE_S=$bench_deadline)"
    else
        [ "$left" -ge "$limit" ] || limit=$left
        step "$name" "$limit" "$W/$name.json" env KVGATE_CUDA_ATTENTION="$step_attn" "$@" --json "$W/$name.json"
    fi
    step_attn=
}
# 4b. the KV host tier (tiers_gpu_bench): TTFT of one prompt recomputed, from the device
# pool, and from pinned host memory after another prompt filled the pool (the prefix cache
# evicting the blocks into the host tier, as the engine's --kv-host-memory does), plus the
# H2D copies alone; batch-invariant, the host hit's logits equal to the recompute's bit for
# bit or the step fails. These run before the bench steps, under their deadline, which moves
# by the time they took (as after the torch step), so the bench's figures keep their time.
# The CPU backend has no host tier (its pool is in host memory): skipped there.
if want tiers; then
    tiers_t0=$(date +%s)
    for run in "${tiers_runs[@]}"; do
        if [ "${KVG_BACKEND:-cuda}" != cuda ]; then
            skip "tiers-${run%%:*}" "the ${KVG_BACKEND} backend has no host tier"
            continue
        fi
        # shellcheck disable=SC2086 # the words of one run
        bench_step "tiers-${run%%:*}" "$t_tiers" own "$tiers" "${dev[@]}" ${run#*:}
    done
    bench_deadline=$(( bench_deadline + $(date +%s) - tiers_t0 ))
fi

if want bench; then
    i=0
    for args in "${bench_runs[@]}"; do
        # shellcheck disable=SC2086 # the words of one bench run
        bench_step "bench-$i-own" "$t_bench" own "$bench" "${dev[@]}" $args --batch-invariant both
        unsup_re='KVGATE_CUDA_ATTENTION=cudnn:'
        # shellcheck disable=SC2086
        bench_step "bench-$i-cudnn" "$t_bench_cudnn" cudnn "$bench" "${dev[@]}" $args --batch-invariant off
        unsup_re=
        i=$((i + 1))
    done
fi

# 6. the model families: FAMILY:TOL, TOL the logits tolerance as a share of the largest
# logit: about twice what the emulated backend measures with these arguments (seed 3's
# prompt, 100 ids and 4 decode steps: llama 0.0065, qwen2 0.034, qwen3 0.020, qwen3moe
# 0.029, gemma2 0.024, gemma3 0.067, phi3 0.037, mistral3 0.030, gpt-oss 0.049; the
# synthetic files amplify rounding on purpose, and a MoE router near a tie can pick
# another expert under BF16: qwen3moe with seed 1's prompt is 0.13 apart). The files go
# to a scratch folder, not $OUT.
if want families; then
    if [ ! -x "$synth" ] || [ ! -f "$vocab" ]; then
        skip families "no $synth or $vocab"
    else
        fam_dir=$(mktemp -d "${TMPDIR:-/tmp}/kvgate-families-XXXXXX")
        for spec in $fam_list; do
            fam=${spec%%:*} tol=${spec#*:}
            f=$fam_dir/$fam.gguf
            if ! "$synth" --arch "$fam" --shape tiny --dtype f32 --vocab "$vocab" --out "$f" >"$W/synth-$fam.log" 2>&1; then
                names+=("family-$fam") statuses+=(fail) secs+=(0)
                failed=1
                echo "family-$fam: synth_gguf failed: $(tail -1 "$W/synth-$fam.log")"
                continue
            fi
            step "family-$fam" "$t_fam" "$W/family-$fam.json" "$check" --model "$f" "${dev[@]}" \
                --check logits,invariance --tol "$tol" "${fam_args[@]}" --json "$W/family-$fam.json"
            rm -f "$f"
        done
        rm -rf "$fam_dir"
    fi
fi

total=$(( $(date +%s) - start_all ))
write_results
if command -v python3 >/dev/null 2>&1 && ! python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$OUT/results.json"; then
    echo "results.json is not valid JSON (a tool's output was cut short?)" >&2
    failed=1
fi


if want bench; then
    echo
    for k in "${!names[@]}"; do
        case ${names[$k]} in
        bench-*)
            echo "== ${names[$k]}: attention ${attns[$k]:-?}, ${statuses[$k]}$([ "${attns[$k]:-}" = own ] &&
                echo " (batch-invariant on: invariant mode; off: the own kernels)")"
            if [ "${statuses[$k]}" = unsupported ]; then
                grep -m1 -- 'KVGATE_CUDA_ATTENTION=cudnn:' "$W/${names[$k]}.log" | sed 's/^/  /'
            else
                sed -n '/^[a-z].*(.*params/,$p' "$W/${names[$k]}.log"
            fi
            ;;
        esac
    done
fi
if [ "${KVG_KEEP_STEPS:-0}" != 1 ]; then
    tar czf "$OUT/steps.tar.gz" -C "$OUT" steps && rm -rf "$W"
fi
echo
unsupported=$(for k in "${!names[@]}"; do [ "${statuses[$k]}" = unsupported ] && echo "${names[$k]}"; done | tr '\n' ' ')
echo "$([ $failed = 0 ] && echo "ALL PASSED" || echo "FAILED"): ${#names[@]} steps in ${total}s${unsupported:+ (unsupported here: ${unsupported% })}; results in $OUT/results.json"
exit $failed
