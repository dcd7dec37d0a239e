#!/bin/sh
# A real single-node Slurm on this machine, for testing `replicate --slurm` (Debian 12 packages,
# no systemd, no cgroups). Needs root (apt-get, daemons). Usage:
#     scripts/slurm-single-node.sh install   # apt-get the packages (~15 s), once
#     scripts/slurm-single-node.sh start     # write slurm.conf, start munged, slurmctld, slurmd
#     scripts/slurm-single-node.sh status    # scontrol ping + sinfo
#     scripts/slurm-single-node.sh stop      # cancel every job, then stop the three daemons
# The node is called `localhost` and offers every core and 95% of the memory slurmd detects.
set -eu
CONF=/etc/slurm/slurm.conf
RUN=/run/slurm-single-node          # PID files of the daemons this script started

die() { echo "slurm-single-node: $*" >&2; exit 1; }

alive() {  # alive PIDFILE: the process in PIDFILE exists and is not a zombie
    [ -s "$1" ] || return 1
    pid=$(cat "$1")
    [ -r "/proc/$pid/stat" ] || return 1
    state=$(sed 's/^.*) //' "/proc/$pid/stat" | cut -d' ' -f1)
    [ "$state" != Z ]
}

install_packages() {
    command -v apt-get >/dev/null || die "needs Debian/Ubuntu's apt-get"
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        slurmctld slurmd slurm-client munge >/dev/null
    echo "slurm-single-node: installed $(slurmctld -V)"
}

write_conf() {
    # the node line must match what slurmd -C reports, else slurmd refuses the node
    node=$(slurmd -C | head -1 | sed -e 's/^NodeName=[^ ]* //' -e 's/ RealMemory=[0-9]*//')
    mem=$(slurmd -C | head -1 | sed 's/.*RealMemory=\([0-9]*\).*/\1/')
    cat > "$CONF" <<EOF
# written by minialign's scripts/slurm-single-node.sh
ClusterName=minialign
SlurmctldHost=localhost
SlurmUser=slurm
StateSaveLocation=/var/lib/slurm/slurmctld
SlurmdSpoolDir=/var/lib/slurm/slurmd
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MailProg=/bin/true
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
SchedulerParameters=batch_sched_delay=0
MinJobAge=300
NodeName=localhost $node RealMemory=$((mem * 95 / 100)) State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
}

munge_works() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }

wait_gone() {  # wait_gone PID...: until none of them is alive (a stopped daemon lingers ~1 s)
    for _ in $(seq 100); do
        left=""
        for pid in "$@"; do
            [ -r "/proc/$pid/stat" ] && [ "$(sed 's/^.*) //' "/proc/$pid/stat" | cut -d' ' -f1)" != Z ] && left=1
        done
        [ -z "$left" ] && return 0
        sleep 0.1
    done
    die "daemons $* still running after 10 s"
}

start() {
    command -v slurmctld >/dev/null || die "Slurm is not installed: run '$0 install' first"
    mkdir -p "$RUN" /run/munge /var/log/slurm /var/lib/slurm/slurmctld /var/lib/slurm/slurmd
    chown munge:munge /run/munge
    chown slurm:slurm /var/lib/slurm/slurmctld /var/log/slurm
    write_conf
    # munged before slurmctld; a running daemon is left alone (starting it again would restart
    # it and could orphan a job being launched)
    munge_works || su -s /bin/sh munge -c /usr/sbin/munged
    munge_works || die "munge does not work (munge -n | unmunge)"
    alive "$RUN/slurmctld.pid" || slurmctld
    alive "$RUN/slurmd.pid" || slurmd -N localhost
    for _ in $(seq 100); do   # cold start to idle takes well under a second here
        if scontrol ping 2>/dev/null | grep -q UP &&
           [ "$(sinfo -h -o %T 2>/dev/null)" = idle ]; then
            echo "slurm-single-node: up, node localhost idle ($(sinfo -h -o '%c CPUs, %m MB'))"
            return 0
        fi
        sleep 0.1
    done
    die "not idle after 10 s: see /var/log/slurm/slurmctld.log and slurmd.log"
}

stop() {
    if command -v scancel >/dev/null && scontrol ping 2>/dev/null | grep -q UP; then
        scancel --full --user="$(id -un)" 2>/dev/null || true
        for _ in $(seq 100); do [ -z "$(squeue -h 2>/dev/null)" ] && break; sleep 0.1; done
    fi
    pids=""
    for d in slurmd slurmctld; do
        if alive "$RUN/$d.pid"; then pids="$pids $(cat "$RUN/$d.pid")"; kill "$(cat "$RUN/$d.pid")"; fi
    done
    wait_gone $pids
    pids=$(pgrep -x munged || true)
    [ -n "$pids" ] && kill $pids && wait_gone $pids
    echo "slurm-single-node: stopped"
}

case "${1:-}" in
    install) install_packages ;;
    start) start ;;
    status) scontrol ping; sinfo ;;
    stop) stop ;;
    *) die "usage: $0 {install|start|status|stop}" ;;
esac
