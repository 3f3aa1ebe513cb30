#!/usr/bin/env bash
# Starts a real Kubernetes control plane as local processes: etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler and kwok (fake nodes and their pods), all bound to
# 127.0.0.1 (with --real-nodes the API server listens on every interface, for the nodes), with
# everything they keep under one state dir. See docs/development.md.
#
#   eval "$(e2e/controlplane/up.sh)"      # last line of stdout: export KUBECONFIG=...
#   eval "$(e2e/controlplane/up.sh --real-nodes)"  # ready for real nodes (nodes.sh add): a node
#                                         # network, the API server on it, cluster DNS
#   e2e/controlplane/down.sh
#
# Environment (all optional):
#   MURMUR_CONTROLPLANE_DIR      state dir (default /tmp/murmur-controlplane); one per instance
#   MURMUR_CONTROLPLANE_BIN      where the binaries are built (default .bin/ beside this script)
#   MURMUR_CONTROLPLANE_<X>_PORT fixed ports, X in APISERVER ETCD ETCD_PEER CONTROLLER_MANAGER
#                                SCHEDULER KWOK; the others are picked free
#   MURMUR_CONTROLPLANE_TIMEOUT  seconds to wait for each component (default 180)
#   MURMUR_CONTROLPLANE_<X>_ARGS extra flags, X in ETCD APISERVER CONTROLLER_MANAGER SCHEDULER
#                                KWOK (word-split), e.g. MURMUR_CONTROLPLANE_CONTROLLER_MANAGER_ARGS=
#                                "--node-monitor-grace-period=20s"
#
# Progress goes to stderr, the logs of the components to $MURMUR_CONTROLPLANE_DIR/logs/; stdout
# is only the export lines, so that a caller can eval it or read its last line.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
source "$HERE/lib.sh"
BIN=${MURMUR_CONTROLPLANE_BIN:-$HERE/.bin}
# shellcheck disable=SC2034 # read by wait_for (lib.sh)
TIMEOUT=${MURMUR_CONTROLPLANE_TIMEOUT:-180}
# The annotation that makes kwok manage a node (and so its pods): tests decide which nodes are
# fake by setting it. It is the one kwokctl uses.
KWOK_ANNOTATION=kwok.x-k8s.io/node=fake


REAL_NODES=0
for arg in "$@"; do
    case $arg in
    --real-nodes) REAL_NODES=1 ;;
    *) die "unknown argument $arg (usage: up.sh [--real-nodes])" ;;
    esac
done

for tool in openssl curl flock setsid base64 sha256sum; do
    command -v "$tool" >/dev/null || die "$tool is needed and not on PATH"
done

started=$SECONDS
"$HERE/build.sh"
export MURMUR_CONTROLPLANE_BIN=$BIN
BIN=$(cd "$BIN" && pwd)

# --- the state dir, its lock, and a running instance -------------------------------------------
mkdir -p "$DIR"
if [[ ! -e $DIR/$MARKER && -n $(ls -A "$DIR") ]]; then
    die "$DIR is not empty and is not a control plane state dir; choose another MURMUR_CONTROLPLANE_DIR"
fi
touch "$DIR/$MARKER"
# Held until this script exits (the components do not inherit it: they get fd 9 closed), so that
# two up.sh, or an up.sh and a down.sh, never work on one state dir at once.
exec 9>>"$DIR/.lock"
flock -n 9 || die "another up.sh or down.sh is working on $DIR"
if live=$(running) && [[ -n $live ]]; then
    die "a control plane is already running in $DIR ($(paste -sd' ' <<<"$live")); run down.sh first, or set MURMUR_CONTROLPLANE_DIR"
fi
# Whatever is left is from an instance that died or failed to start: start afresh.
find "$DIR" -mindepth 1 -maxdepth 1 ! -name "$MARKER" ! -name .lock -exec rm -rf {} +
mkdir -p "$DIR"/{pki,kubeconfigs,logs,pids,etcd,kwok,certs-controller-manager,certs-scheduler}
chmod 700 "$DIR/etcd" # etcd warns about anything wider

