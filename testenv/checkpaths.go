package testenv

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
)

// PathCheck is what CheckPaths found.
type PathCheck struct {
	// Matrix holds every probe, as Check returns it.
	Matrix *Matrix
	// Pairs are the ordered pod pairs probed (Scenario.Expectations).
	Pairs [][2]string
	// Unprobed are the ordered pairs of distinct pods the scenario says do not
	// talk (into an undeclared pool, or between sites joined by nothing).
	Unprobed [][2]string
	// Pairs6 are the ordered pod pairs probed over IPv6, between their
	// address6 (Lab.Expectations6), after every IPv4 pair.
	Pairs6 [][2]string
	// Unprobed6 are the pairs with an address6 on both pods whose IPv6 is not
	// probed, each with the reason.
	Unprobed6 []Unprobed6
	// PolicyDenied are the pairs that should talk but a pod policy of the
	// scenario denies (Scenario.PolicyDenies): the matrix leaves them out, and
	// Policy probes them.
	PolicyDenied [][2]string
	// Policy is CheckPolicy's outcome, for a scenario with pod policies; nil
	// without.
	Policy *PolicyCheck
	// NotStrict is RPFilterNotStrict as the check began.
	NotStrict []string
	// Before and After are RPFilterDrops around the probes.
	Before, After map[string]uint64
	// Before6 and After6 are RPFilter6Drops around the probes: the packets
	// the strict IPv6 rpfilter rule dropped, on the nodes that have it (every
	// node of an IPv6 underlay, and with the CNI leftovers every node of a
	// lab with IPv6 pods); empty where no node has it.
	Before6, After6 map[string]uint64
	// Took is how long the whole check ran.
	Took time.Duration
	// Lost holds, for every pair with a failed or retried probe, the counters
	// that rose on any node or on either pod while that pair was probed
	// (kernel SNMP and extended counters, datapath verdicts and drop reasons):
	// where its packet went.
	Lost map[[2]string][]string
	// Lost6 is Lost for the IPv6 probes.
	Lost6 map[[2]string][]string
}

// FailedPairs returns "src -> dst (protocols)" for every pair with a failed
// probe, in matrix order: IPv4 pairs, then IPv6 ones, whose protocols read
// icmp6, tcp6, udp6.
func (c *PathCheck) FailedPairs() []string {
	if c.Matrix == nil {
		return nil
	}
	type key struct {
		src, dst string
		f        Family
	}
	var keys []key
	protos := map[key][]string{}
	for _, p := range c.Matrix.Failures() {
		k := key{p.Src, p.Dst, p.Family}
		if protos[k] == nil {
			keys = append(keys, k)
		}
		protos[k] = append(protos[k], p.Family.label(p.Proto))
	}
	var out []string
	for _, k := range keys {
		out = append(out, fmt.Sprintf("%s -> %s (%s)", k.src, k.dst, strings.Join(protos[k], " ")))
	}
	return out
}

// failed counts the pairs of family f with a failed probe.
func (c *PathCheck) failed(f Family) int {
	if c.Matrix == nil {
		return 0
	}
	pairs := map[[2]string]bool{}
	for _, p := range c.Matrix.Failures() {
		if p.Family == f {
			pairs[[2]string{p.Src, p.Dst}] = true
		}
	}
	return len(pairs)
}

// RPFilterRose returns the nodes whose RPFilterCounter rose during the
// probes, with the counts before and after. What it counted before the check
// (Before) is the caller's to judge: a test that brought the lab up wants 0
// there too; a check run again on a lab judges its own probes.
func (c *PathCheck) RPFilterRose() []string {
	var out []string
	for _, n := range slices.Sorted(maps.Keys(c.After)) {
		if before, after := c.Before[n], c.After[n]; after > before {
			out = append(out, fmt.Sprintf("node %s: %s %d -> %d: strict rp_filter dropped %d packets during the probes", n, RPFilterCounter, before, after, after-before))
		}
	}
	return out
}

