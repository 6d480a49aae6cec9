#!/bin/bash
# A real two-node SLURM cluster on this one machine, for gputui's tests and for trying the
# sbatch scripts `gputui slurm` writes (docs/clusters.md). Needs root.
#   scripts/slurm/up.sh [DIR]      start it; DIR (default /tmp/gputui-slurm) holds its files
#   source DIR/env.sh              put the client wrappers (srun, sbatch, ...) first on PATH
#   scripts/slurm/down.sh [DIR]    stop every daemon and process it started, delete it all
# Two network namespaces joined by a veth pair: node1 (10.200.0.1, also runs slurmctld) and
# node2 (10.200.0.2), each slurmd with its own host name; its own munged and key (nothing of
# the machine's own munge is used or changed). GPUTUI_SLURM_TAG (<= 6 letters or digits) names
# the namespaces, so two clusters can run side by side. Debian's slurm-wlm and munge are
# installed when missing (apt-get).
# What was learned making it (see also docs/clusters.md):
# - every SLURM client runs INSIDE node1's namespace (the wrappers in DIR/bin): run in the
#   machine's own namespace, a client would send 10.200.0.x traffic out of the machine; and a
#   client without SLURM_CONF looks the controller up in DNS (SRV records): always set it.
# - daemons start under `nsenter --net`, not `ip netns exec` (which remounts /sys, and slurmd
#   then stops: "No filesystem mounted on /sys/fs/cgroup").
# - node names resolve only inside the namespaces (a hosts file bind-mounted over /etc/hosts).
set -euo pipefail
D=${1:-/tmp/gputui-slurm}; TAG=${GPUTUI_SLURM_TAG:-lab}
case $TAG in *[!a-z0-9]*|'') echo "up.sh: GPUTUI_SLURM_TAG must be lower-case letters or digits" >&2; exit 2;; esac
[ ${#TAG} -le 6 ] || { echo "up.sh: GPUTUI_SLURM_TAG has at most 6 characters" >&2; exit 2; }
NS1=gts-$TAG-1; NS2=gts-$TAG-2
[ "$(id -u)" = 0 ] || { echo "up.sh: needs root (network namespaces, bind mounts)" >&2; exit 3; }
if ! type -P slurmctld slurmd munged srun mungekey >/dev/null; then
  # no service may start on its own while the packages install
  pol=0; [ -e /usr/sbin/policy-rc.d ] || { printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; pol=1; }
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    slurmctld slurmd slurm-client munge >/dev/null || { [ $pol = 0 ] || rm -f /usr/sbin/policy-rc.d; exit 4; }
  [ $pol = 0 ] || rm -f /usr/sbin/policy-rc.d
fi
if ip netns list | grep -qE "^$NS1\b|^$NS2\b"; then echo "up.sh: $NS1 exists: run down.sh $D first" >&2; exit 1; fi
mkdir -p "$D"; D=$(cd "$D" && pwd); C=$D/cluster
mkdir -p $C/etc $C/log $C/run $C/bin $C/state/ctld $C/state/slurmd-node1 $C/state/slurmd-node2
printf '%s %s\n' $NS1 $NS2 >$C/namespaces
# munge: a daemon and key of this cluster's own, on its own socket
mungekey -c -f -k $C/etc/munge.key 2>/dev/null; chmod 600 $C/etc/munge.key
munged -f --socket=$C/run/munge.socket --key-file=$C/etc/munge.key --pid-file=$C/run/munged.pid \
  --log-file=$C/log/munged.log --seed-file=$C/run/munged.seed
for _ in $(seq 50); do munge -S $C/run/munge.socket -n 2>/dev/null | unmunge -S $C/run/munge.socket >/dev/null 2>&1 && break; sleep 0.1; done
for ns in $NS1 $NS2; do ip netns add $ns; ip -n $ns link set lo up; done
ip link add gts$TAG-a netns $NS1 type veth peer name gts$TAG-b netns $NS2
ip -n $NS1 addr add 10.200.0.1/24 dev gts$TAG-a; ip -n $NS1 link set gts$TAG-a up
ip -n $NS2 addr add 10.200.0.2/24 dev gts$TAG-b; ip -n $NS2 link set gts$TAG-b up
printf '127.0.0.1 localhost\n10.200.0.1 node1\n10.200.0.2 node2\n' >$C/etc/hosts
export SLURM_CONF=$C/etc/slurm.conf
cat >$SLURM_CONF <<EOF
ClusterName=gputui
SlurmctldHost=node1(10.200.0.1)
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket=$C/run/munge.socket
CredType=cred/munge
MpiDefault=none
MailProg=/bin/true
StateSaveLocation=$C/state/ctld
SlurmdSpoolDir=$C/state/slurmd-%n
SlurmctldPidFile=$C/run/slurmctld.pid
SlurmdPidFile=$C/run/slurmd-%n.pid
SlurmctldLogFile=$C/log/slurmctld.log
SlurmdLogFile=$C/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
# seconds between scancel's SIGTERM and its SIGKILL (gputui's graceful stop fits in it)
KillWait=30
NodeName=node1 NodeAddr=10.200.0.1 CPUs=2
NodeName=node2 NodeAddr=10.200.0.2 CPUs=2
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
in_node() { local ns=$1 h=$2; shift 2
  nsenter --net=/run/netns/$ns unshare --mount --uts --propagation private -- /bin/sh -c \
    'mount --bind "$0" /etc/hosts && hostname "$1" && shift && exec "$@"' $C/etc/hosts $h "$@" </dev/null; }
in_node $NS1 node1 slurmctld -f $SLURM_CONF
in_node $NS1 node1 slurmd -N node1 -f $SLURM_CONF
in_node $NS2 node2 slurmd -N node2 -f $SLURM_CONF
for c in srun sbatch salloc squeue sinfo scancel scontrol sacct sattach; do   # clients: inside node1's netns
  printf '#!/bin/sh\nexport SLURM_CONF=%s\n[ -n "$(ip netns identify $$ 2>/dev/null)" ] || exec ip netns exec %s /usr/bin/%s "$@"\nexec /usr/bin/%s "$@"\n' \
    $SLURM_CONF $NS1 $c $c >$C/bin/$c; chmod +x $C/bin/$c
done
printf 'export SLURM_CONF=%s PATH=%s/bin:$PATH\n' $SLURM_CONF $C >$D/env.sh
for _ in $(seq 100); do
  [ "$($C/bin/sinfo -h -N -t idle -o %N 2>/dev/null | sort -u | wc -l)" = 2 ] && { $C/bin/sinfo; exit 0; }; sleep 0.3
done
tail -n 20 $C/log/*.log >&2; exit 1