# If this script fails past this point, stop what it started; the logs stay for a look.
ok=0
on_exit() {
    if ((!ok)); then
        stop_all || true
        say "failed; the logs are in $DIR/logs (down.sh removes them)"
    fi
}
trap on_exit EXIT

# --- ports -----------------------------------------------------------------------------------
# Each component's port (pick_port, lib.sh).
for name in APISERVER ETCD ETCD_PEER CONTROLLER_MANAGER SCHEDULER KWOK; do
    pick_port "${name}_PORT"
done
SERVER=https://127.0.0.1:$APISERVER_PORT

# --- the node network (--real-nodes) ------------------------------------------------------------
# Real nodes are containers on a bridge of this instance's own: the first 10.X.0.0/16 (X from
# 200) that no interface and no podman network of this machine uses. The host is 10.X.0.1 (the
# API server listens there too), node i is 10.X.0.(10+i) and its pods are 10.X.i.0/24; the host
# routes between the nodes' pod ranges, as a cloud's network does.
HOST_IP='' NODE_PREFIX=''
if ((REAL_NODES)); then
    ((EUID == 0)) || die "--real-nodes needs root (privileged node containers)"
    require_node_tools || die "--real-nodes needs $(require_node_tools 2>&1)"
    used=$(ip -4 -o addr show | awk '{print $4}'; podman network ls --format '{{range .Subnets}}{{.Subnet}} {{end}}' 2>/dev/null)
    for x in {200..250}; do
        grep -q "^10\.$x\." <<<"$(tr ' ' '\n' <<<"$used")" || break
    done
    ((x <= 250)) || die "no free 10.X.0.0/16 for the nodes (X in 200..250)"
    NODE_PREFIX=10.$x
    HOST_IP=$NODE_PREFIX.0.1
fi

# --- certificates and keys -------------------------------------------------------------------
newkey "$PKI/ca.key"
openssl req -x509 -new -key "$PKI/ca.key" -subj "/CN=murmur-controlplane-ca" -days 365 \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -out "$PKI/ca.crt" 2>/dev/null
# The API server's serving certificate: 127.0.0.1 for clients here, the node network's host
# address for the nodes, the first service IP and the in-cluster names for pods.
sign apiserver "/CN=kube-apiserver" "extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,IP:10.96.0.1${HOST_IP:+,IP:$HOST_IP},DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
# Client certificates: the user is the CN, the groups are the Os. system:masters bypasses RBAC
# (for the admin and kwok, which writes the status of every fake node and pod); the controller
# manager and the scheduler get the users that the API server's bootstrap RBAC policy grants.
sign admin "/O=system:masters/CN=admin" "extendedKeyUsage=clientAuth"
sign kwok "/O=system:masters/CN=kwok" "extendedKeyUsage=clientAuth"
sign controller-manager "/CN=system:kube-controller-manager" "extendedKeyUsage=clientAuth"
sign scheduler "/CN=system:kube-scheduler" "extendedKeyUsage=clientAuth"
if ((REAL_NODES)); then
    # kube-proxy on every node (the bootstrap policy binds system:node-proxier to this user),
    # and the API server's client of the kubelets (logs, exec, port-forward).
    sign kube-proxy "/CN=system:kube-proxy" "extendedKeyUsage=clientAuth"
    sign apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" "extendedKeyUsage=clientAuth"
