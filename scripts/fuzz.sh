#!/usr/bin/env bash
# Run binval's cargo-fuzz targets one after the other, each for SECONDS (default 600), and
# report per target: executions, executions/s, coverage (cov / ft), corpus size and crashes.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]     targets: binlog_file binlog_events
#                                             invalidation_message config (default: all)
#
# Needs a nightly toolchain (`rustup toolchain install nightly`); installs cargo-fuzz if it is
# missing. Seed corpora are built from ../shared/binlogs/mysql-test (whole files for
# binlog_file, cut into FORMAT_DESCRIPTION + 8 events for binlog_events: the cut of
# binval::fuzzing::binlog_event_seeds, written by examples/fuzz_seeds.rs), config/*.toml and
# fuzz/seeds/invalidation_message/.
# Everything the runs write stays under .state/fuzz/ (git-ignored): corpus/<target>/ (kept
# from run to run), artifacts/<target>/ (crash inputs), logs/<target>.log, summary.txt.
# One process per target (no -jobs/-workers); libFuzzer's -rss_limit_mb=2048 flags an input
# that makes binval allocate beyond it. Exit status 1 when any target found a crash: copy
# the input to fuzz/regressions/<target>/, fix, and check with `cargo test --test fuzz_corpus`.
# Env: FUZZ_SANITIZER (default address), FUZZ_BINLOGS (seed binlog folder), CARGO_TARGET_DIR.
set -euo pipefail

cd "$(dirname "$0")/.."
root=$PWD
secs=${1:-600}
[ $# -gt 0 ] && shift
all=(binlog_file binlog_events invalidation_message config)
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=("${all[@]}")
for t in "${targets[@]}"; do
    [[ " ${all[*]} " == *" $t "* ]] || { echo "unknown target $t (one of: ${all[*]})" >&2; exit 2; }
done
state=$root/.state/fuzz
binlogs=${FUZZ_BINLOGS:-$root/../shared/binlogs/mysql-test}
sanitizer=${FUZZ_SANITIZER:-address}

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "== installing cargo-fuzz"
    cargo install cargo-fuzz --locked
fi

echo "== seed corpora in $state/seeds"
mkdir -p "$state/logs"
# The cut of binval::fuzzing::binlog_event_seeds, which tests/fuzz_corpus.rs replays.
cargo run --quiet --locked --example fuzz_seeds -- "$state/seeds" "$binlogs" "$root"

echo "== building the targets (nightly, sanitizer $sanitizer)"
cargo +nightly fuzz build --fuzz-dir fuzz -s "$sanitizer"

summary=$state/summary.txt
printf '%-22s %10s %8s %14s %7s %8s  %s\n' target execs exec/s cov/ft corpus crashes seconds >"$summary"
failed=0
for t in "${targets[@]}"; do
    echo "== $t for ${secs}s"
    mkdir -p "$state/corpus/$t" "$state/artifacts/$t"
    log=$state/logs/$t.log
    before=$(ls "$state/artifacts/$t" | wc -l)
    start=$(date +%s)
    status=0
    cargo +nightly fuzz run --fuzz-dir fuzz -s "$sanitizer" "$t" "$state/corpus/$t" "$state/seeds/$t" -- \
        -max_total_time="$secs" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
        -artifact_prefix="$state/artifacts/$t/" >"$log" 2>&1 || status=$?
    took=$(( $(date +%s) - start ))
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
    last=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
    cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
    ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
    corpus=$(sed -n 's/.* corp: \([0-9]*\/[0-9a-zA-Z]*\).*/\1/p' <<<"$last")
    crashes=$(( $(ls "$state/artifacts/$t" | wc -l) - before ))
    if [ "$status" -ne 0 ] && [ "$crashes" -eq 0 ]; then crashes=1; fi
    printf '%-22s %10s %8s %14s %7s %8s  %s\n' "$t" "${execs:-?}" "${rate:-?}" "${cov:-?}/${ft:-?}" "$corpus" "$crashes" "$took" | tee -a "$summary"
    if [ "$crashes" -ne 0 ]; then
        failed=1
        echo "   crash: see $log and $state/artifacts/$t/" >&2
        grep -m1 -A12 -E 'panicked|ERROR: libFuzzer|ERROR: AddressSanitizer' "$log" >&2 || tail -20 "$log" >&2
    fi
done
echo "== summary ($summary)"
cat "$summary"
exit $failed
