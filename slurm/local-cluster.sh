#!/usr/bin/env bash
# A throw-away single-node Slurm cluster on this machine, for CI and for trying the sbatch scripts:
# Debian's munge, slurmctld and slurmd started by hand (no systemd), everything under one state
# directory, traffic on the loopback address only. Needs root.
#
#   slurm/local-cluster.sh start    install the packages when missing (apt-get), write the config,
#                                   start munged, slurmctld and slurmd, wait (bounded) until the
#                                   node is idle; leaves a healthy running cluster alone
#   slurm/local-cluster.sh stop     cancel its jobs, stop the daemons it started, by their PIDs
#   slurm/local-cluster.sh status   the daemons and the node; exit 0 only when healthy
#   slurm/local-cluster.sh env      the line that points Slurm's commands at this cluster:
#                                   eval "$(slurm/local-cluster.sh env)"
#
# Environment: COLOSSAL_SLURM_DIR (state directory, default /tmp/colossal-slurm),
# COLOSSAL_SLURM_PORT (slurmctld's port, default 6817; slurmd uses the next one),
# COLOSSAL_SLURM_CPUS (CPUs the node offers, default the cores here but at least 2),
# COLOSSAL_SLURM_TIMEOUT (seconds to wait for the node, default 60),
# COLOSSAL_SLURM_NO_INSTALL=1 (fail instead of installing missing packages).
#
# The config (DIR/slurm.conf) sets MpiDefault=pmix: Debian's Open MPI 4.1 starts under srun only
# with PMIx. /etc/slurm is not touched; Slurm's commands find the cluster through SLURM_CONF.
set -euo pipefail

dir=${COLOSSAL_SLURM_DIR:-/tmp/colossal-slurm}
port=${COLOSSAL_SLURM_PORT:-6817}
timeout_s=${COLOSSAL_SLURM_TIMEOUT:-60}
conf=$dir/slurm.conf
socket=$dir/munge/socket
daemons=(munged slurmctld slurmd)

say() { echo "local-cluster: $*" >&2; }
die() { say "error: $*"; exit 1; }

usage() { sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; }

# --- packages -------------------------------------------------------------------------------------

install_packages() {
  local missing=() p
  for p in munge slurmctld slurmd slurm-client; do
    dpkg-query -W -f='${Status}' "$p" 2> /dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  [ "${COLOSSAL_SLURM_NO_INSTALL:-0}" = 1 ] && die "missing packages: ${missing[*]} (COLOSSAL_SLURM_NO_INSTALL=1)"
  say "installing ${missing[*]}"
  # The packages' maintainer scripts would start system services; a policy-rc.d forbids that
  # (only when there is none already, and removed afterwards).
  local policy=/usr/sbin/policy-rc.d ours=0 rc=0
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod 755 "$policy" && ours=1
  fi
  local apt=(apt-get -qq -o DPkg::Lock::Timeout=300)
  {
    apt-cache show slurmd > /dev/null 2>&1 || "${apt[@]}" update
    DEBIAN_FRONTEND=noninteractive "${apt[@]}" install -y --no-install-recommends "${missing[@]}"
  } > "$dir/install.log" 2>&1 || rc=$?
  [ "$ours" = 1 ] && rm -f "$policy"
  if [ "$rc" != 0 ]; then
    tail -n 30 "$dir/install.log" >&2
    die "apt-get failed (exit $rc); the log is $dir/install.log"
  fi
}

# --- processes ------------------------------------------------------------------------------------

# The PID this script recorded for a daemon, if that process still runs the daemon with our config
# (so a reused PID or another cluster's daemon is never taken for ours).
pid_of() {
  local name=$1 pid
  pid=$(cat "$dir/run/$name.pid" 2> /dev/null) || return 1
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  [ "$(cat "/proc/$pid/comm" 2> /dev/null)" = "$name" ] || return 1
  grep -q '^State:[[:space:]]*Z' "/proc/$pid/status" 2> /dev/null && return 1
  tr '\0' ' ' < "/proc/$pid/cmdline" 2> /dev/null | grep -qF -- "$dir/" || return 1
  echo "$pid"
}

