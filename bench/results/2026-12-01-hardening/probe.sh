#!/usr/bin/env bash
# Issue #18's findings probed against one dsv4-node binary, as an operator and a hostile client
# would (loopback only, bounded in time). Run it on the commit before the fix and after:
#   bench/results/2026-12-01-hardening/probe.sh BINARY > probe-<build>.log
# Each line: the finding, what happened.
set -u
BIN=$1
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
TOK=$ROOT/tests/data/tok-tiny/tokenizer.json
W=$(mktemp -d)
export NODE_PATH=$ROOT/tests/node_client/node_modules
say() { echo "$1: $2"; }
port_of() { grep -o "$2=[0-9]*" "$1" | head -1 | cut -d= -f2; }
start() {  # start LOG ARGS...: a node on free ports; sets PID GP MP
  local log=$1; shift
  "$BIN" serve --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 "$@" > "$log" 2>&1 &
  PID=$!
  for _ in $(seq 100); do grep -q "event=serving" "$log" && break; sleep 0.1; done
  GP=$(port_of "$log" grpc_port); MP=$(port_of "$log" metrics_port)
}
stop() { kill -TERM $PID 2>/dev/null; wait $PID 2>/dev/null; }

# 1. Requests to the metrics port other than GET /metrics.
start $W/n1.log
for req in "GET /" "GET /foo" "HEAD /metrics" "POST /metrics"; do
  set -- $req
  code=$(curl -s -o /dev/null -m 5 -w '%{http_code}' -X $1 $([ $1 = HEAD ] && echo -I) http://127.0.0.1:$MP$2)
  alive=$(kill -0 $PID 2>/dev/null && echo alive || { wait $PID; echo "dead (exit $?)"; })
  say "finding1.$1_$2" "http=$code node=$alive"
  [ "${alive%% *}" = dead ] && start $W/n1.log
done
stop

# 2. A second node on the same --listen.
start $W/n2.log
"$BIN" serve --listen 127.0.0.1:$GP --metrics-listen 127.0.0.1:0 > $W/n2b.log 2>&1 &
P2=$!
sleep 3
if kill -0 $P2 2>/dev/null; then say finding2.same_port "second node started and serves (shared port)"; kill -9 $P2
else wait $P2; say finding2.same_port "second node exited $?: $(grep -o '^error:.*' $W/n2b.log | head -1 | cut -c1-120)"; fi
wait $P2 2>/dev/null
stop

# 3. SIGTERM twice during the drain, with a stream in flight.
start $W/n3.log --drain-timeout 60
"$BIN" client --target 127.0.0.1:$GP --prompt-ids 5,6,7 --max-tokens 1500 --ignore-eos > $W/c3.log 2>&1 &
C3=$!
sleep 0.5
kill -TERM $PID; sleep 0.2; kill -TERM $PID
wait $PID; rc=$?
wait $C3; crc=$?
say finding3.sigterm_twice "node exit=$rc client exit=$crc client says: $(tail -c 160 $W/c3.log | tr '\n' ' ')"

# 4, 5, 7 and the malformed protobuf: the grpc-js probe.
start $W/n4.log
node "$HERE/probe.js" 127.0.0.1:$GP all 2>&1
stop

# 6. 100 idle connections, then a scrape.
start $W/n6.log
for i in $(seq 100); do exec {fd}<>/dev/tcp/127.0.0.1/$MP; FDS+=($fd); done
t=$(curl -s -o /dev/null -m 45 -w '%{http_code} %{time_total}s' http://127.0.0.1:$MP/metrics)
say finding6.scrape_with_100_idle "$t"
for fd in "${FDS[@]}"; do exec {fd}>&-; done
stop

# 8. A NaN in head.weight.
mkdir -p $W/nan && cp $ROOT/models/dsv4-tiny/config.json $W/nan/ && cp $TOK $W/nan/
python3 - "$ROOT/models/dsv4-tiny/model.safetensors" "$W/nan/model.safetensors" <<'PY'
import json, struct, sys
data = bytearray(open(sys.argv[1], 'rb').read())
n = struct.unpack('<Q', data[:8])[0]
hdr = json.loads(data[8:8 + n])
name = next(k for k in hdr if k.endswith('head.weight'))
b, e = hdr[name]['data_offsets']
for off in range(8 + n + b, 8 + n + e, 4): data[off:off + 4] = struct.pack('<f', float('nan'))
open(sys.argv[2], 'wb').write(data)
PY
"$BIN" serve --model $W/nan --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 > $W/n8.log 2>&1 &
PID=$!
for _ in $(seq 50); do grep -q "event=serving\|error:" $W/n8.log && break; sleep 0.1; done
if grep -q "event=serving" $W/n8.log; then
  GP=$(port_of $W/n8.log grpc_port); MP=$(port_of $W/n8.log metrics_port)
  out=$("$BIN" client --target 127.0.0.1:$GP --prompt-ids 5,6,7 --max-tokens 2 --logprobs 1 --json 2>&1 | head -c 300 | tr '\n' ' ')
  errs=$(curl -s http://127.0.0.1:$MP/metrics | grep '^dsv4_worker_errors_total')
  say finding8.nan_head_weight "served: $out | $errs"
  stop
else
  wait $PID; say finding8.nan_head_weight "refused at load (exit $?): $(grep -o 'error:.*' $W/n8.log | cut -c1-160)"
fi

# 9. The smaller ones.
"$BIN" serve --listen 127.0.0.1:99999 --metrics-listen 127.0.0.1:0 > $W/n9a.log 2>&1 &
PID=$!; sleep 2
if kill -0 $PID 2>/dev/null; then say finding9.listen_99999 "started, gRPC on port $(port_of $W/n9a.log grpc_port)"; kill -9 $PID
else say finding9.listen_99999 "refused: $(grep -o 'error:.*' $W/n9a.log | cut -c1-120)"; fi
wait $PID 2>/dev/null
"$BIN" serve --listen 127.0.0.1:0 --metrics-listen 999.1.1.1:0 > $W/n9b.log 2>&1 &
PID=$!; sleep 2
if kill -0 $PID 2>/dev/null; then say finding9.metrics_999 "started"; kill -9 $PID
else say finding9.metrics_999 "refused: $(grep -o 'error:.*\|what.*' $W/n9b.log | head -1 | cut -c1-120)"; fi
wait $PID 2>/dev/null
start $W/n9c.log --drain-timeout nan
if [ -n "$GP" ] && grep -q event=serving $W/n9c.log; then
  "$BIN" client --target 127.0.0.1:$GP --prompt-ids 5,6,7 --max-tokens 800 --ignore-eos > $W/c9.log 2>&1 &
  C=$!; sleep 0.5; kill -TERM $PID; wait $PID; wait $C
  say finding9.drain_timeout_nan "started; on SIGTERM the stream got: $(tail -c 120 $W/c9.log | tr '\n' ' ')"
else say finding9.drain_timeout_nan "refused: $(grep -o 'error.*\|drain-timeout.*' $W/n9c.log | head -1 | cut -c1-120)"; fi
"$BIN" serve --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --port-file /nonexistent-dir/p.json > $W/n9d.log 2>&1 &
PID=$!; sleep 2
if kill -0 $PID 2>/dev/null; then say finding9.port_file "started without writing it"; kill -9 $PID
else wait $PID; say finding9.port_file "exit $?: $(grep -o 'error:.*' $W/n9d.log | cut -c1-120)"; fi
wait $PID 2>/dev/null
mkdir -p $W/fifo && mkfifo $W/fifo/config.json
timeout 10 "$BIN" serve --model $W/fifo --tokenizer $TOK --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 > $W/n9e.log 2>&1
rc=$?; say finding9.fifo_config "exit $rc$([ $rc = 124 ] && echo ' (hung: killed by timeout 10)'): $(grep -o 'error:.*' $W/n9e.log | cut -c1-100)"
mkdir -p $W/dir/config.json
"$BIN" serve --model $W/dir --tokenizer $TOK --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 > $W/n9f.log 2>&1
say finding9.dir_config "exit $?: $(grep -o 'error:.*' $W/n9f.log | cut -c1-120)"
mkdir -p $W/nohidden && python3 -c "
import json,sys; c=json.load(open('$ROOT/models/dsv4-tiny/config.json')); del c['hidden_size']; json.dump(c, open('$W/nohidden/config.json','w'))"
cp $ROOT/models/dsv4-tiny/model.safetensors $W/nohidden/
"$BIN" serve --model $W/nohidden --tokenizer $TOK --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 > $W/n9g.log 2>&1 &
PID=$!; for _ in $(seq 50); do grep -q "event=serving\|error:" $W/n9g.log && break; sleep 0.1; done
say finding9.no_hidden_size "$(grep -o 'error:.*\|config="[^"]*"' $W/n9g.log | head -1 | cut -c1-140)"
kill -9 $PID 2>/dev/null; wait $PID 2>/dev/null
start $W/n9h.log --kv-blocks 8
node "$HERE/probe.js" 127.0.0.1:$GP kv 2>&1
stop
rm -rf $W