// RPFilter6Rose returns the nodes whose strict IPv6 rpfilter rule
// (RPFilter6Rule) dropped packets during the probes, with the counts before
// and after.
func (c *PathCheck) RPFilter6Rose() []string {
	var out []string
	for _, n := range slices.Sorted(maps.Keys(c.After6)) {
		if before, after := c.Before6[n], c.After6[n]; after > before {
			out = append(out, fmt.Sprintf("node %s: IPv6 rpfilter rule %d -> %d: the strict IPv6 reverse-path filter dropped %d packets during the probes", n, before, after, after-before))
		}
	}
	return out
}

// String reports the check: the pairs, rp_filter's settings and counters
// per node, then the matrix.
func (c *PathCheck) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d ordered pod pairs probed with icmp, tcp and udp, %d failed, in %s\n",
		len(c.Pairs), c.failed(IPv4), c.Took.Round(time.Millisecond))
	if len(c.Pairs6) > 0 || len(c.Unprobed6) > 0 {
		fmt.Fprintf(&b, "IPv6: %d ordered pod pairs probed between their address6 with icmp6, tcp6 and udp6, %d failed\n",
			len(c.Pairs6), c.failed(IPv6))
	}
	if len(c.Unprobed) > 0 {
		var list []string
		for _, p := range c.Unprobed {
			list = append(list, p[0]+"->"+p[1])
		}
		fmt.Fprintf(&b, "not probed (no path by design): %s\n", strings.Join(list, ", "))
	}
	// Pairs left out of IPv6 for one reason share a line.
	var whys []string
	byWhy := map[string][]string{}
	for _, u := range c.Unprobed6 {
		if byWhy[u.Why] == nil {
			whys = append(whys, u.Why)
		}
		byWhy[u.Why] = append(byWhy[u.Why], u.Src+"->"+u.Dst)
	}
	for _, why := range whys {
		fmt.Fprintf(&b, "IPv6 not probed (%s): %s\n", why, strings.Join(byWhy[why], ", "))
	}
	if len(c.PolicyDenied) > 0 {
		var list []string
		for _, p := range c.PolicyDenied {
			list = append(list, p[0]+"->"+p[1])
		}
		fmt.Fprintf(&b, "not in the matrix (a pod policy denies them; policy probes below): %s\n", strings.Join(list, ", "))
	}
	if len(c.NotStrict) > 0 {
		fmt.Fprintf(&b, "rp_filter not strict: %s\n", strings.Join(c.NotStrict, ", "))
	} else {
		b.WriteString("rp_filter: strict (1) on all, default and every interface of every node\n")
	}
	var counts []string
	for _, n := range slices.Sorted(maps.Keys(c.After)) {
		counts = append(counts, fmt.Sprintf("%s %d->%d", n, c.Before[n], c.After[n]))
	}
	fmt.Fprintf(&b, "%s before->after: %s\n", RPFilterCounter, strings.Join(counts, ", "))
	if len(c.After6) > 0 {
		var counts6 []string
		for _, n := range slices.Sorted(maps.Keys(c.After6)) {
			counts6 = append(counts6, fmt.Sprintf("%s %d->%d", n, c.Before6[n], c.After6[n]))
		}
		fmt.Fprintf(&b, "IPv6 rpfilter rule (ip6tables -t raw) drops before->after: %s\n", strings.Join(counts6, ", "))
	}
	if c.Matrix != nil {
		b.WriteString(c.Matrix.String())
	}
	for _, pair := range c.Pairs {
		if lost, ok := c.Lost[pair]; ok {
			fmt.Fprintf(&b, "counters that rose while %s -> %s was probed (it failed or needed a retry):\n", pair[0], pair[1])
			for _, l := range lost {
				fmt.Fprintf(&b, "  %s\n", l)
			}
		}
	}
	for _, pair := range c.Pairs6 {
		if lost, ok := c.Lost6[pair]; ok {
			fmt.Fprintf(&b, "counters that rose while %s -> %s was probed over IPv6 (it failed or needed a retry):\n", pair[0], pair[1])
			for _, l := range lost {
				fmt.Fprintf(&b, "  %s\n", l)
			}
		}
	}
	if c.Policy != nil {
		b.WriteString(c.Policy.String())
	}
	return b.String()
}

