#!/usr/bin/env bash
# `make run`: the engine and nginx with the kvgate module on 127.0.0.1:8080, in the
# foreground; Ctrl-C stops both cleanly.
#
#   make run                                   the default model (see below)
#   make run MODEL=path/to/model.gguf          a GGUF file (carries its tokenizer)
#   make run MODEL=dir/ TOKENIZER=...          any format the engine loads; TOKENIZER for
#                                              formats that do not carry one (llama2.c)
#   PORT=8081 make run                         another port
#
# Without MODEL: stories260K from ../shared (a real, tiny, trained story model) when it
# is there, else synthetic:260K (random weights: the answers are noise, the caching and
# the API are real). nginx uses conf.d/kvgate.conf with this prefix's paths.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD:-build}
case $build in /*) ;; *) build=$root/$build ;; esac
port=${PORT:-8080}
prefix=$build/run
module=$build/ngx_http_kvgate_module.so
engine=$build/bin/kvgate-engine
shared=${KVGATE_SHARED:-$root/../shared}

[ -f "$module" ] || { echo "run: $module is missing (make module)" >&2; exit 1; }
[ -x "$engine" ] || { echo "run: $engine is missing (make engine)" >&2; exit 1; }
mkdir -p "$prefix/logs" "$prefix/tmp" "$prefix/conf"
chmod 755 "$prefix" "$prefix/tmp"

model_args=()
if [ -n "${MODEL:-}" ]; then
    model_args=(--model "$MODEL")
    [ -n "${TOKENIZER:-}" ] && model_args+=(--tokenizer "$TOKENIZER")
    [ -n "${CHAT_TEMPLATE:-}" ] && model_args+=(--chat-template "$CHAT_TEMPLATE")
    echo "kvgate: model $MODEL${TOKENIZER:+ (tokenizer $TOKENIZER)}"
elif [ -f "$shared/models/stories260K/stories260K.bin" ]; then
    model_args=(--model "$shared/models/stories260K/stories260K.bin"
                --tokenizer "$shared/models/stories260K/tok512.bin" --chat-template plain)
    echo "kvgate: no MODEL given: serving stories260K, a tiny trained story model from $shared"
else
    model_args=(--model synthetic:260K --chat-template plain)
    echo "kvgate: no MODEL given and no ../shared: serving synthetic:260K (random weights, the"
    echo "        answers are noise; give MODEL=path/to/model.gguf for a real model)"
fi

sock=$prefix/engine.sock

# The example config, made runnable: our module, our prefix, our port, our socket and
# logs, nginx in the foreground. Everything else is exactly conf.d/kvgate.conf.
sed -e "s|^load_module .*|load_module $module;|" \
    -e "s|listen 127.0.0.1:8080;|listen 127.0.0.1:$port;|" \
    -e "s|unix:/run/kvgate/engine.sock|unix:$sock|" \
    -e "s|/var/log/nginx/|$prefix/logs/|" \
    "$root/conf.d/kvgate.conf" > "$prefix/conf/nginx.conf"
cat >> "$prefix/conf/nginx.conf" <<CONF
daemon off;
pid $prefix/nginx.pid;
error_log $prefix/logs/error.log notice;
CONF
# Temp paths default to /var/lib/nginx; keep them in the prefix.
sed -i "s|^http {|http {\n    client_body_temp_path $prefix/tmp/body;\n    proxy_temp_path $prefix/tmp/proxy;\n    fastcgi_temp_path $prefix/tmp/fastcgi;\n    uwsgi_temp_path $prefix/tmp/uwsgi;\n    scgi_temp_path $prefix/tmp/scgi;|" \
    "$prefix/conf/nginx.conf"

nginx -p "$prefix/" -c "$prefix/conf/nginx.conf" -e "$prefix/logs/error.log" -t -q

# The engine first; its readiness line tells the model name for the example below.
# nginx's workers run as nobody when nginx starts as root: the socket lives in this
# private prefix with mode 0666 (use --socket-group and 0660 in production).
rm -f "$sock" "$prefix/logs/engine.out"
"$engine" "${model_args[@]}" --socket "$sock" --socket-mode 0666 \
    >"$prefix/logs/engine.out" 2>"$prefix/logs/engine.log" &
engine_pid=$!
ready=""
for _ in $(seq 3000); do
    ready=$(grep -m1 "ready on" "$prefix/logs/engine.out" 2>/dev/null || true)
    [ -n "$ready" ] && break
    if ! kill -0 "$engine_pid" 2>/dev/null; then
        echo "run: the engine did not start:" >&2
        cat "$prefix/logs/engine.log" >&2
        exit 1
    fi
    sleep 0.1
done
[ -n "$ready" ] || { echo "run: the engine did not become ready" >&2; kill "$engine_pid"; exit 1; }
echo "$ready"
name=$(printf '%s\n' "$ready" | sed -n 's/.*: model \([^ ]*\) (.*/\1/p')

nginx -p "$prefix/" -c "$prefix/conf/nginx.conf" -e "$prefix/logs/error.log" &
ngx=$!

stop() {
    trap - INT TERM
    kill -QUIT "$ngx" 2>/dev/null || true
    wait "$ngx" 2>/dev/null || true
    kill -TERM "$engine_pid" 2>/dev/null || true
    wait "$engine_pid" 2>/dev/null || true
    echo
    echo "kvgate: stopped"
    exit 0
}
trap stop INT TERM

cat <<MSG
kvgate: nginx on http://127.0.0.1:$port, engine on $sock  (logs: $prefix/logs/)
  Status page: http://127.0.0.1:$port/  (live in a browser; the JSON: curl -s http://127.0.0.1:$port/status)
  Try:
    curl -s http://127.0.0.1:$port/v1/completions -H 'Content-Type: application/json' \\
         -H 'X-Tenant-Id: demo' -d '{"model": "$name", "prompt": "Once upon a time", "max_tokens": 48}'
    curl -sN http://127.0.0.1:$port/v1/chat/completions -H 'Content-Type: application/json' \\
         -d '{"model": "$name", "messages": [{"role": "user", "content": "Tell me a story"}], "stream": true}'
    curl -s http://127.0.0.1:$port/metrics
Ctrl-C stops both.
MSG

wait "$ngx"
stop
