#!/usr/bin/env bash
# A one-node SLURM cluster on this machine, for tests: munged, slurmctld and slurmd as root,
# their config, state and logs in one folder (default /tmp/blockviz-slurm).
#
#   scripts/slurm_local.sh start [DIR]   # then: export SLURM_CONF=DIR/slurm.conf
#   scripts/slurm_local.sh stop  [DIR]
#
# Needs Debian's slurm-wlm and munge (apt-get install -y slurm-wlm munge) and root. No
# cgroups: processes are tracked by /proc (proctrack/linuxproc), no task plugin, no
# accounting (sacct has nothing to say; squeue and sinfo work). A requeued job may start
# again 10 s after its requeue (cred_expire=10; SLURM's default is 120 s), so the tests of
# jobs requeued after a time limit do not wait two minutes for each.
set -euo pipefail

action=${1:-start}
dir=${2:-/tmp/blockviz-slurm}
conf=$dir/slurm.conf

stop() {
    # Each daemon is waited for: slurmctld saves its state and removes its pid file as it
    # leaves, so one still leaving would delete a new one's pid file (the next stop then
    # left that running) and hold the port (the next start then failed to bind it).
    for name in slurmd slurmctld munged; do
        if [[ -f $dir/$name.pid ]]; then
            pid=$(cat "$dir/$name.pid")
            kill "$pid" 2>/dev/null || true
            for _ in $(seq 100); do
                kill -0 "$pid" 2>/dev/null || break
                sleep 0.1
            done
            rm -f "$dir/$name.pid"
        fi
    done
}

if [[ $action == stop ]]; then
    stop
    exit 0
fi
if [[ $action != start ]]; then
    echo "usage: $0 start|stop [DIR]" >&2
    exit 2
fi

for tool in munged slurmctld slurmd sbatch; do
    command -v "$tool" >/dev/null || { echo "$0: $tool is not installed (apt-get install -y slurm-wlm munge)" >&2; exit 1; }
done
[[ $(id -u) == 0 ]] || { echo "$0: slurmd must run as root" >&2; exit 1; }

stop
mkdir -p "$dir/state" "$dir/spool" "$dir/munge"
chmod 700 "$dir/munge"
host=$(hostname -s)
cpus=$(nproc)

# munge: a fresh key and a socket of our own, so nothing is shared with a system munged.
dd if=/dev/urandom of="$dir/munge/munge.key" bs=1 count=1024 status=none
chmod 400 "$dir/munge/munge.key"
munged --force --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.socket" \
    --pid-file="$dir/munged.pid" --log-file="$dir/munged.log" --seed-file="$dir/munge/seed"

cat >"$conf" <<CONF
ClusterName=blockviz
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket,cred_expire=10
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerParameters=sched_interval=1
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
SlurmctldPort=6817
SlurmdPort=6818
ReturnToService=2
MpiDefault=none
KillWait=5
InactiveLimit=0
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE OverSubscribe=FORCE:4 State=UP
CONF

export SLURM_CONF=$conf
slurmctld -c  # -c: no state from an earlier start (jobs, node states)
slurmd
for _ in $(seq 50); do
    if sinfo -h -o %T 2>/dev/null | grep -q idle; then
        echo "export SLURM_CONF=$conf"
        exit 0
    fi
    sleep 0.2
done
echo "$0: the cluster did not come up; see $dir/slurmctld.log and $dir/slurmd.log" >&2
exit 1
