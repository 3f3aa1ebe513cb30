#!/usr/bin/env bash
# The peer-exchange figures beside their references, measured in one go on this machine:
#   - two trainers exchanging a 10M-parameter fp32 model vs iperf3 over loopback (both ways);
#   - an 8-trainer ring averaging round vs torch.distributed gloo all_reduce of the same tensor,
#     uncompressed and with int8 on the wire;
#   - the floor under the ring round: the same 8 processes only moving its bytes over plain TCP.
# Needs iperf3 (apt-get install iperf3) and, for the gloo figure, torch (pip install torch numpy).
# PYTHON is the interpreter for the gloo figure (default python3; it needs torch).
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3}
command -v iperf3 >/dev/null || { echo "iperf3 is not installed: apt-get install iperf3" >&2; exit 3; }

port=$((20000 + RANDOM % 20000))
iperf3 -s -p "$port" -1 >/dev/null 2>&1 &
sleep 0.5
iperf_bidir=$(iperf3 -c 127.0.0.1 -p "$port" -t 5 --bidir -J | python3 -c '
import json, sys
end = json.load(sys.stdin)["end"]
print((end["sum_received"]["bits_per_second"] + end["sum_received_bidir_reverse"]["bits_per_second"]) / 8e9)')
wait

bench=$(cargo bench -q -p murmur-trainer --bench peer_exchange 2>/dev/null)
echo "$bench"
int8=$(cargo bench -q -p murmur-trainer --bench peer_exchange -- ring --compression int8 2>/dev/null)
echo "$int8"
gloo=$("$PYTHON" trainer/bench/allreduce_gloo.py 2>/dev/null | tail -3 || true)
echo "$gloo"

get() { grep "^$1=" <<<"$2" | cut -d= -f2; }
pair=$(get pair_exchange_gbytes_per_second "$bench")
ring=$(get ring_round_seconds "$bench")
ring_int8=$(get ring_round_seconds "$int8")
raw=$(get raw_round_seconds "$bench")
gloo_s=$(get gloo_allreduce_seconds "$gloo")
python3 - "$pair" "$iperf_bidir" "$ring" "$ring_int8" "$raw" "${gloo_s:-}" <<'PY'
import sys
pair, iperf, ring, ring_int8, raw = map(float, sys.argv[1:6])
print(f"iperf3_bidir_gbytes_per_second={iperf:.3f}")
print(f"pair_vs_iperf3={pair / iperf:.2f}   (aim >= 0.70)")
if sys.argv[6]:
    gloo = float(sys.argv[6])
    print(f"ring_round_vs_gloo_allreduce={ring / gloo:.2f}   (time ratio; aim <= 1.00)")
    print(f"ring_round_int8_vs_gloo_allreduce={ring_int8 / gloo:.2f}   (time ratio, int8 on the wire)")
    print(f"raw_tcp_ring_bytes_vs_gloo_allreduce={raw / gloo:.2f}   (the ring round's bytes alone, plain TCP)")
else:
    print("ring_round_vs_gloo_allreduce=n/a (torch not installed)")
PY
