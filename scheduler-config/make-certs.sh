#!/usr/bin/env bash
# TLS option 2, without cert-manager: makes a private CA, the extender's serving certificate and
# kube-scheduler's client certificate with openssl, and the extender's seal key (32 random bytes), then prints the
# kubectl commands that create the three Secrets the manifests mount. It never touches a cluster itself.
# The seal Secret's command creates it only if it does not exist yet: a new key would make a restarted extender
# distrust the bind records of every pod bound before (README.md, "The seal key").
#
#   scheduler-config/make-certs.sh [OUT_DIR]      (default: a new directory under $TMPDIR)
#   scheduler-config/make-certs.sh --renew DIR    new leaves from the CA kept in DIR (its ca.crt and ca.key)
#
# --renew issues both leaves again (new keys, DAYS more) with the CA of an earlier run and prints the commands that
# replace the two TLS Secrets in place; ca.crt stays the same, so nothing that trusts it changes, and the seal key is
# left alone. The extender and kube-scheduler take the new files up without a restart once the kubelet has updated
# the Secret volumes (README.md, "TLS and mTLS"). It refuses a CA that expires before the new leaves would.
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

renew=false
if [[ "${1:-}" == "--renew" ]]; then
    renew=true
    shift
    if [[ -z "${1:-}" || ! -d "$1" ]]; then
        echo "make-certs.sh: --renew needs the directory of an earlier run (its ca.crt and ca.key)" >&2
        exit 2
    fi
fi
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
if ! $renew && [[ -e "$out/ca.key" ]]; then
    echo "make-certs.sh: $out already holds ca.key; choose an empty directory, or renew the leaves with --renew" >&2
    exit 2
fi
cd "$out"

serial() { echo "0x$(openssl rand -hex 16)"; }

if $renew; then
    if [[ ! -f ca.crt || ! -f ca.key ]]; then
        echo "make-certs.sh: $out has no ca.crt and ca.key to renew with" >&2
        exit 2
    fi
    if [[ "$(openssl x509 -in ca.crt -noout -pubkey)" != "$(openssl pkey -in ca.key -pubout)" ]]; then
        echo "make-certs.sh: $out/ca.key is not the key of $out/ca.crt" >&2
        exit 2
    fi
    if ! openssl x509 -in ca.crt -noout -checkend $((DAYS * 86400)) >/dev/null; then
        echo "make-certs.sh: the CA in $out expires within $DAYS days, before the new leaves would; make a new CA" \
            "(run without --renew) and replace all three Secrets" >&2
        exit 2
    fi
fi

# The CA: self-signed, may only sign leaf certificates (pathlen 0). Kept as it is by --renew.
if ! $renew; then
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
    rm -f ca.cnf
fi

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
chmod 0644 ca.crt extender.crt scheduler-client.crt

q() { printf '%q' "$1"; }
# tls_secret SECRET LEAF: the kubectl command that makes the TLS Secret of a leaf (continued on the next lines).
tls_secret() {
    printf 'kubectl -n %s create secret generic %s --type=kubernetes.io/tls \\\n' "$NAMESPACE" "$1"
    printf '    --from-file=tls.crt=%s --from-file=tls.key=%s \\\n' "$(q "$out/$2.crt")" "$(q "$out/$2.key")"
    printf '    --from-file=ca.crt=%s' "$(q "$out/ca.crt")"
}
option_a() {
    cat <<MSG
install -d -m 0700 /etc/gpu-topology-scheduler/tls
install -m 0644 $(q "$out/ca.crt") /etc/gpu-topology-scheduler/tls/ca.crt
install -m 0644 $(q "$out/scheduler-client.crt") /etc/gpu-topology-scheduler/tls/tls.crt
install -m 0600 $(q "$out/scheduler-client.key") /etc/gpu-topology-scheduler/tls/tls.key
MSG
}

if $renew; then
    # Replaced in place: the same names, keys and CA, so the Deployments' volumes take the new files up as they are.
    cat <<MSG
Renewed in $out with its CA (ca.crt unchanged, ca.key still to be kept offline):
  extender.crt extender.key              serving certificate of $svc, until $(openssl x509 -in extender.crt -noout -enddate | cut -d= -f2)
  scheduler-client.crt scheduler-client.key   kube-scheduler's client certificate, until $(openssl x509 -in scheduler-client.crt -noout -enddate | cut -d= -f2)

Replace the two TLS Secrets in place (the seal Secret stays as it is):

$(tls_secret "$EXTENDER_SECRET" extender) \\
    --dry-run=client -o yaml | kubectl replace -f -
$(tls_secret "$SCHEDULER_SECRET" scheduler-client) \\
    --dry-run=client -o yaml | kubectl replace -f -

Option A (the control plane's kube-scheduler), on every control-plane node:

$(option_a)
MSG
    exit 0
fi

# The seal key: 32 random bytes, written as 64 hex digits (the extender strips whitespace around the file's
# content, which could shorten raw random bytes; hex keeps all 256 bits). Mode 0600 from the umask.
openssl rand -hex 32 > seal.key

cat <<MSG
Wrote to $out:
  ca.crt ca.key                          private CA (ca.key stays off the cluster: keep it offline)
  extender.crt extender.key              serving certificate of $svc
  scheduler-client.crt scheduler-client.key   kube-scheduler's client certificate
  seal.key                               the extender's seal key (32 random bytes, hex)

Create the Secrets (after the namespace: kubectl apply -f scheduler-config/namespace.yaml):

$(tls_secret "$EXTENDER_SECRET" extender)
$(tls_secret "$SCHEDULER_SECRET" scheduler-client)
kubectl -n $NAMESPACE get secret $SEAL_SECRET >/dev/null 2>&1 || \\
    kubectl -n $NAMESPACE create secret generic $SEAL_SECRET --from-file=key=$(q "$out/seal.key")

Option A (the control plane's kube-scheduler), on every control-plane node:

$(option_a)
MSG
