// Package wireguard owns a node's WireGuard device: its private key on disk,
// the device itself (the kernel's, or a userspace wireguard-go process where
// the kernel has no wireguard module), and its peers, reached by difference.
//
// The datapath redirects the GENEVE packets of encrypted peers, as plain IPv4
// packets between tunnel addresses, into this device; WireGuard encrypts them
// to the peer's node. This package never decides who the peers are: callers
// pass the desired peers to (*Device).SyncPeers.
//
// Everything that touches the kernel (Ensure, SpawnUserspace, the Device's
// methods) works in the network namespace of the calling thread at the time of
// Ensure or SpawnUserspace: callers working in another namespace lock their
// goroutine to an OS thread switched into it.
package wireguard
