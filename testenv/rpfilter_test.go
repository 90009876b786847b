package testenv

import (
	"bufio"
	"strings"
	"testing"
)

// A /proc/net/netstat as Linux 6.18 writes it, cut to a few columns per line.
const netstatSample = `TcpExt: SyncookiesSent SyncookiesRecv IPReversePathFilter EmbryonicRsts
TcpExt: 0 0 17 3
IpExt: InNoRoutes InTruncatedPkts
IpExt: 5 0
`

func TestParseNetstat(t *testing.T) {
	for _, c := range []struct {
		section, name string
		want          uint64
		err           bool
	}{
		{"TcpExt", "IPReversePathFilter", 17, false},
		{"TcpExt", "EmbryonicRsts", 3, false},
		{"IpExt", "InNoRoutes", 5, false},
		{"TcpExt", "NoSuchCounter", 0, true},
		{"MPTcpExt", "IPReversePathFilter", 0, true},
	} {
		got, err := parseNetstat(bufio.NewScanner(strings.NewReader(netstatSample)), c.section, c.name)
		if (err != nil) != c.err || got != c.want {
			t.Errorf("%s%s: got %d, %v; want %d, error %v", c.section, c.name, got, err, c.want, c.err)
		}
	}
}