// CheckPaths is the check every scenario's end-to-end test runs. It checks
// that rp_filter is strict on every node (all, default and every interface,
// RPFilterNotStrict), reads RPFilterCounter on every node, probes as Check
// does (every ordered pod pair that should talk, so each pair both ways, with
// ICMP, TCP and UDP, and the source each receiver saw, all as
// Scenario.Expectations derives them from the scenario) but one pair at a
// time, each after every node's neighbour entries on the underlay are
// flushed, then over IPv6 every pair Lab.Expectations6 names (pods with an
// address6 in a mesh: the same expectation between their address6), and
// reads the counters again, with the strict IPv6 rpfilter rule's
// (RPFilter6Rule) on the nodes that have it. The error names every pair that
// failed or passed only after a retry, and every node whose counter rose:
// isthmus keeps paths symmetric, so strict rp_filter never drops one of its
// packets. In a scenario with pod policies, the pairs a policy denies stay out
// of the matrix, and CheckPolicy probes every policy after it (fragments, ICMP
// timestamp, an unknown protocol from the denied source; a revoked TCP flow).
// The error is nil only when everything passed; the PathCheck is nil only when
// the check could not run.
func (l *Lab) CheckPaths(ctx context.Context) (*PathCheck, error) {
	start := time.Now()
	c := &PathCheck{}
	var err error
	if c.NotStrict, err = l.RPFilterNotStrict(); err != nil {
		return nil, fmt.Errorf("check paths of lab %s: %w", l.Name, err)
	}
	if c.Before, err = l.RPFilterDrops(); err != nil {
		return nil, fmt.Errorf("check paths of lab %s: %w", l.Name, err)
	}
	if c.Before6, err = l.RPFilter6Drops(ctx); err != nil {
		return nil, fmt.Errorf("check paths of lab %s: %w", l.Name, err)
	}
	want := map[[2]string]bool{}
	for _, e := range l.Scenario.Expectations() {
		want[[2]string{e.Src, e.Dst}] = true
		if l.Scenario.PolicyDenies(e) {
			c.PolicyDenied = append(c.PolicyDenied, [2]string{e.Src, e.Dst})
			continue
		}
		c.Pairs = append(c.Pairs, [2]string{e.Src, e.Dst})
	}
	for _, s := range l.Scenario.Pods() {
		for _, d := range l.Scenario.Pods() {
			if s.Name != d.Name && !want[[2]string{s.Name, d.Name}] {
				c.Unprobed = append(c.Unprobed, [2]string{s.Name, d.Name})
			}
		}
	}
	es6, skipped6 := l.Expectations6()
	c.Unprobed6 = skipped6
	for _, e := range es6 {
		c.Pairs6 = append(c.Pairs6, [2]string{e.Src, e.Dst})
	}
	// One pair at a time, each from cold underlay neighbour caches, as on
	// nodes whose entries expired: a path that holds only while a neighbour
	// entry is fresh (the datapath checks where a fabric packet came from by a
	// FIB lookup that needs one) then fails every time, not only when no
	// earlier probe or health check happened to fill the cache.
	m := &Matrix{}
	for _, p := range l.Scenario.Pods() {
		m.Pods = append(m.Pods, p.Name)
	}
	for _, f := range Families {
		pairs, lost := c.Pairs, &c.Lost
		if f == IPv6 {
			pairs, lost = c.Pairs6, &c.Lost6
		}
		for _, pair := range pairs {
			if err := l.flushUnderlayNeighbours(); err != nil {
				return nil, fmt.Errorf("check paths of lab %s: %w", l.Name, err)
			}
			before, err := l.snapshotCounters(pair[0], pair[1])
			if err != nil {
				return nil, fmt.Errorf("check paths of lab %s: %w", l.Name, err)
			}
			pm, err := l.CheckPairs(ctx, [][2]string{pair}, CheckOptions{Family: f})
			if pm == nil {
				return nil, err
			}
			m.Probes = append(m.Probes, pm.Probes...) // pairs come in matrix order, IPv4 first
			if len(pm.Failures()) > 0 || len(pm.Retried()) > 0 {
				after, err := l.snapshotCounters(pair[0], pair[1])
				if err != nil {
					return nil, fmt.Errorf("check paths of lab %s: %w", l.Name, err)
				}
				if *lost == nil {
					*lost = map[[2]string][]string{}
				}
				(*lost)[pair] = after.diff(before)
			}
		}
	}
	c.Matrix = m
	if c.After, err = l.RPFilterDrops(); err != nil {
		return nil, fmt.Errorf("check paths of lab %s: %w", l.Name, err)
	}
	if c.After6, err = l.RPFilter6Drops(ctx); err != nil {
		return nil, fmt.Errorf("check paths of lab %s: %w", l.Name, err)
	}
	var errs []error
	if len(l.Scenario.PolicyCases()) > 0 {
		var perr error
		if c.Policy, perr = l.CheckPolicy(ctx); c.Policy == nil {
			return nil, fmt.Errorf("check paths of lab %s: %w", l.Name, perr)
		}
		if perr != nil {
			errs = append(errs, perr)
		}
	}
	c.Took = time.Since(start)

	if len(c.NotStrict) > 0 {
		errs = append(errs, fmt.Errorf("rp_filter not strict: %s", strings.Join(c.NotStrict, ", ")))
	}
	if failed := c.FailedPairs(); len(failed) > 0 {
		errs = append(errs, fmt.Errorf("%d of %d pod pairs failed: %s", len(failed), len(c.Pairs)+len(c.Pairs6), strings.Join(failed, ", ")))
	}
	// A receiver that saw another source on an attempt (a MASQUERADE that met the
	// first packet, say) is a wrong path even when a retry then passed.
	var wrongSource []string
	for _, p := range m.Probes {
		for _, e := range p.Errs {
			if strings.Contains(e, "server saw source") {
				wrongSource = append(wrongSource, fmt.Sprintf("%s (%s)", p.name(" -> "), e))
				break
			}
		}
	}
	if len(wrongSource) > 0 {
		errs = append(errs, fmt.Errorf("a receiver saw another source on an attempt: %s", strings.Join(wrongSource, ", ")))
	}
	for _, r := range c.RPFilterRose() {
		errs = append(errs, errors.New(r))
	}
	for _, r := range c.RPFilter6Rose() {
		errs = append(errs, errors.New(r))
	}
	// A pair that needed a retry dropped a packet (every pair starts from cold
	// neighbour caches, and a packet waiting for ARP is queued, not lost): it
	// fails the check even when the retry passed.
	if retried := m.Retried(); len(retried) > 0 {
		var list []string
		for _, p := range retried {
			list = append(list, fmt.Sprintf("%s (attempt %d, first: %s)", p.name(" -> "), p.Attempts, p.Errs[0]))
		}
		errs = append(errs, fmt.Errorf("probes that passed only after a retry: %s", strings.Join(list, ", ")))
	}
	if len(errs) > 0 {
		return c, fmt.Errorf("check paths of lab %s: %w", l.Name, errors.Join(errs...))
	}
	return c, nil
}

