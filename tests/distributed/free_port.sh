# Sourced by the two-rank test scripts. free_port prints a TCP port for
# MASTER_PORT: below the kernel's ephemeral range (which the ranks' own
# outgoing connections draw from, so a port there may be taken between the
# pick and the bind), with nothing listening on it now.
free_port() {
  local low=10000 high=32767 port
  read -r high _ < /proc/sys/net/ipv4/ip_local_port_range 2> /dev/null || high=32768
  high=$((high - 1))
  for _ in $(seq 100); do
    port=$((low + (RANDOM * 32768 + RANDOM) % (high - low)))
    if ! (exec 3<> "/dev/tcp/127.0.0.1/$port") 2> /dev/null; then
      echo "$port"
      return 0
    fi
  done
  echo "no free port found between $low and $high" >&2
  return 1
}
