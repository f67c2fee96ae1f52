#!/bin/sh
# Installs sluice's build, test and bench dependencies from Debian 12's archive.
# --if-missing: do nothing when every package is already installed (fast path
# for `make run` / `make test` on a machine that has them).
set -eu
PKGS="build-essential pkg-config clang clang-format libclang-rt-14-dev
libevent-dev libssl-dev openssl libjansson-dev libpcre2-dev libhiredis-dev
libcmocka-dev libhttp-parser-dev libyaml-dev uthash-dev libyajl-dev
redis-server nginx-light wrk prometheus curl ca-certificates
python3 python3-pytest python3-numpy python3-regex python3-hpack procps iproute2
chromium
kotlin default-jre-headless libokhttp-java
libsystemd-dev systemd debhelper dpkg-dev lintian man-db logrotate
libunistring-dev
zlib1g-dev
libnghttp2-dev nghttp2-client"

if [ "${1:-}" = "--if-missing" ]; then
    missing=""
    for p in $PKGS; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" ||
            missing="$missing $p"
    done
    [ -z "$missing" ] && exit 0
    echo "deps: installing:$missing"
fi

SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# shellcheck disable=SC2086
$SUDO apt-get install -y -qq --no-install-recommends $PKGS >/dev/null
# Node.js (for the openai npm client tests) comes with the machine; Debian 12's own
# nodejs is used only when no node is on PATH.
command -v node >/dev/null 2>&1 || $SUDO apt-get install -y -qq nodejs npm >/dev/null
# The stock redis-server and nginx services are not used: tests start their own.
