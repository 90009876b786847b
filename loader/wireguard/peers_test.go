package wireguard

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// Keys named k1..k6 for readable transcripts; Diff never looks inside a key.
var testKeys = func() []wgtypes.Key {
	ks := make([]wgtypes.Key, 7)
	for i := range ks {
		ks[i][0], ks[i][31] = byte(i), 0xee
	}
	return ks
}()

func keyName(k wgtypes.Key) string {
	if i := slices.Index(testKeys, k); i > 0 {
		return fmt.Sprintf("k%d", i)
	}
	return k.String()
}

func udp(s string) *net.UDPAddr { return net.UDPAddrFromAddrPort(netip.MustParseAddrPort(s)) }

// udp16 is s with its IPv4 address in 16 bytes, as a device may report it.
func udp16(s string) *net.UDPAddr {
	a := udp(s)
	a.IP = a.IP.To16()
	return a
}

func pfx(ss ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

// devNets is ss as a device reports allowed IPs; IPv4 in 16 bytes when wide.
func devNets(wide bool, ss ...string) []net.IPNet {
	var out []net.IPNet
	for _, s := range ss {
		_, n, err := net.ParseCIDR(s)
		if err != nil {
			panic(err)
		}
		if wide {
			n.IP = n.IP.To16()
		}
		out = append(out, *n)
	}
	return out
}

// describe renders one peer change as a line of a transcript.
func describe(pc wgtypes.PeerConfig) string {
	var b strings.Builder
	switch {
	case pc.Remove:
		b.WriteString("remove")
	case pc.UpdateOnly:
		b.WriteString("update")
	default:
		b.WriteString("add")
	}
	b.WriteString(" " + keyName(pc.PublicKey))
	if pc.Endpoint != nil {
		b.WriteString(" endpoint=" + addrPort(pc.Endpoint).String())
	}
	if pc.PersistentKeepaliveInterval != nil {
		b.WriteString(" keepalive=" + pc.PersistentKeepaliveInterval.String())
	}
	if pc.ReplaceAllowedIPs || len(pc.AllowedIPs) > 0 {
		var ps []string
		for _, p := range prefixes(pc.AllowedIPs) {
			ps = append(ps, p.String())
		}
		op := "+allowed="
		if pc.ReplaceAllowedIPs {
			op = "allowed="
		}
		b.WriteString(" " + op + "[" + strings.Join(ps, " ") + "]")
	}
	if pc.PresharedKey != nil {
		b.WriteString(" psk")
	}
	return b.String()
}

func transcript(cfgs []wgtypes.PeerConfig) []string {
	var out []string
	for _, pc := range cfgs {
		out = append(out, describe(pc))
	}
	return out
}

func TestDiff(t *testing.T) {
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	k := testKeys
	ago := func(d time.Duration) time.Time { return now.Add(-d) }
	tests := []struct {
		name    string
		current []wgtypes.Peer
		desired []Peer
		want    []string
	}{
		{name: "nothing to nothing"},
		{
			name:    "a new peer is configured whole",
			desired: []Peer{{PublicKey: k[1], Endpoint: udp("192.0.2.1:51820"), AllowedIPs: pfx("100.64.0.2/32", "10.0.0.0/24"), Keepalive: 25 * time.Second}},
			want:    []string{"add k1 endpoint=192.0.2.1:51820 keepalive=25s allowed=[10.0.0.0/24 100.64.0.2/32]"},
		},
		{
			name:    "a new peer without endpoint waits to learn it",
			desired: []Peer{{PublicKey: k[1], AllowedIPs: pfx("100.64.0.2/32")}},
			want:    []string{"add k1 keepalive=0s allowed=[100.64.0.2/32]"},
		},
		{
			name:    "a peer no longer desired is removed",
			current: []wgtypes.Peer{{PublicKey: k[1], AllowedIPs: devNets(false, "100.64.0.2/32")}},
			want:    []string{"remove k1"},
		},
		{
			name: "an unchanged peer is left alone, whatever the order and width of its addresses",
			current: []wgtypes.Peer{{PublicKey: k[1], Endpoint: udp16("192.0.2.1:51820"), LastHandshakeTime: ago(time.Hour),
				AllowedIPs: devNets(true, "100.64.0.2/32", "10.0.0.0/24"), PersistentKeepaliveInterval: 25 * time.Second}},
			desired: []Peer{{PublicKey: k[1], Endpoint: udp("192.0.2.1:51820"), AllowedIPs: pfx("10.0.0.0/24", "100.64.0.2/32", "10.0.0.7/24"), Keepalive: 25 * time.Second}},
		},
		{
			name:    "allowed IPs that differ are replaced, nothing else",
			current: []wgtypes.Peer{{PublicKey: k[1], Endpoint: udp("192.0.2.1:51820"), AllowedIPs: devNets(false, "100.64.0.2/32")}},
			desired: []Peer{{PublicKey: k[1], Endpoint: udp("192.0.2.1:51820"), AllowedIPs: pfx("100.64.0.2/32", "10.0.1.0/24")}},
			want:    []string{"update k1 allowed=[10.0.1.0/24 100.64.0.2/32]"},
		},
		{
			name:    "allowed IPs desired empty are cleared",
			current: []wgtypes.Peer{{PublicKey: k[1], AllowedIPs: devNets(false, "100.64.0.2/32")}},
			desired: []Peer{{PublicKey: k[1]}},
			want:    []string{"update k1 allowed=[]"},
		},
		{
			name:    "a keepalive that differs is set",
			current: []wgtypes.Peer{{PublicKey: k[1], PersistentKeepaliveInterval: 25 * time.Second}},
			desired: []Peer{{PublicKey: k[1], Keepalive: 0}},
			want:    []string{"update k1 keepalive=0s"},
		},
		{
			name:    "a keepalive is compared in whole seconds",
			current: []wgtypes.Peer{{PublicKey: k[1], PersistentKeepaliveInterval: time.Second}},
			desired: []Peer{{PublicKey: k[1], Keepalive: 1500 * time.Millisecond}},
		},
		{
			name:    "an endpoint the device lacks is set",
			current: []wgtypes.Peer{{PublicKey: k[1], LastHandshakeTime: ago(time.Second)}},
			desired: []Peer{{PublicKey: k[1], Endpoint: udp("192.0.2.1:51820")}},
			want:    []string{"update k1 endpoint=192.0.2.1:51820"},
		},
		{
			name:    "an endpoint learnt in a live session is kept",
			current: []wgtypes.Peer{{PublicKey: k[1], Endpoint: udp("198.51.100.9:40000"), LastHandshakeTime: ago(10 * time.Second)}},
			desired: []Peer{{PublicKey: k[1], Endpoint: udp("192.0.2.1:51820")}},
		},
		{
			name:    "an endpoint learnt 179 s ago is still kept",
			current: []wgtypes.Peer{{PublicKey: k[1], Endpoint: udp("198.51.100.9:40000"), LastHandshakeTime: ago(179 * time.Second)}},
			desired: []Peer{{PublicKey: k[1], Endpoint: udp("192.0.2.1:51820")}},
		},
		{
			name:    "an endpoint of a session gone (181 s) gives way to the desired one",
			current: []wgtypes.Peer{{PublicKey: k[1], Endpoint: udp("198.51.100.9:40000"), LastHandshakeTime: ago(181 * time.Second)}},
			desired: []Peer{{PublicKey: k[1], Endpoint: udp("192.0.2.1:51820")}},
			want:    []string{"update k1 endpoint=192.0.2.1:51820"},
		},
		{
			name:    "an endpoint with no handshake ever (Unix epoch) gives way",
			current: []wgtypes.Peer{{PublicKey: k[1], Endpoint: udp("198.51.100.9:40000"), LastHandshakeTime: time.Unix(0, 0)}},
			desired: []Peer{{PublicKey: k[1], Endpoint: udp("192.0.2.1:51820")}},
			want:    []string{"update k1 endpoint=192.0.2.1:51820"},
		},
		{
			name:    "an endpoint with no handshake ever (zero time) gives way",
			current: []wgtypes.Peer{{PublicKey: k[1], Endpoint: udp("198.51.100.9:40000")}},
			desired: []Peer{{PublicKey: k[1], Endpoint: udp("192.0.2.1:51820")}},
			want:    []string{"update k1 endpoint=192.0.2.1:51820"},
		},
		{
			name:    "a nil desired endpoint never clears a learnt one, even a stale one",
			current: []wgtypes.Peer{{PublicKey: k[1], Endpoint: udp("198.51.100.9:40000"), LastHandshakeTime: ago(time.Hour)}},
			desired: []Peer{{PublicKey: k[1]}},
		},
		{
			name:    "an endpoint equal but for its width is not set again",
			current: []wgtypes.Peer{{PublicKey: k[1], Endpoint: udp16("192.0.2.1:51820"), LastHandshakeTime: ago(time.Hour)}},
			desired: []Peer{{PublicKey: k[1], Endpoint: udp("192.0.2.1:51820")}},
		},
		{
			name: "changes in desired order, removals last and sorted",
			current: []wgtypes.Peer{
				{PublicKey: k[4]}, {PublicKey: k[1]}, {PublicKey: k[3]},
			},
			desired: []Peer{{PublicKey: k[2]}, {PublicKey: k[1], Keepalive: 5 * time.Second}},
			want:    []string{"add k2 keepalive=0s allowed=[]", "update k1 keepalive=5s", "remove k3", "remove k4"},
		},
		{
			name:    "a key given twice is configured as its last entry says",
			desired: []Peer{{PublicKey: k[1], Keepalive: time.Second}, {PublicKey: k[2]}, {PublicKey: k[1], Keepalive: 2 * time.Second}},
			want:    []string{"add k2 keepalive=0s allowed=[]", "add k1 keepalive=2s allowed=[]"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := transcript(Diff(tt.current, tt.desired, now))
			if d := cmp.Diff(tt.want, got); d != "" {
				t.Errorf("Diff transcript (-want +got):\n%s", d)
			}
		})
	}
}

// TestDiffDoesNotAlias checks the changes share no memory with desired: the
// caller may reuse its slices while the changes are applied.
func TestDiffDoesNotAlias(t *testing.T) {
	desired := []Peer{{PublicKey: testKeys[1], Endpoint: udp("192.0.2.1:51820"), AllowedIPs: pfx("100.64.0.2/32")}}
	cfgs := Diff(nil, desired, time.Now())
	desired[0].Endpoint.IP[0] = 9
	desired[0].AllowedIPs[0] = netip.MustParsePrefix("9.9.9.9/32")
	if got := describe(cfgs[0]); got != "add k1 endpoint=192.0.2.1:51820 keepalive=0s allowed=[100.64.0.2/32]" {
		t.Errorf("after changing desired, the change reads %q", got)
	}
}

// applyPeerConfigs is what a WireGuard device does with one ConfigureDevice
// call (ReplacePeers false): the reference the property tests check Diff
// against.
func applyPeerConfigs(current []wgtypes.Peer, cfgs []wgtypes.PeerConfig) []wgtypes.Peer {
	out := slices.Clone(current)
	find := func(k wgtypes.Key) int {
		return slices.IndexFunc(out, func(p wgtypes.Peer) bool { return p.PublicKey == k })
	}
	for _, pc := range cfgs {
		i := find(pc.PublicKey)
		if pc.Remove {
			if i >= 0 {
				out = slices.Delete(out, i, i+1)
			}
			continue
		}
		if i < 0 {
			if pc.UpdateOnly {
				continue
			}
			out = append(out, wgtypes.Peer{PublicKey: pc.PublicKey})
			i = len(out) - 1
		}
		p := &out[i]
		if pc.Endpoint != nil {
			p.Endpoint = cloneUDPAddr(pc.Endpoint)
		}
		if pc.PersistentKeepaliveInterval != nil {
			p.PersistentKeepaliveInterval = *pc.PersistentKeepaliveInterval
		}
		if pc.ReplaceAllowedIPs {
			p.AllowedIPs = nil
		}
		for _, n := range pc.AllowedIPs {
			// An allowed IP belongs to one peer: adding it takes it from another.
			for j := range out {
				out[j].AllowedIPs = slices.DeleteFunc(out[j].AllowedIPs, func(m net.IPNet) bool { return m.String() == n.String() })
			}
			p.AllowedIPs = append(p.AllowedIPs, n)
		}
	}
	return out
}

// randomState returns a random device state and desired state over a small
// pool of keys, endpoints and prefixes, so that they overlap often. The
// desired prefixes are disjoint between peers, as a valid plan's are.
func randomState(r *rand.Rand, now time.Time) ([]wgtypes.Peer, []Peer) {
	endpoints := []string{"", "192.0.2.1:51820", "192.0.2.2:51820", "198.51.100.9:40000", "[2001:db8::1]:51820"}
	allPrefixes := []string{"100.64.0.1/32", "100.64.0.2/32", "100.64.0.3/32", "10.0.0.0/24", "10.0.1.0/24", "fd00::/64"}
	handshakes := []time.Time{{}, time.Unix(0, 0), now.Add(-time.Second), now.Add(-179 * time.Second), now.Add(-181 * time.Second), now.Add(-time.Hour)}
	keepalives := []time.Duration{0, time.Second, 1500 * time.Millisecond, 25 * time.Second}
	endpoint := func() *net.UDPAddr {
		s := endpoints[r.IntN(len(endpoints))]
		if s == "" {
			return nil
		}
		if r.IntN(2) == 0 {
			return udp16(s)
		}
		return udp(s)
	}
	var current []wgtypes.Peer
	for _, ki := range r.Perm(6)[:r.IntN(6)] {
		var nets []string
		for _, p := range allPrefixes {
			if r.IntN(3) == 0 {
				nets = append(nets, p)
			}
		}
		current = append(current, wgtypes.Peer{
			PublicKey:                   testKeys[ki+1],
			Endpoint:                    endpoint(),
			LastHandshakeTime:           handshakes[r.IntN(len(handshakes))],
			PersistentKeepaliveInterval: keepalives[r.IntN(len(keepalives))].Truncate(time.Second),
			AllowedIPs:                  devNets(r.IntN(2) == 0, nets...),
		})
	}
	var desired []Peer
	owner := map[int]int{} // prefix index -> desired peer index
	keys := r.Perm(6)[:r.IntN(6)]
	for i := range keys {
		for pi := range allPrefixes {
			if r.IntN(4) == 0 {
				owner[pi] = i
			}
		}
	}
	for i, ki := range keys {
		var ps []netip.Prefix
		for pi, p := range allPrefixes {
			if o, ok := owner[pi]; ok && o == i {
				ps = append(ps, netip.MustParsePrefix(p))
			}
		}
		r.Shuffle(len(ps), func(a, b int) { ps[a], ps[b] = ps[b], ps[a] })
		desired = append(desired, Peer{
			PublicKey:  testKeys[ki+1],
			Endpoint:   endpoint(),
			AllowedIPs: ps,
			Keepalive:  keepalives[r.IntN(len(keepalives))],
		})
	}
	return current, desired
}

// TestDiffProperties checks, over random states: applying the diff to the
// current peers yields the desired ones (with the endpoint rule), the diff of
// the result is empty, and only peers already there are updated.
func TestDiffProperties(t *testing.T) {
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	for seed := range uint64(2000) {
		r := rand.New(rand.NewPCG(seed, 7))
		current, desired := randomState(r, now)
		cfgs := Diff(current, desired, now)
		fail := func(format string, args ...any) {
			t.Helper()
			t.Fatalf("seed %d: %s\ncurrent: %s\ndesired: %s\ndiff: %q", seed, fmt.Sprintf(format, args...),
				fmtCurrent(current), fmtDesired(desired), transcript(cfgs))
		}
		had := map[wgtypes.Key]wgtypes.Peer{}
		for _, p := range current {
			had[p.PublicKey] = p
		}
		for _, pc := range cfgs {
			_, existed := had[pc.PublicKey]
			if !pc.Remove && pc.UpdateOnly != existed {
				fail("%s: UpdateOnly must be set exactly on peers the device has", describe(pc))
			}
		}
		got := applyPeerConfigs(current, cfgs)
		if len(got) != len(desired) {
			fail("applied: %d peers, want %d", len(got), len(desired))
		}
		for _, want := range desired {
			i := slices.IndexFunc(got, func(p wgtypes.Peer) bool { return p.PublicKey == want.PublicKey })
			if i < 0 {
				fail("applied: %s missing", keyName(want.PublicKey))
			}
			p := got[i]
			if g, w := prefixSet(prefixes(p.AllowedIPs)), prefixSet(want.AllowedIPs); !slices.Equal(g, w) {
				fail("applied: %s allowed %v, want %v", keyName(p.PublicKey), g, w)
			}
			if g, w := p.PersistentKeepaliveInterval, want.Keepalive.Truncate(time.Second); g != w {
				fail("applied: %s keepalive %v, want %v", keyName(p.PublicKey), g, w)
			}
			wantEP := want.Endpoint
			if before, ok := had[want.PublicKey]; ok && before.Endpoint != nil {
				fresh := now.Sub(before.LastHandshakeTime) <= rejectAfterTime
				if want.Endpoint == nil || fresh {
					wantEP = before.Endpoint // learnt: kept
				}
			}
			if fmtUDP(p.Endpoint) != fmtUDP(wantEP) {
				fail("applied: %s endpoint %s, want %s", keyName(p.PublicKey), fmtUDP(p.Endpoint), fmtUDP(wantEP))
			}
		}
		if again := Diff(got, desired, now); len(again) != 0 {
			fail("the diff of the applied state is not empty: %q", transcript(again))
		}
		if self := Diff(asDevice(desired, now), desired, now); len(self) != 0 {
			fail("the diff of desired against itself is not empty: %q", transcript(self))
		}
	}
}

// asDevice is the device state that desired describes, sessions live.
func asDevice(desired []Peer, now time.Time) []wgtypes.Peer {
	var out []wgtypes.Peer
	for _, p := range desired {
		out = append(out, wgtypes.Peer{
			PublicKey:                   p.PublicKey,
			Endpoint:                    p.Endpoint,
			LastHandshakeTime:           now.Add(-time.Second),
			PersistentKeepaliveInterval: p.Keepalive.Truncate(time.Second),
			AllowedIPs:                  ipNets(p.AllowedIPs),
		})
	}
	return out
}

func fmtUDP(a *net.UDPAddr) string {
	if a == nil {
		return "none"
	}
	return addrPort(a).String()
}

func fmtCurrent(ps []wgtypes.Peer) string {
	var b bytes.Buffer
	for _, p := range ps {
		fmt.Fprintf(&b, "\n  %s endpoint=%s handshake=%s keepalive=%v allowed=%v", keyName(p.PublicKey), fmtUDP(p.Endpoint),
			p.LastHandshakeTime.Format(time.TimeOnly), p.PersistentKeepaliveInterval, prefixes(p.AllowedIPs))
	}
	return b.String()
}

func fmtDesired(ps []Peer) string {
	var b bytes.Buffer
	for _, p := range ps {
		fmt.Fprintf(&b, "\n  %s endpoint=%s keepalive=%v allowed=%v", keyName(p.PublicKey), fmtUDP(p.Endpoint), p.Keepalive, p.AllowedIPs)
	}
	return b.String()
}
