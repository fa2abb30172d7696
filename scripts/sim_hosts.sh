#!/usr/bin/env bash
# Simulated hosts on one machine: network namespaces, each a "host" with its
# own address, loopback and hostname, joined by veth pairs to a bridge that
# lives in one more namespace (the switch), so that nothing in the machine's
# own namespace changes and one host's link can be cut alone.
#
#   sim_hosts.sh up N              hosts h0..h(N-1) at 10.87.0.1..N/24
#   sim_hosts.sh down              removes them (and the switch)
#   sim_hosts.sh exec HOST CMD...  runs CMD on HOST (h1, or its address),
#                                  with hostname zest-HOST
#   sim_hosts.sh netem HOST "delay 5ms loss 1% rate 1gbit"
#                                  shapes HOST's link both ways (tc netem;
#                                  without it rate and loss only, see
#                                  cmd_netem); "" removes the shaping
#   sim_hosts.sh cut HOST          takes HOST's link down (its switch port)
#   sim_hosts.sh mend HOST         brings it up again
#   sim_hosts.sh rsh [OPTS] HOST CMD...
#                                  the remote-shell agent for Open MPI's
#                                  mpirun (-mca plm_rsh_agent "sim_hosts.sh
#                                  rsh"): runs CMD on HOST as exec does
#   sim_hosts.sh check             exit 0 when namespaces can be made here,
#                                  else 77 with the reason on stderr
#
# ZEST_SIM_TAG (default "sim") names a set of hosts: the namespaces are
# zest-TAG-hI and zest-TAG-sw, so that runs with different tags (ctest -j)
# never meet. `up` first removes what a crashed run with the same tag left.
# ZEST_SIM_TCP_RETRIES (default 5): the hosts' net.ipv4.tcp_retries2 (see
# cmd_up).
# Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) and iproute2 (ip, tc).
#
# The namespaces share the machine's filesystem, /dev/shm included: an MPI
# job across them must use TCP only (btl tcp,self), or its shared-memory
# transport would bypass the simulated network. See docs/MULTIHOST.md.
set -euo pipefail

tag="${ZEST_SIM_TAG:-sim}"
prefix="zest-${tag}"
switch="${prefix}-sw"
subnet_base="10.87.0"
tcp_retries="${ZEST_SIM_TCP_RETRIES:-5}"

die() {
  echo "sim_hosts.sh: $*" >&2
  exit 2
}

# h3, 3 or 10.87.0.4 -> 3
host_index() {
  local h="$1"
  case "$h" in
    h[0-9]*) echo "${h#h}" ;;
    "$subnet_base".[0-9]*) echo $((${h##*.} - 1)) ;;
    [0-9]*) echo "$h" ;;
    *) die "unknown host '$h': name it h0, h1, ... or by its address ${subnet_base}.1, .2, ..." ;;
  esac
}

host_ns() {
  local i
  i="$(host_index "$1")"
  ip netns list | grep -q "^${prefix}-h${i}\b" ||
    die "host h${i} does not exist (ZEST_SIM_TAG=${tag}): make the hosts with 'sim_hosts.sh up N' first"
  echo "${prefix}-h${i}"
}

ours() {
  ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${prefix}-(sw|h[0-9]+)$" || true
}

cmd_down() {
  local ns
  for ns in $(ours); do
    # Processes left in a namespace keep it alive after `ip netns del`
    # only as an unnamed one; its interfaces go with the last of them.
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$ns" || echo "sim_hosts.sh: could not remove namespace $ns" >&2
  done
}

cmd_up() {
  local n="${1:-}"
  if ! [[ "$n" =~ ^[0-9]+$ ]] || ((n < 1 || n > 200)); then
    die "up N: N must be a number of hosts, 1 to 200"
  fi
  cmd_down
  ip netns add "$switch"
  ip -n "$switch" link set lo up
  ip -n "$switch" link add br0 type bridge
  ip -n "$switch" link set br0 up
  local i ns
  for ((i = 0; i < n; ++i)); do
    ns="${prefix}-h${i}"
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    # TCP gives up on a peer that stopped acknowledging after 5 retries
    # (seconds at the simulated link's round trip) instead of the kernel's
    # 15 (about 15 min): mpirun, whose daemons' connections carry data when
    # a link dies, would otherwise wait that long after every rank has
    # ended. ZEST_SIM_TCP_RETRIES=15 keeps the kernel's default.
    ip netns exec "$ns" sysctl -qw net.ipv4.tcp_retries2="$tcp_retries"
    ip -n "$ns" link add eth0 type veth peer name "h${i}" netns "$switch"
    ip -n "$ns" addr add "${subnet_base}.$((i + 1))/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$switch" link set "h${i}" master br0
    ip -n "$switch" link set "h${i}" up
  done
}

