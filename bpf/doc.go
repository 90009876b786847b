// Package bpf holds the isthmus datapath: the C programs in isthmus.c and lib/, and
// the Go objects bpf2go generates from them (LoadIsthmus, IsthmusObjects and the
// Isthmus* mirrors of the structs in lib/types.h).
//
// The programs are pod_ingress and overlay_egress (GENEVE encapsulation at TC),
// underlay_ingress (decapsulation at TC) and underlay_xdp (decapsulation in XDP). The
// maps routes, peers, peer_sources, config, pod_ifaces and metrics are pinned by name;
// docs/architecture.md is the contract for all of them.
//
// Loading needs a kernel with BTF, LPM tries, bpf_fib_lookup, bpf_redirect_neigh and
// bpf_redirect_peer, and bpf_skb_adjust_room with the decap flags (Linux 6.3 or later).
package bpf
