// Command isthmus-cni is the isthmus CNI plugin (spec 1.1: ADD, DEL, CHECK,
// GC, STATUS, VERSION). ADD asks the agent's IPAM socket for the pod's
// addresses, which the agent hands out only from podCIDRs it verified in the
// API, and wires the pod as the datapath expects: a veth whose host side is
// named pod-<hash> (the agent's default pod pattern), host addresses (/32,
// /128) in the pod, a default route through a link-local gateway answered by
// a permanent neighbour entry for the host side's MAC, a host route to each
// address, and the tunnel MTU. An ADD of an attachment that is wired already
// (a runtime's retry) returns the same result and changes nothing; a failed
// ADD removes only what it made. DEL and GC release reservations straight
// from the node's reservation directory, so they work with the agent down.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/containernetworking/plugins/pkg/ip"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/isthmus-dev/isthmus/loader/buildinfo"
	"github.com/isthmus-dev/isthmus/loader/ipam"
)

// Name is the plugin's type in a network configuration.
const Name = "isthmus-cni"

// The pods' next hops: link-local, answered by the host side of the veth
// through a permanent neighbour entry, as Calico and Cilium do.
var (
	gatewayV4 = netip.MustParseAddr("169.254.1.1")
	gatewayV6 = netip.MustParseAddr("fe80::1")
)

// NetConf is the plugin's configuration: no ranges, only where the agent and
// the reservations are.
type NetConf struct {
	types.PluginConf
	// Socket is the agent's IPAM socket (default ipam.DefaultSocket).
	Socket string `json:"socket,omitempty"`
	// DataDir is the reservation directory (default ipam.DefaultDir).
	DataDir string `json:"dataDir,omitempty"`
	// RuntimeConfig carries the runtime's capability arguments: the conflist
	// declares `ips`, so a runtime may ask for addresses (CNI conventions).
	RuntimeConfig struct {
		IPs []string `json:"ips,omitempty"`
	} `json:"runtimeConfig,omitzero"`
}

// wantedIPs parses the `ips` capability: addresses, with or without a prefix
// length (which the pod's host prefix replaces).
func (c *NetConf) wantedIPs() ([]netip.Addr, error) {
	var out []netip.Addr
	for _, s := range c.RuntimeConfig.IPs {
		a, err := netip.ParseAddr(s)
		if err != nil {
			p, perr := netip.ParsePrefix(s)
			if perr != nil {
				return nil, types.NewError(types.ErrInvalidNetworkConfig, "runtimeConfig.ips", fmt.Sprintf("%q is not an address: %v", s, err))
			}
			a = p.Addr()
		}
		out = append(out, a)
	}
	return out, nil
}

func loadConf(b []byte) (*NetConf, error) {
	c := &NetConf{}
	if err := json.Unmarshal(b, c); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "decode network configuration", err.Error())
	}
	if c.Socket == "" {
		c.Socket = ipam.DefaultSocket
	}
	if c.DataDir == "" {
		c.DataDir = ipam.DefaultDir
	}
	if c.RawPrevResult != nil {
		if err := version.ParsePrevResult(&c.PluginConf); err != nil {
			return nil, types.NewError(types.ErrDecodingFailure, "parse prevResult", err.Error())
		}
	}
	return c, nil
}

func main() {
	skel.PluginMainFuncs(skel.CNIFuncs{Add: cmdAdd, Del: cmdDel, Check: cmdCheck, GC: cmdGC, Status: cmdStatus},
		pluginInfo{version.PluginSupports("0.4.0", "1.0.0", "1.1.0"), buildinfo.Get()}, "isthmus CNI plugin "+buildinfo.Get().String())
}

// pluginInfo is the plugin's answer to VERSION: the CNI versions it supports
// and, beside them, which build it is (the "isthmus" object: release,
// commit, goVersion, as `isthmus version -o json` prints them). Runtimes
// read only the CNI fields and ignore the rest.
type pluginInfo struct {
	version.PluginInfo
	build buildinfo.Info
}

// Encode writes the CNI fields and the build as one JSON object.
func (p pluginInfo) Encode(w io.Writer) error {
	var cni bytes.Buffer
	if err := p.PluginInfo.Encode(&cni); err != nil {
		return err
	}
	var fields map[string]any
	if err := json.Unmarshal(cni.Bytes(), &fields); err != nil {
		return fmt.Errorf("encode version: %w", err)
	}
	fields["isthmus"] = p.build
	return json.NewEncoder(w).Encode(fields)
}

