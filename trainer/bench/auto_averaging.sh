#!/usr/bin/env bash
# averageEvery auto against fixed cadences (1, 2, 4 steps), same job otherwise: the D-Cliques
# example's setting at three seeds, and a ring of 16 on IID and on label-skewed data. One line
# per run: final accuracy and data sent (about 2 minutes on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release --quiet -p murmur-trainer
trainer=target/release/murmur-trainer
last() { "$trainer" simulate "$@" 2>&1 | tail -1; }
for seed in 42 7 8; do
    for every in 1 2 4 auto; do
        echo "dcliques seed $seed, every $every: $(last --members 10 --topology dcliques \
            --clique-size 5 --inter-clique ring --model mlp --partition classes-per-member:2 \
            --batch-size 32 --steps 400 --eval-every 400 --seed "$seed" --average-every "$every")"
    done
done
for partition in iid classes-per-member:2; do
    for every in 1 2 4 auto; do
        echo "ring $partition, every $every: $(last --members 16 --topology ring --model mlp \
            --steps 300 --eval-every 300 --partition "$partition" --average-every "$every")"
    done
done
