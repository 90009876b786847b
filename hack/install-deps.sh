#!/usr/bin/env bash
# Installs, on Debian as root, the package of every program in
# hack/programs.tsv that is missing: the table lists each program
# isthmus' build, tests, lab, benchmarks and demo run. Idempotent: apt-get runs
# only when something is missing, so a repeat run takes a moment.
#
#   hack/install-deps.sh            install what is missing, mount bpffs
#   hack/install-deps.sh --missing  print the packages it would install, one a line
set -euo pipefail

here="${BASH_SOURCE[0]%/*}"
[ "$here" = "${BASH_SOURCE[0]}" ] && here=.
table="$here/programs.tsv"

# missing prints, once each, the packages of every row whose program is absent
# or whose check fails (a row may name several, separated by commas); rows with
# package "-" (not from apt) are left to the README. Bash builtins only, so it
# answers even on a bare PATH.
missing() {
	local program package check used p
	local -a packages
	local -A said=()
	while IFS=$'\t' read -r program package check used; do
		case "$program" in '' | '#'*) continue ;; esac
		[ "$package" = - ] && continue
		if [ "$check" = - ]; then
			command -v "$program" >/dev/null 2>&1 && continue
		else
			sh -c "$check" >/dev/null 2>&1 && continue
		fi
		IFS=, read -ra packages <<<"$package"
		for p in "${packages[@]}"; do
			[ -n "${said[$p]:-}" ] && continue
			said[$p]=1
			echo "$p"
		done
	done <"$table"
}

if [ "${1:-}" = --missing ]; then
	missing
	exit 0
fi

mapfile -t need < <(missing)
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
	# A row naming the wrong package shows here, not later in a test.
	mapfile -t still < <(missing)
	if [ "${#still[@]}" -gt 0 ]; then
		echo "install-deps: still missing after apt-get: ${still[*]}; check $table" >&2
		exit 1
	fi
fi

# Programs are pinned in bpffs; a fresh machine may not have it mounted.
if ! mount | grep -q ' /sys/fs/bpf type bpf '; then
	[ "$(id -u)" -eq 0 ] && mount -t bpf bpf /sys/fs/bpf
fi
