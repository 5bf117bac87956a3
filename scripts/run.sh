#!/usr/bin/env bash
# `make run`: starts what exists today in the foreground on 127.0.0.1:8080 and stops it
# cleanly on Ctrl-C. Today that is nginx with the kvgate module and conf.d/kvgate.conf;
# the engine process joins here once it exists (see README).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD:-build}
case $build in /*) ;; *) build=$root/$build ;; esac
port=${PORT:-8080}
prefix=$build/run
module=$build/ngx_http_kvgate_module.so

[ -f "$module" ] || { echo "run: $module is missing (make module)" >&2; exit 1; }
mkdir -p "$prefix/logs" "$prefix/tmp" "$prefix/conf"
chmod 755 "$prefix" "$prefix/tmp"

# The example config, made runnable: our module path, our prefix, our port, and nginx in
# the foreground. Everything else is exactly conf.d/kvgate.conf.
sed -e "s|^load_module .*|load_module $module;|" \
    -e "s|listen 127.0.0.1:8080;|listen 127.0.0.1:$port;|" \
    -e "s|unix:/run/kvgate/engine.sock|unix:$prefix/engine.sock|" \
    "$root/conf.d/kvgate.conf" > "$prefix/conf/nginx.conf"
cat >> "$prefix/conf/nginx.conf" <<CONF
daemon off;
pid $prefix/nginx.pid;
error_log $prefix/logs/error.log notice;
CONF
# Temp paths default to /var/lib/nginx; keep them in the prefix.
sed -i "s|^http {|http {\n    client_body_temp_path $prefix/tmp/body;\n    proxy_temp_path $prefix/tmp/proxy;\n    fastcgi_temp_path $prefix/tmp/fastcgi;\n    uwsgi_temp_path $prefix/tmp/uwsgi;\n    scgi_temp_path $prefix/tmp/scgi;\n    access_log $prefix/logs/access.log;|" \
    "$prefix/conf/nginx.conf"

nginx -p "$prefix/" -c "$prefix/conf/nginx.conf" -e "$prefix/logs/error.log" -t -q

cat <<MSG
kvgate: nginx with the kvgate module on http://127.0.0.1:$port  (logs: $prefix/logs/)
  The engine is the next milestone: until it exists every request to /v1/ answers
  503 engine_unavailable. Try:
    curl -s http://127.0.0.1:$port/v1/models
  The shared library's tools work now:
    echo -n "Once upon a time" | $build/bin/kvgate-tokenize --tokenizer ../shared/models/stories260K/tok512.bin --bos
Ctrl-C stops it.
MSG

nginx -p "$prefix/" -c "$prefix/conf/nginx.conf" -e "$prefix/logs/error.log" &
ngx=$!
trap 'kill -QUIT $ngx 2>/dev/null; wait $ngx 2>/dev/null; echo; echo "kvgate: stopped"; exit 0' INT TERM
wait $ngx
