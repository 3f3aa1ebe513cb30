#!/usr/bin/env bash
# Outer steps against per-step training on the D-Cliques example's setting (10 members, two
# classes each, cliques of five, 400 steps), in the simulator, at three seeds: per-step clique
# averaging (the example), D-PSGD averaging every 8 steps, and D-PSGD with outer steps every 8
# steps, uncompressed, int8 and int4. Then gossip (one random partner a round) per-step, every 8
# steps, and with outer steps every 8 (heavy ball as SlowMo, Nesterov as NoLoCo), on the same
# skewed shards and on IID ones. One line per run: final accuracy and MB sent (about 4 minutes
# on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release --quiet -p murmur-trainer
trainer=target/release/murmur-trainer
job=(--members 10 --topology dcliques --clique-size 5 --inter-clique ring --model mlp
    --batch-size 32 --steps 400 --eval-every 400)
# Two classes a member unless `partition=iid last ...`.
last() {
    "$trainer" simulate "${job[@]}" --partition "${partition:-classes-per-member:2}" "$@" 2>&1 |
        tail -1
}
for seed in 42 7 8; do
    echo "seed $seed, per-step clique averaging: $(last --seed "$seed")"
    echo "seed $seed, dpsgd every 8: $(last --seed "$seed" --algorithm dpsgd --average-every 8)"
    for compression in none int8 int4; do
        echo "seed $seed, dpsgd outer 8, $compression: $(last --seed "$seed" --algorithm dpsgd \
            --outer-local-steps 8 --compression "$compression")"
    done
done
for seed in 42 7 8; do
    echo "seed $seed, gossip per-step: $(last --seed "$seed" --algorithm gossip)"
    echo "seed $seed, gossip every 8: $(last --seed "$seed" --algorithm gossip --average-every 8)"
    echo "seed $seed, gossip outer 8, heavy ball 1/0.5: $(last --seed "$seed" --algorithm gossip \
        --outer-local-steps 8 --outer-optimizer sgd --outer-learning-rate 1 --outer-momentum 0.5)"
    echo "seed $seed, gossip outer 8, nesterov: $(last --seed "$seed" --algorithm gossip \
        --outer-local-steps 8)"
    echo "seed $seed, IID, gossip per-step: $(partition=iid last --seed "$seed" --algorithm gossip)"
    echo "seed $seed, IID, gossip outer 8, nesterov: $(partition=iid last --seed "$seed" \
        --algorithm gossip --outer-local-steps 8)"
done
