#!/usr/bin/env bash
# Installs the Debian packages kvgate's build and tests need. Idempotent and quiet
# when everything is present. Run as root (or with sudo available).
set -euo pipefail

pkgs=(
    build-essential pkg-config perl
    libjansson-dev libssl-dev libutf8proc-dev
    nginx nginx-dev libpcre2-dev zlib1g-dev
    clang libclang-rt-14-dev
    libopenblas-dev libsimde-dev
    prometheus  # promtool and a real scrape for t/prometheus.t
    # t/gateway-dashboard.t loads the status page in a real browser (headless)
    chromium
    # t/chat-templates.t: the reference chat-template renderer (t/tools/jinja_ref.py)
    python3 python3-jinja2
)
# npm: t/gateway-sdk.t, t/gateway-anthropic-sdk.t and t/chat-templates.t install their npm
# packages with it. Debian's, unless a Node.js already here brings its own (NodeSource's nodejs package has npm in it,
# and conflicts with Debian's npm).
command -v npm >/dev/null 2>&1 || pkgs+=(nodejs npm)

# t/deb.t builds the Debian packages (make deb) and installs them on this machine, which it
# does only as root on Debian (or with KVGATE_DEB_TEST=1; KVGATE_DEB_TEST=0 turns it off):
# only then does it need the packaging tools.
if [ "${KVGATE_DEB_TEST:-}" = 1 ] || { [ "${KVGATE_DEB_TEST:-}" != 0 ] && [ "$(id -u)" -eq 0 ] \
        && [ -f /etc/debian_version ]; }; then
    pkgs+=(debhelper dpkg-dev fakeroot lintian help2man adduser)
fi

missing=()
for p in "${pkgs[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$p")
    fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "deps: installing ${missing[*]}"
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
# Debian's nginx and prometheus packages start their services when installed (nginx on
# :80, prometheus on :9090); the tests start their own. A policy-rc.d that denies every
# start keeps invoke-rc.d from starting them, for the install only (one already there is
# the machine's own and is left alone).
policy=/usr/sbin/policy-rc.d
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\n# kvgate deps.sh: no service starts during the install\nexit 101\n' | $sudo tee "$policy" >/dev/null
    $sudo chmod 755 "$policy"
    trap '$sudo rm -f "$policy"' EXIT
fi
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "deps: done"
