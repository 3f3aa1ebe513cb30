#!/usr/bin/env bash
# Real nodes for a control plane started with `up.sh --real-nodes`: each one a privileged podman
# container (as kind makes its nodes) from a node image built here from Debian's packages, running
# containerd with runc and the CNI bridge plugin, the kubelet and kube-proxy of the control plane's
# own build. Pods run in real containers from images imported into the node's containerd. See
# docs/development.md.
#
#   nodes.sh add NAME [--zone ZONE] [--label KEY=VALUE]... [--no-wait]
#                          start a node; prints "NAME SECONDS" once the Node is Ready
#   nodes.sh kill NAME     the machine dies at once (its container, kubelet and pods SIGKILLed);
#                          the Node object stays, as a cloud leaves it until its controller acts
#   nodes.sh load ARCHIVE...   import image archives (OCI or docker) into every running node,
#                          and into every node added later
#   nodes.sh list          NAME IP STATE of each node of the instance
#   nodes.sh images        build what nodes need if missing (up.sh --real-nodes runs it): the
#                          node image, and the pause and CoreDNS images as archives for the nodes
#
# Environment: MURMUR_CONTROLPLANE_DIR (the instance, as for up.sh), MURMUR_CONTROLPLANE_TIMEOUT
# (seconds to wait for Ready, default 180), MURMUR_NODE_HOST_PATHS (directories of this machine,
# colon-separated, that every node holds read-only at the same path: data on a node's disk).
# Needs root, podman, ip, mmdebstrap (the first time).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
source "$HERE/lib.sh"
TIMEOUT=${MURMUR_CONTROLPLANE_TIMEOUT:-180}

usage() { sed -n '/^#   nodes.sh add/,/^#  *node image, and the pause/p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

# The node image: Debian's packages only (images/debian-rootfs.sh: mmdebstrap with this
# machine's apt sources, which are not left in the image). Its tag names its recipe.
NODE_PACKAGES=containerd,runc,containernetworking-plugins,iptables,iproute2,procps,util-linux,kmod,ca-certificates
NODE_IMAGE=localhost/murmur-node:bookworm-$(sha256sum <<<"$NODE_PACKAGES" | cut -c1-12)
# The sandbox ("pause") image containerd starts for every pod, and CoreDNS: static binaries on
# scratch. The pause image is catatonit in its pause mode (-P), from Debian.
PAUSE_IMAGE=localhost/murmur-pause:catatonit
COREDNS_IMAGE=localhost/murmur-coredns:v1.15.0

# scratch_image IMAGE ENTRYPOINT-JSON FILE...: IMAGE holding FILEs in / on scratch.
scratch_image() {
    local image=$1 entrypoint=$2 ctx
    shift 2
    podman image exists "$image" && return
    ctx=$(mktemp -d /tmp/murmur-image.XXXXXX)
    cp "$@" "$ctx/"
    {
        echo "FROM scratch"
        for f in "$@"; do echo "COPY $(basename "$f") /$(basename "$f")"; done
        echo "ENTRYPOINT $entrypoint"
    } >"$ctx/Containerfile"
    podman build --quiet -t "$image" "$ctx" >/dev/null
    rm -rf "$ctx"
}

cmd_images() {
    local out=$DIR/images started=$SECONDS
    mkdir -p "$out"
    "$HERE/../../images/debian-rootfs.sh" "$NODE_IMAGE" --variant=minbase --include="$NODE_PACKAGES"
    command -v catatonit >/dev/null || die "catatonit is needed for the pause image (apt-get install catatonit)"
    scratch_image "$PAUSE_IMAGE" '["/catatonit", "-P"]' "$(command -v catatonit)"
    scratch_image "$COREDNS_IMAGE" '["/coredns"]' "$BIN/coredns"
    for pair in "pause:$PAUSE_IMAGE" "coredns:$COREDNS_IMAGE"; do
        [[ -f $out/${pair%%:*}.tar ]] ||
            podman save --quiet --format oci-archive -o "$out/${pair%%:*}.tar" "${pair#*:}"
        echo "${pair#*:}" >"$out/${pair%%:*}.ref"
    done
    echo "$NODE_IMAGE" >"$DIR/node-image.ref"
    say "node images ready in $((SECONDS - started)) s"
}

# The instance: up.sh --real-nodes wrote its network into env.
instance() {
    [[ -f $DIR/env ]] || die "no control plane in $DIR (up.sh --real-nodes first, or set MURMUR_CONTROLPLANE_DIR)"
    # shellcheck source=/dev/null
    source "$DIR/env"
    [[ -n ${MURMUR_CONTROLPLANE_NODE_PREFIX:-} ]] || die "the control plane in $DIR was started without --real-nodes"
    PREFIX=$MURMUR_CONTROLPLANE_NODE_PREFIX
    HOST_IP=$MURMUR_CONTROLPLANE_HOST_IP
    K="$MURMUR_CONTROLPLANE_BIN/kubectl --kubeconfig=$DIR/kubeconfig"
}

cmd_add() {
    local name='' zone='' wait=1 labels=()
    while (($#)); do
        case $1 in
        --zone) zone=${2:?--zone ZONE}; shift ;;
        --label) labels+=("${2:?--label KEY=VALUE}"); shift ;;
        --no-wait) wait=0 ;;
        -*) say "unknown flag $1"; usage ;;
        *) [[ -z $name ]] || usage; name=$1 ;;
        esac
        shift
    done
    [[ $name =~ ^[a-z0-9]([-a-z0-9]*[a-z0-9])?$ ]] || die "node name '$name': lower-case letters, digits and '-'"
    instance
    [[ -n $zone ]] && labels+=("topology.kubernetes.io/zone=$zone")
    local node=$DIR/nodes/$name i
    # One index per node for the life of the instance: a node's address and pod range are never
    # handed to another while the API may still hold pods with them.
    exec 8>>"$DIR/nodes/.lock"
    flock 8
    [[ ! -e $node ]] || die "node $name exists in $DIR (a name is used once per instance)"
    i=$(($(cat "$DIR/nodes/.count" 2>/dev/null || echo 0) + 1))
    ((i <= 240)) || die "no more node addresses (240 per instance)"
    echo "$i" >"$DIR/nodes/.count"
    mkdir -p "$node"/{config,containerd,logs}
    flock -u 8
    local ip=$PREFIX.0.$((10 + i)) cidr=$PREFIX.$i.0/24 started
    echo "$cidr" >"$node/pod-cidr"
    local conf=$node/config
    # Its identity: the kubelet's client certificate (the Node authorizer knows it by the name)
    # and its serving certificate, which the API server checks when it asks for logs or exec.
    sign "node-$name" "/O=system:nodes/CN=system:node:$name" "extendedKeyUsage=clientAuth"
    sign "node-$name-serving" "/CN=$name" "extendedKeyUsage=serverAuth
