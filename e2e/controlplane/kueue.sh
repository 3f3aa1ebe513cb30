#!/usr/bin/env bash
# Runs Kueue (sigs.k8s.io/kueue, the version kueue/go.mod pins) against the control plane that
# up.sh started in $MURMUR_CONTROLPLANE_DIR, as a local process like the other components:
#
#   e2e/controlplane/kueue.sh        # after up.sh; down.sh stops it with the rest
#
# What a cluster install gets from Kueue's manifests, made for a controller outside the cluster:
#  - its CRDs, from the module's config/components/crd/bases;
#  - its webhooks reached by URL (https://127.0.0.1:PORT) instead of through a Service, for core
#    pods and Kueue's own kinds only (the integration this runs is the pod one), and for pods only
#    where they carry kueue.x-k8s.io/queue-name: every other pod of the cluster is left alone;
#  - the conversion webhook of the CRDs that serve two versions, by URL as well;
#  - its serving certificate: an RSA CA and a certificate for the Service name and 127.0.0.1, in
#    the webhook server's certificate dir and in the Secret its internal certificate manager
#    reads (which wants PKCS#1 keys and a CA valid for the name kueue-ca, and then finds nothing
#    to renew).
# Kueue's metrics are off and its visibility API server is not run (VisibilityOnDemand=false: it
# is an aggregated API server that needs an APIService the API server can route to).
#
# Progress goes to stderr, Kueue's log to $MURMUR_CONTROLPLANE_DIR/logs/kueue.log.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
source "$HERE/lib.sh"
BIN=${MURMUR_CONTROLPLANE_BIN:-$HERE/.bin}
# shellcheck disable=SC2034 # read by wait_for (lib.sh)
TIMEOUT=${MURMUR_CONTROLPLANE_TIMEOUT:-180}

[[ -e $DIR/$MARKER && -f $DIR/kubeconfig ]] || die "no control plane in $DIR: run up.sh first"
our_pid kube-apiserver >/dev/null || die "the API server of $DIR is not running"
if pid=$(our_pid kueue); then
    say "Kueue runs already (pid $pid)"
    exit 0
fi
for tool in openssl curl jq base64 go; do
    command -v "$tool" >/dev/null || die "$tool is needed and not on PATH"
done
started=$SECONDS
"$HERE/build.sh"
BIN=$(cd "$BIN" && pwd)
export KUBECONFIG=$DIR/kubeconfig
kubectl() { "$BIN/kubectl" "$@"; }
# The module's manifests: CRDs and webhook configurations.
MODULE=$(cd "$HERE/kueue" && GOFLAGS=-mod=readonly go list -m -f '{{.Dir}}' sigs.k8s.io/kueue)
[[ -d $MODULE/config/components ]] || die "Kueue's module is not in the Go module cache ($MODULE)"
NS=kueue-system
SERVICE=kueue-webhook-service
SECRET=kueue-webhook-server-cert

pick_port KUEUE_WEBHOOK_PORT
pick_port KUEUE_HEALTH_PORT
URL=https://127.0.0.1:$KUEUE_WEBHOOK_PORT
WORK=$DIR/kueue
mkdir -p "$WORK/certs" "$WORK/serving"

# --- the serving certificate ---------------------------------------------------------------------
rsa() { openssl genrsa -traditional -out "$1" 2048 2>/dev/null; }
rsa "$WORK/certs/ca.key"
openssl req -x509 -new -key "$WORK/certs/ca.key" -subj "/O=kueue/CN=kueue-ca" -days 365 \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,digitalSignature" \
    -addext "subjectAltName=DNS:kueue-ca" \
    -out "$WORK/certs/ca.crt" 2>/dev/null
rsa "$WORK/certs/tls.key"
openssl req -new -key "$WORK/certs/tls.key" -subj "/CN=$SERVICE.$NS.svc" -out "$WORK/certs/tls.csr" 2>/dev/null
openssl x509 -req -in "$WORK/certs/tls.csr" -CA "$WORK/certs/ca.crt" -CAkey "$WORK/certs/ca.key" \
    -set_serial "0x$(openssl rand -hex 16)" -days 365 -out "$WORK/certs/tls.crt" \
    -extfile <(printf '%s\n' "subjectAltName=DNS:$SERVICE.$NS.svc,IP:127.0.0.1" \
        "extendedKeyUsage=serverAuth" "keyUsage=critical,digitalSignature,keyEncipherment") 2>/dev/null
