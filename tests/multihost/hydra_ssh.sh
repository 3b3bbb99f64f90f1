#!/bin/sh
# An "ssh" for MPICH's hydra (`-launcher ssh -launcher-exec <this>`) that
# enters a test host of tests/hosts.py instead of logging in. The host map
# ($KD_TEST_HOSTS_MAP, written by hosts.Cluster) has one line per host:
# "<address> <hostname> <holder pid>".
while [ $# -gt 0 ]; do
  case "$1" in
    -b|-c|-D|-E|-e|-F|-I|-i|-J|-L|-l|-m|-O|-o|-p|-Q|-R|-S|-W|-w) shift 2;;
    -*) shift;;
    *) break;;
  esac
done
host=${1#*@}
shift
pid=$(awk -v h="$host" '$1 == h || $2 == h { print $3; exit }' "${KD_TEST_HOSTS_MAP:?}")
if [ -z "$pid" ]; then
  echo "tests/multihost/hydra_ssh.sh: unknown host $host" >&2
  exit 255
fi
# Like ssh: the remaining words are one command line for a shell.
exec nsenter -t "$pid" -n -u -i -m -- /bin/sh -c "$*"
