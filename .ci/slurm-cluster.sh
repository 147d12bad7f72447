#!/usr/bin/env bash
# A real two-node SLURM cluster on this one host, for tests/slurm/: slurmctld plus two slurmd (node1, node2),
# each slurmd in its own UTS namespace so that its hostname matches its NodeName. Stock Debian packages, no munge
# (auth/none). Idempotent: `start` on a running cluster only checks it; `stop` on a stopped one does nothing.
# Everything lives under $SLURM_TEST_DIR (default /tmp/pytest-sglang-slurm); tests find slurm.conf there.
# Ports of its own, free ones picked when the cluster starts (or $SLURM_TEST_PORTS, "CTLD NODE1 NODE2"): a
# controller someone else runs on SLURM's 6817 must never be the one this cluster's slurmd register with.
# `watch PID` stops the cluster once process PID is gone (the test session that started it, SIGKILLed).
#   .ci/slurm-cluster.sh install|start|stop|status|watch PID
set -euo pipefail
DIR=${SLURM_TEST_DIR:-/tmp/pytest-sglang-slurm}
CONF=$DIR/slurm.conf
export SLURM_CONF=$CONF
say() { echo "[slurm-cluster] $*"; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo -n "$@"; fi; }

install() {
  if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v srun >/dev/null; then
    return 0
  fi
  # Not slurm-wlm-emulator: in bookworm it is a front-end build that cannot run, and it takes over slurmd.
  as_root apt-get update -q && as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
    slurmctld slurmd slurm-client
}

free_ports() {
  python3 -c 'import socket
socks = [socket.socket() for _ in range(3)]
for s in socks:
    s.bind(("", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))'
}

write_conf() {
  local ports ctld n1 n2
  ports=${SLURM_TEST_PORTS:-$(free_ports)}
  read -r ctld n1 n2 <<<"$ports"
  mkdir -p "$DIR/state" "$DIR/spool"
  for i in 0 1; do [ -c "$DIR/fakegpu$i" ] || mknod "$DIR/fakegpu$i" c 1 3; done  # GRES files: char devices
  cat > "$CONF" <<CONF
ClusterName=pytestsglang
SlurmctldHost=localhost
SlurmUser=root
AuthType=auth/none
CredType=cred/none
SlurmctldPort=$ctld
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd-%n.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
KillWait=5
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName=node1 NodeAddr=127.0.0.1 Port=$n1 CPUs=1 RealMemory=1000 Gres=gpu:2 State=UNKNOWN
NodeName=node2 NodeAddr=127.0.0.1 Port=$n2 CPUs=1 RealMemory=1000 Gres=gpu:2 State=UNKNOWN
PartitionName=debug Nodes=node[1-2] Default=YES MaxTime=INFINITE State=UP
CONF
  cat > "$DIR/gres.conf" <<CONF
GresTypes=gpu
AutoDetect=off
NodeName=node[1-2] Name=gpu File=$DIR/fakegpu[0-1]
CONF
}

# A daemon killed outright stays a zombie where the init process does not reap (this machine's), and kill -0
# succeeds on a zombie: only a process in any other state is alive.
alive() {
  [ -f "$1" ] || return 1
  local state
  state=$(ps -o stat= -p "$(cat "$1")" 2>/dev/null) || return 1
  [ -n "$state" ] && [ "${state:0:1}" != Z ]
}

# Bounded: with no controller up, each client call would wait out its own message timeout.
idle() { [ "$(timeout 5 sinfo -h -N -o '%t' 2>/dev/null | grep -c '^idle')" = 2 ]; }

start() {
  install || { say "cannot install slurmctld/slurmd/slurm-client: tests/slurm/ will skip"; return 1; }
  # a running cluster keeps its conf: new ports would cut its daemons off
  alive "$DIR/slurmctld.pid" || write_conf
  # -c: a test cluster starts with no jobs recovered from an earlier session's state (the tests expect an empty queue)
  alive "$DIR/slurmctld.pid" || slurmctld -c -f "$CONF"
  for n in node1 node2; do
    alive "$DIR/slurmd-$n.pid" || unshare --uts sh -c "hostname $n; exec slurmd -f '$CONF'"
  done
  for _ in $(seq 60); do
    if idle; then say "up: $(sinfo -h -N -o '%N %t' | tr '\n' ' ')(controller port $(ctld_port))"; return 0; fi
    # a node left down/drained by an earlier session comes back on request
    timeout 5 scontrol update nodename=node[1-2] state=resume >/dev/null 2>&1 || true
    sleep 0.5
  done
  say "the nodes did not come up idle within 30 s: $(timeout 5 sinfo -N 2>&1 | tr '\n' ' '); see $DIR/*.log"
  return 1
}

ctld_port() { sed -n 's/^SlurmctldPort=//p' "$CONF"; }

# The session that started the cluster is gone (a SIGKILL runs no teardown): stop what it left.
watch() {
  local pid=$1 state
  while state=$(ps -o stat= -p "$pid" 2>/dev/null) && [ "${state:0:1}" != Z ]; do sleep 1; done
  stop
}

stop() {
  timeout 5 scancel --user=root 2>/dev/null || true
  for f in "$DIR"/slurmd-node1.pid "$DIR"/slurmd-node2.pid "$DIR"/slurmctld.pid; do
    if alive "$f"; then kill "$(cat "$f")"; fi
  done
  for f in "$DIR"/slurmd-node1.pid "$DIR"/slurmd-node2.pid "$DIR"/slurmctld.pid; do
    for _ in $(seq 50); do alive "$f" || break; sleep 0.1; done
  done
  say "stopped"
}

case "${1:-}" in
  install) install ;;
  start) start ;;
  stop) stop ;;
  status) sinfo -N ;;
  watch) watch "${2:?watch PID: the process whose end stops the cluster}" ;;
  *) echo "usage: $0 install|start|stop|status|watch PID" >&2; exit 2 ;;
esac
