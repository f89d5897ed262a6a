#!/usr/bin/env bash
# TLS option 2, without cert-manager: makes a private CA, the extender's serving certificate and
# kube-scheduler's client certificate with openssl, and the extender's seal key (32 random bytes), then prints the
# kubectl commands that create the three Secrets the manifests mount. It never touches a cluster itself.
# The seal Secret's command creates it only if it does not exist yet: a new key would make a restarted extender
# distrust the bind records of every pod bound before (README.md, "The seal key").
#
#   scheduler-config/make-certs.sh [OUT_DIR]      (default: a new directory under $TMPDIR)
#
# Keys are written with mode 0600. Keep OUT_DIR out of any git work tree (the script refuses one):
# nothing secret belongs in this repository. ca.key never goes to the cluster: no Secret it prints carries it, so
# no reader of a namespace can mint a kube-scheduler certificate and call /bind. It is needed only to issue new
# certificates; keep it offline (a vault, an HSM or an encrypted disk), not on a node.
# DAYS sets the leaf lifetime (default 365); the CA lasts ten years.
set -euo pipefail
umask 077

NAMESPACE=gpu-topology-system
SERVICE=gpu-topology-extender
EXTENDER_SECRET=gpu-topology-extender-tls
SCHEDULER_SECRET=gpu-topology-scheduler-client-tls
SEAL_SECRET=gpu-topology-seal
DAYS=${DAYS:-365}

out=${1:-}
if [[ -z "$out" ]]; then
    out=$(mktemp -d "${TMPDIR:-/tmp}/gpu-topology-certs.XXXXXX")
fi
mkdir -p "$out"
out=$(cd "$out" && pwd)
if git -C "$out" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    echo "make-certs.sh: $out is inside a git work tree; choose a directory outside it" >&2
    exit 2
fi
if [[ -e "$out/ca.key" ]]; then
    echo "make-certs.sh: $out already holds ca.key; choose an empty directory" >&2
    exit 2
fi
cd "$out"

serial() { echo "0x$(openssl rand -hex 16)"; }

# The CA: self-signed, may only sign leaf certificates (pathlen 0).
cat > ca.cnf <<CNF
[req]
distinguished_name = dn
prompt = no
[dn]
CN = gpu-topology-ca
[v3_ca]
basicConstraints = critical, CA:TRUE, pathlen:0
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
CNF
openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out ca.key 2>/dev/null
openssl req -x509 -new -key ca.key -sha256 -days 3650 -set_serial "$(serial)" \
    -config ca.cnf -extensions v3_ca -out ca.crt

# leaf NAME CN EXTENDED_KEY_USAGE [SUBJECT_ALT_NAME]
leaf() {
    local name=$1 cn=$2 eku=$3 san=${4:-}
    {
        echo "basicConstraints = critical, CA:FALSE"
        echo "keyUsage = critical, digitalSignature, keyEncipherment"
        echo "extendedKeyUsage = $eku"
        echo "subjectKeyIdentifier = hash"
        echo "authorityKeyIdentifier = keyid"
        if [[ -n "$san" ]]; then echo "subjectAltName = $san"; fi
    } > "$name.ext"
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$name.key" 2>/dev/null
    openssl req -new -key "$name.key" -subj "/CN=$cn" -out "$name.csr"
    openssl x509 -req -in "$name.csr" -CA ca.crt -CAkey ca.key -set_serial "$(serial)" -sha256 \
        -days "$DAYS" -extfile "$name.ext" -out "$name.crt" 2>/dev/null
    rm -f "$name.csr" "$name.ext"
}

# The extender's serving certificate for every name of its Service. Client usage too: its probes present it
# to its own port when --client-ca is set (extender.yaml).
svc="$SERVICE.$NAMESPACE.svc"
leaf extender "$svc" "serverAuth, clientAuth" \
    "DNS:$SERVICE, DNS:$SERVICE.$NAMESPACE, DNS:$svc, DNS:$svc.cluster.local"
# kube-scheduler's client certificate (tlsConfig.certFile/keyFile), named kube-scheduler: the one client name the
# extender accepts for its verbs (--client-name in extender.yaml).
leaf scheduler-client kube-scheduler "clientAuth"
rm -f ca.cnf
chmod 0644 ca.crt extender.crt scheduler-client.crt

# The seal key: 32 random bytes, written as 64 hex digits (the extender strips whitespace around the file's
# content, which could shorten raw random bytes; hex keeps all 256 bits). Mode 0600 from the umask.
openssl rand -hex 32 > seal.key

q() { printf '%q' "$1"; }
cat <<MSG
Wrote to $out:
  ca.crt ca.key                          private CA (ca.key stays off the cluster: keep it offline)
  extender.crt extender.key              serving certificate of $svc
  scheduler-client.crt scheduler-client.key   kube-scheduler's client certificate
  seal.key                               the extender's seal key (32 random bytes, hex)

Create the Secrets (after the namespace: kubectl apply -f scheduler-config/namespace.yaml):

kubectl -n $NAMESPACE create secret generic $EXTENDER_SECRET --type=kubernetes.io/tls \\
    --from-file=tls.crt=$(q "$out/extender.crt") --from-file=tls.key=$(q "$out/extender.key") \\
    --from-file=ca.crt=$(q "$out/ca.crt")
kubectl -n $NAMESPACE create secret generic $SCHEDULER_SECRET --type=kubernetes.io/tls \\
    --from-file=tls.crt=$(q "$out/scheduler-client.crt") --from-file=tls.key=$(q "$out/scheduler-client.key") \\
    --from-file=ca.crt=$(q "$out/ca.crt")
kubectl -n $NAMESPACE get secret $SEAL_SECRET >/dev/null 2>&1 || \\
    kubectl -n $NAMESPACE create secret generic $SEAL_SECRET --from-file=key=$(q "$out/seal.key")

Option A (the control plane's kube-scheduler), on every control-plane node:

install -d -m 0700 /etc/gpu-topology-scheduler/tls
install -m 0644 $(q "$out/ca.crt") /etc/gpu-topology-scheduler/tls/ca.crt
install -m 0644 $(q "$out/scheduler-client.crt") /etc/gpu-topology-scheduler/tls/tls.crt
install -m 0600 $(q "$out/scheduler-client.key") /etc/gpu-topology-scheduler/tls/tls.key
MSG
