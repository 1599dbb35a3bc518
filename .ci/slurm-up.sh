#!/usr/bin/env bash
# Install and start a real single-node Slurm (slurmctld, slurmd, slurmdbd + MariaDB, munge) on this
# machine, for the `@pytest.mark.slurm` tests and `eagle-batch bench slurm`.
#
# Debian 12 (Slurm 22.05), as root, no systemd: every daemon is started directly. Idempotent: a second
# call with everything up returns in about a second; a changed slurm.conf restarts the Slurm daemons.
# The node advertises 8 CPUs and 8 GPUs whatever the machine has (fake /dev-style character devices)
# so jobs ask for GPUs exactly as on a real GPU node. Why each setting: beside it in the generated files
# below, and in docs/how-to/slurm-cluster.md ("The local Slurm for tests"). Accounting (slurmdbd + MariaDB) is not
# optional: without it `sacct` fails, submitit cannot tell a cancelled or OOM-killed job from a running one
# (it never writes a result) and waits forever.
#
#   .ci/slurm-up.sh            # install if needed, start, wait until the node is idle and sacct answers
#   .ci/slurm-down.sh          # stop the daemons (keeps packages and the accounting database)
#
# Env: EB_SLURM_CPUS (8), EB_SLURM_GPUS (8), EB_SLURM_MEM_MB (16000), EB_SLURM_ROOT (/var/lib/eagle-batch-slurm)
set -euo pipefail

CPUS=${EB_SLURM_CPUS:-8}
GPUS=${EB_SLURM_GPUS:-8}
MEM_MB=${EB_SLURM_MEM_MB:-16000}
ROOT=${EB_SLURM_ROOT:-/var/lib/eagle-batch-slurm}
ETC=/etc/slurm
NODE=$(hostname -s)
CLUSTER=eaglebatch
DB_PASS=eaglebatch-local-only  # MariaDB listens on the unix socket of this machine only
LOG=$ROOT/log
t0=$(date +%s)

