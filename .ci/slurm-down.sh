#!/usr/bin/env bash
# Stop the single-node Slurm that .ci/slurm-up.sh started (slurmd, slurmctld, slurmdbd, MariaDB, munge).
# Packages, configs, Slurm state and the accounting database stay, so the next slurm-up is fast.
#   --purge  also removes Slurm's saved state and job records (a fresh cluster next time)
set -uo pipefail
ROOT=${EB_SLURM_ROOT:-/var/lib/eagle-batch-slurm}

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
stop_pid() {  # stop_pid NAME PIDFILE: TERM, wait up to 10 s, then KILL
  local name=$1 f=$2 pid
  alive "$f" || return 0
  pid=$(cat "$f"); echo "[slurm-down] stopping $name (pid $pid)"
  kill "$pid" 2>/dev/null
  for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
}

stop_pid slurmd /run/slurm/slurmd.pid
stop_pid slurmctld /run/slurm/slurmctld.pid
stop_pid slurmdbd /run/slurm/slurmdbd.pid
if command -v mysqladmin >/dev/null && mysqladmin ping >/dev/null 2>&1; then
  echo "[slurm-down] stopping MariaDB"; mysqladmin shutdown || true
fi
stop_pid munged /run/munge/munged.pid

if [ "${1:-}" = "--purge" ]; then
  echo "[slurm-down] purging $ROOT/ctld, $ROOT/slurmd and the accounting database"
  rm -rf "$ROOT/ctld" "$ROOT/slurmd"
  rm -rf /var/lib/mysql/slurm_acct_db
fi
exit 0
