package plan

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

func prefixes(s string) []netip.Prefix {
	var out []netip.Prefix
	for _, f := range strings.Fields(s) {
		if !strings.Contains(f, "/") {
			out = append(out, HostPrefix(netip.MustParseAddr(f)))
			continue
		}
		p, err := netip.ParsePrefix(f)
		if err != nil {
			panic(err)
		}
		out = append(out, p)
	}
	return out
}

func TestSubtract(t *testing.T) {
	tests := []struct {
		from, remove, want string
	}{
		{"10.0.0.0/24", "", "10.0.0.0/24"},
		{"10.0.0.0/24", "10.0.1.1", "10.0.0.0/24"},
		{"10.0.0.0/24", "10.0.0.0/16", ""},
		{"10.0.0.0/24", "10.0.0.0/24", ""},
		{"10.0.0.0/30", "10.0.0.1", "10.0.0.0/32 10.0.0.2/31"},
		{"10.0.0.0/24", "10.0.0.0", "10.0.0.1/32 10.0.0.2/31 10.0.0.4/30 10.0.0.8/29 10.0.0.16/28 10.0.0.32/27 10.0.0.64/26 10.0.0.128/25"},
		{"10.0.0.0/24", "10.0.0.255", "10.0.0.0/25 10.0.0.128/26 10.0.0.192/27 10.0.0.224/28 10.0.0.240/29 10.0.0.248/30 10.0.0.252/31 10.0.0.254/32"},
		// Seed 000 gateway case: the remote node CIDR holds the tunnel endpoint.
		{"192.168.10.0/28", "192.168.10.10", "192.168.10.0/29 192.168.10.8/31 192.168.10.11/32 192.168.10.12/30"},
		{"192.168.10.0/28", "192.168.10.10 192.168.10.11", "192.168.10.0/29 192.168.10.8/31 192.168.10.12/30"},
		{"10.0.0.0/24", "10.0.0.0/26 10.0.0.192/26", "10.0.0.64/26 10.0.0.128/26"},
		{"10.0.0.0/24", "10.0.0.0/25 10.0.0.128/25", ""},
		// Equivalent spellings: host bits in from or remove, IPv4-mapped and
		// upper-case IPv6 addresses.
		{"10.0.2.5/23", "10.0.2.0/24", "10.0.3.0/24"},
		{"10.0.2.0/23", "10.0.2.77/24", "10.0.3.0/24"},
		{"10.0.0.0/30", "::ffff:10.0.0.1", "10.0.0.0/32 10.0.0.2/31"},
		{"2001:DB8::/126", "2001:db8::1", "2001:db8::/128 2001:db8::2/127"},
		{"2001:db8::/32", "2001:0DB8:8000::/33", "2001:db8::/33"},
		{"fd00::/127", "fd00::1 fd00::", ""},
		// The other family is ignored.
		{"10.0.0.0/24", "::/0", "10.0.0.0/24"},
		{"fd00::/64", "0.0.0.0/0", "fd00::/64"},
		{"0.0.0.0/0", "0.0.0.0/1", "128.0.0.0/1"},
		{"::/0", "8000::/1", "::/1"},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%s-%s", tt.from, tt.remove), func(t *testing.T) {
			got := Subtract(netip.MustParsePrefix(tt.from), prefixes(tt.remove)...)
			if fmt.Sprint(got) != fmt.Sprint(prefixes(tt.want)) {
				t.Errorf("Subtract(%s, %s) = %v, want %v", tt.from, tt.remove, got, prefixes(tt.want))
			}
		})
	}
}

// TestSubtractCovers checks, address by address over a small space, that the
// result is exactly from minus the holes, its prefixes are disjoint and as
// large as they can be (nothing left to aggregate), for fixed and random
// holes (nested, overlapping, outside from).
func TestSubtractCovers(t *testing.T) {
	from := netip.MustParsePrefix("10.0.0.0/26")
	holeSets := [][]netip.Prefix{
		prefixes("10.0.0.7 10.0.0.8 10.0.0.63"),
		prefixes("10.0.0.16/29 10.0.0.33 10.0.0.0"),
		prefixes("10.0.0.1 10.0.0.2 10.0.0.3 10.0.0.4 10.0.0.5"),
	}
	r := rand.New(rand.NewPCG(26, 1))
	for range 200 {
		var holes []netip.Prefix
		for range 1 + r.IntN(12) {
			a := netip.AddrFrom4([4]byte{10, 0, 0, byte(r.IntN(80))})
			holes = append(holes, netip.PrefixFrom(a, 25+r.IntN(8)).Masked())
		}
		holeSets = append(holeSets, holes)
	}
	for _, holes := range holeSets {
		got := Subtract(from, holes...)
		if agg := AggregatePrefixes(slices.Clone(got)); !slices.Equal(agg, got) {
			t.Errorf("holes %v: %v could be %v", holes, got, agg)
		}
		for a := from.Addr(); from.Contains(a); a = a.Next() {
			inHole := false
			for _, h := range holes {
				inHole = inHole || h.Contains(a)
			}
			covered := 0
			for _, p := range got {
				if p.Contains(a) {
					covered++
				}
			}
			if want := map[bool]int{true: 0, false: 1}[inHole]; covered != want {
				t.Errorf("holes %v: %s covered %d times by %v, want %d", holes, a, covered, got, want)
			}
		}
	}
}