say() { echo "[slurm-up $(( $(date +%s) - t0 ))s] $*"; }
die() { echo "[slurm-up] ERROR: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "run as root (it installs packages and starts system daemons)"

# ---------------------------------------------------------------------------------------------- install
need=()
for b in slurmctld slurmd slurmdbd sbatch munged mariadbd; do
  command -v "$b" >/dev/null 2>&1 || [ -x "/usr/sbin/$b" ] || need+=("$b")
done
if [ ${#need[@]} -gt 0 ]; then
  say "installing packages (missing: ${need[*]})"
  export DEBIAN_FRONTEND=noninteractive
  # policy-rc.d 101: the packages' postinst must not try to start daemons (no init system here).
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
  apt-get update -qq >/dev/null || apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends \
    slurmctld slurmd slurmdbd slurm-client munge mariadb-server >/dev/null
  rm -f /usr/sbin/policy-rc.d
fi

mkdir -p "$ROOT/dev" "$LOG" "$ROOT/ctld" "$ROOT/slurmd" "$ETC" /run/slurm /run/munge /var/log/munge

# ----------------------------------------------------------------------------------------- fake GPUs
# gres.conf needs real character devices: plain files or no files make slurmd drain the node.
for i in $(seq 0 $((GPUS - 1))); do
  [ -c "$ROOT/dev/nvidia$i" ] || { rm -f "$ROOT/dev/nvidia$i"; mknod "$ROOT/dev/nvidia$i" c 195 "$i"; }
done

# ------------------------------------------------------------------------------------------- configs
write_if_changed() {  # write_if_changed FILE MODE  (content on stdin); echoes "changed" if it did
  local f=$1 mode=$2 tmp
  tmp=$(mktemp)
  cat > "$tmp"
  if [ -f "$f" ] && cmp -s "$tmp" "$f"; then rm -f "$tmp"; return 0; fi
  install -m "$mode" "$tmp" "$f"; rm -f "$tmp"; echo changed
}

changed=""
changed+=$(write_if_changed "$ETC/slurm.conf" 644 <<EOF
# Written by eagle-batch .ci/slurm-up.sh: a single-node test cluster. Do not use in production.
ClusterName=$CLUSTER
SlurmctldHost=$NODE(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# Short credential lifetime: a requeued job may start again after ~10 s instead of ~145 s.
AuthInfo=cred_expire=10
StateSaveLocation=$ROOT/ctld
SlurmdSpoolDir=$ROOT/slurmd
SlurmctldPidFile=/run/slurm/slurmctld.pid
SlurmdPidFile=/run/slurm/slurmd.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
SlurmctldPort=6817
SlurmdPort=6818
# No cgroups on this machine (no systemd, possibly cgroup v2 read-only): plain process tracking.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=5,bf_interval=5
JobRequeue=1
ReturnToService=2
MinJobAge=600
KillWait=5
Waittime=0
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=60
MpiDefault=none
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStorageTRES=gres/gpu
JobCompType=jobcomp/none
# Advertise a bigger node than this machine really is (CPUs / GPUs / memory), like a real GPU node.
SlurmdParameters=config_overrides
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEM_MB Gres=gpu:$GPUS State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
)
changed+=$(write_if_changed "$ETC/gres.conf" 644 <<EOF
AutoDetect=off
NodeName=$NODE Name=gpu File=$ROOT/dev/nvidia[0-$((GPUS - 1))]
EOF
)
changed+=$(write_if_changed "$ETC/slurmdbd.conf" 600 <<EOF
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
SlurmUser=root
PidFile=/run/slurm/slurmdbd.pid
LogFile=$LOG/slurmdbd.log
DebugLevel=info
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=$DB_PASS
StorageLoc=slurm_acct_db
EOF
)

# --------------------------------------------------------------------------------------------- munge
alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

if [ ! -s /etc/munge/munge.key ]; then
  say "creating munge key"
  if command -v mungekey >/dev/null; then mungekey --create --keyfile=/etc/munge/munge.key --force
  else dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null; fi
fi
chown -R munge:munge /etc/munge /run/munge /var/log/munge /var/lib/munge 2>/dev/null || true
chmod 0700 /etc/munge; chmod 0400 /etc/munge/munge.key
if ! alive /run/munge/munged.pid; then
  say "starting munged"
  rm -f /run/munge/munge.socket.2*
  runuser -u munge -- /usr/sbin/munged
fi
for _ in $(seq 50); do munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
munge -n </dev/null | unmunge >/dev/null || die "munge does not work (see /var/log/munge/munged.log)"

# ------------------------------------------------------------------------------------------- MariaDB
if ! mysqladmin ping >/dev/null 2>&1; then
  say "starting MariaDB"
  mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld
  [ -d /var/lib/mysql/mysql ] || mariadb-install-db --user=mysql --datadir=/var/lib/mysql >/dev/null
  # Small buffers: 2-core / shared-memory CI machines; accounting writes are tiny.
  (setsid mariadbd --user=mysql --skip-networking --innodb-buffer-pool-size=32M \
     --performance-schema=OFF --log-error="$LOG/mariadb.log" </dev/null >/dev/null 2>&1 &)
  for _ in $(seq 150); do mysqladmin ping >/dev/null 2>&1 && break; sleep 0.2; done
  mysqladmin ping >/dev/null 2>&1 || die "MariaDB did not start (see $LOG/mariadb.log)"
fi
mysql -u root <<EOF
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$DB_PASS';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
EOF

# --------------------------------------------------------------------------------------------- Slurm
stop_pid() { if alive "$1"; then kill "$(cat "$1")"; for _ in $(seq 50); do alive "$1" || break; sleep 0.1; done; fi; }
if [ -n "$changed" ]; then
  say "configuration changed: (re)starting the Slurm daemons"
  stop_pid /run/slurm/slurmd.pid; stop_pid /run/slurm/slurmctld.pid; stop_pid /run/slurm/slurmdbd.pid
fi

if ! alive /run/slurm/slurmdbd.pid; then
  say "starting slurmdbd"
  slurmdbd
  for _ in $(seq 150); do (exec 3<>/dev/tcp/127.0.0.1/6819) 2>/dev/null && break; sleep 0.2; done
  (exec 3<>/dev/tcp/127.0.0.1/6819) 2>/dev/null || die "slurmdbd did not open port 6819 (see $LOG/slurmdbd.log)"
fi
# The cluster must exist in the accounting database before slurmctld registers with it.
if ! sacctmgr -n -P show cluster format=cluster 2>/dev/null | grep -qx "$CLUSTER"; then
  say "registering cluster $CLUSTER in accounting"
  sacctmgr -i add cluster "$CLUSTER" >/dev/null
fi
if ! alive /run/slurm/slurmctld.pid; then
  say "starting slurmctld"
  slurmctld
fi
if ! alive /run/slurm/slurmd.pid; then
  say "starting slurmd"
  slurmd
fi

# ------------------------------------------------------------------------------------------ wait idle
state=""
for i in $(seq 300); do
  state=$(sinfo -h -n "$NODE" -o %T 2>/dev/null | head -1 || true)
  case "$state" in
    idle|mixed|allocated|completing) break ;;
    drain*|down*|fail*)
      # A drain persists in StateSaveLocation across restarts (e.g. after a broken gres.conf).
      [ $((i % 10)) = 1 ] && scontrol update nodename="$NODE" state=resume >/dev/null 2>&1 || true ;;
  esac
  sleep 0.2
done
case "$state" in idle|mixed|allocated|completing) ;; *)
  die "node $NODE is '$state', not idle (see $LOG/slurmctld.log and $LOG/slurmd.log; sinfo -R)" ;; esac
for _ in $(seq 150); do sacct -n -X -S now-1minutes >/dev/null 2>&1 && break; sleep 0.2; done
sacct -n -X -S now-1minutes >/dev/null || die "sacct does not answer (see $LOG/slurmdbd.log)"
say "up: node $NODE $state, $(sinfo -h -n "$NODE" -o '%c CPUs, %G'), accounting ok"