// flushUnderlayNeighbours removes every node's dynamic neighbour entries on
// UnderlayDev in both families (permanent ones stay), as `ip neigh flush dev
// eth0` and `ip -6 neigh flush dev eth0` do: ARP's on an IPv4 underlay,
// neighbour discovery's on an IPv6 one.
func (l *Lab) flushUnderlayNeighbours() error {
	for _, n := range l.Scenario.Nodes() {
		if err := flushNeighbours(l.NodeNS(n.Name), UnderlayDev); err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
	}
	return nil
}

func flushNeighbours(nsName, dev string) error {
	h, ns, err := handleAt(nsName)
	if err != nil {
		return err
	}
	defer ns.Close()
	defer h.Close()
	link, err := h.LinkByName(dev)
	if err != nil {
		return fmt.Errorf("find %s: %w", dev, err)
	}
	var neighs []netlink.Neigh
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		nbs, err := h.NeighList(link.Attrs().Index, fam)
		if err != nil {
			return fmt.Errorf("list neighbours on %s: %w", dev, err)
		}
		neighs = append(neighs, nbs...)
	}
	for _, nb := range neighs {
		if nb.State&(netlink.NUD_PERMANENT|netlink.NUD_NOARP) != 0 {
			continue
		}
		if err := h.NeighDel(&nb); err != nil && !errors.Is(err, syscall.ENOENT) {
			return fmt.Errorf("flush neighbour %s on %s: %w", nb.IP, dev, err)
		}
	}
	return nil
}
