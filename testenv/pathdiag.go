package testenv

import (
	"bufio"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"

	imaps "github.com/isthmus-dev/isthmus/maps"
)

// counterSnapshot holds, per namespace ("node a1", "pod a1-p1"), the counters that
// say where a packet went missing: the kernel's SNMP and extended counters of
// that namespace (/proc/net/snmp, /proc/net/netstat) and, for a node running an
// agent, every datapath counter (verdicts and drop reasons, per hook).
type counterSnapshot map[string]map[string]uint64

// snapshotCounters reads the counters of every node and of the named pods. A
// node without pinned maps (no agent, or a baseline datapath) has kernel
// counters only.
func (l *Lab) snapshotCounters(pods ...string) (counterSnapshot, error) {
	s := counterSnapshot{}
	for _, n := range l.Scenario.Nodes() {
		c, err := kernelCounters(l.NodeNS(n.Name))
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", n.Name, err)
		}
		if err := datapathCounters(l.PinDir(n.Name), c); err != nil {
			return nil, fmt.Errorf("node %s: %w", n.Name, err)
		}
		s["node "+n.Name] = c
	}
	for _, p := range pods {
		c, err := kernelCounters(l.PodNS(p))
		if err != nil {
			return nil, fmt.Errorf("pod %s: %w", p, err)
		}
		s["pod "+p] = c
	}
	return s, nil
}

// kernelCounters reads /proc/net/snmp, /proc/net/netstat and, for IPv6 (the
// IPv6 underlay and IPv6 pods), /proc/net/snmp6 as the namespace sees them
// (thread-self: /proc/self/net is the thread group leader's namespace, not
// the calling thread's).
func kernelCounters(nsName string) (map[string]uint64, error) {
	out := map[string]uint64{}
	err := Do(nsName, func() error {
		for _, f := range []string{"snmp", "netstat"} {
			if err := readProcNetTable(filepath.Join("/proc/thread-self/net", f), out); err != nil {
				return err
			}
		}
		return readProcNetSNMP6(filepath.Join("/proc/thread-self/net", "snmp6"), out)
	})
	return out, err
}

// readProcNetSNMP6 parses /proc/net/snmp6, one "Ip6InReceives  42" per line,
// into keys such as "Ip6.InReceives" (and "Icmp6.", "Udp6.", "UdpLite6."),
// the shape readProcNetTable gives the IPv4 ones. A kernel without IPv6 has
// no such file, which is no error.
func readProcNetSNMP6(path string, out map[string]uint64) error {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) != 2 {
			continue
		}
		v, err := strconv.ParseUint(fields[1], 10, 64)
		if err != nil {
			continue
		}
		name := fields[0]
		for _, prefix := range []string{"UdpLite6", "Icmp6", "Udp6", "Ip6"} {
			if rest, ok := strings.CutPrefix(name, prefix); ok && rest != "" {
				name = prefix + "." + rest
				break
			}
		}
		out[name] = v
	}
	return sc.Err()
}

// readProcNetTable parses the header/value line pairs of /proc/net/snmp and
// /proc/net/netstat ("Tcp: RtoAlgorithm ..." then "Tcp: 1 ...") into
// "Tcp.ActiveOpens"-style keys.
func readProcNetTable(path string, out map[string]uint64) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	var header []string
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 {
			continue
		}
		if header == nil || header[0] != fields[0] {
			header = fields
			continue
		}
		prefix := strings.TrimSuffix(fields[0], ":")
		for i := 1; i < len(fields) && i < len(header); i++ {
			if v, err := strconv.ParseUint(fields[i], 10, 64); err == nil {
				out[prefix+"."+header[i]] = v
			}
		}
		header = nil
	}
	return sc.Err()
}

// datapathCounters adds every counter of the node's pinned metrics map as
// "isthmus.<hook>.<name>" packets. A missing pin is no error: no agent runs.
func datapathCounters(pinDir string, out map[string]uint64) error {
	m, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, string(imaps.MapMetrics)), nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read datapath counters: %w", err)
	}
	defer m.Close()
	all, err := imaps.ReadMetrics(m)
	if err != nil {
		return fmt.Errorf("read datapath counters: %w", err)
	}
	for k, c := range all {
		out["isthmus."+k.Hook.String()+"."+k.Name()] += c.Packets
	}
	return nil
}

// diff returns "where: counter +n" for every counter that rose from before to
// s, in a stable order: what a probe that lost a packet left behind.
func (s counterSnapshot) diff(before counterSnapshot) []string {
	var out []string
	for _, where := range slices.Sorted(maps.Keys(s)) {
		var rose []string
		for _, k := range slices.Sorted(maps.Keys(s[where])) {
			if d := s[where][k] - before[where][k]; s[where][k] > before[where][k] {
				rose = append(rose, fmt.Sprintf("%s +%d", k, d))
			}
		}
		if len(rose) > 0 {
			out = append(out, where+": "+strings.Join(rose, ", "))
		}
	}
	return out
}

// DatapathCount returns the sum over every node's hooks of the datapath
// counter name (a drop reason such as "nat_source_limit", or a verdict), as
// the pinned metrics maps hold it now. Nodes without an agent add nothing.
func (l *Lab) DatapathCount(name string) (uint64, error) {
	var sum uint64
	for _, n := range l.Scenario.Nodes() {
		c := map[string]uint64{}
		if err := datapathCounters(l.PinDir(n.Name), c); err != nil {
			return 0, fmt.Errorf("node %s: %w", n.Name, err)
		}
		for k, v := range c {
			if strings.HasSuffix(k, "."+name) {
				sum += v
			}
		}
	}
	return sum, nil
}
