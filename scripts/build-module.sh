#!/usr/bin/env bash
# Builds the kvgate nginx dynamic module against the installed Debian nginx
# (see ../shared/notes/nginx-module-on-debian.md for why it is done this way).
#
#   scripts/build-module.sh            -> $BUILD/ngx_http_kvgate_module.so
#   scripts/build-module.sh --asan     -> $BUILD/asan/ngx_http_kvgate_module.so
#   (KVG_MODULE_ASAN=1 does the same as --asan)
#
# BUILD is the build directory (default: build), as in the Makefile. The ASan variant links
# $BUILD/asan/libkvgate.a (the library built with ASan+UBSan), the plain one $BUILD/libkvgate.a.
#
# nginx's configure (~25 s) runs only when this build directory has never been configured or
# when something it bakes into objs/Makefile changed: the addon config, the module's .c
# files, the compiler flags, the library path or the nginx-dev version. Otherwise only
# `make -f objs/Makefile modules` runs. Quiet on success; the full log is printed on failure.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD:-build}
case $build in /*) ;; *) build=$root/$build ;; esac

asan=${KVG_MODULE_ASAN:-0}
case ${1:-} in
    --asan) asan=1 ;;
    "") ;;
    *) echo "usage: $0 [--asan]" >&2; exit 2 ;;
esac

ngx_dist=/usr/share/nginx/src
ngx_bin=/usr/sbin/nginx
name=ngx_http_kvgate_module

# Debian's conf_flags lacks the --with-cc-opt/--with-ld-opt its nginx was built with
# (nginx -V); these mirror them, minus the reproducible-build path mapping. They do not
# enter the binary-compatibility signature; they only give the module the same hardening.
if [ "$asan" = 1 ]; then
    out=$build/asan
    lib=$build/asan/libkvgate.a
    # The library in $BUILD/asan is instrumented for UBSan as well, so the link needs the
    # UBSan runtime too; the module itself gets both so its own code is checked the same way.
    cc_opt="-g -O1 -fPIC -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
    ld_opt="-Wl,-z,relro -Wl,-z,now -fPIC -fsanitize=address,undefined"
    variant="ASan module"
else
    out=$build
    lib=$build/libkvgate.a
    cc_opt="-g -O2 -fstack-protector-strong -Wformat -Werror=format-security -fPIC -D_FORTIFY_SOURCE=2"
    ld_opt="-Wl,-z,relro -Wl,-z,now -fPIC"
    variant="module"
fi

src=$out/nginx-src
log=$out/nginx-module-build.log
so=$out/$name.so

fail() {
    echo "build-module: $*" >&2
    if [ -s "$log" ]; then
        echo "---- $log ----" >&2
        cat "$log" >&2
        echo "---- end of $log ----" >&2
    fi
    exit 1
}

[ -d "$ngx_dist" ] || fail "$ngx_dist not found: install nginx-dev (make deps)"
[ -x "$ngx_bin" ] || fail "$ngx_bin not found: install nginx (make deps)"
if [ ! -f "$lib" ]; then
    if [ "$asan" = 1 ]; then
        fail "$lib not found: run 'make BUILD=${BUILD:-build} ${BUILD:-build}/asan/libkvgate.a' first"
    fi
    fail "$lib not found: run 'make BUILD=${BUILD:-build} lib' first"
fi

mkdir -p "$out"
# Two makes started on the same build directory must not configure the same tree at once.
exec 9>"$out/.build-module.lock"
flock 9
: >"$log"

ngx_dev_version=$(dpkg-query -W -f='${Version}' nginx-dev 2>/dev/null || echo unknown)
stamp_text=$(
    echo "nginx-dev $ngx_dev_version"
    echo "cc_opt $cc_opt"
    echo "ld_opt $ld_opt"
    echo "lib $lib"
    echo "root $root"
    cat "$root/config"
    cd "$root" && ls ngx_module/*.c
)
stamp=$src/.kvgate-configure-stamp

if [ ! -f "$src/objs/Makefile" ] || [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$stamp_text" ]; then
    start=$SECONDS
    rm -rf "$src"
    cp -r "$ngx_dist" "$src"
    chmod -R u+w "$src"
    (
        cd "$src"
        # shellcheck disable=SC1091
        source ./conf_flags
        export KVG_LIB=$lib
        ./configure "${NGX_CONF_FLAGS[@]}" --with-cc-opt="$cc_opt" --with-ld-opt="$ld_opt" \
            --add-dynamic-module="$root"
    ) >>"$log" 2>&1 || fail "nginx configure failed for the $variant"
    printf '%s\n' "$stamp_text" >"$stamp"
    echo "build-module: configured $src ($((SECONDS - start)) s)"
fi

# objs/Makefile does not list libraries as prerequisites of the .so, so a rebuilt
# libkvgate.a would not be relinked on its own.
if [ "$lib" -nt "$src/objs/$name.so" ]; then
    rm -f "$src/objs/$name.so"
fi

make -C "$src" -f objs/Makefile -j"$(nproc)" modules >>"$log" 2>&1 \
    || fail "compiling the $variant failed"

# load_module refuses a module whose signature (the NGX_* features it was compiled with)
# differs from the binary's; catch that here rather than at the first nginx -t.
signature() {
    LC_ALL=C grep -aoE '[0-9],[0-9],[0-9],[01]{30,}' "$1" | sort -u
}
want=$(signature "$ngx_bin")
got=$(signature "$src/objs/$name.so")
[ -n "$want" ] && [ "$(printf '%s\n' "$want" | wc -l)" = 1 ] \
    || fail "cannot read the module signature of $ngx_bin (got '$want')"
[ "$got" = "$want" ] \
    || fail "signature mismatch: $ngx_bin has '$want', the $variant has '$got' (not binary compatible)"

cp "$src/objs/$name.so" "$so.tmp"
mv -f "$so.tmp" "$so"
echo "build-module: ${so#"$root"/} ok"
