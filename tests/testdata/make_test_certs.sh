#!/usr/bin/env bash
# Makes the TLS material the tests and the demo use, in OUTDIR:
#   ca.pem ca.key                a throwaway certificate authority
#   server.pem server.key        the daemon's certificate (localhost, 127.0.0.1)
#   client.pem client.key        a client certificate for mutual TLS
#   other-ca.pem                 an unrelated CA (a client trusting it must fail)
# Fresh keys every time; nothing secret is committed. Needs openssl.
set -euo pipefail
OUT=${1:?usage: make_test_certs.sh OUTDIR}
mkdir -p "$OUT"
cd "$OUT"
if [ -s server.pem ] && [ -s client.pem ] && [ -s other-ca.pem ]; then exit 0; fi
umask 077
days=3650
openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days $days \
  -subj "/CN=spikeguard test CA" 2>/dev/null
openssl req -x509 -newkey rsa:2048 -nodes -keyout other-ca.key -out other-ca.pem -days $days \
  -subj "/CN=unrelated CA" 2>/dev/null
cat > ext.cnf <<'CNF'
[server]
subjectAltName = DNS:localhost, IP:127.0.0.1
extendedKeyUsage = serverAuth
[client]
extendedKeyUsage = clientAuth
CNF
openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr \
  -subj "/CN=localhost" 2>/dev/null
openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem \
  -days $days -extfile ext.cnf -extensions server 2>/dev/null
openssl req -newkey rsa:2048 -nodes -keyout client.key -out client.csr \
  -subj "/CN=spikeguard-client" 2>/dev/null
openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out client.pem \
  -days $days -extfile ext.cnf -extensions client 2>/dev/null
rm -f server.csr client.csr ext.cnf ca.srl
chmod 644 ./*.pem
