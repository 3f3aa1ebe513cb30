#!/usr/bin/env bash
# Time and bytes to a target accuracy, and final accuracy, for the D-Cliques example's job (MLP,
# the embedded MNIST sample, 10 processes, two classes each, batch 32, SGD lr 0.05 momentum 0.9,
# 400 steps) trained five ways on the same cores:
#   - murmur per-step: `murmur run` of manifests/examples/dcliques-spot-cpu.yaml;
#   - murmur outer, int4: manifests/examples/dcliques-outer-cpu.yaml (outer steps every 8);
#   - murmur outer, none: the same, uncompressed;
#   - murmur outer, int4, under chaos: one member SIGKILLed CHAOS_AT_MS into the run (default
#     1000; the calm run reaches the target after 1.7-2.4 s of its 4-5), CHAOS_RUNS times
#     (default 5, a different member each time), interleaved with as many calm runs. One run's
#     seconds to the target move by up to a third from one run to the next on 2 cores, more
#     than a kill costs, so `time_to_target_chaos_vs_calm` compares the medians.
#     `steps_to_target_chaos_vs_calm` is the same ratio in steps, which timing noise does not
#     move; `chaos_kills_before_target` says how many kills came before each chaos run reached
#     the target (a later one costs nothing);
#   - PyTorch DDP (torchrun, gloo) and torchft's DiLoCo (sync every 8, Nesterov outer step lr 0.7
#     momentum 0.9): trainer/bench/peers_torch.py.
# Time is from launch to the first evaluation at which the members' mean accuracy reaches
# TARGET (default 0.90). Every run evaluates every EVAL_EVERY steps (default 8: the outer runs'
# localSteps and DiLoCo's sync period. An outer member evaluates its anchor, which changes only at
# an outer step, so at a cadence that is not a multiple of 8 it reports an anchor up to 7 steps
# old at a later step's time). Bytes are what the loopback interface sent during the run (every
# process talks over it, frames and TCP headers included), prorated to that step. One line per
# run, then key=value figures. Needs python3 with torch, mlxtend and torchft (pip install torch
# mlxtend torchft); PYTHON names another interpreter. About 4.5 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/../.."
TARGET=${TARGET:-0.90}
CHAOS_AT_MS=${CHAOS_AT_MS:-1000}
CHAOS_RUNS=${CHAOS_RUNS:-5}
EVAL_EVERY=${EVAL_EVERY:-8}
PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c 'import torch, mlxtend, torchft' 2>/dev/null; then
    echo "$PYTHON lacks torch, mlxtend or torchft: pip install torch mlxtend torchft" >&2
    exit 3
fi
cargo build --release --quiet -p murmur -p murmur-trainer
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
lo_sent() { awk '$1 == "lo:" {print $10}' /proc/net/dev; }
now() { date +%s.%N; }

# Prints: name|seconds to target|fraction of the steps at target|final accuracy|bytes|wall.
# Reads `step seconds accuracy` lines (any member, any order) on stdin.
judge() {
    "$PYTHON" -c '
import sys, collections
name, target, total_bytes, wall = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
by = collections.defaultdict(list)
for line in sys.stdin:
    step, seconds, acc = line.split()
    by[int(step)].append((float(seconds), float(acc)))
steps = sorted(by)
last = steps[-1]
final = sum(a for _, a in by[last]) / len(by[last])
hit = next((s for s in steps if sum(a for _, a in by[s]) / len(by[s]) >= target), None)
if hit is None:
    print(f"{name}|nan|nan|{final:.4f}|{total_bytes}|{wall:.2f}")
else:
    seconds = max(t for t, _ in by[hit])
    print(f"{name}|{seconds:.2f}|{hit / last:.4f}|{final:.4f}|{total_bytes}|{wall:.2f}")
' "$@"
}

murmur_run() { # name manifest [murmur run flags]
    local name=$1 manifest=$2
    shift 2
    local before started
    before=$(lo_sent)
    started=$(now)
    target/release/murmur run "$manifest" --output "$work/$name" --eval-every "$EVAL_EVERY" "$@" \
        > "$work/$name.out" 2>&1
    echo "$name: $(grep -o 'preemptions survived.*' "$work/$name.out")" >&2
    local sent=$(($(lo_sent) - before)) wall
    wall=$("$PYTHON" -c "print($(now) - $started)")
    # Evaluations every EVAL_EVERY steps, one line per member and attempt. A status posted at
    # such a step before its evaluation carries the one before (the CSV's accuracy is the
    # member's latest), so the last row of a member's step is its evaluation.
    awk -F, -v every="$EVAL_EVERY" 'NR > 1 && $6 != "" && $4 % every == 0 {row[$2 "," $3 "," $4] = $4 " " $1 " " $6}
        END {for (k in row) print row[k]}' "$work/$name/metrics.csv" |
        judge "$name" "$TARGET" "$sent" "$wall"
}

