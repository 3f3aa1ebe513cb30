#!/usr/bin/env bash
# Reproduce the rows of docs/claims.md: `bash docs/claims/reproduce.sh [ROW...]` with ROW one of
# dcliques, straggler, one-peer, compression, proxy-clumps, moshpit (default: all). Each row writes its curves.csv,
# results.json and plot under docs/claims/ROW/ and prints the figures the table quotes.
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

proxy_clumps() {
    # arXiv 2212.08743 in its own setting: 24 members, K = ceil(log2 24) = 5 clumps of 5 and 4,
    # so 5 cliques on one ring; plain neighbourhood averaging (D-PSGD) after each local step;
    # proxy vectors from a public batch outside the test set. Heterogeneous cliques (one member
    # of each clump) against the homogeneous control (cliques cut from one clump each) on the
    # same ring, then D-Cliques (cliques of 5 on a ring, from label histograms) and a random
    # 4-regular graph (48 edges against the cliques' 51). Three seeds each.
    local common=(--members 24 --algorithm dpsgd --model mlp --batch-size 32 --steps 400
        --eval-every 50 --inter-clique ring)
    for part in classes-per-member:2 dirichlet:0.5; do
        local d=$out/proxy-clumps/${part/:/-}
        for seed in 7 8 9; do
            for mix in heterogeneous homogeneous; do
                echo "== $part seed $seed proxy clumps, $mix"
                $sim simulate "${common[@]}" --partition $part --seed $seed \
                    --topology proxy-clumps --clique-mix $mix --output $d/$mix-$seed |
                    tail -3 | head -1
            done
            echo "== $part seed $seed dcliques, random-regular:4"
            $sim simulate "${common[@]}" --partition $part --seed $seed --clique-size 5 \
                --topology dcliques,random-regular:4 --output $d/others-$seed | tail -4 | head -2
        done
        $sim plot -o $d/accuracy.png "heterogeneous=$d/heterogeneous-7/results.json" \
            "homogeneous=$d/homogeneous-7/results.json" "$d/others-7/results.json"
    done
    # Large jobs: 100 members (7 clumps, 15 cliques): is one ring of cliques enough, or should
    # the inter-clique links be a small world? Against random 6- and 8-regular graphs (300 and
    # 400 edges, against the ring's 300 and the small world's 390).
    local d=$out/proxy-clumps/100
    for algorithm in dpsgd clique-averaging; do
        for inter in ring small-world; do
            echo "== 100 members, $algorithm, inter-clique $inter"
            $sim simulate --members 100 --algorithm $algorithm --model mlp --batch-size 32 \
                --steps 300 --eval-every 50 --partition classes-per-member:2 --seed 7 \
                --topology proxy-clumps --inter-clique $inter \
                --output $d/$algorithm-$inter | tail -3 | head -1
        done
    done
    $sim simulate --members 100 --algorithm dpsgd --model mlp --batch-size 32 --steps 300 \
        --eval-every 50 --partition classes-per-member:2 --seed 7 \
        --topology random-regular:6,random-regular:8 --output $d/random-regular | tail -4 | head -2
    $sim plot -o $d/accuracy.png "ring, D-PSGD=$d/dpsgd-ring/results.json" \
        "small world, D-PSGD=$d/dpsgd-small-world/results.json" \
        "ring, clique averaging=$d/clique-averaging-ring/results.json" \
        "small world, clique averaging=$d/clique-averaging-small-world/results.json" \
        "$d/random-regular/results.json"
}

moshpit() {
    # Averaging alone (no gradient steps; each member its own random logistic model): rounds
    # until the consensus distance is 1e-6. Moshpit on a 4x4x4 grid, full (64) and with members
    # missing (60 and 49: the grid is repaired as the operator does, holes refilled from its
    # last cell), against D-PSGD and gossip on a ring and an exponential graph of the same size.
    local common=(--model logistic --consensus-only --target-consensus 1e-6 --seed 7)
    local d=$out/moshpit
    for n in 64 60 49; do
        echo "== $n members, moshpit (grid of 64)"
        $sim simulate "${common[@]}" --members $n --departed $((64 - n)) --group-size 4 \
            --topology moshpit --algorithm moshpit --steps 60 --eval-every 1 \
            --output $d/moshpit-$n | tail -3 | head -1
    done
    for n in 60 49; do
        for algorithm in dpsgd gossip; do
            echo "== $n members, $algorithm"
            $sim simulate "${common[@]}" --members $n --topology exponential \
                --algorithm $algorithm --steps 200 --eval-every 1 \
                --output $d/exponential-$algorithm-$n | tail -3 | head -1
            $sim simulate "${common[@]}" --members $n --topology ring --algorithm $algorithm \
                --steps 8000 --eval-every 20 --output $d/ring-$algorithm-$n | tail -3 | head -1
        done
    done
    # Two plots: the ring takes thousands of rounds, the others tens.
    $sim plot --consensus -o $d/consensus.png "moshpit, 60 of 64=$d/moshpit-60/results.json" \
        "moshpit, 49 of 64=$d/moshpit-49/results.json" "moshpit, 64=$d/moshpit-64/results.json" \
        "exponential, D-PSGD=$d/exponential-dpsgd-60/results.json" \
        "exponential, gossip=$d/exponential-gossip-60/results.json"
    $sim plot --consensus -o $d/consensus-ring.png "ring, D-PSGD=$d/ring-dpsgd-60/results.json" \
        "ring, gossip=$d/ring-gossip-60/results.json"
}

rows=("$@")
[ ${#rows[@]} -gt 0 ] || rows=(dcliques straggler one-peer compression proxy-clumps moshpit)
for row in "${rows[@]}"; do
    echo "### $row"
    case $row in
        dcliques) dcliques ;;
        straggler) straggler ;;
        one-peer) one_peer ;;
        compression) compression ;;
        proxy-clumps) proxy_clumps ;;
        moshpit) moshpit ;;
        *) echo "unknown row $row: use dcliques, straggler, one-peer, compression, proxy-clumps or moshpit" >&2; exit 2 ;;
    esac
done