func cmdAdd(args *skel.CmdArgs) error {
	conf, err := loadConf(args.StdinData)
	if err != nil {
		return err
	}
	netns, err := ns.GetNS(args.Netns)
	if err != nil {
		return types.NewError(types.ErrInvalidEnvironmentVariables, "open netns "+args.Netns, err.Error())
	}
	defer netns.Close()
	want, err := conf.wantedIPs()
	if err != nil {
		return err
	}
	att := ipam.Attachment{ContainerID: args.ContainerID, IfName: args.IfName}
	host := ipam.HostIface(args.ContainerID, args.IfName)
	store := ipam.Store{Dir: conf.DataDir}
	held, err := heldBy(store, att)
	if err != nil {
		return types.NewError(types.ErrIOFailure, "read reservations", err.Error())
	}
	// A runtime retries ADD (after its own restart, or when it lost the
	// result): an attachment that is wired already gets the same result
	// again, and anything else in the way is refused before it is touched.
	exists, err := attachmentExists(netns, args.IfName, host)
	if err != nil {
		return err
	}
	if exists {
		result, err := existingResult(netns, args.IfName, host, held, want)
		if err != nil {
			return types.NewError(types.ErrInternal, "add "+args.IfName, err.Error()+"; nothing was changed")
		}
		result.CNIVersion = conf.CNIVersion
		return types.PrintResult(result, conf.CNIVersion)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got, err := ipam.NewClient(conf.Socket).Add(ctx, ipam.AddRequest{
		Attachment: att, NetNS: args.Netns, HostIface: host, IPs: want,
	})
	if err != nil {
		return asCNIError("isthmus ipam add", err)
	}
	result, err := wire(netns, args.IfName, host, got)
	if err != nil {
		// Leave nothing behind that this ADD made (the runtime will retry,
		// and DEL may never come), and nothing else.
		undoAdd(netns, args.IfName, store, att, held)
		return err
	}
	result.CNIVersion = conf.CNIVersion
	return types.PrintResult(result, conf.CNIVersion)
}

// heldBy returns the addresses the store holds for att.
func heldBy(store ipam.Store, att ipam.Attachment) ([]netip.Addr, error) {
	have, err := store.List()
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, r := range have {
		if r.Attachment == att {
			out = append(out, r.Addr)
		}
	}
	return out, nil
}

// attachmentExists reports whether the pod's interface or the host side of
// its veth is there already.
func attachmentExists(netns ns.NetNS, ifname, host string) (bool, error) {
	if _, err := netlink.LinkByName(host); err == nil {
		return true, nil
	} else if !errors.As(err, &netlink.LinkNotFoundError{}) {
		return false, fmt.Errorf("look up %s: %w", host, err)
	}
	found := false
	err := netns.Do(func(ns.NetNS) error {
		_, err := netlink.LinkByName(ifname)
		if err == nil {
			found = true
			return nil
		}
		if errors.As(err, &netlink.LinkNotFoundError{}) {
			return nil
		}
		return fmt.Errorf("look up %s in %s: %w", ifname, netns.Path(), err)
	})
	return found, err
}

// existingResult is the result of an ADD that wired this attachment before:
// the host side and the pod's interface are the two ends of one veth, and the
// pod's interface holds every address reserved for the attachment, among
// them every address the runtime asks for (want). It reads the kernel and the
// store and changes nothing; an error says what does not match.
func existingResult(netns ns.NetNS, ifname, host string, held, want []netip.Addr) (*current.Result, error) {
	if len(held) == 0 {
		return nil, fmt.Errorf("%s or %s exists already but no address is reserved for this attachment (another pod's interface, or a name collision)", host, ifname)
	}
	for _, w := range want {
		if !slices.Contains(held, w) {
			return nil, fmt.Errorf("the attachment exists with %v, the runtime asks for %s", held, w)
		}
	}
	hostLink, err := netlink.LinkByName(host)
	if err != nil {
		return nil, fmt.Errorf("the attachment holds %v but its host side %s is missing: %w", held, host, err)
	}
	if _, ok := hostLink.(*netlink.Veth); !ok {
		return nil, fmt.Errorf("%s exists and is a %s, not the host side of a veth", host, hostLink.Type())
	}
	var cont netlink.Link
	var addrs []netlink.Addr
	if err := netns.Do(func(ns.NetNS) error {
		var err error
		if cont, err = netlink.LinkByName(ifname); err != nil {
			return fmt.Errorf("find %s in %s: %w", ifname, netns.Path(), err)
		}
		addrs, err = netlink.AddrList(cont, netlink.FAMILY_ALL)
		if err != nil {
			return fmt.Errorf("list addresses of %s: %w", ifname, err)
		}
		return nil
	}); err != nil {
		return nil, err
	}
	if _, ok := cont.(*netlink.Veth); !ok || cont.Attrs().ParentIndex != hostLink.Attrs().Index || hostLink.Attrs().ParentIndex != cont.Attrs().Index {
		return nil, fmt.Errorf("%s in %s is not the peer of %s", ifname, netns.Path(), host)
	}
	result := &current.Result{Interfaces: []*current.Interface{
		{Name: host, Mac: hostLink.Attrs().HardwareAddr.String()},
		{Name: ifname, Mac: cont.Attrs().HardwareAddr.String(), Mtu: cont.Attrs().MTU, Sandbox: netns.Path()},
	}}
	contIdx := 1
	for _, a := range held {
		p := netip.PrefixFrom(a, a.BitLen())
		if !slices.ContainsFunc(addrs, func(x netlink.Addr) bool { return x.IPNet.String() == ipNet(p).String() }) {
			return nil, fmt.Errorf("%s in %s lacks its reserved address %s", ifname, netns.Path(), p)
		}
		result.IPs, result.Routes = appendAddr(result.IPs, result.Routes, p, &contIdx)
	}
	return result, nil
}

// appendAddr adds a pod address and its default route to a result.
func appendAddr(ips []*current.IPConfig, routes []*types.Route, a netip.Prefix, contIdx *int) ([]*current.IPConfig, []*types.Route) {
	gw := gatewayFor(a.Addr())
	def := netip.PrefixFrom(netip.IPv4Unspecified(), 0)
	if a.Addr().Is6() {
		def = netip.PrefixFrom(netip.IPv6Unspecified(), 0)
	}
	return append(ips, &current.IPConfig{Interface: contIdx, Address: *ipNet(a), Gateway: gw.AsSlice()}),
		append(routes, &types.Route{Dst: *ipNet(def), GW: gw.AsSlice()})
}

// undoAdd removes what a failed ADD made: the pod's interface, which takes
// the host side and its host routes with it (neither existed before the ADD:
// cmdAdd checked), and the reservations that were not the attachment's
// before (held). The host side is never deleted by name: that name may be
// another pod's.
func undoAdd(netns ns.NetNS, ifname string, store ipam.Store, att ipam.Attachment, held []netip.Addr) {
	netns.Do(func(ns.NetNS) error {
		if err := ip.DelLinkByName(ifname); err != nil && !errors.Is(err, ip.ErrLinkNotFound) {
			fmt.Fprintf(os.Stderr, "isthmus-cni: undo add: delete %s: %v\n", ifname, err)
		}
		return nil
	})
	store.ReleaseIf(func(r ipam.Reservation) bool { return r.Attachment == att && !slices.Contains(held, r.Addr) })
}

// wire makes the veth and gives the pod its addresses and routes.
func wire(netns ns.NetNS, ifname, host string, got ipam.AddResponse) (*current.Result, error) {
	hostNS, err := ns.GetCurrentNS()
	if err != nil {
		return nil, fmt.Errorf("open host netns: %w", err)
	}
	defer hostNS.Close()
	var hostIf, contIf net.Interface
	if err := netns.Do(func(ns.NetNS) error {
		hostIf, contIf, err = ip.SetupVethWithName(ifname, host, got.MTU, "", hostNS)
		return err
	}); err != nil {
		return nil, fmt.Errorf("create veth %s: %w", host, err)
	}
	hostLink, err := netlink.LinkByName(host)
	if err != nil {
		return nil, fmt.Errorf("find %s: %w", host, err)
	}
	result := &current.Result{Interfaces: []*current.Interface{
		{Name: hostIf.Name, Mac: hostIf.HardwareAddr.String()},
		{Name: contIf.Name, Mac: contIf.HardwareAddr.String(), Mtu: got.MTU, Sandbox: netns.Path()},
	}}
	contIdx := 1
	for _, a := range got.Addrs {
		result.IPs, result.Routes = appendAddr(result.IPs, result.Routes, a, &contIdx)
		if err := netlink.RouteReplace(&netlink.Route{LinkIndex: hostLink.Attrs().Index, Scope: netlink.SCOPE_LINK, Dst: ipNet(a)}); err != nil {
			return nil, fmt.Errorf("add host route to %s: %w", a, err)
		}
	}
	var podMAC net.HardwareAddr
	err = netns.Do(func(ns.NetNS) error {
		link, err := netlink.LinkByName(ifname)
		if err != nil {
			return fmt.Errorf("find %s: %w", ifname, err)
		}
		podMAC = link.Attrs().HardwareAddr
		if err := netlink.LinkSetUp(link); err != nil {
			return fmt.Errorf("set %s up: %w", ifname, err)
		}
		idx := link.Attrs().Index
		for _, a := range got.Addrs {
			if a.Addr().Is6() {
				// No duplicate address detection: the address is the pod's alone.
				if err := os.WriteFile("/proc/sys/net/ipv6/conf/"+ifname+"/accept_dad", []byte("0"), 0o644); err != nil {
					return fmt.Errorf("turn off DAD on %s: %w", ifname, err)
				}
			}
			if err := netlink.AddrAdd(link, &netlink.Addr{IPNet: ipNet(a)}); err != nil {
				return fmt.Errorf("add address %s: %w", a, err)
			}
			gw := gatewayFor(a.Addr())
			family := netlink.FAMILY_V4
			if gw.Is6() {
				family = netlink.FAMILY_V6
			}
			if err := netlink.NeighSet(&netlink.Neigh{LinkIndex: idx, Family: family, State: netlink.NUD_PERMANENT,
				IP: gw.AsSlice(), HardwareAddr: hostIf.HardwareAddr}); err != nil {
				return fmt.Errorf("add neighbour %s: %w", gw, err)
			}
			if gw.Is4() {
				if err := netlink.RouteReplace(&netlink.Route{LinkIndex: idx, Scope: netlink.SCOPE_LINK, Dst: ipNet(netip.PrefixFrom(gw, 32))}); err != nil {
					return fmt.Errorf("add route to %s: %w", gw, err)
				}
			}
			if err := netlink.RouteReplace(&netlink.Route{LinkIndex: idx, Gw: gw.AsSlice(), Family: family}); err != nil {
				return fmt.Errorf("add default route via %s: %w", gw, err)
			}
		}
		return nil
	})
	if err != nil {
		return result, err
	}
	// The host reaches the pod's IPv6 addresses without neighbour discovery, as the
	// pod reaches its gateway: the host end's link-local address, which solicitation
	// would be sent from, is still tentative for a second or two after the interface
	// comes up, and the pod's first IPv6 replies would wait for it.
	for _, a := range got.Addrs {
		if a.Addr().Is6() {
			if err := netlink.NeighSet(&netlink.Neigh{LinkIndex: hostLink.Attrs().Index, Family: netlink.FAMILY_V6,
				State: netlink.NUD_PERMANENT, IP: a.Addr().AsSlice(), HardwareAddr: podMAC}); err != nil {
				return result, fmt.Errorf("add neighbour %s on %s: %w", a.Addr(), hostLink.Attrs().Name, err)
			}
		}
	}
	return result, nil
}

func gatewayFor(a netip.Addr) netip.Addr {
	if a.Is6() {
		return gatewayV6
	}
	return gatewayV4
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// unwire deletes the pod's interface (which takes the host side and the host
// routes with it) and, should the netns be gone already, the host side.
// Everything already gone counts as done.
func unwire(netnsPath, ifname, host string) error {
	if netnsPath != "" {
		err := ns.WithNetNSPath(netnsPath, func(ns.NetNS) error {
			if err := ip.DelLinkByName(ifname); err != nil && !errors.Is(err, ip.ErrLinkNotFound) {
				return err
			}
			return nil
		})
		var nsErr ns.NSPathNotExistErr
		if err != nil && !errors.As(err, &nsErr) {
			return fmt.Errorf("delete %s in %s: %w", ifname, netnsPath, err)
		}
	}
	if err := ip.DelLinkByName(host); err != nil && !errors.Is(err, ip.ErrLinkNotFound) {
		return fmt.Errorf("delete %s: %w", host, err)
	}
	return nil
}

func cmdDel(args *skel.CmdArgs) error {
	conf, err := loadConf(args.StdinData)
	if err != nil {
		return err
	}
	if err := unwire(args.Netns, args.IfName, ipam.HostIface(args.ContainerID, args.IfName)); err != nil {
		return err
	}
	if _, err := (ipam.Store{Dir: conf.DataDir}).Release(ipam.Attachment{ContainerID: args.ContainerID, IfName: args.IfName}); err != nil {
		return types.NewError(types.ErrIOFailure, "release reservation", err.Error())
	}
	return nil
}

// cmdCheck verifies what ADD returned is still true: the reservation is on
// disk, the pod's interface has its addresses and MTU, its routes are there,
// and the host side and host routes exist.
func cmdCheck(args *skel.CmdArgs) error {
	conf, err := loadConf(args.StdinData)
	if err != nil {
		return err
	}
	if conf.PrevResult == nil {
		return types.NewError(types.ErrInvalidNetworkConfig, "check needs prevResult", "")
	}
	prev, err := current.NewResultFromResult(conf.PrevResult)
	if err != nil {
		return types.NewError(types.ErrDecodingFailure, "convert prevResult", err.Error())
	}
	att := ipam.Attachment{ContainerID: args.ContainerID, IfName: args.IfName}
	have, err := ipam.Store{Dir: conf.DataDir}.List()
	if err != nil {
		return types.NewError(types.ErrIOFailure, "read reservations", err.Error())
	}
	for _, c := range prev.IPs {
		a, _ := netip.AddrFromSlice(c.Address.IP)
		if !reservedBy(have, a.Unmap(), att) {
			return fmt.Errorf("check %s: address %s is not reserved for it", args.IfName, a)
		}
	}
	host := ipam.HostIface(args.ContainerID, args.IfName)
	hostLink, err := netlink.LinkByName(host)
	if err != nil {
		return fmt.Errorf("check %s: host side %s: %w", args.IfName, host, err)
	}
	for _, c := range prev.IPs {
		routes, err := netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Dst: &c.Address, LinkIndex: hostLink.Attrs().Index},
			netlink.RT_FILTER_DST|netlink.RT_FILTER_OIF)
		if err != nil || len(routes) == 0 {
			return fmt.Errorf("check %s: no host route to %s through %s", args.IfName, c.Address.String(), host)
		}
	}
	return ns.WithNetNSPath(args.Netns, func(ns.NetNS) error {
		link, err := netlink.LinkByName(args.IfName)
		if err != nil {
			return fmt.Errorf("check %s: %w", args.IfName, err)
		}
		for _, i := range prev.Interfaces {
			if i.Sandbox != "" && i.Name == args.IfName && i.Mtu != 0 && i.Mtu != link.Attrs().MTU {
				return fmt.Errorf("check %s: MTU %d, want %d", args.IfName, link.Attrs().MTU, i.Mtu)
			}
		}
		addrs, err := netlink.AddrList(link, netlink.FAMILY_ALL)
		if err != nil {
			return fmt.Errorf("check %s: list addresses: %w", args.IfName, err)
		}
		for _, c := range prev.IPs {
			found := false
			for _, a := range addrs {
				found = found || a.IPNet.String() == c.Address.String()
			}
			if !found {
				return fmt.Errorf("check %s: address %s missing", args.IfName, c.Address.String())
			}
		}
		if err := ip.ValidateExpectedRoute(prev.Routes); err != nil {
			return fmt.Errorf("check %s: %w", args.IfName, err)
		}
		return nil
	})
}

