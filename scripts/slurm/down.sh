#!/bin/bash
# Stop the cluster scripts/slurm/up.sh started in DIR (default /tmp/gputui-slurm): its jobs,
# daemons and every process left in its namespaces; delete the namespaces and DIR's files.
D=${1:-/tmp/gputui-slurm}; C=$D/cluster
[ -d $C ] || { echo "down.sh: no cluster in $D"; exit 0; }
[ -x $C/bin/scancel ] && timeout 10 $C/bin/scancel -u root 2>/dev/null
# SIGTERM to every daemon at once (each takes 1-2 s to stop), then wait for all (SIGKILL at 10 s)
stop() { local pids="" p f
  for f in "$@"; do [ -s "$f" ] && p=$(cat "$f") && kill "$p" 2>/dev/null && pids="$pids $p"; done
  for _ in $(seq 100); do
    local alive=""; for p in $pids; do kill -0 "$p" 2>/dev/null && alive="$alive $p"; done
    [ -z "$alive" ] && return 0; pids=$alive; sleep 0.1
  done; kill -9 $pids 2>/dev/null; }
stop $C/run/slurmd-node1.pid $C/run/slurmd-node2.pid $C/run/slurmctld.pid $C/run/munged.pid
for ns in $(cat $C/namespaces 2>/dev/null); do
  ip netns list | grep -qw $ns || continue
  for p in $(ip netns pids $ns); do kill -9 $p 2>/dev/null; done   # leftover slurmstepd or tasks
  ip netns del $ns
done
rm -rf $C $D/env.sh; echo "down.sh: done"
