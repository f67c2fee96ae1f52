# bench/lib.sh — what the bench scripts share: background processes that are
# cleaned up on exit, waiting for a port, and CPU time from /proc. Sourced
# (bash) after WORK (the scratch directory) is set.

PIDS=()
cleanup() {
    local p
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    if [ "${BENCH_KEEP:-0}" = 1 ]; then echo "bench: kept $WORK"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Starts a background process, remembered for cleanup; its pid in $LAST.
spawn() {
    "$@" &
    LAST=$!
    PIDS+=("$LAST")
}

# Stops one process started with spawn and forgets it.
stop() {
    local p=$1 keep=() q
    kill "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
    for q in "${PIDS[@]}"; do [ "$q" = "$p" ] || keep+=("$q"); done
    PIDS=("${keep[@]}")
}

# Exits unless the given ports of 127.0.0.1 are free (nothing accepts).
ports_free() {
    local p
    for p in "$@"; do
        if (exec 3<>/dev/tcp/127.0.0.1/"$p") 2>/dev/null; then
            echo "bench: port $p is in use (set BENCH_PORT_BASE)" >&2
            exit 1
        fi
    done
}

# Waits (bounded: $3 tries 50 ms apart, default 200; valgrind needs ~1200)
# until something accepts on 127.0.0.1:$1 and $2 is alive.
wait_port() {
    local _
    for _ in $(seq "${3:-200}"); do
        kill -0 "$2" 2>/dev/null || { echo "bench: process $2 died (port $1)" >&2; exit 1; }
        if (exec 3<>/dev/tcp/127.0.0.1/"$1") 2>/dev/null; then return 0; fi
        sleep 0.05
    done
    echo "bench: nothing listens on port $1" >&2
    exit 1
}

# Waits (bounded: valgrind starts slowly, 60 s) until $2 (a process) answers
# http://127.0.0.1:$1/metrics, sluice's admin listener.
wait_admin_slow() {
    local _
    for _ in $(seq 600); do
        kill -0 "$2" 2>/dev/null || { echo "bench: process $2 died (admin port $1)" >&2; exit 1; }
        if curl -sf "http://127.0.0.1:$1/metrics" >/dev/null 2>&1; then return 0; fi
        sleep 0.1
    done
    echo "bench: nothing answers on admin port $1 (under valgrind?)" >&2
    exit 1
}

# A throwaway P-256 certificate for the TLS benches: $WORK/crt.pem, $WORK/key.pem.
bench_cert() {
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
        -subj /CN=localhost -keyout "$WORK/key.pem" -out "$WORK/crt.pem" 2>/dev/null
}

# The h2 benches' sluice conf (h2_bench.sh, callgrind_h2.sh): TLS on 127.0.0.1:$2
# with bench_cert's pair, in front of http://127.0.0.1:$3; written to $1.
h2_sluice_conf() {
    cat >"$1" <<EOF
listen:
  - address: 127.0.0.1:$2
    tls: { cert: $WORK/crt.pem, key: $WORK/key.pem }
admin: { address: "off" }
workers: 1
limits: { keepalive_requests: 100000 }
http2: { max_concurrent_streams: 128 }
upstreams:
  main:
    servers: [ { url: "http://127.0.0.1:$3" } ]
    keepalive: 128
models:
  bench-model: { upstream: main }
log: { access: "off", level: warn }
EOF
}

# "CPU USER": utime+stime and utime alone (user space), in clock ticks,
# summed over the given processes (all threads), both from one read of each
# /proc/PID/stat so that the two bracket the same interval.
cpu_user_ticks() {
    local p t=0 u=0 a b
    for p in "$@"; do
        read -r a b < <(awk '{ sub(/^.*\) /, ""); printf "%d %d\n", $12 + $13, $12 }' "/proc/$p/stat")
        t=$((t + a))
        u=$((u + b))
    done
    echo "$t $u"
}

# utime+stime alone.
cpu_ticks() {
    local t u
    read -r t u <<<"$(cpu_user_ticks "$@")"
    echo "$t"
}

# The baseline proxy every bench measures sluice against: nginx relaying to
# the model server at 127.0.0.1:$2 over kept-alive HTTP/1.1 connections,
# listening on 127.0.0.1:$3 and setting the upstream key as sluice's confs
# do. $4 more location directives (say "proxy_buffering off;"), $5 more
# lines for the http block, $6 master_process (as nginx_conf's $3).
nginx_proxy_conf() {
    nginx_conf "$1" "$5
    upstream model { server 127.0.0.1:$2; keepalive 64; }
    server {
        listen 127.0.0.1:$3;
        location / {
            proxy_pass http://model;
            proxy_http_version 1.1;${4:+
            $4}
            proxy_set_header Connection \"\";
            proxy_set_header Authorization \"Bearer upstream-key\";
        }
    }" "${6:-}"
}

# A bench nginx's conf in $1/nginx.conf: one worker, no access log, its pid,
# error log and temp paths inside $1, and $2 as the rest of its http block;
# $3 "off" runs it without a master process (default on); $4 its
# worker_connections (default 4096; more raises its descriptor limit too).
nginx_conf() {
    mkdir -p "$1/tmp"
    cat >"$1/nginx.conf" <<EOF
worker_processes 1;
daemon off;
master_process ${3:-on};
pid $1/nginx.pid;
error_log $1/error.log warn;
worker_rlimit_nofile $((${4:-4096} * 2));
events { worker_connections ${4:-4096}; }
http {
    access_log off;
    keepalive_requests 1000000;
    client_body_temp_path $1/tmp/body;
    proxy_temp_path $1/tmp/proxy;
    fastcgi_temp_path $1/tmp/fastcgi;
    uwsgi_temp_path $1/tmp/uwsgi;
    scgi_temp_path $1/tmp/scgi;
$2
}
EOF
}

# The model server of the policy and cache benches: nginx answering every
# request with one fixed 265-byte chat.completion on 127.0.0.1:$1, pinned to
# CPU $2 (uses $WORK and $NGINX_BIN). Returns once it accepts.
FIXED_ANSWER='{"id":"chatcmpl-bench","object":"chat.completion","created":0,"model":"bench-model","choices":[{"index":0,"message":{"role":"assistant","content":"Hello! How can I help?"},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":7,"total_tokens":16}}'
nginx_fixed_upstream() {
    local port=$1 cpu=$2
    nginx_conf "$WORK/nginx" "    server {
        listen 127.0.0.1:$port;
        location / {
            default_type application/json;
            return 200 '$FIXED_ANSWER';
        }
    }"
    spawn taskset -c "$cpu" "$NGINX_BIN" -p "$WORK/nginx/" -e "$WORK/nginx/error.log" \
        -c "$WORK/nginx/nginx.conf"
    wait_port "$port" "$LAST"
}