# Runs "$@" in the namespace of host $1, in a UTS namespace of its own whose
# hostname is zest-hI (error messages and MPI name hosts by hostname).
cmd_exec() {
  local ns i
  ns="$(host_ns "$1")"
  i="$(host_index "$1")"
  shift
  (($# > 0)) || die "exec HOST CMD...: no command"
  # shellcheck disable=SC2016  # expanded by the inner sh
  exec ip netns exec "$ns" unshare --uts -- sh -c 'hostname "$0" && exec "$@"' "zest-h${i}" "$@"
}

# Where the kernel has netem (CONFIG_NET_SCH_NETEM), SPEC goes to it as
# is. Without it, "rate R" becomes a tbf qdisc and "loss P%" an nftables rule
# dropping that share of packets at random (needs nft); a delay cannot be
# made then, which is an error (exit 3) naming what is missing.
cmd_netem() {
  local ns i
  ns="$(host_ns "$1")"
  i="$(host_index "$1")"
  local spec="${2-}"
  tc -n "$ns" qdisc del dev eth0 root 2>/dev/null || true
  tc -n "$switch" qdisc del dev "h${i}" root 2>/dev/null || true
  ip netns exec "$ns" nft delete table inet zest_netem 2>/dev/null || true
  [[ -n "$spec" ]] || return 0
  # Both directions: out of the host, and out of the switch towards it.
  # shellcheck disable=SC2086  # the netem arguments, word by word
  if tc -n "$ns" qdisc add dev eth0 root netem $spec 2>/dev/null; then
    # shellcheck disable=SC2086
    tc -n "$switch" qdisc add dev "h${i}" root netem $spec
    return
  fi
  local -a words
  read -r -a words <<<"$spec"
  local k=0 rate="" loss=""
  while ((k < ${#words[@]})); do
    case "${words[k]}" in
      rate) rate="${words[k + 1]:-}"; k=$((k + 2)) ;;
      loss) loss="${words[k + 1]:-}"; k=$((k + 2)) ;;
      *)
        echo "sim_hosts.sh: this kernel has no netem (CONFIG_NET_SCH_NETEM is off): '${words[k]}' cannot be simulated; only 'rate R' (tbf) and 'loss P%' (nftables) can" >&2
        exit 3
        ;;
    esac
  done
  if [[ -n "$rate" ]]; then
    tc -n "$ns" qdisc add dev eth0 root tbf rate "$rate" burst 64kb latency 100ms
    tc -n "$switch" qdisc add dev "h${i}" root tbf rate "$rate" burst 64kb latency 100ms
  fi
  if [[ -n "$loss" ]]; then
    command -v nft >/dev/null || {
      echo "sim_hosts.sh: loss without netem needs nftables (Debian: apt-get install nftables)" >&2
      exit 3
    }
    local per10k
    per10k=$(awk -v p="${loss%\%}" 'BEGIN { v = p * 100; if (v < 0 || v > 10000) exit 1; printf "%d", v }') ||
      die "loss $loss: give a percentage, 0% to 100%"
    # Dropped at random on the way out and on the way in (counted: `ip
    # netns exec zest-TAG-hI nft list table inet zest_netem` shows how many).
    local rule="numgen random mod 10000 < $per10k counter drop"
    ((per10k < 10000)) || rule="counter drop"
    ip netns exec "$ns" nft -f - <<NFT
table inet zest_netem {
  chain out { type filter hook output priority 0; $rule; }
  chain in { type filter hook input priority 0; $rule; }
}
NFT
  fi
}

cmd_link() {
  local state="$1" i
  host_ns "$2" >/dev/null
  i="$(host_index "$2")"
  ip -n "$switch" link set "h${i}" "$state"
}

# Open MPI calls its agent as `agent [options] HOST COMMAND...` (ssh-style
# options first, when it passes any).
cmd_rsh() {
  while (($# > 0)) && [[ "$1" == -* ]]; do shift; done
  (($# >= 2)) || die "rsh [OPTS] HOST COMMAND...: missing the host or the command"
  local host="$1"
  shift
  # The remote command comes as one shell string, as ssh would run it.
  cmd_exec "$host" sh -c "$*"
}

cmd_check() {
  if [[ $(id -u) -ne 0 ]]; then
    echo "needs root to make network namespaces (running as uid $(id -u))" >&2
    exit 77
  fi
  local t
  for t in ip tc unshare; do
    command -v "$t" >/dev/null || { echo "needs '$t' (Debian: apt-get install iproute2 util-linux)" >&2; exit 77; }
  done
  local probe="zest-probe-$$"
  if ! err=$(ip netns add "$probe" 2>&1); then
    echo "cannot make a network namespace here ($err)" >&2
    exit 77
  fi
  local ok=0
  ip netns exec "$probe" true 2>/dev/null && ip -n "$probe" link add zpa type veth peer name zpb 2>/dev/null || ok=1
  ip netns del "$probe" 2>/dev/null || true
  if ((ok != 0)); then
    echo "can make a network namespace but not enter it or give it a veth pair" >&2
    exit 77
  fi
}

command="${1:-}"
shift || true
case "$command" in
  up) cmd_up "$@" ;;
  down) cmd_down ;;
  exec) cmd_exec "$@" ;;
  netem) (($# >= 1)) || die "netem HOST SPEC"; cmd_netem "$@" ;;
  cut) (($# == 1)) || die "cut HOST"; cmd_link down "$1" ;;
  mend) (($# == 1)) || die "mend HOST"; cmd_link up "$1" ;;
  rsh) cmd_rsh "$@" ;;
  check) cmd_check ;;
  *) die "usage: sim_hosts.sh up N | down | exec HOST CMD... | netem HOST SPEC | cut HOST | mend HOST | rsh [OPTS] HOST CMD... | check" ;;
esac
