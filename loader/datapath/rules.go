package datapath

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// PodTable is the routing table of the routes only the node's pods take
// (plan.Route.TransitOnly: its peers' node addresses, the nodes reached
// through gateways), and RulePriority the priority of the policy rules that
// send the pods' sources (plan.NodePlan.TunnelSources) to it: after the local
// table's rule (0), before main's (32766). A lookup that finds nothing in the
// table goes on to the next rule, so every other destination of a pod is
// routed by main as before.
const (
	PodTable     = 201
	RulePriority = 201
)

// FabricTable is the routing table of the routes a member's declared pods
// take to its site's gateways by the underlay device (plan.Route.ViaFabric),
// and FabricRulePriority the priority of the rules that send those sources
// (plan.NodePlan.FabricEgress) to it: right before the pods' table, which
// holds the same prefixes into isthmus0 for the node's other pod sources. A
// lookup that finds nothing there goes on to the next rule, like PodTable's.
const (
	FabricTable        = 202
	FabricRulePriority = 200
)

// RuleSet is the kernel's policy rules as the rule sync sees them: only those
// of one table and priority (PodTable, FabricTable), each one by its source.
type RuleSet interface {
	List() ([]netip.Prefix, error)
	// Add adds the rule `from src lookup <table>`; one already there is no error.
	Add(src netip.Prefix) error
	// Delete removes the rule; one already gone is no error.
	Delete(src netip.Prefix) error
}

// RuleResult counts what SyncRules changed.
type RuleResult struct {
	Added, Deleted int
}

// SyncRules brings s to the rules for the IPv4 prefixes of sources by
// difference: adds first, then deletes. It stops at the first error and
// returns what it did up to there.
func SyncRules(s RuleSet, sources []netip.Prefix) (RuleResult, error) {
	var res RuleResult
	current, err := s.List()
	if err != nil {
		return res, err
	}
	var want []netip.Prefix
	for _, p := range sources {
		if a := p.Addr().Unmap(); a.Is4() {
			want = append(want, netip.PrefixFrom(a, p.Bits()).Masked())
		}
	}
	slices.SortFunc(want, netip.Prefix.Compare)
	want = slices.Compact(want)
	slices.SortFunc(current, netip.Prefix.Compare)
	for _, p := range want {
		if !slices.Contains(current, p) {
			if err := s.Add(p); err != nil {
				return res, fmt.Errorf("add rule from %v: %w", p, err)
			}
			res.Added++
		}
	}
	for _, p := range current {
		if !slices.Contains(want, p) {
			if err := s.Delete(p); err != nil {
				return res, fmt.Errorf("delete rule from %v: %w", p, err)
			}
			res.Deleted++
		}
	}
	if st, ok := s.(staleRules); ok {
		n, err := st.DeleteStale()
		res.Deleted += n
		if err != nil {
			return res, err
		}
	}
	return res, nil
}

// staleRules is a RuleSet that may also hold rules of its table and priority in an
// older form (another selector), which SyncRules removes after its own.
type staleRules interface {
	DeleteStale() (int, error)
}

// KernelRules are the policy rules of the calling thread's network namespace
// that look up Table with priority Priority: PodTable and RulePriority when
// both are zero. Each rule matches its source only in packets without the
// flow marks it passes over (EnsureFlowMarks): PodTable's `from SRC fwmark
// 0/0x400 lookup 201` skips flows that entered the node on the underlay device
// for a local address, FabricTable's `fwmark 0/0xc00` those that entered on
// isthmus0 too.
type KernelRules struct {
	Table, Priority int
}

var _ RuleSet = KernelRules{}

func (k KernelRules) table() (table, priority int) {
	if k.Table == 0 {
		return PodTable, RulePriority
	}
	return k.Table, k.Priority
}

