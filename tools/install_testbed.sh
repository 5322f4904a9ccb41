#!/usr/bin/env bash
# Debian's Slurm, munge and OpenSSH for the two-node test bed of the multi-node tests
# (tools/testbed.py, tests/test_multinode.py). Idempotent: nothing to do if present. No daemon
# is started or enabled here: the test bed starts its own, inside its namespaces, and ends them.
set -euo pipefail
NEED=(/usr/sbin/slurmd /usr/sbin/slurmctld /usr/bin/srun /usr/sbin/munged /usr/sbin/sshd /usr/bin/ssh)
missing=0
for path in "${NEED[@]}"; do [ -x "$path" ] || missing=1; done
if [ "$missing" = 0 ]; then
  exit 0
fi
if ! command -v apt-get >/dev/null || [ "$(id -u)" != 0 ]; then
  echo "tools/install_testbed.sh: Slurm/munge/sshd missing and no apt-get as root; the multi-node tests will be skipped" >&2
  exit 0
fi
echo "== Installing Debian slurm, munge and openssh for the multi-node test bed =="
apt-get update -qq
# policy-rc.d 101: the packages' scripts must not start their daemons on this machine
POLICY=/usr/sbin/policy-rc.d
CREATED=0
if [ ! -e "$POLICY" ]; then printf '#!/bin/sh\nexit 101\n' > "$POLICY"; chmod +x "$POLICY"; CREATED=1; fi
trap '[ "$CREATED" = 1 ] && rm -f "$POLICY"' EXIT
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
  slurmd slurmctld slurm-client munge openssh-server openssh-client iproute2 >/dev/null
