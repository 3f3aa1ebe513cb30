#!/usr/bin/env bash
# Where a member's time goes, with and without overlap: `murmur run` of the D-Cliques examples
# (10 processes on this machine's cores) as they are, and with `algorithm.overlap: true`:
#   - per-step: manifests/examples/dcliques-spot-cpu.yaml (clique averaging every step), whose
#     overlapped rounds travel while the step's gradient computes;
#   - outer: manifests/examples/dcliques-outer-cpu.yaml (outer steps every 8, int4), overlapped
#     by 1 local step (the default) and by a whole round (overlapSteps 8).
# Each trainer logs, when done, the seconds it trained and the seconds it waited for peers'
# payloads (the exchange it did not hide). One line per run: wall seconds, mean trained and
# waited seconds per member, the waited share, final mean accuracy and bytes sent. RUNS (default
# 3) runs of each. About 4 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS=${RUNS:-3}
cargo build --release --quiet -p murmur -p murmur-trainer
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# name manifest [jq edit of the manifest as JSON]
one() {
    local name=$1 manifest=$2 edit=${3:-.} started wall
    # murmur reads YAML, and JSON is YAML: the edit is applied with jq.
    python3 -c 'import json, sys, yaml; print(json.dumps(yaml.safe_load(open(sys.argv[1]))))' "$manifest" |
        jq "$edit" > "$work/$name.yaml"
    rm -rf "${work:?}/$name"
    started=$(date +%s.%N)
    target/release/murmur run "$work/$name.yaml" --output "$work/$name" > "$work/$name.out" 2>&1
    wall=$(python3 -c "print(f'{$(date +%s.%N) - $started:.1f}')")
    cat "$work/$name"/logs/member-*.log | jq -c 'select(.fields.message == "done") | .fields' |
        python3 -c '
import json, sys
name, wall, summary = sys.argv[1], sys.argv[2], json.load(open(sys.argv[3]))
done = [json.loads(l) for l in sys.stdin]
trained = sum(d["trained_seconds"] for d in done) / len(done)
waited = sum(d["waited_seconds"] for d in done) / len(done)
accuracy = sum(d["accuracy"] for d in done) / len(done)
megabytes = summary["bytesExchanged"] / 1e6
print(f"{name:<22} wall {wall:>5} s  trained {trained:5.2f} s  waited {waited:5.2f} s "
      f"({100 * waited / trained:4.1f}%)  accuracy {100 * accuracy:.2f}%  "
      f"{megabytes:.1f} MB")
' "$name" "$wall" "$work/$name/summary.json"
}

for _ in $(seq "$RUNS"); do
    one "per-step" manifests/examples/dcliques-spot-cpu.yaml
    one "per-step overlapped" manifests/examples/dcliques-spot-cpu.yaml '.spec.algorithm.overlap = true'
    one "outer" manifests/examples/dcliques-outer-cpu.yaml
    one "outer overlapped 1" manifests/examples/dcliques-outer-cpu.yaml '.spec.algorithm.overlap = true'
    one "outer overlapped 8" manifests/examples/dcliques-outer-cpu.yaml \
        '.spec.algorithm.overlap = true | .spec.algorithm.outer.overlapSteps = 8'
done