chmod 600 "$WORK"/certs/*.key
# Where the webhook server reads them (in a cluster, the Secret mounted as a volume).
cp "$WORK/certs/tls.crt" "$WORK/certs/tls.key" "$WORK/serving/"
CA_BUNDLE=$(base64 -w0 "$WORK/certs/ca.crt")

# --- CRDs, the namespace, the Secret, the webhooks -----------------------------------------------
say "installing Kueue's CRDs and webhooks (webhook server $URL)"
kubectl apply --server-side -f "$MODULE/config/components/crd/bases/" >/dev/null
# `kubectl wait` fails at once on a CRD read before the API server gave it conditions: ask again.
deadline=$((SECONDS + 60))
until kubectl wait --for=condition=Established -f "$MODULE/config/components/crd/bases/" --timeout=60s >/dev/null 2>&1; do
    ((SECONDS < deadline)) || die "Kueue's CRDs are not Established after 60 s"
    sleep 1
done
for crd in localqueues clusterqueues cohorts workloads multikueueclusters; do
    kubectl patch crd "$crd.kueue.x-k8s.io" --type=merge -p "$(jq -cn --arg url "$URL/convert" --arg ca "$CA_BUNDLE" \
        '{spec: {conversion: {strategy: "Webhook", webhook: {conversionReviewVersions: ["v1"], clientConfig: {url: $url, caBundle: $ca}}}}}')" >/dev/null
done
kubectl create namespace "$NS" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
kubectl -n "$NS" create secret generic "$SECRET" --dry-run=client -o yaml \
    --from-file=ca.crt="$WORK/certs/ca.crt" --from-file=ca.key="$WORK/certs/ca.key" \
    --from-file=tls.crt="$WORK/certs/tls.crt" --from-file=tls.key="$WORK/certs/tls.key" | kubectl apply -f - >/dev/null
kubectl create --dry-run=client -o json -f "$MODULE/config/components/webhook/manifests.yaml" |
    jq --arg url "$URL" --arg ca "$CA_BUNDLE" --arg ns "$NS" '
        (if .kind == "List" then .items else [.] end) | map(
            .metadata = {name: ("kueue-" + (if (.kind | startswith("Mutating")) then "mutating" else "validating" end) + "-webhook-configuration")}
            | .webhooks |= map(
                select([.rules[].apiGroups[]] | any(. == "" or . == "kueue.x-k8s.io"))
                | .clientConfig = {url: ($url + .clientConfig.service.path), caBundle: $ca}
                | .namespaceSelector = {matchExpressions: [{key: "kubernetes.io/metadata.name", operator: "NotIn", values: ["kube-system", $ns]}]}
                | if [.rules[].apiGroups[]] | any(. == "") then
                    .objectSelector = {matchExpressions: [{key: "kueue.x-k8s.io/queue-name", operator: "Exists"}]}
                  else . end))
        | {apiVersion: "v1", kind: "List", items: .}' | kubectl apply -f - >/dev/null

# --- Kueue -----------------------------------------------------------------------------------------
cat >"$WORK/config.yaml" <<EOF
apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
namespace: $NS
health:
  healthProbeBindAddress: 127.0.0.1:$KUEUE_HEALTH_PORT
metrics:
  bindAddress: "0"
webhook:
  host: 127.0.0.1
  port: $KUEUE_WEBHOOK_PORT
  certDir: $WORK/serving
leaderElection:
  leaderElect: false
internalCertManagement:
  enable: true
  webhookServiceName: $SERVICE
  webhookSecretName: $SECRET
manageJobsWithoutQueueName: false
integrations:
  frameworks: ["pod"]
EOF
say "starting Kueue $(awk '$1 == "sigs.k8s.io/kueue" { print $2 }' "$HERE/kueue/go.mod")"
trap 'stop kueue' ERR
start kueue --config="$WORK/config.yaml" --kubeconfig="$DIR/kubeconfig" --feature-gates=VisibilityOnDemand=false
wait_for kueue curl -sf --max-time 5 "http://127.0.0.1:$KUEUE_HEALTH_PORT/readyz"
# Ready once the webhook answers with the certificate the API server was given.
wait_for kueue curl -s --max-time 5 --cacert "$WORK/certs/ca.crt" -o /dev/null "$URL/convert"
say "ready in $((SECONDS - started))s: kueue=$(our_pid kueue); log in $DIR/logs/kueue.log"