# The scale benches' nginx confs (scale.sh, kernel_req.sh, cachegrind_scale.sh),
# for any number of connections (30,000 a worker, backlog 8192, idle
# keep-alive 300 s), into directory $1: scale_upstream_conf answers
# $FIXED_ANSWER on 127.0.0.1:$2; scale_proxy_conf proxies 127.0.0.1:$2 to the
# upstream on 127.0.0.1:$3 with a keep-alive pool that never closes an idle
# connection, plus /nginx_status; $4 master_process (default on; "off"
# for a run under valgrind).
scale_upstream_conf() {
    nginx_conf "$1" "    keepalive_timeout 300s;
    server {
        listen 127.0.0.1:$2 backlog=8192;
        location / {
            default_type application/json;
            return 200 '$FIXED_ANSWER';
        }
    }" on 30000
}

scale_proxy_conf() {
    nginx_conf "$1" "    keepalive_timeout 300s;
    upstream bench { server 127.0.0.1:$3; keepalive 16384; keepalive_requests 1000000; }
    server {
        listen 127.0.0.1:$2 backlog=8192;
        location / {
            proxy_pass http://bench;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
        }
        location = /nginx_status { stub_status; }
    }" "${4:-on}" 30000
}

# A minimal sluice conf on stdout: one worker, listener 127.0.0.1:$1, upstream
# "main" at 127.0.0.1:$2 serving bench-model, access log off. $3 the admin
# port or "off" (default off); $4 the upstream's extra line (default
# "keepalive: 64", "-" for none); $5 the log level (default warn).
bench_sluice_conf() {
    local admin='"off"' up_line=${4:-keepalive: 64}
    [ "${3:-off}" = off ] || admin=127.0.0.1:$3
    cat <<EOF
listen:
  - address: 127.0.0.1:$1
admin:
  address: $admin
workers: 1
upstreams:
  main:
    servers:
      - url: "http://127.0.0.1:$2"
EOF
    [ "$up_line" = - ] || printf '    %s\n' "$up_line"
    cat <<EOF
models:
  bench-model: { upstream: main }
log:
  access: "off"
  level: ${5:-warn}
EOF
}