subjectAltName=IP:$ip,DNS:$name"
    kubeconfig "$conf/kubelet.kubeconfig" "node-$name" "https://$HOST_IP:$MURMUR_CONTROLPLANE_APISERVER_PORT"
    kubeconfig "$conf/kube-proxy.kubeconfig" kube-proxy "https://$HOST_IP:$MURMUR_CONTROLPLANE_APISERVER_PORT"
    cp "$PKI/ca.crt" "$conf/ca.crt"
    cp "$PKI/node-$name-serving.crt" "$conf/kubelet.crt"
    cp "$PKI/node-$name-serving.key" "$conf/kubelet.key"
    cat >"$conf/node.env" <<EOF
NODE_NAME=$name
NODE_IP=$ip
NODE_LABELS=$(IFS=,; echo "${labels[*]}")
EOF
    # The pods' network: a bridge with this node's /24, no masquerading (pods see each other's
    # addresses; the host routes between nodes).
    cat >"$conf/cni.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "murmur",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "$cidr"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
    cat >"$conf/containerd.toml" <<EOF
version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
[grpc]
  address = "/run/containerd/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$(cat "$DIR/images/pause.ref")"
  # This VM refuses a negative oom_score_adj (no CAP_SYS_RESOURCE): without this every sandbox
  # dies with runc's "can't get final child's PID from pipe".
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "/etc/cni/net.d"
EOF
    cat >"$conf/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: /etc/murmur-node/ca.crt}
authorization: {mode: Webhook}
tlsCertFile: /etc/murmur-node/kubelet.crt
tlsPrivateKeyFile: /etc/murmur-node/kubelet.key
clusterDomain: cluster.local
clusterDNS: [10.96.0.10]
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
# cgroup v1 (this VM) with cgroupfs; Kubernetes plans to drop v1 (KEP-5573): pinned at 1.37.
failCgroupV1: false
cgroupDriver: cgroupfs
failSwapOn: false
# No CAP_SYS_RESOURCE here: the kubelet may not lower its own oom_score_adj.
oomScoreAdj: 0
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
# The nodes share one disk: none of them garbage-collects images or evicts pods over it.
imageGCHighThresholdPercent: 100
evictionHard: {memory.available: 100Mi}
serializeImagePulls: false
EOF
    cat >"$conf/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: /etc/murmur-node/kube-proxy.kubeconfig}
