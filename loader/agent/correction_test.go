package agent

import (
	"net/netip"
	"testing"

	"github.com/isthmus-dev/isthmus/loader/plan"
)

// TestCorrectionText: the agent's log line names what cut a route, the tunnel
// endpoint or the local prefix, and never prints an unset address.
func TestCorrectionText(t *testing.T) {
	for _, tt := range []struct {
		c    plan.Correction
		want string
	}{
		{plan.Correction{Removed: netip.MustParsePrefix("192.168.10.0/28"), Endpoint: netip.MustParseAddr("192.168.10.10"),
			Kept: []netip.Prefix{netip.MustParsePrefix("192.168.10.0/29")}, Origin: `Site "flex-site" spec.nodeCidrs[0]`},
			`route 192.168.10.0/28 (Site "flex-site" spec.nodeCidrs[0]) contained tunnel endpoint 192.168.10.10: replaced by [192.168.10.0/29]`},
		{plan.Correction{Removed: netip.MustParsePrefix("10.0.2.0/23"), Local: netip.MustParsePrefix("10.0.0.0/16"),
			Origin: `GatewayPool "cluster-flex-gw" spec.routedCidrs[0]`},
			`route 10.0.2.0/23 (GatewayPool "cluster-flex-gw" spec.routedCidrs[0]) overlapped local prefix 10.0.0.0/16: replaced by []`},
	} {
		if got := correctionText(tt.c); got != tt.want {
			t.Errorf("correctionText = %q, want %q", got, tt.want)
		}
	}
}