# issue #16's sluice confs (bench/realistic.sh, bench/callgrind_req.sh): $WORK/$1.yaml;
# $1 name, $2 port, $3 admin port, $4 full, plain or bodies, $5 upstream port
# (default $UP_PORT); uses $WORK/words.txt and checks the conf with $SLUICE_BIN -t.
# The benches' auth section: HS256 tokens signed with SLUICE_BENCH_TOKEN_SECRET
# (`sluice token` makes them), request signatures with
# SLUICE_BENCH_SIGNING_SECRET, required when $1 is "true". Further lines of
# the section (indented two spaces) may follow as $2.
export SLUICE_BENCH_TOKEN_SECRET=bench-token-secret-0123456789abcdefghij
export SLUICE_BENCH_SIGNING_SECRET=bench-signing-secret-0123456789abcdefgh
# nonce_memory 1g (8 Mi nonces): a signed bench sends 50-60k requests/s for
# a warm-up and every round into one process, past 1 Mi nonces (the default
# 128m) by a third round, when the store would answer nonce_store_full.
bench_auth_conf() {
    cat <<EOF
auth:
  tokens:
    issuer: sluice
    audience: chat
    keys:
      - { kid: k1, alg: HS256, secret_env: SLUICE_BENCH_TOKEN_SECRET }
  signing: { required: $1, secret_env: SLUICE_BENCH_SIGNING_SECRET, window: 300s, nonce_memory: 1g }
EOF
    [ -z "${2:-}" ] || printf '%s\n' "$2"
}

# issue #16's model server: nginx answering every request with a 282-byte
# chat.completion on 127.0.0.1:$1, from $WORK/up (uses $NGINX_BIN). $2 a CPU
# to pin it to ("" for none), $3 more lines for its http block, $4 its
# master_process (default on). Returns once it accepts.
REALISTIC_ANSWER='{"id":"chatcmpl-bench","object":"chat.completion","created":1700000000,"model":"served-model","choices":[{"index":0,"message":{"role":"assistant","content":"The sea is vast and so calm."},"finish_reason":"stop"}],"usage":{"prompt_tokens":31,"completion_tokens":9,"total_tokens":40}}'
# POST /v1/responses gets the same answer as a Responses API object.
REALISTIC_RESP_ANSWER='{"id":"resp_bench","object":"response","created_at":1700000000,"status":"completed","model":"served-model","output":[{"id":"msg_bench","type":"message","status":"completed","role":"assistant","content":[{"type":"output_text","text":"The sea is vast and so calm.","annotations":[]}]}],"usage":{"input_tokens":31,"output_tokens":9,"total_tokens":40}}'
realistic_upstream() {
    local pin=()
    [ -z "${2:-}" ] || pin=(taskset -c "$2")
    nginx_conf "$WORK/up" "${3:-}
    server {
        listen 127.0.0.1:$1;
        location / {
            default_type application/json;
            return 200 '$REALISTIC_ANSWER';
        }
        location = /v1/responses {
            default_type application/json;
            return 200 '$REALISTIC_RESP_ANSWER';
        }
    }" "${4:-on}"
    spawn "${pin[@]}" "$NGINX_BIN" -p "$WORK/up/" -e "$WORK/up/error.log" -c "$WORK/up/nginx.conf"
    wait_port "$1" "$LAST"
}