mode: iptables
clusterCIDR: $PREFIX.0.0/16
# A container may not size the host's conntrack table: leave it as it is.
conntrack: {maxPerCore: 0}
metricsBindAddress: 127.0.0.1:10249
EOF
    # kube-proxy looks at the kernel's modules where a machine has them (this VM has none).
    local modules=()
    [[ -d /lib/modules ]] && modules=(-v /lib/modules:/lib/modules:ro)
    local host_paths=() path paths=()
    IFS=: read -ra paths <<<"${MURMUR_NODE_HOST_PATHS:-}"
    for path in ${paths[@]+"${paths[@]}"}; do host_paths+=(-v "$path:$path:ro"); done
    started=$(date +%s.%N)
    podman run -d --quiet --name "$(node_container "$name")" --hostname "$name" \
        --label "$(node_label)" --label "murmur.dev/node=$name" \
        --privileged --network "$(node_network)" --ip "$ip" \
        --tmpfs /run --tmpfs /tmp \
        -v "$node/containerd:/var/lib/containerd" \
        -v "$node/logs:/var/log/murmur" \
        -v "$conf:/etc/murmur-node:ro" \
        -v "$DIR/images:/images:ro" \
        -v "$MURMUR_CONTROLPLANE_BIN:/opt/controlplane:ro" \
        -v "$HERE/node:/opt/murmur-node:ro" \
        ${modules[@]+"${modules[@]}"} ${host_paths[@]+"${host_paths[@]}"} \
        "$(cat "$DIR/node-image.ref")" /opt/murmur-node/entrypoint.sh >"$node/container-id"
    ip route replace "$cidr" via "$ip"
    ((wait)) || return 0
    local deadline=$((SECONDS + TIMEOUT))
    until $K get node "$name" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null | grep -q True; do
        if [[ $(podman inspect -f '{{.State.Running}}' "$(node_container "$name")" 2>/dev/null) != true ]]; then
            podman logs "$(node_container "$name")" 2>&1 | tail -20 >&2
            tail -20 "$node/logs/kubelet.log" >&2 2>/dev/null || true
            die "node $name stopped; its logs are in $node/logs"
        fi
        ((SECONDS < deadline)) || die "node $name not Ready after ${TIMEOUT}s; its logs are in $node/logs"
        sleep 0.2
    done
    echo "$name $(awk -v s="$started" -v e="$(date +%s.%N)" 'BEGIN {printf "%.2f", e - s}')"
}

cmd_kill() {
    local name=${1:?nodes.sh kill NAME}
    instance
    [[ -d $DIR/nodes/$name ]] || die "no node $name in $DIR"
    podman rm -f -t 0 "$(node_container "$name")" >/dev/null
    ip route del "$(cat "$DIR/nodes/$name/pod-cidr")" 2>/dev/null || true
}

cmd_load() {
    (($#)) || die "nodes.sh load ARCHIVE..."
    instance
    local archive c
    for archive in "$@"; do
        [[ -f $archive ]] || die "$archive: no such file"
        ln -f "$archive" "$DIR/images/" 2>/dev/null || cp "$archive" "$DIR/images/"
        for c in $(podman ps -q --filter "label=$(node_label)"); do
            podman exec -i "$c" ctr -n k8s.io images import - <"$archive" >/dev/null ||
                die "importing $archive into $(podman inspect -f '{{.Name}}' "$c") failed"
        done
    done
}

cmd_list() {
    instance
    podman ps -a --filter "label=$(node_label)" --format '{{index .Labels "murmur.dev/node"}} {{.State}}'
}

((EUID == 0)) || die "real nodes need root"
require_node_tools || exit 1
BIN=${MURMUR_CONTROLPLANE_BIN:-$HERE/.bin}
cmd=${1:-}
(($#)) && shift
case $cmd in
add) cmd_add "$@" ;;
kill) cmd_kill "$@" ;;
load) cmd_load "$@" ;;
list) cmd_list ;;
images) cmd_images ;;
*) usage ;;
esac
