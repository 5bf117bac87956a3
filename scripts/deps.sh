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
    # t/gateway-dashboard.t loads the status page in a real browser (headless)
    chromium
)

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
# The Debian nginx package starts a service on :80 when installed; policy-rc.d keeps
# it from starting where we can (containers without systemd ignore it anyway).
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "deps: done"
