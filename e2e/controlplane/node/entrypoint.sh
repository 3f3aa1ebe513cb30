#!/usr/bin/env bash
# PID 1's child in a real node's container (nodes.sh add): containerd, the images, the kubelet and
# kube-proxy, as a machine of a cluster runs them. Everything it needs is mounted by nodes.sh:
#   /etc/murmur-node/      this node's configuration (node.env, certificates, kubeconfigs,
#                          kubelet and kube-proxy configs, the CNI network), read-only
#   /opt/controlplane/     the control plane build (kubelet and kube-proxy are entries of it)
#   /images/               OCI archives to import before the kubelet starts (pause, CoreDNS, ...)
#   /var/lib/containerd    a host directory: overlayfs snapshots cannot live on overlayfs
#   /var/log/murmur/       the logs of containerd, the kubelet and kube-proxy, kept on the host
# The node lives as long as all three do: if one exits, this script stops the others and exits,
# and the container with it (a machine whose kubelet died is a lost node).
set -euo pipefail

CONF=/etc/murmur-node
LOGS=/var/log/murmur
# shellcheck source=/dev/null
source "$CONF/node.env" # NODE_NAME NODE_IP
mkdir -p "$LOGS"
say() { echo "node $NODE_NAME: $*" | tee -a "$LOGS/node.log" >&2; }

# The kubelet bind-mounts volumes under its root dir and needs them seen by containerd's
# containers: shared propagation, as on a host booted by systemd.
mount --make-rshared /

# Pods' cgroups go under this container's own: podman mounts each cgroup v1 hierarchy here with
# the container's cgroup as its root, so the kubelet's /kubepods is per node, and the container's
# death takes its pods with it, as a machine's would. /proc/PID/cgroup still names the host's
# paths; bind the root under those paths too (as kind's entrypoint does), so that the kubelet
# and cAdvisor find the cgroups they read there.
while IFS=: read -r _ controllers path; do
    [[ -n $controllers && $path != / ]] || continue
    dir=/sys/fs/cgroup/${controllers#name=}
    [[ -d $dir && ! -e $dir$path ]] || continue
    mkdir -p "$dir$path"
    mount --bind "$dir" "$dir$path"
done </proc/self/cgroup

# This network namespace routes its pods' traffic, and kube-proxy's rules must see what crosses
# the pods' bridge (a pod reaching a Service whose endpoint is on the same node).
sysctl -q -w net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1

mkdir -p /etc/containerd /etc/cni/net.d /var/lib/kubelet "$LOGS"
cp "$CONF/containerd.toml" /etc/containerd/config.toml
cp "$CONF/cni.conflist" /etc/cni/net.d/10-murmur.conflist
cp "$CONF/kubelet.yaml" /var/lib/kubelet/config.yaml

pids=()
stop_all() {
    for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    wait || true
}
trap 'stop_all; exit 0' TERM INT

containerd >>"$LOGS/containerd.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do
    ctr version >/dev/null 2>&1 && break
    sleep 0.1
done
ctr version >/dev/null 2>&1 || { say "containerd did not start"; tail -20 "$LOGS/containerd.log" >&2; exit 1; }

# The images the node has before its kubelet registers: what a node image or a registry mirror
# would give a real node. Pods ask for them with imagePullPolicy IfNotPresent (or Never).
started=$(date +%s.%N)
shopt -s nullglob
for archive in /images/*.tar; do
    ctr -n k8s.io images import "$archive" >>"$LOGS/images.log" 2>&1 ||
        { say "importing $archive failed"; tail -5 "$LOGS/images.log" >&2; exit 1; }
done
say "images imported in $(awk -v s="$started" -v e="$(date +%s.%N)" 'BEGIN {printf "%.1f", e - s}') s"

/opt/controlplane/kubelet \
    --config=/var/lib/kubelet/config.yaml \
    --kubeconfig="$CONF/kubelet.kubeconfig" \
    --hostname-override="$NODE_NAME" \
    --node-ip="$NODE_IP" \
    --node-labels="$NODE_LABELS" \
    --v=1 >>"$LOGS/kubelet.log" 2>&1 &
pids+=($!)
/opt/controlplane/kube-proxy --config="$CONF/kube-proxy.yaml" --hostname-override="$NODE_NAME" \
    >>"$LOGS/kube-proxy.log" 2>&1 &
pids+=($!)
say "kubelet and kube-proxy started"

# The first of the three to exit ends the node.
set +e
wait -n "${pids[@]}"
code=$?
say "a node process exited ($code); stopping the node"
stop_all
exit "$code"
