# shellcheck shell=bash
# Shared by up.sh and down.sh (sourced, not run): where an instance lives and how to find and
# stop exactly the processes it started. It brings say and die to the scripts that source it.

# shellcheck source=../support/say.sh
source "$(dirname "${BASH_SOURCE[0]}")/../support/say.sh"

# The state dir holds everything of one instance: certificates, kubeconfigs, etcd's data, logs,
# pid files. Two instances (two test processes) need two state dirs.
MURMUR_CONTROLPLANE_DIR=${MURMUR_CONTROLPLANE_DIR:-/tmp/murmur-controlplane}
case $MURMUR_CONTROLPLANE_DIR in
/*) ;;
*) MURMUR_CONTROLPLANE_DIR=$PWD/$MURMUR_CONTROLPLANE_DIR ;;
esac
DIR=${MURMUR_CONTROLPLANE_DIR%/}
# Only a dir carrying this marker is ever emptied or removed, so that a mistyped
# MURMUR_CONTROLPLANE_DIR (say, $HOME) cannot lose anyone's files.
# shellcheck disable=SC2034 # used by up.sh and down.sh
MARKER=.murmur-controlplane

# --- certificates and kubeconfigs (up.sh makes the CA; nodes.sh signs each node's identity) ---
PKI=$DIR/pki
# P-256 keys in PKCS#8 (-----BEGIN PRIVATE KEY-----): generated in milliseconds, and read by Go,
# openssl and rustls (the operator's kube client) alike.
newkey() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }
# sign NAME SUBJECT EXTENSIONS [CA]: $PKI/NAME.key and NAME.crt, signed by CA (default: ca).
sign() {
    local ca=${4:-ca}
    newkey "$PKI/$1.key"
    openssl req -new -key "$PKI/$1.key" -subj "$2" -out "$PKI/$1.csr" 2>/dev/null
    openssl x509 -req -in "$PKI/$1.csr" -CA "$PKI/$ca.crt" -CAkey "$PKI/$ca.key" \
        -set_serial "0x$(openssl rand -hex 16)" -days 365 -out "$PKI/$1.crt" \
        -extfile <(printf '%s\n' "basicConstraints=critical,CA:FALSE" \
            "keyUsage=critical,digitalSignature" "subjectKeyIdentifier=hash" \
            "authorityKeyIdentifier=keyid" "$3") 2>/dev/null
    rm -f "$PKI/$1.csr"
    chmod 600 "$PKI/$1.key"
}
# kubeconfig FILE USER SERVER: a kubeconfig for the certificate $PKI/USER.crt, with the
# certificates embedded, so that it works for any client (kube-rs included) and inside a node's
# container without resolving paths.
kubeconfig() {
    cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: murmur
  cluster:
    server: $3
    certificate-authority-data: $(base64 -w0 "$PKI/ca.crt")
users:
- name: $2
  user:
    client-certificate-data: $(base64 -w0 "$PKI/$2.crt")
    client-key-data: $(base64 -w0 "$PKI/$2.key")
contexts:
- name: murmur
  context:
    cluster: murmur
    user: $2
current-context: murmur
EOF
    chmod 600 "$1"
}

# In start order; stopped all at once. kueue runs only where kueue.sh started it.
COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok kueue)

# is_ours PID: the process runs and belongs to this instance. A pid file can outlive its process
# (a crash, a reboot) and the number be reused by something else; every process up.sh starts has
# a path under the state dir on its command line, which an unrelated process will not have.
is_ours() {
    local cmdline
    cmdline=$(tr '\0' ' ' 2>/dev/null <"/proc/$1/cmdline") || return 1
    [[ $cmdline == *"$DIR/"* ]]
}

# our_pid NAME: prints the pid of component NAME if it is running.
our_pid() {
    local f=$DIR/pids/$1.pid pid
    [[ -f $f ]] || return 1
    pid=$(<"$f")
    [[ $pid =~ ^[0-9]+$ ]] && is_ours "$pid" && echo "$pid"
}

# running: prints "name=pid" for each component of this instance that is running.
running() {
    local name pid
    for name in "${COMPONENTS[@]}"; do
        if pid=$(our_pid "$name"); then echo "$name=$pid"; fi
    done
}

# --- real nodes (up.sh --real-nodes, nodes.sh) ------------------------------------------------
# podman as this VM needs it: runc (crun refuses the hybrid cgroup layout), cgroupfs, and open
# file and process limits no higher than a process here may set.
export CONTAINERS_CONF=${CONTAINERS_CONF:-$(dirname "${BASH_SOURCE[0]}")/node/containers.conf}
# The label on everything podman makes for this instance (the network, the node containers).
node_label() { echo "murmur.dev/controlplane=$DIR"; }
# node_network: this instance's podman network (nodes.sh puts its nodes on it).
node_network() { echo "murmur-$(sha256sum <<<"$DIR" | cut -c1-8)"; }
# node_container NAME: the container of node NAME of this instance.
node_container() { echo "$(node_network)-$1"; }
# require_node_tools: says which of the tools real nodes need are missing (and fails), or nothing.
require_node_tools() {
    local tool missing=()
    for tool in podman ip mmdebstrap; do
        command -v "$tool" >/dev/null || missing+=("$tool")
    done
    ((${#missing[@]} == 0)) || { echo "${missing[*]} (apt-get install podman iproute2 mmdebstrap)" >&2; return 1; }
}

# remove_nodes: every node container of this instance (the machines die at once), the host's
# routes to their pods, and the node network.
remove_nodes() {
    command -v podman >/dev/null || return 0
    local ids
    ids=$(podman ps -aq --filter "label=$(node_label)" 2>/dev/null) || return 0
    # shellcheck disable=SC2086
    [[ -z $ids ]] || podman rm -f -t 0 $ids >/dev/null 2>&1 || true
    if [[ -d $DIR/nodes ]]; then
        local cidr
        for cidr in "$DIR"/nodes/*/pod-cidr; do
            [[ -f $cidr ]] && ip route del "$(<"$cidr")" 2>/dev/null || true
        done
    fi
    podman network rm -f "$(node_network)" >/dev/null 2>&1 || true
}

