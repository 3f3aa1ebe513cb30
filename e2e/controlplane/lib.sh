# shellcheck shell=bash
# Shared by up.sh and down.sh (sourced, not run): where an instance lives and how to find and
# stop exactly the processes it started.

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

# In start order; stopped all at once.
COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok pod-runner)

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

# pod_bridge: the name of the pod runner's bridge for this state dir; its pods' network
# namespaces are named after it (BRIDGE-<pod uid>), so that down.sh can find what a killed runner
# left behind.
pod_bridge() { echo "mp$(sha256sum <<<"$DIR" | cut -c1-8)"; }

# remove_pod_network: the bridge and namespaces of this instance's pod runner, if any are left.
remove_pod_network() {
    local bridge ns
    bridge=$(pod_bridge)
    command -v ip >/dev/null || return 0
    for ns in $(ip netns list 2>/dev/null | awk -v p="$bridge-" 'index($1, p) == 1 {print $1}'); do
        ip netns del "$ns" 2>/dev/null || true
        rm -rf "/etc/netns/$ns"
    done
    ip link del "$bridge" 2>/dev/null || true
}

# stop_all: stops every running component: TERM, then KILL what is left after a grace period,
# and waits until none runs. etcd goes last: an API server whose etcd is gone holds its in-flight
# requests until they time out (60 s) before it exits, and every other component only talks to
# the API server. Each one stops on TERM within about two seconds.
stop_all() {
    stop pod-runner # first: it stops its pods' processes while it can still reach the API server
    remove_pod_network
    stop kwok kube-scheduler kube-controller-manager kube-apiserver
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
