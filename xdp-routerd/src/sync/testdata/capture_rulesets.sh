#!/bin/sh
# Captures `nft -t -j list ruleset` (NAME.json) and `iptables-save`, `====`, `ip6tables-save`
# (NAME_save.txt) of the router rulesets the per-packet reach tests read, each built in a scratch
# network namespace as the tool itself builds it: the test bed's router ruleset with a LOG rule at
# the end of FORWARD or first in it; ufw (Debian's package, run in the namespace with its own copy
# of /etc/ufw and /etc/default) with `default deny routed`, `route allow in on eth1 out on eth0`
# and logging low, medium and high; fw4_style.nft and fw4_log_first.nft from OUTDIR; the rules
# with matches whose answer changes without a commit (an ipset before the established accept, a
# time rule after it, an ipset after `--ctstate NEW`) and expiring.nft from OUTDIR; rules narrowed
# by their flow-constant tests (a hashlimit on port 22 first in FORWARD; narrowed.nft and
# narrowed_log_first.nft from OUTDIR); a first-6-packets NFQUEUE rule (connbytes) and native
# `ct original packets 1-6` / `ct packets > 100` rules; firewalld (Debian's package, run in the
# namespace with its own copy of /etc/firewalld and a private system bus) as a router: eth0 in
# zone external (masquerading), eth1 in internal, a policy accepting internal → external, denied
# packets logged (`--set-log-denied=all`), also kept as firewalld_router.nft.
# Usage (root, ufw and firewalld installed, iptables = iptables-nft): capture_rulesets.sh OUTDIR
set -e
OUT=$1
N=xrcap
fresh() {
  ip netns del $N 2>/dev/null || true
  rm -rf /etc/netns/$N
  ip netns add $N
  ip netns exec $N sh -c 'ip link add eth0 type veth peer name p0; ip link add eth1 type veth peer name p1
    for i in lo eth0 eth1; do ip link set $i up; done
    sysctl -qw net.ipv4.ip_forward=1 net.ipv6.conf.all.forwarding=1'
}
dump() { # name
  ip netns exec $N nft -t -j list ruleset > $OUT/$1.json
  { ip netns exec $N iptables-save; echo ====; ip netns exec $N ip6tables-save; } | grep -v '^# \(Generated\|Completed\)' > $OUT/$1_save.txt
}
router() { # the test bed's router ruleset (tests/src/testbed/topology.rs)
  ip netns exec $N sh -c 'iptables -w -t nat -A POSTROUTING -o eth0 -j MASQUERADE
    for t in iptables ip6tables; do
      $t -w -P FORWARD DROP
      $t -w -A FORWARD -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT
      $t -w -A FORWARD -i eth1 -o eth0 -j ACCEPT
    done'
}
fresh; router
ip netns exec $N iptables -w -A FORWARD -j LOG --log-prefix "drop: "
dump router_log_end
fresh; router
ip netns exec $N iptables -w -I FORWARD 1 -j LOG --log-prefix "drop: "
dump router_log_first

for level in low medium high; do
  fresh
  mkdir -p /etc/netns/$N; cp -a /etc/ufw /etc/netns/$N/ufw; cp -a /etc/default /etc/netns/$N/default
  ip netns exec $N sh -c "iptables -w -t nat -A POSTROUTING -o eth0 -j MASQUERADE
    ufw default deny routed >/dev/null && ufw route allow in on eth1 out on eth0 >/dev/null &&
    ufw logging $level >/dev/null && ufw --force enable >/dev/null && ufw status verbose | head -3"
  dump ufw_$level
  ip netns exec $N ufw --force disable >/dev/null
done

fresh
ip netns exec $N nft -f $OUT/fw4_style.nft
dump fw4_style
ip netns exec $N nft -f $OUT/fw4_log_first.nft
dump fw4_log_first
fresh
ip netns exec $N sh -c 'ipset create blk hash:ip
  iptables -w -A FORWARD -m set --match-set blk dst -j DROP
  iptables -w -A FORWARD -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT
  iptables -w -A FORWARD -p udp --dport 53 -m time --timestart 10:00 --timestop 12:00 -j DROP
  iptables -w -A FORWARD -m conntrack --ctstate NEW -m set --match-set blk src -j DROP
  iptables -w -P FORWARD DROP'
dump expiring_iptables_nft
ip netns exec $N sh -c 'iptables -w -F FORWARD; ipset destroy blk'
ip netns exec $N nft -f $OUT/expiring.nft
dump expiring_nft
fresh; router
ip netns exec $N iptables -w -I FORWARD 1 -p tcp --dport 22 -m hashlimit --hashlimit-above 5/sec \
  --hashlimit-burst 10 --hashlimit-mode srcip --hashlimit-name ssh -j DROP
dump narrowed_iptables_nft
ip netns exec $N nft -f $OUT/narrowed.nft
ip netns exec $N nft -f $OUT/narrowed_log_first.nft
dump narrowed_nft
fresh; router
ip netns exec $N sh -c 'iptables -w -I FORWARD 1 -p udp -m connbytes --connbytes 1:6 \
    --connbytes-dir original --connbytes-mode packets -j NFQUEUE --queue-num 7 --queue-bypass
  nft add table inet dpi
  nft add chain inet dpi f "{ type filter hook forward priority 10; }"
  nft add rule inet dpi f ct original packets 1-6 counter
  nft add rule inet dpi f ct packets \> 100 counter'
dump narrowed_connbytes

fresh
mkdir -p /etc/netns/$N; cp -a /etc/firewalld /etc/netns/$N/firewalld
# firewalld needs a system bus: its own, in a mount namespace of its own (never the host's).
ip netns exec $N unshare -m sh -c 'mount --make-rprivate /
  mount -t tmpfs tmpfs /run/dbus; mount -t tmpfs tmpfs /var/lib/dbus
  dbus-uuidgen --ensure=/var/lib/dbus/machine-id; dbus-daemon --system --fork --nopidfile
  firewalld --nofork --nopid & fw=$!
  for i in $(seq 60); do firewall-cmd --state >/dev/null 2>&1 && break; sleep 1; done
  firewall-cmd -q --permanent --zone=external --add-interface=eth0
  firewall-cmd -q --permanent --zone=internal --add-interface=eth1
  firewall-cmd -q --permanent --new-policy=lan-to-wan
  firewall-cmd -q --permanent --policy=lan-to-wan --add-ingress-zone=internal
  firewall-cmd -q --permanent --policy=lan-to-wan --add-egress-zone=external
  firewall-cmd -q --permanent --policy=lan-to-wan --set-target=ACCEPT
  firewall-cmd -q --set-log-denied=all; firewall-cmd -q --reload
  nft list ruleset > /tmp/xrcap-firewalld.nft
  kill $fw; wait $fw'
mv /tmp/xrcap-firewalld.nft $OUT/firewalld_router.nft
ip netns exec $N nft -f $OUT/firewalld_router.nft
dump firewalld_router
ip netns del $N; rm -rf /etc/netns/$N
