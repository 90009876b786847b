package testenv

import (
	"bufio"
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Reverse-path filtering on the lab's nodes. Every node runs with strict
// rp_filter (RFC 3704) on all, default and every interface, as RHEL-family and
// hardened images set it; isthmus promises that it holds (DESIGN.md: paths are
// symmetric). The kernel counts each packet it drops for it in
// TcpExtIPReversePathFilter (nstat's name; IPReversePathFilter on the TcpExt
// lines of /proc/net/netstat), one counter per network namespace.

// rpFilterStrict is rp_filter's strict mode; 0 is off, 2 loose.
const rpFilterStrict = 1

// RPFilterCounter is the kernel counter of packets strict or loose rp_filter
// dropped, as nstat names it.
const RPFilterCounter = "TcpExtIPReversePathFilter"

// RPFilterDrops returns, for every node of the lab, the packets rp_filter has
// dropped in the node's namespace since it was made (RPFilterCounter).
func (l *Lab) RPFilterDrops() (map[string]uint64, error) {
	out := map[string]uint64{}
	for _, n := range l.Scenario.Nodes() {
		v, err := rpFilterDrops(l.NodeNS(n.Name))
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", n.Name, err)
		}
		out[n.Name] = v
	}
	return out, nil
}

// rpFilterDrops reads RPFilterCounter in the named namespace. /proc/net is the
// process's (its first thread's) namespace; /proc/thread-self/net is the one
// Do switched the reading thread into.
func rpFilterDrops(nsName string) (uint64, error) {
	var v uint64
	err := Do(nsName, func() error {
		f, err := os.Open("/proc/thread-self/net/netstat")
		if err != nil {
			return fmt.Errorf("read %s: %w", RPFilterCounter, err)
		}
		defer f.Close()
		v, err = parseNetstat(bufio.NewScanner(f), "TcpExt", "IPReversePathFilter")
		return err
	})
	return v, err
}

// parseNetstat returns one counter of /proc/net/netstat, whose sections come
// as two lines each: "TcpExt: Name1 Name2 ..." then "TcpExt: 1 2 ...".
func parseNetstat(sc *bufio.Scanner, section, name string) (uint64, error) {
	var names []string
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 || fields[0] != section+":" {
			continue
		}
		if names == nil {
			names = fields[1:]
			continue
		}
		i := slices.Index(names, name)
		if i < 0 || i+1 >= len(fields) {
			break
		}
		v, err := strconv.ParseUint(fields[i+1], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("parse %s%s %q: %w", section, name, fields[i+1], err)
		}
		return v, nil
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("read netstat: %w", err)
	}
	return 0, fmt.Errorf("no %s%s in /proc/net/netstat", section, name)
}

// RPFilterNotStrict returns "<node> <conf>=<mode>" for every place of every
// node where reverse-path filtering is not strict: all or default (which new
// interfaces copy) set to anything but 1, or an interface whose effective mode
// is not 1. The kernel takes the larger of all's and the interface's value, so
// an interface at 2 is loose whatever all says. Nothing returned means strict
// everywhere.
func (l *Lab) RPFilterNotStrict() ([]string, error) {
	var out []string
	for _, n := range l.Scenario.Nodes() {
		conf, err := rpFilterConf(l.NodeNS(n.Name))
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", n.Name, err)
		}
		all := conf["all"]
		for _, dev := range slices.Sorted(maps.Keys(conf)) {
			v := conf[dev]
			switch dev {
			case "all", "default":
				if v != rpFilterStrict {
					out = append(out, fmt.Sprintf("%s %s=%d", n.Name, dev, v))
				}
			default:
				if max(all, v) != rpFilterStrict {
					out = append(out, fmt.Sprintf("%s %s=%d (effective %d with all=%d)", n.Name, dev, v, max(all, v), all))
				}
			}
		}
	}
	return out, nil
}

// rpFilterConf reads net.ipv4.conf.*.rp_filter in the named namespace, by
// configuration name (all, default and each interface).
func rpFilterConf(nsName string) (map[string]int, error) {
	conf := map[string]int{}
	err := Do(nsName, func() error {
		dirs, err := os.ReadDir("/proc/sys/net/ipv4/conf")
		if err != nil {
			return fmt.Errorf("list net.ipv4.conf: %w", err)
		}
		for _, d := range dirs {
			raw, err := os.ReadFile(filepath.Join("/proc/sys/net/ipv4/conf", d.Name(), "rp_filter"))
			if err != nil {
				return fmt.Errorf("read rp_filter of %s: %w", d.Name(), err)
			}
			v, err := strconv.Atoi(strings.TrimSpace(string(raw)))
			if err != nil {
				return fmt.Errorf("parse rp_filter of %s: %w", d.Name(), err)
			}
			conf[d.Name()] = v
		}
		return nil
	})
	return conf, err
}

// RPFilter6Rule is the strict IPv6 reverse-path filter of the lab's nodes
// (ip6tables -t raw, as ip6tables-restore takes it after -A): firewalld's
// default, on every node of an IPv6 underlay and, with the CNI leftovers, on
// every node of an isthmus lab with IPv6 pods (nodeRules6). IPv6 has no
// rp_filter sysctl; the rule's packet counter counts what it dropped.
const RPFilter6Rule = "PREROUTING -m rpfilter --invert -j DROP"

// RPFilter6Drops returns, for every node of the lab that has RPFilter6Rule,
// the packets the rule has dropped in the node's namespace since it was
// installed. Nodes without the rule are not in the map.
func (l *Lab) RPFilter6Drops(ctx context.Context) (map[string]uint64, error) {
	out := map[string]uint64{}
	for _, n := range l.Scenario.Nodes() {
		text, err := l.Exec(ctx, l.NodeNS(n.Name), "ip6tables", "-w", "-t", "raw", "-L", "PREROUTING", "-v", "-x", "-n")
		if err != nil {
			return nil, fmt.Errorf("node %s: read the IPv6 rpfilter rule's counter: %w", n.Name, err)
		}
		v, ok, err := rpfilterDropCount(text)
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", n.Name, err)
		}
		if ok {
			out[n.Name] = v
		}
	}
	return out, nil
}

// rpfilterDropCount returns the packet count of the DROP rule matching
// rpfilter invert in the output of ip6tables -L PREROUTING -v -x -n, and
// whether there is one:
//
//	Chain PREROUTING (policy ACCEPT 12 packets, 960 bytes)
//	    pkts      bytes target     prot opt in     out     source               destination
//	       0        0 DROP       0    --  *      *       ::/0                 ::/0                 rpfilter invert
func rpfilterDropCount(list string) (uint64, bool, error) {
	for _, line := range strings.Split(list, "\n") {
		f := strings.Fields(line)
		if len(f) < 3 || f[2] != "DROP" || !strings.HasSuffix(strings.TrimSpace(line), "rpfilter invert") {
			continue
		}
		n, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			return 0, false, fmt.Errorf("read the IPv6 rpfilter rule's counter: %q: %w", line, err)
		}
		return n, true, nil
	}
	return 0, false, nil
}
