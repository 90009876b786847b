package bpf

// The -fdebug-prefix-map and -fdebug-compilation-dir flags keep the absolute checkout path
// out of the object's debug info, so regenerating in another directory gives identical
// output (CI compares it byte for byte).
//go:generate go tool bpf2go -cc clang -cflags "-O2 -g -Wall -Werror -fdebug-compilation-dir=. -fdebug-prefix-map=${PWD}=." -target bpfel -type route_key -type route_value -type peer_value -type peer_source_key -type peer_source_value -type datapath_config -type pod_iface_value -type metrics_key -type metrics_value -type decap_meta -type hook -type metric -type drop_reason Isthmus isthmus.c -- -I../headers -nostdinc