# issue #16's realistic request with "stream":true, written to $1 (compact JSON).
realistic_sse_body() {
    python3 - "$1" <<'EOF'
import json, sys
b = {"model": "chat-model", "messages": [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Write one sentence about the sea, please, in plain English."}],
    "max_tokens": 64, "stream": True}
open(sys.argv[1], "wb").write(json.dumps(b, separators=(",", ":")).encode())
EOF
}

# issue #16's realistic request as the Responses API sends it (the system
# prompt as instructions, the user text as input, max_output_tokens), into
# $1; $2 "stream" for its streamed form.
realistic_resp_body() {
    python3 - "$1" "${2:-}" <<'EOF'
import json, sys
b = {"model": "chat-model", "instructions": "You are a helpful assistant.",
     "input": "Write one sentence about the sea, please, in plain English.",
     "max_output_tokens": 64}
if sys.argv[2] == "stream":
    b["stream"] = True
open(sys.argv[1], "wb").write(json.dumps(b, separators=(",", ":")).encode())
EOF
}

# issue #16's body with escapes, as an SDK that writes \n and \uXXXX sends
# it: a two-line system prompt, a user message with \n, one \" and one
# \u00e9 (confs plain-esc and full-esc), into $1.
realistic_esc_body() {
    printf '%s' '{"model":"chat-model","messages":[{"role":"system","content":"You are a helpful assistant.\nAnswer in plain English."},{"role":"user","content":"Write one sentence about the sea, please.\nUse the word \"tide\" and the caf\u00e9 by the harbour."}],"max_tokens":64}' >"$1"
}

# issue #16's body with the user message as content parts, as a multimodal
# (vision) client sends it: the question in two text parts and one
# image_url part (confs plain-parts and full-parts), into $1.
realistic_parts_body() {
    printf '%s' '{"model":"chat-model","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":[{"type":"text","text":"Write one sentence about the sea, please,"},{"type":"text","text":" in plain English."},{"type":"image_url","image_url":{"url":"https://example.com/images/sea-0042.jpg"}}]}],"max_tokens":64}' >"$1"
}

# issue #16's body with a realistic tools array of two functions (nested
# parameter schemas: an enum, an array of objects), as an agent SDK sends
# it (confs full-tools and full-tools-budget), into $1.
realistic_tools_body() {
    python3 - "$1" <<'EOF'
import json, sys
tools = [
    {"type": "function", "function": {
        "name": "get_weather",
        "description": "Get the current weather at a place on the coast.",
        "parameters": {"type": "object", "properties": {
            "location": {"type": "string", "description": "City and country, e.g. Brest, France"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["location"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "search_tides",
        "description": "Search the tide tables of a harbour for a day.",
        "parameters": {"type": "object", "properties": {
            "harbour": {"type": "string"},
            "date": {"type": "string", "description": "ISO 8601 date"},
            "filters": {"type": "array", "items": {"type": "object", "properties": {
                "kind": {"type": "string", "enum": ["high", "low"]},
                "min_height_m": {"type": "number"}}}}},
            "required": ["harbour", "date"]}}}]
b = {"model": "chat-model", "messages": [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Write one sentence about the sea, please, in plain English."}],
    "max_tokens": 64, "tools": tools}
open(sys.argv[1], "wb").write(json.dumps(b, separators=(",", ":")).encode())
EOF
}

# issue #16's three confs (plain, full, full-sse) in $WORK on one port pair
# ($1 listen, $2 admin): realistic_upstream on $UP_PORT and, when $3 (the
# confs to be run) names full-sse or full-resp-sse, $SSE_UP_BIN's 8 events
# on $SSE_UP_PORT,
# with the streamed body in $WORK/body-sse.json; full-sig (full, every
# request signed) beside them. Sets TOKEN, a bearer token for the full confs,
# and SIGNING_KEY, its signing key.
realistic_trio() {
    realistic_upstream "$UP_PORT"
    case " $3 " in *" full-sse "* | *" full-sse-budget "* | *" full-resp-sse "*)
        [ -x "$SSE_UP_BIN" ] || { echo "bench: $SSE_UP_BIN not built" >&2; exit 1; }
        spawn "$SSE_UP_BIN" -l "127.0.0.1:$SSE_UP_PORT" -n 8
        wait_port "$SSE_UP_PORT" "$LAST"
        realistic_sse_body "$WORK/body-sse.json"
        ;;
    esac
    export SLUICE_BENCH_UPSTREAM_KEY=upstream-key
    realistic_conf plain "$1" "$2" plain
    realistic_conf full "$1" "$2" full
    # the same confs sending realistic_esc_body's body
    realistic_conf plain-esc "$1" "$2" plain
    realistic_conf full-esc "$1" "$2" full
    realistic_esc_body "$WORK/body-esc.json"
    # and realistic_parts_body's
    realistic_conf plain-parts "$1" "$2" plain
    realistic_conf full-parts "$1" "$2" full
    realistic_parts_body "$WORK/body-parts.json"
    realistic_conf full-sse "$1" "$2" full "$SSE_UP_PORT"
    # full-resp / full-resp-sse: full's conf and checks, the Responses API
    # request (POST /v1/responses; the upstreams answer that API: nginx a
    # response object, $SSE_UP_BIN its stream with 8 delta events)
    cp "$WORK/full.yaml" "$WORK/full-resp.yaml"
    realistic_resp_body "$WORK/body-resp.json"
    cp "$WORK/full-sse.yaml" "$WORK/full-resp-sse.yaml"
    realistic_resp_body "$WORK/body-resp-sse.json" stream
    # full-budget / full-resp-budget / full-tools-budget: full with a token
    # budget a minute no bench ever spends (the prompt estimated, the
    # reservation taken and settled with the answer's usage on every
    # request); full-tools: full sending realistic_tools_body's body
    sed 's/concurrent: 1000 }/concurrent: 1000, tokens_per_minute: 1000000000 }/' \
        "$WORK/full.yaml" >"$WORK/full-budget.yaml"
    grep -q 'tokens_per_minute: 1000000000 }' "$WORK/full-budget.yaml" ||
        { echo "bench: full-budget conf" >&2; exit 1; }
    cp "$WORK/full-budget.yaml" "$WORK/full-resp-budget.yaml"
    # full-sse-budget: full-sse with that budget (every chunk goes through
    # the budget's stream accounting, the usage chunk settles it)
    sed 's/concurrent: 1000 }/concurrent: 1000, tokens_per_minute: 1000000000 }/' \
        "$WORK/full-sse.yaml" >"$WORK/full-sse-budget.yaml"
    grep -q 'tokens_per_minute: 1000000000 }' "$WORK/full-sse-budget.yaml" ||
        { echo "bench: full-sse-budget conf" >&2; exit 1; }
    cp "$WORK/full-budget.yaml" "$WORK/full-tools-budget.yaml"
    cp "$WORK/full.yaml" "$WORK/full-tools.yaml"
    realistic_tools_body "$WORK/body-tools.json"
    # full-sig: full with every request signed (auth.signing.required),
    # nonces in the in-process store; the same token as full
    sed 's/signing: { required: false,/signing: { required: true,/' "$WORK/full.yaml" >"$WORK/full-sig.yaml"
    grep -q 'required: true' "$WORK/full-sig.yaml" || { echo "bench: full-sig conf" >&2; exit 1; }
    read -r TOKEN SIGNING_KEY <<<"$("$SLUICE_BIN" token --sub bench-user --ttl 1h -c "$WORK/full.yaml" |
        awk '/^access_token:/ { t = $2 } /^signing_key:/ { k = $2 } END { print t, k }')"
}

# What a request of realistic_trio's conf $1 carries: sets REQ_TOKEN,
# REQ_SIGNING_KEY (full-sig: realistic.lua signs every request with it),
# REQ_BODY (a body file, or "" for wrk's realistic.lua default) and REQ_PATH
# (/v1/responses for full-resp*, else /v1/chat/completions).
realistic_req() {
    REQ_TOKEN="" REQ_BODY="" REQ_SIGNING_KEY="" REQ_PATH=/v1/chat/completions
    case $1 in full*) REQ_TOKEN=$TOKEN ;; esac
    [ "$1" != full-sig ] || REQ_SIGNING_KEY=$SIGNING_KEY
    case $1 in full-sse | full-sse-budget) REQ_BODY=$WORK/body-sse.json ;; esac
    case $1 in *-esc) REQ_BODY=$WORK/body-esc.json ;; esac
    case $1 in *-parts) REQ_BODY=$WORK/body-parts.json ;; esac
    case $1 in full-resp | full-resp-sse)
        REQ_BODY=$WORK/body-${1#full-}.json REQ_PATH=/v1/responses
        ;;
    full-resp-budget) REQ_BODY=$WORK/body-resp.json REQ_PATH=/v1/responses ;;
    full-tools | full-tools-budget) REQ_BODY=$WORK/body-tools.json ;;
    esac
}

