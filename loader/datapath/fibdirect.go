package datapath

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// The kernel's own policy rules: what every namespace starts with.
const (
	localRulePriority   = 0
	mainRulePriority    = 32766
	defaultRulePriority = 32767
)

// DirectFIB reports whether the fast path's FIB lookups may go straight to the main
// table (maps.ConfigFlagFIBDirect, bpf/lib/fib.h fib_lookup_v4_fast) in the calling
// thread's network namespace: see DirectFIBRules. reason names the rule that stops it.
func DirectFIB(underlay netip.Addr) (ok bool, reason string, err error) {
	rs, err := netlink.RuleList(netlink.FAMILY_V4)
	if err != nil {
		return false, "", fmt.Errorf("list policy rules: %w", err)
	}
	ok, reason = DirectFIBRules(rs, underlay)
	return ok, reason, nil
}

// DirectFIBRules reports whether, with the IPv4 policy rules rs, a lookup that the
// main table answers with the fast path's expected outcome (a next hop toward a peer
// from the underlay address, or a local pod's interface) gets the same answer from
// the whole rule list: every rule is the kernel's own (local, main, default, without
// selectors) or isthmus' (PodTable, FabricTable at their priorities, selecting a
// source that does not hold underlay). Those select only the node's pod blocks, and
// their tables hold remote prefixes and throw routes, never a route to a local pod or
// from the underlay address. Any other rule (an operator's policy routing, a VRF's
// l3mdev rule, another CNI's table) could, so the lookups walk the rules. reason
// names the first rule that does not qualify.
func DirectFIBRules(rs []netlink.Rule, underlay netip.Addr) (ok bool, reason string) {
	for _, r := range rs {
		if !directFIBRule(r, underlay) {
			return false, fmt.Sprintf("policy rule %d (table %d) is not the kernel's or isthmus'", r.Priority, r.Table)
		}
	}
	return true, ""
}

func directFIBRule(r netlink.Rule, underlay netip.Addr) bool {
	if r.Type != 0 && r.Type != unix.FR_ACT_TO_TBL {
		return false // blackhole, unreachable, prohibit, goto, nop
	}
	if r.Dst != nil || r.Tos != 0 || r.TunID != 0 || r.IifName != "" || r.OifName != "" ||
		r.Invert || r.Dport != nil || r.Sport != nil || r.IPProto != 0 || r.UIDRange != nil ||
		(r.Goto > 0) || (r.Flow > 0) || r.SuppressPrefixlen > 0 || r.SuppressIfgroup > 0 {
		return false
	}
	switch {
	case r.Priority == localRulePriority && r.Table == unix.RT_TABLE_LOCAL,
		r.Priority == mainRulePriority && r.Table == unix.RT_TABLE_MAIN,
		r.Priority == defaultRulePriority && r.Table == unix.RT_TABLE_DEFAULT:
		return r.Src == nil && r.Mark == 0 && (r.Mask == nil || *r.Mask == 0)
	case r.Priority == RulePriority && r.Table == PodTable,
		r.Priority == FabricRulePriority && r.Table == FabricTable:
		if r.Src == nil {
			return false
		}
		ip, ok := netip.AddrFromSlice(r.Src.IP)
		if !ok {
			return false
		}
		ones, _ := r.Src.Mask.Size()
		return !netip.PrefixFrom(ip.Unmap(), ones).Contains(underlay)
	}
	return false
}

// RuleSubscribe sends on changes after every change of the IPv4 policy rules of the
// calling thread's network namespace (added or deleted by anyone), until done is
// closed; a full changes channel coalesces them. onErr gets a receive error, after
// which changes is closed.
func RuleSubscribe(changes chan<- struct{}, done <-chan struct{}, onErr func(error)) error {
	s, err := nl.Subscribe(unix.NETLINK_ROUTE, unix.RTNLGRP_IPV4_RULE)
	if err != nil {
		return fmt.Errorf("subscribe to policy rule changes: %w", err)
	}
	go func() {
		<-done
		s.Close()
	}()
	go func() {
		defer close(changes)
		for {
			msgs, _, err := s.Receive()
			if errors.Is(err, unix.ENOBUFS) {
				// Changes overflowed the socket: some were lost, so look again.
				select {
				case changes <- struct{}{}:
				default:
				}
				continue
			}
			if err != nil {
				select {
				case <-done:
				default:
					onErr(err)
				}
				return
			}
			for _, m := range msgs {
				if m.Header.Type != unix.RTM_NEWRULE && m.Header.Type != unix.RTM_DELRULE {
					continue
				}
				select {
				case changes <- struct{}{}:
				default: // one pending change already says "look again"
				}
			}
		}
	}()
	return nil
}