torch_run() { # name mode
    local name=$1 mode=$2 before
    mkdir -p "$work/$name"
    before=$(lo_sent)
    export MURMUR_BENCH_T0
    MURMUR_BENCH_T0=$(now)
    if [ "$mode" = ddp ]; then
        "$PYTHON" -m torch.distributed.run --standalone --nproc-per-node 10 \
            trainer/bench/peers_torch.py ddp "$work/$name" --eval-every "$EVAL_EVERY" \
            > "$work/$name.out" 2>&1
    else
        "$PYTHON" trainer/bench/peers_torch.py lighthouse "$work" --members 10 \
            > "$work/lighthouse" 2> "$work/lighthouse.log" &
        local lighthouse=$!
        while ! [ -s "$work/lighthouse" ]; do sleep 0.1; done
        local pids=()
        for rank in $(seq 0 9); do
            "$PYTHON" trainer/bench/peers_torch.py diloco --rank "$rank" --members 10 \
                --eval-every "$EVAL_EVERY" \
                --lighthouse "$(head -1 "$work/lighthouse")" "$work/$name" \
                > "$work/$name.$rank.out" 2>&1 &
            pids+=($!)
        done
        wait "${pids[@]}"
        kill "$lighthouse"
    fi
    local sent=$(($(lo_sent) - before)) wall
    wall=$("$PYTHON" -c "print($(now) - $MURMUR_BENCH_T0)")
    cat "$work/$name"/rank-*.jsonl |
        "$PYTHON" -c 'import sys, json
for l in sys.stdin:
    d = json.loads(l); print(d["step"], d["seconds"], d["accuracy"])' |
        judge "$name" "$TARGET" "$sent" "$wall"
}

sed 's/compression: {kind: int4}/compression: {kind: none}/' \
    manifests/examples/dcliques-outer-cpu.yaml > "$work/outer-none.yaml"
results=$work/results
{
    murmur_run per-step manifests/examples/dcliques-spot-cpu.yaml
    murmur_run outer-int4 manifests/examples/dcliques-outer-cpu.yaml
    murmur_run outer-none "$work/outer-none.yaml"
    for k in $(seq 1 "$CHAOS_RUNS"); do
        # One strike: at CHAOS_AT_MS, and none in the half interval after it.
        murmur_run "outer-int4-chaos-$k" manifests/examples/dcliques-outer-cpu.yaml \
            --chaos preempt --every "${CHAOS_AT_MS}ms" --for "$((CHAOS_AT_MS * 3 / 2))ms" \
            --kill --chaos-seed "$k"
        if ((k < CHAOS_RUNS)); then
            murmur_run "outer-int4-calm-$((k + 1))" manifests/examples/dcliques-outer-cpu.yaml
        fi
    done
    torch_run ddp ddp
    torch_run diloco diloco
} > "$results"
"$PYTHON" - "$results" "$TARGET" <<'EOF'
import math, sys
print(f"{'run':<18} {'wall s':>8} {'s to ' + sys.argv[2]:>10} {'at fraction':>12} {'final':>8} {'MB sent':>10} {'MB to target':>13}")
for line in open(sys.argv[1]):
    name, seconds, fraction, final, sent, wall = line.strip().split("|")
    f = float(fraction)
    to = "n/a" if math.isnan(f) else f"{int(sent) * f / 1e6:.1f}"
    print(f"{name:<18} {float(wall):8.1f} {seconds:>10} {fraction:>12} {100 * float(final):7.2f}% {int(sent) / 1e6:10.1f} {to:>13}")
EOF
"$PYTHON" - "$results" "$work" <<'EOF'
import json, math, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    name, seconds, fraction, final, sent, wall = line.strip().split("|")
    runs[name] = dict(seconds=float(seconds), fraction=float(fraction), final=float(final),
                      bytes=int(sent), wall=float(wall))
def to_target(r):
    return r["bytes"] * r["fraction"]
def ratio(a, b):
    return "nan" if math.isnan(a) or math.isnan(b) or b == 0 else f"{a / b:.3f}"
step, outer = runs["per-step"], runs["outer-int4"]
calm = [r for name, r in runs.items() if name == "outer-int4" or name.startswith("outer-int4-calm-")]
chaos = {name: r for name, r in runs.items() if name.startswith("outer-int4-chaos-")}
def median(rs, key):
    values = [r[key] for r in rs]
    return math.nan if any(math.isnan(v) for v in values) else statistics.median(values)
print(f"bytes_outer_vs_per_step={ratio(outer['bytes'], step['bytes'])}")
print(f"accuracy_outer_minus_per_step={100 * (outer['final'] - step['final']):.2f}")
print(f"wall_outer_vs_per_step={ratio(outer['wall'], step['wall'])}")
print(f"time_to_target_outer_vs_per_step={ratio(outer['seconds'], step['seconds'])}")
print(f"time_to_target_vs_ddp={ratio(outer['seconds'], runs['ddp']['seconds'])}")
print(f"bytes_to_target_vs_diloco_peer={ratio(to_target(outer), to_target(runs['diloco']))}")
# Medians of the interleaved calm and chaos runs (a chaos run that never reached the target
# makes it nan).
print(f"time_to_target_chaos_vs_calm={ratio(median(chaos.values(), 'seconds'), median(calm, 'seconds'))}")
# The same in steps: what the kills cost in training, without the runs' timing noise.
print(f"steps_to_target_chaos_vs_calm={ratio(median(chaos.values(), 'fraction'), median(calm, 'fraction'))}")
# A kill after a chaos run reached the target costs it nothing: say how many came before, per run.
before = []
for name, r in sorted(chaos.items()):
    kills = [e["atSeconds"] for e in json.load(open(f"{sys.argv[2]}/{name}/events.json"))
             if e["reason"] == "Chaos"]
    before.append(f"{sum(t < r['seconds'] for t in kills)}/{len(kills)}")
print(f"chaos_kills_before_target={','.join(before)}   (per chaos run: before/all)")
EOF