# stop_all: stops every running component: TERM, then KILL what is left after a grace period,
# and waits until none runs. etcd goes last: an API server whose etcd is gone holds its in-flight
# requests until they time out (60 s) before it exits, and every other component only talks to
# the API server. Each one stops on TERM within about two seconds.
stop_all() {
    remove_nodes
    stop kueue kwok kube-scheduler kube-controller-manager kube-apiserver
    stop etcd
}

# stop NAME...: TERM the named components at once, KILL any left after the grace period.
stop() {
    local grace=${MURMUR_CONTROLPLANE_STOP_GRACE:-10} name pid
    local -a pids=() left
    for name in "$@"; do
        if pid=$(our_pid "$name"); then
            kill -TERM "$pid" 2>/dev/null || true
            pids+=("$pid")
        fi
    done
    local deadline=$((SECONDS + grace)) killed=0
    while ((${#pids[@]})); do
        left=()
        for pid in "${pids[@]}"; do
            if is_ours "$pid"; then left+=("$pid"); fi
        done
        pids=(${left[@]+"${left[@]}"})
        ((${#pids[@]})) || break
        if ((!killed && SECONDS >= deadline)); then
            echo "controlplane: still running after ${grace}s, sending KILL: ${pids[*]}" >&2
            kill -KILL "${pids[@]}" 2>/dev/null || true
            killed=1
        elif ((killed && SECONDS >= deadline + 10)); then
            echo "controlplane: pids ${pids[*]} survive KILL; giving up" >&2
            return 1
        fi
        sleep 0.1
    done
}

# --- starting and waiting (up.sh, kueue.sh; they set BIN and TIMEOUT and define die) ------------
# start NAME ARGS...: runs $BIN/NAME in its own session (no signal sent to the caller's terminal
# or process group reaches it), with no stdin and its output in logs/NAME.log, and records its pid
# and its command line.
start() {
    local name=$1
    shift
    # Its command line, for restart.sh.
    mkdir -p "$DIR/commands"
    printf '%q ' "$BIN/$name" "$@" >"$DIR/commands/$name"
    setsid "$BIN/$name" "$@" </dev/null >"$DIR/logs/$name.log" 2>&1 9>&- &
    echo $! >"$DIR/pids/$name.pid"
}
# wait_for NAME CHECK...: runs CHECK until it succeeds; fails if NAME exits or TIMEOUT passes.
wait_for() {
    local name=$1 deadline=$((SECONDS + TIMEOUT))
    shift
    until "$@" >/dev/null 2>&1; do
        if ! our_pid "$name" >/dev/null; then
            tail -n 30 "$DIR/logs/$name.log" >&2 || true
            die "$name exited; its log is $DIR/logs/$name.log"
        fi
        if ((SECONDS >= deadline)); then
            tail -n 30 "$DIR/logs/$name.log" >&2 || true
            die "$name not ready after ${TIMEOUT}s; its log is $DIR/logs/$name.log"
        fi
        sleep 0.2
    done
}
# https_ok URL: GET through TLS, trusting the CA; the admin certificate authenticates. The
# controller manager and scheduler serve a self-signed certificate of their own (-k there).
https_ok() { curl -sf --max-time 5 --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" "$@"; }

# --- ports --------------------------------------------------------------------------------------
# Free ports below the kernel's ephemeral range (32768+ by default), so that an outgoing
# connection cannot take one between the pick and the bind. A port is free when no TCP socket
# of this machine (any state, v4 or v6) uses it. Two instances starting in the same instant
# could still pick the same port; the loser fails its readiness wait and reports it.
declare -A taken=()
ports_scanned=0
# pick_port NAME_PORT: sets $NAME_PORT to $MURMUR_CONTROLPLANE_NAME_PORT, or to a free port.
pick_port() {
    local -n chosen=$1
    local fixed=MURMUR_CONTROLPLANE_$1 p addr
    if ((!ports_scanned)); then
        while read -r _ addr _; do # sl local_address(hex ip:port) rem_address ...
            [[ $addr == *:* ]] && taken[$((16#${addr##*:}))]=1
        done < <(tail -q -n +2 /proc/net/tcp /proc/net/tcp6 2>/dev/null)
        ports_scanned=1
    fi
    if [[ -n ${!fixed:-} ]]; then
        p=${!fixed}
    else
        for _ in {1..1000}; do
            p=$((20000 + RANDOM % 12000))
            [[ -z ${taken[$p]:-} ]] && break
        done
    fi
    taken[$p]=1
    # shellcheck disable=SC2034 # a nameref: sets the caller's variable
    chosen=$p
}
