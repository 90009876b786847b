package main

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"
	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/isthmus-dev/isthmus/loader/datapath"
	"github.com/isthmus-dev/isthmus/maps"
)

func newTraceCmd() *cobra.Command {
	var (
		pinDir   string
		prefixes []string
		output   string
	)
	cmd := &cobra.Command{
		Use:   "trace --prefix P [--prefix P ...]",
		Short: "Print the datapath's decisions for packets to or from the given prefixes, live",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "text" && output != "json" {
				return fmt.Errorf("parse -o: %q is not text or json", output)
			}
			var ps []netip.Prefix
			for _, s := range prefixes {
				p, err := netip.ParsePrefix(s)
				if err != nil {
					a, aerr := netip.ParseAddr(s)
					if aerr != nil {
						return fmt.Errorf("parse prefix: %w", err)
					}
					p = netip.PrefixFrom(a, a.BitLen())
				}
				if !p.Addr().Unmap().Is4() {
					return fmt.Errorf("parse prefix %s: the datapath is IPv4 only", s)
				}
				ps = append(ps, p.Masked())
			}
			if len(ps) == 0 {
				return errors.New("trace: give at least one --prefix")
			}
			return runTrace(cmd.OutOrStdout(), pinDir, ps, output == "json")
		},
	}
	cmd.Flags().StringVar(&pinDir, "pin-dir", datapath.DefaultPinDir, "bpffs directory the agent pinned into")
	cmd.Flags().StringSliceVar(&prefixes, "prefix", nil, "IPv4 prefix (or address) whose packets to trace; repeatable")
	cmd.Flags().StringVarP(&output, "output", "o", "text", "output: text or json")
	return cmd
}

// runTrace turns tracing on for ps, prints events until SIGINT or SIGTERM, then
// removes ps and clears CFG_F_TRACE. One tracer at a time: a set flag is refused.
func runTrace(w io.Writer, pinDir string, ps []netip.Prefix, asJSON bool) error {
	open := func(n maps.Name) (*ebpf.Map, error) {
		m, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, string(n)), nil)
		if err != nil {
			return nil, fmt.Errorf("open pinned map %s: %w", n, err)
		}
		return m, nil
	}
	cfgMap, err := open(maps.MapConfig)
	if err != nil {
		return err
	}
	defer cfgMap.Close()
	pfx, err := open(maps.MapTracePrefixes)
	if err != nil {
		return err
	}
	defer pfx.Close()
	events, err := open(maps.MapTraceEvents)
	if err != nil {
		return err
	}
	defer events.Close()
	peersMap, err := open(maps.MapPeers)
	if err != nil {
		return err
	}
	defer peersMap.Close()
	rd, err := ringbuf.NewReader(events)
	if err != nil {
		return fmt.Errorf("read trace_events: %w", err)
	}
	defer rd.Close()

	var cfg maps.DatapathConfig
	if err := cfgMap.Lookup(uint32(0), &cfg); err != nil {
		return fmt.Errorf("read config: %w", err)
	}
	if cfg.Flags&maps.ConfigFlagTrace != 0 {
		return fmt.Errorf("trace: another trace is running on this node (CFG_F_TRACE is set; if none is, clear it by ending a trace: the flag is cleared on exit)")
	}
	for _, p := range ps {
		k := maps.RouteKeyFromPrefix(p)
		if err := pfx.Put(&k, &maps.TracePrefixValue{}); err != nil {
			return fmt.Errorf("add trace prefix %s: %w", p, err)
		}
	}
	setFlag := func(on bool) error {
		// Read-modify-write: the agent may have written other fields meanwhile.
		if err := cfgMap.Lookup(uint32(0), &cfg); err != nil {
			return fmt.Errorf("read config: %w", err)
		}
		cfg.Flags &^= maps.ConfigFlagTrace
		if on {
			cfg.Flags |= maps.ConfigFlagTrace
		}
		if err := cfgMap.Put(uint32(0), &cfg); err != nil {
			return fmt.Errorf("write config: %w", err)
		}
		return nil
	}
	cleanup := func() error {
		errs := []error{setFlag(false)}
		for _, p := range ps {
			k := maps.RouteKeyFromPrefix(p)
			if err := pfx.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				errs = append(errs, fmt.Errorf("remove trace prefix %s: %w", p, err))
			}
		}
		return errors.Join(errs...)
	}
	if err := setFlag(true); err != nil {
		return errors.Join(err, cleanup())
	}

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sig)
	go func() { <-sig; rd.Close() }()

	boot := bootTime()
	names := ifNames{}
	peers := peerNames{m: peersMap, cache: map[uint32]netip.Addr{}}
	enc := json.NewEncoder(w)
	for {
		rec, err := rd.Read()
		if errors.Is(err, ringbuf.ErrClosed) || errors.Is(err, os.ErrClosed) {
			return cleanup()
		}
		if err != nil {
			return errors.Join(fmt.Errorf("read trace_events: %w", err), cleanup())
		}
		var ev maps.TraceEvent
		if _, err := binary.Decode(rec.RawSample, binary.NativeEndian, &ev); err != nil {
			continue
		}
		t := traceView(ev, boot, names, peers.addr)
		if asJSON {
			enc.Encode(t)
		} else {
			fmt.Fprintln(w, t.String())
		}
	}
}

// bootTime returns the wall-clock time of CLOCK_MONOTONIC zero, which bpf_ktime_get_ns counts from.
func bootTime() time.Time {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return time.Now()
	}
	return time.Now().Add(-time.Duration(ts.Nano()))
}

