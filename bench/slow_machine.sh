#!/usr/bin/env bash
# Run a command as if on a slower machine: pinned to one core (taskset) and held to a
# share of that core by a cgroup CPU quota. The demo's start-up probe then shows how much
# slower it is (compare its "machine probe" line with a run on the whole machine).
#
#   bench/slow_machine.sh [--core N] [--share PCT] -- make demo
#
# The group's CPU weight is the highest there is, so other work on the machine (tests,
# builds) cannot push it below its share: it is held to exactly that share of the core.
# Two runs on different cores can go side by side. Needs root and the cgroup v1 `cpu`
# controller (/sys/fs/cgroup/cpu) or cgroup v2 (/sys/fs/cgroup/cpu.max available).
# On the 2-core development machine (probe 1.82 s on both cores), one core at 63-70%
# gave probes of 3.9-6.2 s (2.1-3.4x); docs/demo-run.md has the runs.
set -euo pipefail

core=0
share=65
while [[ $# -gt 0 ]]; do
  case "$1" in
    --core) core=$2; shift 2 ;;
    --share) share=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "usage: $0 [--core N] [--share PCT] -- command..." >&2; exit 2 ;;
  esac
done
[[ $# -gt 0 ]] || { echo "usage: $0 [--core N] [--share PCT] -- command..." >&2; exit 2; }
if ! [[ "$share" =~ ^[0-9]+$ ]] || (( share < 5 || share > 100 )); then
  echo "--share must be a whole percentage from 5 to 100, got $share" >&2; exit 2
fi

period=10000                       # microseconds: short, so the quota does not stall in bursts
quota=$(( period * share / 100 ))
name="turnstile-slow-$core-$$"
if [[ -d /sys/fs/cgroup/cpu && -w /sys/fs/cgroup/cpu ]]; then   # cgroup v1
  group=/sys/fs/cgroup/cpu/$name
  mkdir "$group"
  echo "$period" > "$group/cpu.cfs_period_us"
  echo "$quota" > "$group/cpu.cfs_quota_us"
  echo 262144 > "$group/cpu.shares"   # its full share even beside other work (see above)
elif [[ -f /sys/fs/cgroup/cgroup.controllers ]]; then            # cgroup v2
  group=/sys/fs/cgroup/$name
  mkdir "$group"
  echo "$quota $period" > "$group/cpu.max"
  echo 10000 > "$group/cpu.weight"     # its full share even beside other work (see above)
else
  echo "no writable cgroup cpu controller here (run as root?)" >&2; exit 1
fi
trap 'rmdir "$group" 2>/dev/null || true' EXIT

echo "slow machine: core $core at $share% ($group)" >&2
# the child joins the group, then becomes the command (pinned); the trap removes the group
bash -c 'echo $$ > "$1/cgroup.procs"; shift; exec taskset -c "$@"' _ "$group" "$core" "$@"