fi
# The front proxy (request header) CA, a CA of its own as kubeadm makes it: the API server
# publishes it in kube-system/extension-apiserver-authentication, where the controller manager
# and the scheduler (delegated authentication) look for it and log an error on every sync when it
# is missing, and an aggregated API server (say metrics-server) trusts requests proxied with
# front-proxy-client.
newkey "$PKI/front-proxy-ca.key"
openssl req -x509 -new -key "$PKI/front-proxy-ca.key" -subj "/CN=murmur-front-proxy-ca" -days 365 \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -out "$PKI/front-proxy-ca.crt" 2>/dev/null
sign front-proxy-client "/CN=front-proxy-client" "extendedKeyUsage=clientAuth" front-proxy-ca
# Service account tokens: the API server signs them with sa.key and checks them with sa.pub;
# the controller manager's token controller signs legacy token Secrets with sa.key.
newkey "$PKI/sa.key"
openssl pkey -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
chmod 600 "$PKI"/*.key

KUBECONFIG_ADMIN=$DIR/kubeconfig
kubeconfig "$KUBECONFIG_ADMIN" admin "$SERVER"
for user in kwok controller-manager scheduler; do
    kubeconfig "$DIR/kubeconfigs/$user.kubeconfig" "$user" "$SERVER"
done

# --- the components (start and wait_for: lib.sh) ------------------------------------------------
# Extra flags from the environment, word-split on purpose.
extra() { local var=MURMUR_CONTROLPLANE_$1_ARGS; echo "${!var:-}"; }

# etcd: one member on loopback. --unsafe-no-fsync: the data dies with the instance anyway, and
# fsync on every write is most of what slows a test cluster on a shared disk.
say "starting etcd on 127.0.0.1:$ETCD_PORT"
# shellcheck disable=SC2046
start etcd \
    --name=murmur \
    --data-dir="$DIR/etcd" \
    --listen-client-urls="http://127.0.0.1:$ETCD_PORT" \
    --advertise-client-urls="http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-advertise-peer-urls="http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster="murmur=http://127.0.0.1:$ETCD_PEER_PORT" \
    --unsafe-no-fsync \
    --log-level=warn \
    $(extra ETCD)
wait_for etcd curl -sf --max-time 5 "http://127.0.0.1:$ETCD_PORT/health"

# The API server.
#  --authorization-mode=Node,RBAC: RBAC as in a real cluster (the operator's Role must be right).
#  --service-account-*: the issuer and keys for the tokens projected into pods and TokenRequest.
#  --service-cluster-ip-range: Service IPs, routed by kube-proxy on real nodes (and only numbers
#    without them).
#  Without real nodes, --endpoint-reconciler-type=none: the reconciler of the "kubernetes"
#    Service's endpoints refuses a loopback --advertise-address (fatal since 1.37: "cannot use
#    public IP 127.0.0.1 with endpoint reconciler"), and no pod dials that Service. With them,
#    the API server listens on the node network too and advertises its host address there, so
#    that pods reach it through the "kubernetes" Service as in any cluster; it reaches the
#    kubelets at their InternalIP with a client certificate, and checks theirs.
#  --shutdown-send-retry-after: on TERM, wait for in-flight requests only, then close within
#    2 s; by default the HTTP server waits up to 60 s (--request-timeout) for open connections,
#    the clients' own watches included, which made every down.sh end in KILL.
#  The default admission plugins stay on (ServiceAccount included: the controller manager
#  creates each namespace's "default" ServiceAccount, which pods are admitted against).
#  The Eviction API (pods/eviction) is always served, and since 1.31 (GA) an eviction, a taint
#  eviction, a pod GC deletion and a preemption add a DisruptionTarget condition to the pod.
if ((REAL_NODES)); then
    NETWORK_ARGS=(--bind-address=0.0.0.0 --advertise-address="$HOST_IP"
        --kubelet-preferred-address-types=InternalIP
        --kubelet-client-certificate="$PKI/apiserver-kubelet-client.crt"
        --kubelet-client-key="$PKI/apiserver-kubelet-client.key"
        --kubelet-certificate-authority="$PKI/ca.crt")
else
    NETWORK_ARGS=(--bind-address=127.0.0.1 --advertise-address=127.0.0.1 --endpoint-reconciler-type=none)
fi
say "starting kube-apiserver on $SERVER"
# shellcheck disable=SC2046
start kube-apiserver \
    "${NETWORK_ARGS[@]}" \
    --secure-port="$APISERVER_PORT" \
    --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
    --tls-cert-file="$PKI/apiserver.crt" \
    --tls-private-key-file="$PKI/apiserver.key" \
    --client-ca-file="$PKI/ca.crt" \
    --requestheader-client-ca-file="$PKI/front-proxy-ca.crt" \
    --requestheader-allowed-names=front-proxy-client \
    --requestheader-username-headers=X-Remote-User \
    --requestheader-group-headers=X-Remote-Group \
    --requestheader-extra-headers-prefix=X-Remote-Extra- \
    --proxy-client-cert-file="$PKI/front-proxy-client.crt" \
    --proxy-client-key-file="$PKI/front-proxy-client.key" \
    --authorization-mode=Node,RBAC \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$PKI/sa.pub" \
    --service-account-signing-key-file="$PKI/sa.key" \
    --service-cluster-ip-range=10.96.0.0/16 \
    --shutdown-send-retry-after=true \
    --allow-privileged=true \
    $(extra APISERVER)
wait_for kube-apiserver https_ok "$SERVER/readyz"

# The controller manager, with the controllers a test of the operator leans on, named one by one:
# namespaces and ServiceAccounts (pods are admitted against "default"), their tokens and the
# root CA ConfigMap, owner-reference garbage collection, node lifecycle (NotReady nodes get
# tainted) and taint eviction, pod GC (pods of deleted nodes), PodDisruptionBudget status (the
# Eviction API checks it), Deployments/ReplicaSets/StatefulSets/Jobs (the chart and the test
# workloads), EndpointSlices for Services, the aggregated ClusterRoles (admin/edit/view),
# PersistentVolumeClaims bound to PersistentVolumes (checkpoint volumes on real nodes), and
# ResourceQuota usage (quota admission refuses pods until a quota's status is counted).
# Each controller acts as its own ServiceAccount in kube-system (--use-service-account-credentials,
# as kubeadm sets it): the API server's bootstrap RBAC policy grants the controllers' roles to
# those accounts; the user system:kube-controller-manager alone may not, e.g., create the
# kube-root-ca.crt ConfigMaps or aggregate ClusterRoles.
# No leader election: one instance, and no Lease round trips before it starts working.
CONTROLLERS=(
    namespace-controller
    serviceaccount-controller
    serviceaccount-token-controller
    root-ca-certificate-publisher-controller
    garbage-collector-controller
    node-lifecycle-controller
    taint-eviction-controller
    pod-garbage-collector-controller
    disruption-controller
    deployment-controller
    replicaset-controller
    statefulset-controller
    job-controller
    ttl-after-finished-controller
    endpointslice-controller
    clusterrole-aggregation-controller
    persistentvolume-binder-controller
    resourcequota-controller
)
say "starting kube-controller-manager, kube-scheduler and kwok"
KCM_KUBECONFIG=$DIR/kubeconfigs/controller-manager.kubeconfig
# shellcheck disable=SC2046
start kube-controller-manager \
    --kubeconfig="$KCM_KUBECONFIG" \
    --authentication-kubeconfig="$KCM_KUBECONFIG" \
    --authorization-kubeconfig="$KCM_KUBECONFIG" \
    --bind-address=127.0.0.1 \
    --secure-port="$CONTROLLER_MANAGER_PORT" \
    --cert-dir="$DIR/certs-controller-manager" \
    --leader-elect=false \
    --use-service-account-credentials=true \
    --controllers="$(IFS=,; echo "${CONTROLLERS[*]}")" \
    --service-account-private-key-file="$PKI/sa.key" \
    --root-ca-file="$PKI/ca.crt" \
    $(extra CONTROLLER_MANAGER)

SCHED_KUBECONFIG=$DIR/kubeconfigs/scheduler.kubeconfig
# shellcheck disable=SC2046
start kube-scheduler \
    --kubeconfig="$SCHED_KUBECONFIG" \
    --authentication-kubeconfig="$SCHED_KUBECONFIG" \
    --authorization-kubeconfig="$SCHED_KUBECONFIG" \
    --bind-address=127.0.0.1 \
    --secure-port="$SCHEDULER_PORT" \
    --cert-dir="$DIR/certs-scheduler" \
    --leader-elect=false \
    $(extra SCHEDULER)

# kwok plays the kubelet of every node annotated $KWOK_ANNOTATION, and of nothing else.
#  --config: its Stages (kwok v0.8 has none built in): kwokctl's defaults, embedded in kwok's
#    module and printed by the controlplane binary, so they always match the kwok version.
#  --node-lease-duration-seconds: node liveness is the node Lease, which kwok renews only when
#    this is set (the heartbeat stage refreshes conditions every 10 minutes only); 40 s as kwokctl.
#  --node-ip, --node-port: what a node reports as its kubelet address, so that the API server's
#    logs/exec/port-forward requests come to kwok's own server on loopback.
#  --cidr: pod IPs on loopback (127.1.x.x), so that a client that dials a fake pod's IP stays
#    on this machine instead of reaching for a private network.
#  HOME: kwok also loads ~/.kwok/kwok.yaml if there is one; keep a user's out.
"$BIN/controlplane" kwok-stages >"$DIR/kwok/stages.yaml"
# shellcheck disable=SC2046
HOME=$DIR/kwok start kwok \
    --kubeconfig="$DIR/kubeconfigs/kwok.kubeconfig" \
    --config="$DIR/kwok/stages.yaml" \
    --manage-all-nodes=false \
    --manage-nodes-with-annotation-selector="$KWOK_ANNOTATION" \
    --node-lease-duration-seconds=40 \
    --node-ip=127.0.0.1 \
    --node-port="$KWOK_PORT" \
    --server-address="127.0.0.1:$KWOK_PORT" \
    --cidr=127.1.0.1/16 \
    $(extra KWOK)

wait_for kube-controller-manager curl -skf --max-time 5 "https://127.0.0.1:$CONTROLLER_MANAGER_PORT/healthz"
wait_for kube-scheduler curl -skf --max-time 5 "https://127.0.0.1:$SCHEDULER_PORT/healthz"
wait_for kwok curl -sf --max-time 5 "http://127.0.0.1:$KWOK_PORT/healthz"
# Pods are admitted only once their namespace's "default" ServiceAccount exists; seeing it in
# "default" shows the ServiceAccount controller at work.
wait_for kube-controller-manager https_ok "$SERVER/api/v1/namespaces/default/serviceaccounts/default"

# --- real nodes: their images and cluster DNS ----------------------------------------------------
# The node network (a podman network of this instance), the node, pause and CoreDNS images with
# their archives for the nodes to import, and CoreDNS as the cluster's DNS (kube-system/coredns
# behind the kube-dns Service at 10.96.0.10, the kubelets' clusterDNS): it runs once a node is
# there (nodes.sh add).
if ((REAL_NODES)); then
    podman network create --subnet "$NODE_PREFIX.0.0/24" --gateway "$HOST_IP" --disable-dns \
        --label "murmur.dev/controlplane=$DIR" "$(node_network)" >/dev/null
    mkdir -p "$DIR/images" "$DIR/nodes"
    "$HERE/nodes.sh" images >&2
    "$BIN/kubectl" --kubeconfig="$KUBECONFIG_ADMIN" apply -f - >/dev/null \
        < <(sed "s|@IMAGE@|$(cat "$DIR/images/coredns.ref")|" "$HERE/node/coredns.yaml")
fi

# --- done ------------------------------------------------------------------------------------
# Everything a test may want, for `source`.
cat >"$DIR/env" <<EOF
export MURMUR_CONTROLPLANE_DIR=$DIR
export MURMUR_CONTROLPLANE_BIN=$BIN
export MURMUR_CONTROLPLANE_SERVER=$SERVER
export MURMUR_CONTROLPLANE_APISERVER_PORT=$APISERVER_PORT
export MURMUR_CONTROLPLANE_ETCD_PORT=$ETCD_PORT
export MURMUR_CONTROLPLANE_ETCD_PEER_PORT=$ETCD_PEER_PORT
export MURMUR_CONTROLPLANE_CONTROLLER_MANAGER_PORT=$CONTROLLER_MANAGER_PORT
export MURMUR_CONTROLPLANE_SCHEDULER_PORT=$SCHEDULER_PORT
export MURMUR_CONTROLPLANE_KWOK_PORT=$KWOK_PORT
export MURMUR_CONTROLPLANE_KWOK_ANNOTATION=$KWOK_ANNOTATION
export MURMUR_CONTROLPLANE_HOST_IP=$HOST_IP
export MURMUR_CONTROLPLANE_NODE_PREFIX=$NODE_PREFIX
export KUBECONFIG=$KUBECONFIG_ADMIN
EOF
ok=1
say "ready in $((SECONDS - started))s: $(running | paste -sd' '); logs in $DIR/logs"
echo "export MURMUR_CONTROLPLANE_BIN=$BIN"
echo "export KUBECONFIG=$KUBECONFIG_ADMIN"
