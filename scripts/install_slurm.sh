#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, from Debian's packages (Slurm 22.05 on Debian 12):
# installs slurmctld + slurmd + the client tools + munge, writes /etc/slurm/slurm.conf for
# this host (its CPUs and memory as `slurmd -C` reports them), starts munged, slurmctld and
# slurmd (no systemd needed) and waits until the node is idle. Idempotent: daemons that run
# already (their pid files) are left alone, a changed slurm.conf is re-read.
#   sudo bash scripts/install_slurm.sh          # then: sbatch, squeue, sinfo work here
# Settings (env): SLURM_PARTITION (default verlmp), SLURMCTLD_PORT (6817), SLURMD_PORT (6818).
# It needs root and apt. It is meant for tests and for trying launch/*.sbatch on one
# machine; a real cluster has its own Slurm (docs/multinode.md).
set -euo pipefail
PARTITION=${SLURM_PARTITION:-verlmp}
CTLD_PORT=${SLURMCTLD_PORT:-6817}
SLURMD_PORT=${SLURMD_PORT:-6818}
CONF=/etc/slurm/slurm.conf
CTLD_PID=/run/slurmctld.pid
SLURMD_PID=/run/slurmd.pid
MUNGE_PID=/run/munge/munged.pid

log() { echo "install_slurm: $*" >&2; }
[ "$(id -u)" -eq 0 ] || { log "needs root (apt-get, /etc/slurm, daemons)"; exit 1; }

running() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

install_packages() {
  if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v sbatch >/dev/null \
      && command -v munged >/dev/null; then
    return
  fi
  log "installing slurmctld slurmd slurm-client munge (apt)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    slurmctld slurmd slurm-client munge >/dev/null
}

start_munge() {
  mkdir -p /run/munge
  chown munge:munge /run/munge
  [ -s /etc/munge/munge.key ] || { log "no /etc/munge/munge.key (the munge package creates it)"; exit 1; }
  running "$MUNGE_PID" || runuser -u munge -- /usr/sbin/munged --pid-file="$MUNGE_PID"
  munge -n | unmunge >/dev/null
}

resolve_host() {
  # slurmd, srun and torchrun's rendezvous find this node by its name.
  local host
  host=$(hostname -s)
  if ! getent hosts "$host" >/dev/null; then
    echo "127.0.0.1 $host" >> /etc/hosts
    log "added '127.0.0.1 $host' to /etc/hosts (the name did not resolve)"
  fi
}

write_conf() {
  local host node new
  host=$(hostname -s)
  node=$(slurmd -C | head -n 1)  # NodeName=<host> CPUs=.. Boards=.. ... RealMemory=..
  mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
  new=$(cat <<EOF
# Written by scripts/install_slurm.sh: a one-node cluster for tests (no cgroups, no accounting).
ClusterName=verlmp
SlurmctldHost=$host
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=$CTLD_PID
SlurmdPidFile=$SLURMD_PID
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SlurmdTimeout=60
$node State=UNKNOWN
PartitionName=$PARTITION Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
)
  if [ ! -f "$CONF" ] || [ "$(cat "$CONF")" != "$new" ]; then
    printf '%s\n' "$new" > "$CONF"
    log "wrote $CONF ($node)"
    running "$CTLD_PID" && scontrol reconfigure || true
  fi
}

start_daemons() {
  running "$CTLD_PID" || slurmctld
  running "$SLURMD_PID" || slurmd
  local host state i
  host=$(hostname -s)
  for i in $(seq 1 60); do
    state=$(sinfo -h -n "$host" -o %T 2>/dev/null | head -n 1 || true)
    case "$state" in
      idle*|mixed*|allocated*) log "node $host is $state (partition $PARTITION)"; return ;;
      down*|drain*) scontrol update nodename="$host" state=resume 2>/dev/null || true ;;
    esac
    sleep 1
  done
  log "node $host did not become idle (state: ${state:-none}); see /var/log/slurm/"
  exit 1
}

install_packages
resolve_host
start_munge
write_conf
start_daemons
