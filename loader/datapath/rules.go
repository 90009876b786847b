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
	return res, nil
}

// KernelRules are the policy rules of the calling thread's network namespace
// that look up Table with priority Priority: PodTable and RulePriority when
// both are zero.
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
		if r.Src == nil || r.Dst != nil {
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
	return r
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
