#!/usr/bin/env bash
# A long experiment on a device machine whose calls last at most 10 minutes: start it in its own process
# session (it outlives the call that started it, until the machine goes back), then watch it from later
# calls, each bringing back what it has written so far.
#
#   bash scripts/gpu/detached.sh start LOG CMD...            # CMD's output to LOG, its pid to LOG.pid
#   bash scripts/gpu/detached.sh watch LOG SECONDS DIR TGZ   # wait up to SECONDS for it to end, then pack
#                                                            # DIR into TGZ; exit 0 when it has ended
set -uo pipefail
verb=${1:?start|watch}; log=${2:?log file}; shift 2
case $verb in
  start)
    setsid nohup "$@" > "$log" 2>&1 < /dev/null &
    echo $! > "$log.pid"
    echo "started pid $(cat "$log.pid"): $*"
    ;;
  watch)
    seconds=${1:?seconds}; dir=${2:?folder to pack}; tgz=${3:?archive}
    pid=$(cat "$log.pid")
    end=$(( $(date +%s) + seconds ))
    while kill -0 "$pid" 2>/dev/null && [ "$(date +%s)" -lt "$end" ]; do sleep 5; done
    tail -n 40 "$log"
    [ -f "$dir/times.tsv" ] && cat "$dir/times.tsv"
    tar -czf "$tgz" -C "$(dirname "$dir")" "$(basename "$dir")" 2>/dev/null
    if kill -0 "$pid" 2>/dev/null; then echo "still running (pid $pid)"; exit 3; fi
    echo "ended"
    ;;
  *) echo "usage: detached.sh start|watch ..."; exit 2 ;;
esac
