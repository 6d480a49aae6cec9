#!/bin/bash
# Stop the cluster scripts/slurm/up.sh started in DIR (default /tmp/gputui-slurm): its jobs,
# daemons and every process left in its namespaces; delete the namespaces and DIR's files.
D=${1:-/tmp/gputui-slurm}; C=$D/cluster
[ -d $C ] || { echo "down.sh: no cluster in $D"; exit 0; }
[ -x $C/bin/scancel ] && timeout 10 $C/bin/scancel -u root 2>/dev/null
stop() { [ -s "$1" ] || return 0; local p; p=$(cat "$1"); kill "$p" 2>/dev/null || return 0
  for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || return 0; sleep 0.1; done; kill -9 "$p"; }
stop $C/run/slurmd-node1.pid; stop $C/run/slurmd-node2.pid; stop $C/run/slurmctld.pid
for ns in $(cat $C/namespaces 2>/dev/null); do
  ip netns list | grep -qw $ns || continue
  for p in $(ip netns pids $ns); do kill -9 $p 2>/dev/null; done   # leftover slurmstepd or tasks
  ip netns del $ns
done
stop $C/run/munged.pid
rm -rf $C $D/env.sh; echo "down.sh: done"