realistic_conf() {
    local f=$WORK/$1.yaml
    cat >"$f" <<EOF
listen:
  - address: 127.0.0.1:$2
admin:
  address: 127.0.0.1:$3
workers: 1
limits:
  max_body_bytes: 4m
upstreams:
  main:
    servers:
      - url: "http://127.0.0.1:${5:-$UP_PORT}"
    keepalive: 64
    api_key_env: SLUICE_BENCH_UPSTREAM_KEY
models:
  chat-model: { upstream: main, name: served-model }
log:
  access: "off"
  level: warn
EOF
    if [ "$4" = full ]; then
        # 1,001 entries that never occur in the bench's prompt or answer
        [ -f "$WORK/words.txt" ] ||
            for i in $(seq 0 1000); do printf 'forbiddenword%04dx\n' "$i"; done >"$WORK/words.txt"
        cat >>"$f" <<EOF
$(bench_auth_conf false)
ratelimit:
  per_user: { requests_per_minute: 1000000, concurrent: 1000 }
filters:
  words:
    - { file: "$WORK/words.txt", action: mask }
  regex:
    - { name: phone, pattern: '1[3-9]\\d{9}', action: mask }
  output: true
EOF
    fi
    if [ "$4" = bodies ]; then
        # plain, but a user message of any length (filters.input.max_chars
        # is 8000 by default)
        printf 'filters:\n  input: { max_chars: 0 }\n' >>"$f"
    fi
    "$SLUICE_BIN" -t -c "$f" >/dev/null 2>&1 || { "$SLUICE_BIN" -t -c "$f"; exit 1; }
}
