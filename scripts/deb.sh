#!/usr/bin/env bash
# `make deb`: builds kvgate's Debian packages with dpkg-buildpackage (debian/ at the top
# of the repository) into $BUILD/deb/:
#   libnginx-mod-http-kvgate_VERSION_ARCH.deb   the nginx module
#   kvgate-engine_VERSION_ARCH.deb              the engine, its tools, the systemd unit
# then runs lintian on them ($BUILD/deb/lintian.txt).
#
# dpkg-buildpackage writes its results next to the source tree and wants the tree to
# itself, so it builds a copy: $BUILD/deb/src/kvgate-VERSION holds the files git
# tracks plus the untracked ones it does not ignore (without git: everything but the
# build folders). Nothing is rebuilt when neither those files nor the installed
# nginx-dev (the ABI the module is built for) changed since the last build: the
# fingerprint of both is $BUILD/deb/.fingerprint. Quiet on success; the build log is
# $BUILD/deb/build.log and is printed on failure.
#
# Needs dpkg-dev, debhelper, nginx-dev and the other Build-Depends of debian/control
# (make deps installs them where the package test runs). KVG_DEB_LINTIAN=0 skips lintian.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD:-build}
case $build in /*) ;; *) build=$root/$build ;; esac
out=$build/deb

fail() {
    echo "deb: $*" >&2
    if [ -s "$out/build.log" ]; then
        echo "---- $out/build.log (last 80 lines) ----" >&2
        tail -n 80 "$out/build.log" >&2
        echo "---- end of $out/build.log ----" >&2
    fi
    exit 1
}

command -v dpkg-buildpackage >/dev/null || fail "dpkg-buildpackage not found: install dpkg-dev debhelper (make deps as root)"
cd "$root"
version=$(dpkg-parsechangelog -S Version)
arch=$(dpkg-architecture -qDEB_HOST_ARCH)

# The source files, NUL-separated, relative to the top: those the packages are built
# from. The tests, the docs, the fuzzers and CI's scripts are left out, so that editing
# them does not rebuild the packages.
list_sources() {
    list_all | grep -zvE '^(t|docs|fuzz|\.ci)/'
}
list_all() {
    if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
        git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do
            # A tracked file deleted in the work tree is not part of the sources any more.
            [ -e "$f" ] && printf '%s\0' "$f"
        done
    else
        find . \( -path ./build -o -path './build-*' -o -name .git \) -prune -o \( -type f -o -type l \) \
            -printf '%P\0'
    fi | LC_ALL=C sort -z
}

mkdir -p "$out"
exec 9>"$out/.lock"
flock 9

fingerprint=$(
    {
        dpkg-query -W -f='nginx-dev ${Version}\n' nginx-dev 2>/dev/null || echo "nginx-dev none"
        list_sources | xargs -0 sha256sum --
    } | sha256sum | cut -d' ' -f1
)
debs=("$out/libnginx-mod-http-kvgate_${version}_$arch.deb" "$out/kvgate-engine_${version}_$arch.deb")
if [ -f "$out/.fingerprint" ] && [ "$(cat "$out/.fingerprint")" = "$fingerprint" ] \
    && [ -f "${debs[0]}" ] && [ -f "${debs[1]}" ]; then
    echo "deb: ${debs[0]#"$root"/} ${debs[1]#"$root"/} up to date"
    exit 0
fi

start=$SECONDS
rm -f "$out/.fingerprint" "$out"/*.deb "$out"/*.buildinfo "$out"/*.changes "$out/lintian.txt"
rm -rf "$out/src"
tree=$out/src/kvgate-$version
mkdir -p "$tree"
list_sources | tar -C "$root" --null -T - -cf - | tar -C "$tree" -xf -

# -b: binary packages only (the source package would be a tarball of the whole tree);
# -us -uc: nothing to sign with.
(cd "$tree" && dpkg-buildpackage -b -us -uc -j"$(nproc)") >"$out/build.log" 2>&1 \
    || fail "dpkg-buildpackage failed"
mv "$out/src"/*.deb "$out/src"/*.buildinfo "$out/src"/*.changes "$out/"
rm -rf "$out/src"
for d in "${debs[@]}"; do
    [ -f "$d" ] || fail "dpkg-buildpackage did not make ${d#"$out"/}"
done
echo "deb: built ${debs[0]#"$root"/} ${debs[1]#"$root"/} ($((SECONDS - start)) s)"

if [ "${KVG_DEB_LINTIAN:-1}" != 0 ]; then
    if command -v lintian >/dev/null; then
        # lintian's exit status is 1 on any error tag: the packages are still usable, so
        # report them rather than fail (docs/operations.md lists the tags left and why).
        lintian --tag-display-limit 0 "$out/kvgate_${version}_$arch.changes" 2>&1 \
            | grep -v "^running with root privileges is not recommended" >"$out/lintian.txt" || true
        if [ -s "$out/lintian.txt" ]; then
            echo "deb: lintian ($out/lintian.txt):"
            sed 's/^/  /' "$out/lintian.txt"
        else
            echo "deb: lintian: clean"
        fi
    else
        echo "deb: lintian not installed: not checked"
    fi
fi
printf '%s\n' "$fingerprint" >"$out/.fingerprint"
