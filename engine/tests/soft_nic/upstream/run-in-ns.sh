#!/usr/bin/env bash
# Runs a command where upstream Mooncake's topology discovery finds the soft NIC's HCAs.
#
#   unshare -rm engine/tests/soft_nic/upstream/run-in-ns.sh CMD ARGS...
#
# Upstream accepts an HCA only if /dev/infiniband/<uverbsN> is a read-write character
# device, and reads /sys/class/infiniband/<dev> (fixed paths, no override). Inside the
# private mount namespace that `unshare -rm` gives (no root needed, nothing on the host
# changes) this script mounts a fresh /dev with the usual nodes bound from the real
# one plus /dev/infiniband/uverbsN (each a bind of /dev/null), and a tmpfs on
# /sys/class whose infiniband/<dev> entries point into the synthetic sysfs tree at
# $MC_SYSFS_ROOT (SoftFabric in ../mod.rs writes it). HCAs: $SOFTNIC_HCAS.
set -euo pipefail
: "${MC_SYSFS_ROOT:?set MC_SYSFS_ROOT to the sysfs tree of the soft fabric}"
[ "$#" -gt 0 ] || { echo "usage: unshare -rm $0 CMD ARGS..." >&2; exit 2; }
OLD="$(mktemp -d)"
mount --rbind /dev "$OLD"
mount -t tmpfs -o mode=755 softnic-dev /dev
for n in null zero full random urandom tty; do
    if [ -e "$OLD/$n" ]; then : > "/dev/$n"; mount --bind "$OLD/$n" "/dev/$n"; fi
done
for d in shm pts mqueue; do
    if [ -d "$OLD/$d" ]; then mkdir -p "/dev/$d"; mount --rbind "$OLD/$d" "/dev/$d"; fi
done
ln -s /proc/self/fd /dev/fd
ln -s /proc/self/fd/0 /dev/stdin
ln -s /proc/self/fd/1 /dev/stdout
ln -s /proc/self/fd/2 /dev/stderr
mkdir -p /dev/infiniband
IFS=, read -ra HCAS <<< "${SOFTNIC_HCAS:-soft_0}"
for i in "${!HCAS[@]}"; do
    : > "/dev/infiniband/uverbs$i"
    mount --bind "$OLD/null" "/dev/infiniband/uverbs$i"
done
mount -t tmpfs softnic-sysclass /sys/class
mkdir -p /sys/class/infiniband
for h in "${HCAS[@]}"; do
    ln -s "$(readlink -f "$MC_SYSFS_ROOT/class/infiniband/$h")" "/sys/class/infiniband/$h"
done
exec "$@"
