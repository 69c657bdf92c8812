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
# binval::fuzzing::binlog_event_seeds), config/*.toml and fuzz/seeds/invalidation_message/.
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
rm -rf "$state/seeds"
mkdir -p "$state/seeds" "$state/logs"
python3 - "$state/seeds" "$binlogs" "$root" <<'PY'
import os, shutil, sys
seeds, binlogs, root = sys.argv[1:4]
EVENTS_PER_SEED = 8  # binval::fuzzing::EVENTS_PER_SEED
for t in ("binlog_file", "binlog_events", "invalidation_message", "config"):
    os.makedirs(os.path.join(seeds, t), exist_ok=True)
names = sorted(os.listdir(binlogs)) if os.path.isdir(binlogs) else []
for name in names:
    data = open(os.path.join(binlogs, name), "rb").read()
    shutil.copy(os.path.join(binlogs, name), os.path.join(seeds, "binlog_file", name))
    if not data.startswith(b"\xfebin"):
        continue
    events, rest = [], data[4:]
    while len(rest) >= 19:
        size = int.from_bytes(rest[9:13], "little")
        if size < 19 or size > len(rest):
            break
        events.append(rest[:size])
        rest = rest[size:]
    if not events:
        continue
    fde, others = events[0], events[1:]
    for i in range(0, len(others), EVENTS_PER_SEED):
        seed = b"\x00" + fde + b"".join(others[i:i + EVENTS_PER_SEED])
        open(os.path.join(seeds, "binlog_events", f"{name}.{i // EVENTS_PER_SEED:04}"), "wb").write(seed)
for name in sorted(os.listdir(os.path.join(root, "config"))):
    shutil.copy(os.path.join(root, "config", name), os.path.join(seeds, "config", name))
msgs = os.path.join(root, "fuzz", "seeds", "invalidation_message")
for name in sorted(os.listdir(msgs)):
    shutil.copy(os.path.join(msgs, name), os.path.join(seeds, "invalidation_message", name))
# Committed crash inputs seed their own target too.
for t in os.listdir(seeds):
    reg = os.path.join(root, "fuzz", "regressions", t)
    for name in sorted(os.listdir(reg)) if os.path.isdir(reg) else []:
        if name not in ("README.md", ".gitkeep"):
            shutil.copy(os.path.join(reg, name), os.path.join(seeds, t, "regression-" + name))
for t in sorted(os.listdir(seeds)):
    print(f"   {t}: {len(os.listdir(os.path.join(seeds, t)))} seeds")
PY

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