stop_daemon() {
  local name=$1 pid i
  if pid=$(pid_of "$name"); then
    say "stopping $name (pid $pid)"
    kill -TERM "$pid" 2> /dev/null || true
    for i in $(seq 50); do pid_of "$name" > /dev/null || break; sleep 0.2; done
    if pid_of "$name" > /dev/null; then
      say "$name (pid $pid) is still running after 10 s; killing it"
      kill -KILL "$pid" 2> /dev/null || true
    fi
  fi
  rm -f "$dir/run/$name.pid"
}

# Starts a daemon in the foreground mode of its own session (so $! is the daemon and a signal to
# the caller's process group does not reach it), with its output in DIR/log/NAME.out.
launch() {
  local name=$1
  shift
  SLURM_CONF=$conf setsid "$@" < /dev/null >> "$dir/log/$name.out" 2>&1 9>&- &
  echo $! > "$dir/run/$name.pid"
}

node_state() {
  SLURM_CONF=$conf timeout 10 sinfo --noheader --Node --format=%t 2> /dev/null | head -n 1
}

healthy() {
  local d
  for d in "${daemons[@]}"; do pid_of "$d" > /dev/null || return 1; done
  case "$(node_state)" in idle | mix | mixed | alloc | allocated | comp | completing) return 0 ;; esac
  return 1
}

# --- configuration --------------------------------------------------------------------------------

write_config() {
  local node cpus mem mpi comm addrs
  node=$(hostname -s)
  cpus=${COLOSSAL_SLURM_CPUS:-$(nproc)}
  [ "$cpus" -ge 2 ] || cpus=2  # so that srun -n 2 fits on one core
  mem=$(awk '/^MemTotal:/ { print int($2 / 1024 * 0.9) }' /proc/meminfo)
  mpi=none
  if compgen -G "/usr/lib/*/slurm-wlm/mpi_pmix*.so" > /dev/null; then mpi=pmix; fi
  # The daemons and srun bind to the address the host name resolves to when told not to listen
  # on every address: only safe when that address is a loopback one.
  addrs=$(getent ahostsv4 "$(hostname)" 2> /dev/null | awk '{ print $1 }' | sort -u)
  comm="# $(hostname) resolves to '${addrs//$'\n'/ }': listening on every address, connecting to 127.0.0.1"
  if [ -n "$addrs" ] && ! grep -qv '^127\.' <<< "$addrs"; then
    comm="CommunicationParameters=NoInAddrAny,NoCtldInAddrAny"
  fi
  cat > "$conf.tmp" << EOF
# Written by slurm/local-cluster.sh: one node, loopback only, state under $dir.
ClusterName=colossal-ci
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
$comm
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$socket,cred_expire=10
StateSaveLocation=$dir/ctld
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/run/slurmctld.self.pid
SlurmdPidFile=$dir/run/slurmd.self.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=$mpi
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1,bf_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
JobRequeue=1
MailProg=/bin/true
InactiveLimit=0
KillWait=5
MinJobAge=600
Waittime=0
NodeName=$node NodeAddr=127.0.0.1 NodeHostname=$node CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF
  mv "$conf.tmp" "$conf"
  chmod 644 "$conf"
}

# --- commands -------------------------------------------------------------------------------------

