package maps

// DropReason names one entry of enum drop_reason in bpf/lib/drop.h.
type DropReason struct {
	// Code is the enum value (negative).
	Code int32
	// Const is the C enumerator, such as "DROP_UNKNOWN_PEER".
	Const string
	// Name is a short snake_case name for logs and metrics, such as "unknown_peer".
	Name string
	// Description is one sentence on what was dropped.
	Description string
}

// dropReasons mirrors bpf/lib/drop.h entry for entry; TestDropReasonsMatchBTF checks
// it against the enum in the compiled object. Never renumber: a retired reason
// keeps its slot.
var dropReasons = []DropReason{
	{-130, "DROP_INVALID_PACKET", "invalid_packet", "Truncated or malformed outer L2, L3 or L4 header."},
	{-131, "DROP_GENEVE_TRUNCATED", "geneve_truncated", "UDP payload shorter than a GENEVE header."},
	{-132, "DROP_GENEVE_VERSION", "geneve_version", "GENEVE version is not 0."},
	{-133, "DROP_GENEVE_OPT_LEN", "geneve_opt_len", "GENEVE options run past the end of the packet."},
	{-134, "DROP_GENEVE_CRITICAL", "geneve_critical", "GENEVE header has the critical-options bit set for options we do not understand."},
	{-135, "DROP_GENEVE_PROTOCOL", "geneve_protocol", "GENEVE protocol type is not Ethernet (0x6558)."},
	{-136, "DROP_GENEVE_VNI", "geneve_vni", "GENEVE VNI is not the one configured."},
	{-137, "DROP_UNKNOWN_PEER", "unknown_peer", "Outer source address is not a known peer."},
	{-138, "DROP_INNER_SRC_DENIED", "inner_src_denied", "Inner source address is not allowed for the sending peer."},
	{-139, "DROP_INNER_INVALID", "inner_invalid", "Truncated or malformed inner headers."},
	{-140, "DROP_INNER_UNSUPPORTED", "inner_unsupported", "Inner frame is not IPv4."},
	{-141, "DROP_NO_CONFIG", "no_config", "The config map entry is missing."},
	{-142, "DROP_ENCAP_FAILED", "encap_failed", "Growing or writing the packet for encapsulation failed."},
	{-143, "DROP_DECAP_FAILED", "decap_failed", "Shrinking the packet for decapsulation failed."},
	{-144, "DROP_NO_UNDERLAY_ROUTE", "no_underlay_route", "No FIB route to the peer's underlay address."},
	{-145, "DROP_NO_OVERLAY_ROUTE", "no_overlay_route", "isthmus0 got a packet for a destination no peer owns."},
	{-146, "DROP_NOT_LOCAL", "not_local", "Decapsulated packet is for no local pod or host address."},
	{-147, "DROP_TTL_EXCEEDED", "ttl_exceeded", "Inner TTL would reach zero."},
	{-148, "DROP_FRAG_NEEDED", "frag_needed", "Inner packet is larger than the tunnel MTU."},
	{-149, "DROP_REDIRECT_FAILED", "redirect_failed", "The redirect helper refused the packet."},
	{-150, "DROP_NO_NEXTHOP", "no_nexthop", "The route's next-hop group has no live member."},
	{-151, "DROP_SNAT_NO_PORT", "snat_no_port", "No free port in the SNAT range for a new flow."},
	{-152, "DROP_SNAT_INSERT", "snat_insert", "The nat table refused a new translation."},
	{-153, "DROP_SNAT_UNSUPPORTED", "snat_unsupported", "The source needs SNAT but the protocol cannot be translated."},
	{-154, "DROP_SNAT_REWRITE", "snat_rewrite", "Rewriting addresses or checksums for SNAT failed."},
	{-155, "DROP_TRANSIT_LOOP", "transit_loop", "Transit would send the packet back to the peer it came from."},
	{-156, "DROP_POD_SRC_SPOOFED", "pod_src_spoofed", "A pod sent from a source that does not route back through its interface."},
	{-157, "DROP_POD_GENEVE", "pod_geneve", "A pod sent UDP to the GENEVE port of a peer's underlay address."},
	{-158, "DROP_GENEVE_OAM", "geneve_oam", "GENEVE control frame (O bit set): never forwarded to a pod."},
	{-159, "DROP_OUTER_FRAGMENT", "outer_fragment", "First fragment of a GENEVE datagram to this node: outer fragments are not reassembled."},
	{-160, "DROP_ECN_NOT_ECT", "ecn_not_ect", "Outer header marked CE on an inner packet that is not ECN-capable (RFC 6040)."},
	{-161, "DROP_UNDERLAY_MTU", "underlay_mtu", "A transiting frame is longer than the MTU toward its next hop and its inner packet lacks DF."},
	{-162, "DROP_POD_SRC_NOT_RESERVED", "pod_src_not_reserved", "A pod on an interface the CNI plugin made sent from an address the plugin did not reserve for it."},
	{-163, "DROP_INNER_MARTIAN", "inner_martian", "Decapsulated inner source is a martian (0/8, 127/8, 224/4, 240/4) or this node's own underlay or tunnel address."},
	{-164, "DROP_ICMP_GSO", "icmp_gso", "An ICMP error (frag needed, time exceeded) for a transiting GSO frame the kernel would not shrink: sent, it would be segmented as TCP."},
	{-165, "DROP_NAT_SOURCE_LIMIT", "nat_source_limit", "A new translated flow of a pod source that already holds its whole share of the nat (or masq_nat) table (--snat-flows-per-source)."},
	{-166, "DROP_NAT_REPLY_UNKNOWN", "nat_reply_unknown", "A TCP segment to the tunnel (or masquerade) address that no translation, local socket or conntrack entry claims: dropped, not reset by the host."},
	{-167, "DROP_NEXTHOP_NOT_PEER", "nexthop_not_peer", "The route's next hop has no peers entry, so how to reach it (in the clear or encrypted) is unknown."},
	{-168, "DROP_WIREGUARD_NO_KEY", "wireguard_no_key", "For an encrypted peer whose WireGuard public key is not known yet."},
	{-169, "DROP_WIREGUARD_NO_DEVICE", "wireguard_no_device", "For an encrypted peer, and this node has no WireGuard device (or no tunnel address to send from)."},
	{-170, "DROP_CLEARTEXT_FROM_ENCRYPTED", "cleartext_from_encrypted", "GENEVE in the clear from a peer of an encrypted pair."},
	{-171, "DROP_WIREGUARD_PEER_CLEAR", "wireguard_peer_clear", "GENEVE out of WireGuard from a peer this node tunnels to in the clear."},
	{-172, "DROP_WIREGUARD_NOT_GENEVE", "wireguard_not_geneve", "A packet out of the WireGuard device that is not GENEVE for this node."},
	{-173, "DROP_NO_UNDERLAY6", "no_underlay6", "For a peer on the IPv6 underlay, and this node has no IPv6 underlay address."},
}

// DropReasons returns every drop reason, in code order from -130 down.
func DropReasons() []DropReason {
	return append([]DropReason(nil), dropReasons...)
}

// DropReasonByCode returns the reason with enum value code (negative).
func DropReasonByCode(code int32) (DropReason, bool) {
	for _, r := range dropReasons {
		if r.Code == code {
			return r, true
		}
	}
	return DropReason{}, false
}
