#!/usr/bin/env bash
# Reproduce the rows of docs/claims.md: `bash docs/claims/reproduce.sh [ROW...]` with ROW one of
# dcliques, straggler, one-peer, compression (default: all). Each row writes its curves.csv,
# results.json and accuracy.png under docs/claims/ROW/ and prints the figures the table quotes.
# Every command is a `murmur-trainer simulate` with explicit settings; each row takes under 10
# minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release -q -p murmur-trainer
sim=./target/release/murmur-trainer
out=docs/claims

dcliques() {
    # Bellet et al. 2022: D-Cliques (10% of the edges) matches fully connected on 1-class shards.
    $sim simulate --members 100 --topology dcliques,fully-connected,ring \
        --partition classes-per-member:1 --model logistic --steps 500 --seed 1 \
        --output $out/dcliques
}

straggler() {
    # One member (5) 4x slower; time (in steps of a full-speed member) until the mean test
    # accuracy reaches 85%, all members / full-speed members.
    local common=(--members 16 --partition classes-per-member:2 --model mlp --batch-size 32
        --learning-rate 0.05 --momentum 0.9 --eval-every 10 --target-accuracy 0.85)
    for slow in none 5:4; do
        local flag=()
        [ "$slow" = none ] || flag=(--slow "$slow")
        for run in "exponential dpsgd" "exponential gossip" "exponential async-gossip" \
            "exponential-one-peer dpsgd"; do
            set -- $run
            echo "== $1 $2, slow: $slow"
            $sim simulate "${common[@]}" --steps 600 --seed 7 "${flag[@]}" \
                --topology "$1" --algorithm "$2" \
                --output "$out/straggler/$1-$2-slow-${slow/:/x}" | grep -A1 '^topology'
        done
    done
    local d=$out/straggler
    $sim plot -o $d/time-to-accuracy.png "D-PSGD=$d/exponential-dpsgd-slow-5x4/results.json" \
        "gossip=$d/exponential-gossip-slow-5x4/results.json" \
        "async gossip=$d/exponential-async-gossip-slow-5x4/results.json" \
        "one-peer=$d/exponential-one-peer-dpsgd-slow-5x4/results.json" \
        "async gossip, nobody slow=$d/exponential-async-gossip-slow-none/results.json"
    # Seed to seed, async gossip alone, 250 steps: the full-speed members' time to 85% with
    # nobody slow, with member 5 at 4x, and with member 5 at 1.001x (no real slowness, but the
    # same change in the order of events), and the totals over the seeds.
    local totals=(0 0 0)
    for seed in $(seq 7 22); do
        local line="seed $seed:"
        local k=0
        for slow in none 5:4 5:1.001; do
            local flag=()
            [ "$slow" = none ] || flag=(--slow "$slow")
            local t
            t=$($sim simulate "${common[@]}" --steps 250 --seed "$seed" "${flag[@]}" \
                --topology exponential --algorithm async-gossip | tail -1 | awk '{print $NF}')
            t=${t#*/}
            [[ $t =~ ^[0-9]+$ ]] || { echo "seed $seed, slow $slow: 85% not reached"; exit 1; }
            line="$line $slow $t"
            totals[k]=$((totals[k] + t))
            k=$((k + 1))
        done
        echo "$line"
    done
    echo "total over seeds 7-22: none ${totals[0]}, 5:4 ${totals[1]}, 5:1.001 ${totals[2]}"
}

one_peer() {
    # Ying et al. 2021: one peer per round at distance 2^k against the static exponential graph.
    for n in 16 32; do
        $sim simulate --members $n --topology exponential,exponential-one-peer \
            --algorithm dpsgd --partition classes-per-member:2 --model mlp --batch-size 32 \
            --learning-rate 0.05 --momentum 0.9 --steps 600 --eval-every 50 --seed 7 \
            --output $out/one-peer/$n
    done
    # The hypothesis for the gap: label skew. The same 16 members on IID shards.
    $sim simulate --members 16 --topology exponential,exponential-one-peer \
        --algorithm dpsgd --partition iid --model mlp --batch-size 32 \
        --learning-rate 0.05 --momentum 0.9 --steps 600 --eval-every 50 --seed 7 \
        --output $out/one-peer/16-iid
}

compression() {
    # Low-precision (int8) and top-k 1% with error feedback on non-IID D-Cliques.
    for c in none int8 top-k:0.01 top-k:0.05; do
        echo "== $c"
        $sim simulate --members 10 --topology dcliques --clique-size 5 --inter-clique ring \
            --model mlp --partition classes-per-member:2 --batch-size 32 --steps 400 \
            --seed 42 --compression $c --output "$out/compression/${c/:/-}" | grep -A1 '^topology'
    done
    local d=$out/compression
    $sim plot -o $d/accuracy.png "none=$d/none/results.json" "int8=$d/int8/results.json" \
        "top-k 1%=$d/top-k-0.01/results.json" "top-k 5%=$d/top-k-0.05/results.json"
    # The hypothesis that top-k 1% only needs longer: twice the steps, against none.
    for c in none top-k:0.01; do
        echo "== $c, 800 steps"
        $sim simulate --members 10 --topology dcliques --clique-size 5 --inter-clique ring \
            --model mlp --partition classes-per-member:2 --batch-size 32 --steps 800 \
            --seed 42 --compression $c | grep -A1 '^topology'
    done
}

rows=("$@")
[ ${#rows[@]} -gt 0 ] || rows=(dcliques straggler one-peer compression)
for row in "${rows[@]}"; do
    echo "### $row"
    case $row in
        dcliques) dcliques ;;
        straggler) straggler ;;
        one-peer) one_peer ;;
        compression) compression ;;
        *) echo "unknown row $row: use dcliques, straggler, one-peer or compression" >&2; exit 2 ;;
    esac
done
