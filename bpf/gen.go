package bpf

// Output must be byte-identical wherever the checkout lives (CI regenerates and compares).
// bpf2go strips DWARF, so no path reaches the object today (checked: identical without
// the flags); -fdebug-compilation-dir and -fdebug-prefix-map keep it so if that changes.
// -nostdinc: only the vendored headers in ../headers are used.
//go:generate go tool bpf2go -cc clang -cflags "-O2 -g -Wall -Werror -fdebug-compilation-dir=. -fdebug-prefix-map=${PWD}=." -target bpfel -type route_key -type route_value -type peer_value -type route6_key -type peer_source_key -type peer_source6_key -type peer_source_value -type datapath_config -type pod_iface_value -type metrics_key -type metrics_value -type decap_meta -type nexthop_group -type fabric_prefix_value -type snat_exempt_value -type masq_exempt_value -type pod_addr_key -type pod_addr6_key -type pod_addr_value -type nat_key -type nat_value -type nat_state -type nat_source_key -type nat_source_value -type trace_event -type trace_prefix_value -type health_key -type health_reach_value -type health_prober_key -type health_prober_value -type redirect_slot -type redirect_drop_key -type hook -type metric -type metric_slots -type drop_reason Isthmus isthmus.c -- -I../headers -nostdinc
