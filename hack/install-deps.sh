#!/usr/bin/env bash
# Installs what isthmus needs to build, test and run its lab on Debian, as root.
# Idempotent: it only calls apt-get when a tool is missing, so repeat runs are instant.
set -euo pipefail

need=()
have() { command -v "$1" >/dev/null 2>&1; }
have clang     || need+=(clang)
have llc       || need+=(llvm)
have llvm-strip || need+=(llvm)
have bpftool   || need+=(bpftool)
have ip        || need+=(iproute2)
have iptables  || need+=(iptables)
have iperf3    || need+=(iperf3)
have tshark    || need+=(tshark)
have tcpdump   || need+=(tcpdump)
have socat     || need+=(socat)
have conntrack || need+=(conntrack)
have nft       || need+=(nftables)   # kube-proxy's nftables mode in the lab
have sockperf  || need+=(sockperf)   # request/response latency in isthmus bench
have ethtool   || need+=(ethtool)
have nsenter   || need+=(util-linux)
/usr/bin/python3 -c 'import scapy' >/dev/null 2>&1 || need+=(python3-scapy)

if [ "${#need[@]}" -gt 0 ]; then
	if [ "$(id -u)" -ne 0 ]; then
		echo "install-deps: missing ${need[*]}; run as root (apt-get needs it)" >&2
		exit 1
	fi
	echo "install-deps: installing ${need[*]}" >&2
	export DEBIAN_FRONTEND=noninteractive
	# tshark asks whether non-root users may capture; answer it up front.
	echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# Programs are pinned in bpffs; a fresh machine may not have it mounted.
if ! mount | grep -q ' /sys/fs/bpf type bpf '; then
	[ "$(id -u)" -eq 0 ] && mount -t bpf bpf /sys/fs/bpf
fi
