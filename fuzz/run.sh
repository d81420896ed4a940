#!/usr/bin/env bash
# Runs every fuzz target for a bounded time (cargo fuzz, nightly).
#
#   fuzz/run.sh SECONDS_PER_TARGET [target ...]
#   fuzz/run.sh build        only build the targets (CI builds them in the
#                            background while other steps run)
#
# Each target starts from its checked-in seeds (fuzz/seeds/<target>, from
# real client traffic: see record-corpus.sh and derive_seeds.rs) plus what
# earlier runs on this machine found (target/fuzz-corpus/<target>), and
# first replays its regression inputs (fuzz/regressions/<target>: inputs
# that once crashed it). A crash, a leak of the RSS limit or a timeout
# fails the run and names the input; copy it into fuzz/regressions/<target>
# once fixed. SANITIZER=address builds with ASan (slower to build and run);
# the default is none: Rust's checks catch what we look for (panics,
# aborts, unbounded allocation, hangs).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
secs=${1:?usage: fuzz/run.sh SECONDS [target ...] | fuzz/run.sh build}
shift
targets=${*:-request batch consumer_protocol storage_files rest_body sasl peer_response}
sanitizer=${SANITIZER:-none}
cd "$here"
mkdir -p "$here/target"
build_log=$here/target/fuzz-build.log
if cargo +nightly fuzz build -O -a -s "$sanitizer" >"$build_log" 2>&1; then
    tail -1 "$build_log"
else
    echo "fuzz: the build failed; the end of its output:"
    tail -60 "$build_log"
    exit 1
fi
[ "$secs" != build ] || exit 0
failed=0
for t in $targets; do
    corpus=$here/target/fuzz-corpus/$t
    mkdir -p "$corpus" "$here/regressions/$t"
    cp -n "$here/seeds/$t"/* "$corpus/" 2>/dev/null || true
    if [ -n "$(ls -A "$here/regressions/$t")" ]; then
        cargo +nightly fuzz run -O -a -s "$sanitizer" "$t" "$here/regressions/$t" -- -runs=0 || { echo "fuzz: $t: a regression input fails again"; failed=1; }
    fi
    log=$here/target/fuzz-$t.log
    started=$here/target/fuzz-$t.started
    touch "$started"
    if cargo +nightly fuzz run -O -a -s "$sanitizer" "$t" "$corpus" -- -max_total_time="$secs" -rss_limit_mb=2048 -timeout=20 -print_final_stats=1 >"$log" 2>&1; then
        runs=$(grep -Eo 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -Eo '[0-9]+$' || echo '?')
        cov=$(grep -Eo 'cov: [0-9]+' "$log" | tail -1 || true)
        echo "fuzz: $t: ${secs}s, $runs runs, $cov, corpus $(ls "$corpus" | wc -l), no crash"
    else
        echo "fuzz: $t: FAILED; the input is in $here/artifacts/$t. The end of the run's output:"
        tail -40 "$log"
        # The input itself, so that a failure on a machine that is gone
        # can be replayed: base64 -d >fuzz/regressions/$t/crash.
        find "$here/artifacts/$t" -type f -newer "$started" 2>/dev/null | head -3 | while read -r a; do
            echo "fuzz: $t: $(basename "$a"), $(stat -c %s "$a") bytes, base64:"
            head -c 65536 "$a" | base64 -w 100
        done
        failed=1
    fi
done
exit $failed
