#!/usr/bin/env bash
# Runs each libFuzzer target for a bounded time and prints one summary line per
# target. Usage: run-fuzzers.sh SECONDS FUZZER...
# Corpora persist in build/fuzz/corpus-NAME (seeded from fuzz/seeds/NAME when present);
# crash reproducers are written to build/fuzz/. Exits non-zero if any target crashed.
set -uo pipefail
secs=$1; shift
export KVGATE_SHARED=${KVGATE_SHARED:-$(cd "$(dirname "$0")/../.." && pwd)/shared}
status=0
for f in "$@"; do
    name=$(basename "$f")
    dir=$(dirname "$f")
    corpus="$dir/corpus-$name"
    mkdir -p "$corpus"
    seeds=()
    [ -d "fuzz/seeds/$name" ] && seeds=("fuzz/seeds/$name")
    # The real vocabulary files are good seeds for the loader, but they live in
    # ../shared and are never copied into the repository: seed from a build copy.
    if [ "$name" = fuzz_tokenizer_load ]; then
        extra="$dir/seeds-shared-$name"
        mkdir -p "$extra"
        cp -f "$KVGATE_SHARED/models/stories260K/tok512.bin" "$extra/" 2>/dev/null || true
        seeds+=("$extra")
    fi
    log="$dir/$name.log"
    if "$f" -max_total_time="$secs" -rss_limit_mb=2048 -artifact_prefix="$dir/$name-" \
            -print_final_stats=1 "$corpus" "${seeds[@]}" >"$log" 2>&1; then
        execs=$(grep -m1 '^stat::number_of_executed_units' "$log" | awk '{print $2}')
        cov=$(grep -E '^#[0-9]+' "$log" | tail -1 | grep -o 'cov: [0-9]*')
        printf '%-28s ok      %10s execs in %ss  %s\n' "$name" "${execs:-?}" "$secs" "$cov"
    else
        printf '%-28s CRASHED (see %s)\n' "$name" "$log"
        grep -m5 -E 'ERROR|SUMMARY|Test unit written' "$log" | sed 's/^/    /'
        status=1
    fi
done
exit $status