// skipMarks is the fwmark mask of k's rules: the flow marks they pass over.
func (k KernelRules) skipMarks() uint32 {
	if table, _ := k.table(); table == FabricTable {
		return UnderlayFlowMark | OverlayFlowMark
	}
	return UnderlayFlowMark
}

// List returns the sources of the IPv4 rules with k's priority that look up
// k's table.
func (k KernelRules) List() ([]netip.Prefix, error) {
	table, priority := k.table()
	rs, err := netlink.RuleListFiltered(netlink.FAMILY_V4, &netlink.Rule{Table: table, Priority: priority},
		netlink.RT_FILTER_TABLE|netlink.RT_FILTER_PRIORITY)
	if err != nil {
		return nil, fmt.Errorf("list rules of table %d: %w", table, err)
	}
	var out []netip.Prefix
	for _, r := range rs {
		if r.Src == nil || r.Dst != nil || !k.hasSelector(r) {
			continue
		}
		ip, ok := netip.AddrFromSlice(r.Src.IP)
		if !ok {
			continue
		}
		ones, _ := r.Src.Mask.Size()
		out = append(out, netip.PrefixFrom(ip.Unmap(), ones))
	}
	return out, nil
}

func (k KernelRules) nl(src netip.Prefix) *netlink.Rule {
	r := netlink.NewRule()
	r.Family = unix.AF_INET
	r.Table, r.Priority = k.table()
	r.Src = &net.IPNet{IP: src.Addr().AsSlice(), Mask: net.CIDRMask(src.Bits(), 32)}
	mask := k.skipMarks()
	r.Mark, r.Mask = 0, &mask
	return r
}

// hasSelector reports whether r matches only packets without k's flow marks,
// as the rules k adds do.
func (k KernelRules) hasSelector(r netlink.Rule) bool {
	return r.Mark == 0 && r.Mask != nil && *r.Mask == k.skipMarks()
}

// DeleteStale removes the rules of k's table and priority with another
// selector (an older agent's, without the flow marks) and returns how many it
// removed. The kernel cannot tell a rule without a mark selector from ours in a
// delete (a zero mark and mask name none), so it removes every rule of that
// source and adds its own back.
func (k KernelRules) DeleteStale() (int, error) {
	table, priority := k.table()
	rs, err := netlink.RuleListFiltered(netlink.FAMILY_V4, &netlink.Rule{Table: table, Priority: priority},
		netlink.RT_FILTER_TABLE|netlink.RT_FILTER_PRIORITY)
	if err != nil {
		return 0, fmt.Errorf("list rules of table %d: %w", table, err)
	}
	ours := map[string]bool{}
	var stale []netlink.Rule
	for _, r := range rs {
		if k.hasSelector(r) && r.Src != nil {
			ours[r.Src.String()] = true
		} else {
			stale = append(stale, r)
		}
	}
	for i, r := range stale {
		plain := netlink.NewRule()
		plain.Family, plain.Table, plain.Priority, plain.Src, plain.Dst = unix.AF_INET, table, priority, r.Src, r.Dst
		for {
			err := netlink.RuleDel(plain)
			if errors.Is(err, unix.ENOENT) {
				break
			}
			if err != nil {
				return i, fmt.Errorf("delete stale rule %v: %w", r, err)
			}
		}
		if r.Src != nil && r.Dst == nil && ours[r.Src.String()] {
			src, _ := netip.ParsePrefix(r.Src.String())
			if err := k.Add(src); err != nil {
				return i + 1, fmt.Errorf("add rule from %v: %w", src, err)
			}
		}
	}
	return len(stale), nil
}

// Add adds the rule; EEXIST is success.
func (k KernelRules) Add(src netip.Prefix) error {
	err := netlink.RuleAdd(k.nl(src))
	if errors.Is(err, unix.EEXIST) {
		return nil
	}
	return err
}

// Delete removes the rule; ENOENT (already gone) is success.
func (k KernelRules) Delete(src netip.Prefix) error {
	err := netlink.RuleDel(k.nl(src))
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	return err
}