// peerNames resolves the 32 bits an event names a peer by to its address: an
// IPv4 address as it is, a handle (a peer on the IPv6 underlay) through its
// peers entry, cached.
type peerNames struct {
	m     *ebpf.Map
	cache map[uint32]netip.Addr
}

func (p peerNames) addr(v uint32) netip.Addr {
	a := maps.BE32ToAddr(v)
	if !maps.IsHandle(a) {
		return a
	}
	if got, ok := p.cache[v]; ok {
		return got
	}
	var pv maps.PeerValue
	if err := p.m.Lookup(v, &pv); err == nil && pv.Flags&maps.PeerFlagUnderlay6 != 0 {
		a = maps.From16ToAddr(pv.Underlay6)
	}
	p.cache[v] = a
	return a
}

// ifNames caches interface names by ifindex.
type ifNames map[uint32]string

func (n ifNames) name(i uint32) string {
	if i == 0 {
		return ""
	}
	if s, ok := n[i]; ok {
		return s
	}
	s := fmt.Sprint(i)
	if ifc, err := net.InterfaceByIndex(int(i)); err == nil {
		s = ifc.Name
	}
	n[i] = s
	return s
}

// traceLine is one event for printing.
type traceLine struct {
	Time      time.Time  `json:"time"`
	Hook      string     `json:"hook"`
	Iface     string     `json:"iface"`
	Decision  string     `json:"decision"`
	Code      int32      `json:"code"`
	Proto     string     `json:"proto"`
	Src       string     `json:"src"`
	Dst       string     `json:"dst"`
	Len       uint32     `json:"len"`
	Peer      netip.Addr `json:"peer,omitzero"`
	Group     uint32     `json:"group,omitempty"`
	TunnelSrc uint16     `json:"tunnel_sport,omitempty"`
	NatFrom   string     `json:"nat_from,omitempty"`
	Target    string     `json:"target,omitempty"`
}

var hookNames = []string{"pod_ingress", "overlay_egress", "underlay_tc", "underlay_xdp", "underlay_egress", "wireguard_ingress"}

var decisionNames = map[int32]string{1: "encap", 2: "decap", 3: "deliver pod", 4: "deliver host",
	5: "frag-needed sent", 6: "deliver fabric", 7: "snat", 8: "reverse snat", 9: "snat new",
	10: "fabric ingress", 11: "transit", 14: "masquerade", 15: "reverse masquerade"}

func ntohs(v uint16) uint16 {
	var b [2]byte
	binary.NativeEndian.PutUint16(b[:], v)
	return binary.BigEndian.Uint16(b[:])
}

// traceView is ev for printing; peer names the event's peer (peerNames.addr).
func traceView(ev maps.TraceEvent, boot time.Time, names ifNames, peer func(uint32) netip.Addr) traceLine {
	t := traceLine{
		Time:  boot.Add(time.Duration(ev.Timestamp)),
		Iface: names.name(ev.Ifindex),
		Code:  ev.Code,
		Len:   ev.Len,
		Group: ev.Group,
	}
	t.Hook = fmt.Sprint(ev.Hook)
	if int(ev.Hook) < len(hookNames) {
		t.Hook = hookNames[ev.Hook]
	}
	if ev.Code < 0 {
		t.Decision = fmt.Sprintf("drop %d", ev.Code)
		if r, ok := maps.DropReasonByCode(ev.Code); ok {
			t.Decision = "drop " + r.Name
		}
	} else if n, ok := decisionNames[ev.Code]; ok {
		t.Decision = n
	} else {
		t.Decision = fmt.Sprint(ev.Code)
	}
	t.Proto = map[uint8]string{1: "icmp", 6: "tcp", 17: "udp"}[ev.Proto]
	if t.Proto == "" {
		t.Proto = fmt.Sprint(ev.Proto)
	}
	addr := func(a uint32, port uint16) string {
		if ev.Proto == 6 || ev.Proto == 17 {
			return netip.AddrPortFrom(maps.BE32ToAddr(a), ntohs(port)).String()
		}
		return maps.BE32ToAddr(a).String()
	}
	t.Src, t.Dst = addr(ev.Saddr, ev.Sport), addr(ev.Daddr, ev.Dport)
	if ev.Peer != 0 {
		t.Peer = peer(ev.Peer)
	}
	t.TunnelSrc = ntohs(ev.TunnelSport)
	if ev.NatAddr != 0 {
		t.NatFrom = addr(ev.NatAddr, ev.NatPort)
	}
	t.Target = names.name(ev.TargetIfindex)
	return t
}

// String is the text form: time, hook, interface, tuple, decision and its details.
func (t traceLine) String() string {
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s %s %s %s -> %s %s %s", t.Time.Format("15:04:05.000000"), t.Hook, t.Iface,
		t.Src, t.Dst, t.Proto, t.Decision)
	if t.Peer.IsValid() {
		fmt.Fprintf(&b, " peer %s", t.Peer)
	}
	if t.Group != 0 {
		fmt.Fprintf(&b, " group %d", t.Group)
	}
	if t.Decision == "encap" && t.TunnelSrc != 0 {
		fmt.Fprintf(&b, " sport %d", t.TunnelSrc)
	}
	if t.NatFrom != "" {
		fmt.Fprintf(&b, " was %s", t.NatFrom)
	}
	if t.Target != "" {
		fmt.Fprintf(&b, " to %s", t.Target)
	}
	fmt.Fprintf(&b, " len %d", t.Len)
	return b.String()
}