start() {
  [ "$(id -u)" = 0 ] || die "start needs root (the daemons run as root)"
  mkdir -p "$dir/run" "$dir/log" "$dir/ctld" "$dir/spool" "$dir/munge"
  if healthy; then
    say "already running (SLURM_CONF=$conf)"
    return 0
  fi
  local t0=$SECONDS d
  for d in slurmd slurmctld munged; do stop_daemon "$d"; done  # leftovers of a failed start
  install_packages
  write_config
  # munge: a key of our own, its socket in our directory (the system's munged is not used).
  if [ ! -s "$dir/munge/key" ]; then
    (umask 077 && dd if=/dev/urandom of="$dir/munge/key" bs=1024 count=1 status=none)
  fi
  chmod 400 "$dir/munge/key"
  chmod 755 "$dir/munge"
  rm -f "$socket" "$socket.lock"
  launch munged munged --foreground --force --socket="$socket" --key-file="$dir/munge/key" \
    --pid-file="$dir/run/munged.self.pid" --seed-file="$dir/munge/seed"
  local i
  for i in $(seq 50); do [ -S "$socket" ] && break; sleep 0.1; done
  [ -S "$socket" ] || { cat "$dir/log/munged.out" >&2; stop; die "munged did not start"; }
  launch slurmctld slurmctld -D -i -f "$conf"
  launch slurmd slurmd -D -f "$conf" -N "$(hostname -s)"
  local deadline=$((SECONDS + timeout_s)) state=""
  while [ $SECONDS -lt $deadline ]; do
    for d in "${daemons[@]}"; do
      if ! pid_of "$d" > /dev/null; then
        tail -n 20 "$dir/log/$d.out" "$dir/log/$d.log" >&2 2> /dev/null || true
        stop
        die "$d exited during start-up (logs in $dir/log)"
      fi
    done
    state=$(node_state || true)
    case "$state" in
      idle | mix | mixed | alloc | allocated)
        say "ready in $((SECONDS - t0)) s (node $(hostname -s) $state, MpiDefault=$(sed -n 's/^MpiDefault=//p' "$conf"));" \
          "use it with: export SLURM_CONF=$conf"
        return 0 ;;
      down* | drain* | drng*)
        SLURM_CONF=$conf scontrol update nodename="$(hostname -s)" state=resume > /dev/null 2>&1 || true ;;
    esac
    sleep 0.5
  done
  tail -n 20 "$dir/log/slurmctld.log" "$dir/log/slurmd.log" >&2 2> /dev/null || true
  stop
  die "the node was not ready after ${timeout_s} s (last state '${state:-no answer}'); logs in $dir/log"
}

stop() {
  if pid_of slurmctld > /dev/null && pid_of munged > /dev/null; then
    local jobs i
    jobs=$(SLURM_CONF=$conf timeout 10 squeue --noheader --format=%A 2> /dev/null | tr '\n' ' ' || true)
    if [ -n "${jobs// /}" ]; then
      say "cancelling jobs $jobs"
      # shellcheck disable=SC2086
      SLURM_CONF=$conf timeout 10 scancel $jobs 2> /dev/null || true
      for i in $(seq 30); do
        [ -z "$(SLURM_CONF=$conf timeout 5 squeue --noheader --format=%A 2> /dev/null || true)" ] && break
        sleep 0.5
      done
    fi
  fi
  local d
  for d in slurmd slurmctld munged; do stop_daemon "$d"; done
}

status() {
  local d pid rc=0
  for d in "${daemons[@]}"; do
    if pid=$(pid_of "$d"); then echo "$d: running (pid $pid)"; else echo "$d: not running"; rc=1; fi
  done
  if [ "$rc" = 0 ]; then
    SLURM_CONF=$conf timeout 10 sinfo --Node --long 2>&1 || true
    SLURM_CONF=$conf timeout 10 squeue 2>&1 || true
  fi
  if healthy; then
    echo "healthy: export SLURM_CONF=$conf"
  else
    echo "not running or not healthy (state in $dir)"
    return 1
  fi
}

case "${1:-}" in
  start) mkdir -p "$dir" && exec 9> "$dir/.lock" && flock -w 120 9 && start ;;
  stop) mkdir -p "$dir" && exec 9> "$dir/.lock" && flock -w 120 9 && stop && say "stopped" ;;
  status) status ;;
  env) echo "export SLURM_CONF=$conf" ;;
  -h | --help | help) usage ;;
  *) usage >&2; exit 2 ;;
esac