func reservedBy(have []ipam.Reservation, a netip.Addr, att ipam.Attachment) bool {
	for _, r := range have {
		if r.Addr == a && r.Attachment == att {
			return true
		}
	}
	return false
}

// cmdGC releases every reservation whose attachment the runtime no longer
// has, and deletes the host side of its veth if it is still there.
func cmdGC(args *skel.CmdArgs) error {
	conf, err := loadConf(args.StdinData)
	if err != nil {
		return err
	}
	keep := make([]ipam.Attachment, 0, len(conf.ValidAttachments))
	for _, v := range conf.ValidAttachments {
		keep = append(keep, ipam.Attachment{ContainerID: v.ContainerID, IfName: v.IfName})
	}
	freed, err := ipam.Store{Dir: conf.DataDir}.ReleaseExcept(keep)
	if err != nil {
		return types.NewError(types.ErrIOFailure, "release reservations", err.Error())
	}
	for _, r := range freed {
		if err := ip.DelLinkByName(ipam.HostIface(r.ContainerID, r.IfName)); err != nil && !errors.Is(err, ip.ErrLinkNotFound) {
			return fmt.Errorf("gc: delete host side of %s/%s: %w", r.ContainerID, r.IfName, err)
		}
	}
	return nil
}

// cmdStatus is ready only when the agent answers and has verified ranges.
func cmdStatus(args *skel.CmdArgs) error {
	conf, err := loadConf(args.StdinData)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := ipam.NewClient(conf.Socket).Status(ctx)
	if err != nil {
		return types.NewError(types.ErrPluginNotAvailable, "isthmus agent unreachable", err.Error())
	}
	if !st.Ready {
		return types.NewError(types.ErrPluginNotAvailable, "isthmus ipam not ready", st.Reason)
	}
	return nil
}

// asCNIError keeps the agent's CNI error code; an unreachable agent means
// "try again later".
func asCNIError(what string, err error) error {
	var e *ipam.Error
	if errors.As(err, &e) {
		return types.NewError(e.Code, what, e.Msg)
	}
	return types.NewError(types.ErrTryAgainLater, what, err.Error())
}
