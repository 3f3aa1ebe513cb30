#!/usr/bin/env bash
# Run every fuzz target for SECONDS each (default 60), seeded with the repository's own inputs.
# A crash fails the run and its input is copied into fuzz/regressions/<target>/, where the
# regression tests replay it on every `cargo test` from then on.
#
#   fuzz/run.sh 600       # while developing: ten minutes each
#
# FUZZ_TARGET_DIR puts the build elsewhere than fuzz/target, to keep it between clones (a cold
# build of the targets and their dependencies takes about 7 minutes on 2 cores).
#
# Needs cargo-fuzz (cargo install cargo-fuzz). It uses nightly-only compiler flags; on a stable
# toolchain RUSTC_BOOTSTRAP=1 lets it pass them.
set -euo pipefail
cd "$(dirname "$0")"
seconds="${1:-60}"
export RUSTC_BOOTSTRAP=1
# Seeds: the example manifests, and every regression input of each target.
mkdir -p corpus/manifest corpus/topology_document corpus/frame corpus/control_request
cp ../manifests/examples/*.yaml corpus/manifest/
for target in frame topology_document manifest control_request; do
    cp regressions/"$target"/* corpus/"$target"/ 2>/dev/null || true
done
target_dir="${FUZZ_TARGET_DIR:-target}"
cargo fuzz build --dev --sanitizer none --target-dir "$target_dir"
status=0
for target in frame topology_document manifest control_request; do
    echo "::: fuzz $target for ${seconds}s"
    if ! cargo fuzz run --dev --sanitizer none --target-dir "$target_dir" "$target" -- -max_total_time="$seconds" -max_len=65536 \
        -print_final_stats=1 2>&1 | grep -E '^(Done|stat::number_of_executed_units|==|SUMMARY|thread|panicked)|crash-|ERROR'; then
        :
    fi
    # crash-, oom-, timeout-, leak-: anything libFuzzer kept is a failure.
    if ls artifacts/"$target"/* >/dev/null 2>&1; then
        for crash in artifacts/"$target"/*; do
            cp "$crash" regressions/"$target"/
            echo "fuzz: $target crashed on $crash (kept in fuzz/regressions/$target/)" >&2
        done
        status=1
    fi
done
exit $status
